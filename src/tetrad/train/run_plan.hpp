// The run plan: every setting of a training run that is resolved from the config, the launch
// and the device, resolved in one place (resolve_run_plan) and carried as typed values with the
// reason for each choice the log prints. A pure function of its inputs: no MPI, no files, no
// device work (the planner behind `grid = "auto"` reads its machine file). The model's transport
// is checked here (comm::check_transport) but chosen by the caller: choosing asks, collectively,
// whether ranks share a GPU (comm::choose_transport).
//
// What this does not do: build anything (process groups, the model, loaders), or check that the
// run fits in memory (memory_check.hpp).
#pragma once
#include <cstdint>
#include <string>

#include "tetrad/backend/backend.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/layer_split.hpp"
#include "tetrad/parallel/options.hpp"
#include "tetrad/train/config.hpp"

namespace tetrad::comm {
class Communicator;
}

namespace tetrad {

// How this process was launched.
struct Launch {
  int world = 1;           // ranks of the job
  int ranks_per_node = 0;  // the launcher's count (launcher_ranks_per_node); 0: unknown
  int threads = 1;         // OpenMP threads of each rank (after train.threads is applied)
  bool mpi = false;        // MPI is initialised (a one-rank job may run without it)
  bool open_mpi = false;   // under Open MPI's mpirun (its SIGCONT notice: core/signals.hpp)
  std::string sigkill_timeout;  // Open MPI's odls_base_sigkill_timeout as set ("" : default)
  // Ranks on this node: the launcher's count, else all of them (one node assumed).
  int ranks_on_node() const { return ranks_per_node > 0 ? ranks_per_node : world; }
};

struct RunPlan {
  parallel::GridShape grid;
  // grid = "auto", or none named on more than one rank: the planner's lines (machine,
  // prediction, runner-up); "" for a grid the config names.
  std::string grid_why;
  // The global micro-batch's sequences are split over the Z x D ranks (`replicas` slots).
  int replicas = 1;
  int local_batch = 1;    // sequences per micro-batch on this rank (B)
  int seq_len = 1;        // T
  int64_t tokens_per_step = 0;  // micro_batch x seq_len x grad_accum (the whole job's)

  // The model's options: GEMM and attention precision, GEMM layouts, recomputation, ZeRO, the
  // pipeline's layers and the overlap switches (device left null: the caller's backend).
  parallel::ParallelOptions model;
  std::string precision_why;  // train.precision = "auto": the device's reason ("" otherwise)
  std::string layouts_why;    // how train.gemm_layouts resolved
  // The layers of each virtual stage (parallel.pipeline_layers on this grid; empty when Gp = 1),
  // as the model resolves them.
  parallel::LayerSplit layer_split;
  bool bf16() const { return model.precision == backend::Precision::BF16; }
};

// Throws Error for a grid that does not match the launch, a micro-batch the grid cannot split,
// NCCL with a pipeline axis, and the settings the parsers refuse. `device`: the backend the model
// will run on (it says what precision "auto" means, Backend::auto_precision, and decides the GEMM
// layouts).
RunPlan resolve_run_plan(const RunConfig& cfg, const Launch& launch, const backend::Backend& device);

// train.precision on `device` as resolve_run_plan resolves it ("auto": Backend::auto_precision,
// bf16 where the device has bf16 matrix hardware, and why). Throws Error for another value.
backend::PrecisionChoice run_precision(const RunConfig& cfg, const backend::Backend& device);

// Every rank of `world` resolved the same GEMM precision, or an Error on every rank naming what
// each chose (collective). precision "auto" is measured per machine and kept per node
// (backend/cpu/precision_auto.hpp): the ranks of one node read one answer, but nodes that keep
// separate caches measure on their own and could choose differently near the margin.
void check_precision_agreed(const RunPlan& plan, const comm::Communicator& world);

// The config with what the plan chose filled in (a grid not named: the one chosen), as the run
// folder's config.toml records it.
RunConfig resolved_config(const RunConfig& cfg, const RunPlan& plan);

// The parallel.* overlap keys as the model's options; parallel.progress_thread = "auto" resolves
// by progress_thread_wins with this node's rank count and each rank's OpenMP threads.
parallel::OverlapOptions overlap_options(const OverlapConfig& c, int ranks_on_node, int threads);
// "true" / "false", or "auto": a helper thread only when every rank on the node has a core to
// spare for it (ranks_on_node x (threads + 1) <= cores). Throws Error for another value.
bool progress_thread_wins(const std::string& mode, int ranks_on_node, int threads);

}  // namespace tetrad
