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
#include "tetrad/train/metrics_log.hpp"
#include "tetrad/train/run_plan.hpp"
#include "tetrad/train/stop_control.hpp"

namespace tetrad {

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
  // resume: continue although train.seed or the training data differ from the checkpoint's
  // (said so, and a "data_change" record in metrics.jsonl); without it such a resume is refused.
  bool allow_data_change = false;
  double peak_gflops = 0;     // FMA peak for MFU (0: measure at start)
  bool quiet = false;         // no progress lines (tests)
  std::string trace_path;     // Chrome trace-event JSON of trace_steps steps ("" : none)
  int trace_steps = 3;        // steps on the timeline (after the first, when the run is longer)
  StepHook step_hook;         // called at the start of every step (tests: stall_hook)
};

// Runs training as configured. Throws Error on bad input (config, data, checkpoint) before any
// work is lost; a non-finite step is skipped and reported, train.max_bad_steps in a row stop the
// run with the last good checkpoint intact.
TrainResult train(const RunConfig& cfg, const TrainOptions& opt, std::ostream& out);

}  // namespace tetrad
