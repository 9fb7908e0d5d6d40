// The training loop: data -> forward/backward over micro-batches -> clip -> AdamW, with progress
// lines, metrics.jsonl, validation, checkpoints, exact resume and graceful stop on SIGINT/SIGTERM.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <iosfwd>
#include <vector>

#include "tetrad/parallel/comm_schedule.hpp"
#include "tetrad/train/config.hpp"

namespace tetrad {

// Where one step's time went on this rank (seconds); the parts add up to `step` (test_train).
struct StepBreakdown {
  double step = 0;          // wall time of the step
  double compute = 0;       // model kernels and model code between them
  double comm_exposed = 0;  // blocked in collectives
  double wait = 0;          // waiting for the slowest rank at the start of the step
  double optimizer = 0;     // gradient norm, clipping, AdamW
  double data = 0;          // reading and masking tokens
  double comm_issued = 0;   // Σ issue -> completion of every collective (hidden or exposed)
  double hidden_fraction() const {
    return comm_issued > 0 ? std::max(0.0, 1.0 - comm_exposed / comm_issued) : 0.0;
  }
};

struct TrainResult {
  int64_t first_step = 0;           // 0, or the step a resumed run continued from
  std::vector<double> losses;       // training loss of each step taken by this call (NaN if skipped)
  std::vector<double> val_losses;   // validation losses in order
  int64_t steps_done = 0;           // global step count at the end
  bool stopped_by_signal = false;
  std::string last_checkpoint;      // folder of the final checkpoint ("" if none written)
  std::vector<StepBreakdown> breakdowns;  // one per step taken (this rank's)
  std::string resumed_from;         // checkpoint folder a resumed run loaded ("" if none)
  double checkpoint_blocked_s = 0;  // total time training waited for checkpoints
};

struct TrainOptions {
  bool resume = false;        // continue from the latest good checkpoint in run.dir
  bool overwrite = false;     // run.dir holds checkpoints and !resume: delete them (else refused)
  double peak_gflops = 0;     // FMA peak for MFU (0: measure at start)
  bool quiet = false;         // no progress lines (tests)
  std::string trace_path;     // Chrome trace-event JSON of trace_steps steps ("" : none)
  int trace_steps = 3;        // steps on the timeline (after the first, when the run is longer)
};

// The parallel.* overlap keys as the model's options; parallel.progress_thread = "auto" resolves
// by progress_thread_wins with this node's rank count and each rank's OpenMP threads.
parallel::OverlapOptions overlap_options(const OverlapConfig& c, int ranks_on_node, int threads);
// "true" / "false", or "auto": a helper thread only when every rank on the node has a core to
// spare for it (ranks_on_node x (threads + 1) <= cores). Throws Error for another value.
bool progress_thread_wins(const std::string& mode, int ranks_on_node, int threads);

// Runs training as configured. Throws Error on bad input (config, data, checkpoint) before any
// work is lost; a non-finite step is skipped and reported, train.max_bad_steps in a row stop the
// run with the last good checkpoint intact.
TrainResult train(const RunConfig& cfg, const TrainOptions& opt, std::ostream& out);

// Validation loss of a model given by folder (HF-format folder or checkpoint) on a prepared split:
// the mean loss per token of the split's first `batches` micro-batches (in order, unshuffled).
// On a grid (inference_grid's "x,y,z,d"; collective over MPI_COMM_WORLD unless "1,1,1,1") the
// one model evaluates the same micro-batches, dealt out over the Z x D slots (batch i to slot
// i mod Gz*Gd), and every rank returns the whole figure.
double evaluate_checkpoint(const std::string& model_dir, const std::string& data_dir,
                           const std::string& split, int micro_batch, int seq_len, int batches,
                           std::ostream& out, const std::string& grid = "1,1,1,1");

}  // namespace tetrad
