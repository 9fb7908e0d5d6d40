// The run configuration: one TOML file (configs/*.toml, documented in docs/config.md) plus
// command-line overrides `--set section.key=value`. Every key is declared once in config.cpp's
// schema, which drives parsing, validation (unknown keys and wrong types are errors that name the
// key, the file and what was expected), the resolved-config dump saved in the run folder, and the
// documentation table.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tetrad/model/model_config.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/options.hpp"
#include "tetrad/parallel/pipeline_schedule.hpp"

namespace tetrad {

struct TrainConfig {
  uint64_t seed = 1337;
  int micro_batch = 4;        // sequences per micro-batch, whole grid (split over Z x D)
  int seq_len = 64;           // tokens per sequence (<= model.max_seq)
  int grad_accum = 1;         // micro-batches per optimizer step
  int64_t max_steps = 100;
  double lr = 6e-4;           // peak learning rate
  double min_lr_ratio = 0.1;  // cosine decays to lr * min_lr_ratio
  int64_t warmup_steps = 10;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8;
  double grad_clip = 1.0;     // global-norm clipping; 0 disables
  bool decay_embeddings = false, decay_norms = false, decay_biases = false;
  int64_t log_interval = 1;
  int64_t eval_interval = 50;  // 0 disables validation
  int eval_batches = 8;
  int64_t checkpoint_interval = 0;  // 0: only at the end
  int keep_checkpoints = 3;
  // Write checkpoints on a background thread while training goes on. Briefly off while a heap
  // corruption in SIGTERM'd runs was suspected of it; the cause was elsewhere (core/signals.hpp).
  bool async_checkpoint = true;
  double step_timeout = 0;       // seconds a step (or a validation / checkpoint phase) may take; 0: off
  double comm_timeout = 0;       // seconds a collective may wait (0: TETRAD_COMM_TIMEOUT, else 300)
  int max_bad_steps = 5;      // consecutive non-finite steps before stopping
  int threads = 0;            // 0: all cores
  // GEMM precision: "fp32", "bf16" (bf16 operands, fp32 accumulation, fp32 master weights and
  // optimizer; backend/cpu/precision.hpp) or "auto" (bf16 where the CPU has bf16 matrix units).
  std::string precision = "auto";
  // Arithmetic of attention's products: "auto" (bf16 in bf16 runs where the bf16 attention kernel
  // is the faster one: CPUs with AMX; else fp32), "fp32" or "bf16" (docs/precision.md).
  std::string attention_precision = "auto";
  // Storage of the activations in bf16 runs (ParallelOptions::bf16_activations): "auto" (the
  // tensors that only feed GEMMs and the block's saved tensors in bf16: half their memory) or
  // "fp32" (all in fp32: more memory; the backward reads the forward's fp32 values, so grids
  // agree to fp32 accuracy; docs/precision.md, "bf16 through the step in the parallel model").
  std::string activation_precision = "auto";
  // Layout of each bf16 GEMM (parallel/gemm_layouts.hpp, docs/precision.md): "auto" (tune where
  // bf16 GEMMs run natively on the CPU's matrix units, else rule), "rule" (fixed, the same in
  // every process) or "tune" (timed at start-up on this rank's shapes; kept in checkpoints).
  std::string gemm_layouts = "auto";
  // Gradient communication (reduce-scatters over Z and D, data-parallel all-reduces): "fp32", or
  // "bf16" (bf16 on the wire, fp32 sums; docs/precision.md, "bf16 gradient communication").
  std::string grad_comm_precision = "fp32";
  // Where the model computes (backend::create): "cpu"; "cpu-strict" (the CPU's arithmetic on
  // memory the host cannot read: the device path checked without a GPU); "cuda" (one GPU per
  // rank, chosen by the node-local rank) or "cuda:N", in a CUDA build on a machine with a GPU.
  std::string device = "cpu";
  // The communicator of the model's process groups: "nccl" (collectives on the GPU's memory,
  // parallel/process_groups.hpp on_nccl; needs train.device = cuda and a build with NCCL), "mpi"
  // (device buffers staged through host memory), or "auto" (nccl where the device is cuda, the
  // build has NCCL, the job has more than one rank, every rank has a GPU of its own and the grid
  // has no pipeline axis; else mpi). The trainer's host values always go over MPI.
  std::string comm = "auto";
  // MiB this rank may use on its device, replacing the device's own figure in the memory check
  // before the first step (train/device_memory.hpp): for ranks sharing a device with other jobs,
  // and for tests. 0: the device's figure (Backend::memory_available divided among its ranks).
  int64_t memory_limit_mib = 0;
  std::string loss_mask = "none";  // none | goldfish | static | random (train/loss_mask.hpp)
  int goldfish_k = 4;
  int goldfish_h = 13;
  std::string recompute = "none";  // none | selective | full (activation recomputation)
};

// parallel.* overlap switches (parallel/comm_schedule.hpp OverlapOptions; docs/parallel.md).
// Defaults: every switch that keeps results bit-identical and measured faster, with the progress
// thread (2 ranks x 1 thread, small model, tetrad train, modes alternating, docs/benchmarks.md
// "Overlap"): on the Z grid the step took 7.1-7.5 s against 9.4-10.5 s off, on the D grid the
// exposed data-parallel all-reduce fell ~90%; losses bit-identical. They were off for a while
// because of a heap corruption in SIGTERM'd runs, which was oneDNN's GEMM taking the signal
// (core/signals.hpp), not the overlap; a collective timeout now abandons every pending request
// instead of waiting for each again. Off: the weight cache (memory), forward chunks (changes
// rounding), buckets (per-tensor all-reduces measured; no bucket size chosen yet).
struct OverlapConfig {
  bool backward_allreduce = true;
  bool reduce_scatter = true;
  int prefetch_depth = 1;
  bool prefetch_across_steps = true;
  bool cache_gathered_weights = false;
  bool dp_overlap = true;
  double dp_bucket_mb = 0;
  int forward_chunks = 1;
  std::string progress_thread = "auto";  // true | false | auto (a core to spare per rank)
};

struct RunConfig {
  std::string model_name = "tiny";  // named base configuration, overridden field by field
  ModelConfig model;
  std::string data_dir = "data/kjv";  // output of `tetrad prepare`
  // Packed documents kept apart (ParallelOptions::document_mask, document_positions): attention
  // inside each document only; positions restarting at each document. Both need shards that
  // record document boundaries (token shard format version 2).
  bool document_mask = false;
  bool document_positions = false;
  std::string init_from;             // Hugging Face folder to fine-tune from (optional)
  std::string run_dir = "runs/default";
  // x,y,z,d, x,y,z,p,d or named ("d=2,x=2") process grid (docs/parallel.md), or "auto"; empty
  // (not named): 1x1x1x1 on one rank, chosen as "auto" on more (train/auto_grid.hpp)
  std::string grid;
  std::string machine = "local";     // machine file or shipped name for grid = "auto"
  OverlapConfig overlap;
  int zero = 0;                      // ZeRO stage over the data axis: 0, 1 or 2
  bool sparse_embedding_grad = true;  // embedding gradient as touched rows over Z (docs/parallel.md)
  bool sequence_shard = false;  // the residual stream split along the tokens over Y (docs/parallel.md)
  std::string schedule = "1f1b";     // pipeline schedule: 1f1b | interleaved
  int virtual_stages = 1;            // pipeline chunks per stage (interleaved)
  std::string pipeline_layers = "even";  // layer split: even | balanced | "3,1" (layer_split.hpp)
  std::string cp_comm = "allgather";     // context axis exchange: allgather | ring (options.hpp)
  // E, the experts of a mixture of experts split over E of the data (and context) ranks
  // (GridShape::e(): folded, no ranks of its own); the same as e=E in parallel.grid.
  int expert_parallel = 1;
  TrainConfig train;

