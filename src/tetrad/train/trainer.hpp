// The training loop: data -> forward/backward over micro-batches -> clip -> AdamW, with progress
// lines, metrics.jsonl, validation, checkpoints, exact resume and graceful stop on SIGINT/SIGTERM.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <vector>

#include "tetrad/train/config.hpp"

namespace tetrad {

struct TrainResult {
  int64_t first_step = 0;           // 0, or the step a resumed run continued from
  std::vector<double> losses;       // training loss of each step taken by this call (NaN if skipped)
  std::vector<double> val_losses;   // validation losses in order
  int64_t steps_done = 0;           // global step count at the end
  bool stopped_by_signal = false;
  std::string last_checkpoint;      // folder of the final checkpoint ("" if none written)
  std::string resumed_from;         // checkpoint folder a resumed run loaded ("" if none)
  double checkpoint_blocked_s = 0;  // total time training waited for checkpoints
};

struct TrainOptions {
  bool resume = false;        // continue from the latest good checkpoint in run.dir
  double peak_gflops = 0;     // FMA peak for MFU (0: measure at start)
  bool quiet = false;         // no progress lines (tests)
};

// Runs training as configured. Throws Error on bad input (config, data, checkpoint) before any
// work is lost; a non-finite step is skipped and reported, train.max_bad_steps in a row stop the
// run with the last good checkpoint intact.
TrainResult train(const RunConfig& cfg, const TrainOptions& opt, std::ostream& out);

// Validation loss of a model given by folder (HF-format folder or checkpoint) on a prepared split.
double evaluate_checkpoint(const std::string& model_dir, const std::string& data_dir,
                           const std::string& split, int micro_batch, int seq_len, int batches,
                           std::ostream& out);

}  // namespace tetrad