  void validate() const;  // throws Error naming the key
};

// What the config alone decides, each setting parsed once into its typed value: the first stage
// of the run plan's resolver (train/run_plan.hpp adds what the launch and the device decide) and
// what RunConfig::validate() checks. `tetrad train`, `tetrad bench`, `tetrad plan` and the config's
// validation all read the settings from here.
struct RunSettings {
  // The model's options from the config: recomputation, ZeRO, virtual stages, the layer split's
  // spec, the sparse embedding gradient, attention precision ("auto": unset), a GEMM layout plan
  // given as text, bf16 gradient communication. Left for the plan: precision, the GEMM layout
  // mode, the overlap switches and the device.
  parallel::ParallelOptions model;
  std::string precision;     // train.precision: "fp32", "bf16" or "auto" (the device's)
  std::string gemm_layouts;  // train.gemm_layouts: "auto", "rule" or "tune"; "" with a plan
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::OneFOneB;
  // parallel.grid when it names one; unset for "auto" or none named (chosen with the launch).
  std::optional<parallel::GridShape> grid;
};

// The grid with parallel.expert_parallel folded in (GridShape::e()): the key and an e=E named in
// the grid must agree (else an Error naming both).
parallel::GridShape with_expert_fold(parallel::GridShape grid, int expert_parallel);

// Throws Error naming the key and what was expected, for each setting in the order
// RunConfig::validate() reports them. Also checks the layer split against a named pipeline grid
// and the transport against the named grid's pipeline axis (comm::check_transport).
RunSettings resolve_settings(const RunConfig& cfg);

// Loads `path` (empty: defaults only), then applies overrides "section.key=value" in order.
// Throws Error naming the file/key and what was expected.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides);

// The resolved configuration as TOML (every key, including defaults).
std::string to_toml(const RunConfig& cfg);

// Markdown table of every key: name, type, default, meaning (docs/config.md is generated from it).
std::string config_reference_markdown();

}  // namespace tetrad
