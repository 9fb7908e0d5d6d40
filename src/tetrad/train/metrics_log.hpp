// metrics.jsonl: one JSON object a line, appended to and never truncated (--overwrite deletes
// the file first). The records, by kind:
//   start    {"event":"start","step":S,"resumed":bool,"max_steps":N}  each time training starts
//            (a reader, tools/report, drops the lines of an abandoned timeline after step S)
//   step     {"step","loss","lr","grad_norm","tokens_per_s","mfu","mfu_peak","mfu_peak_gflops",
//             "step_time_s","elapsed_s","dropped_fraction","t_compute_s","t_comm_exposed_s",
//             "t_wait_s","t_optimizer_s","t_data_s","t_comm_issued_s","comm_hidden_fraction"}
//            and "hfu" where recomputation runs (hardware FLOPs over the same peak)
//   skipped  {"step":S,"skipped":true}  a non-finite step that was not applied
//   val      {"step":S,"val_loss":L}
//   data_change {"event":"data_change","step":S,"changes":[...],"allowed_by":"--allow-data-change"}
//            a resume that continued although train.seed or the training data differ from the
//            checkpoint's (each difference in words)
// The records are built by pure functions (tested without a run); MetricsLog writes them on rank
// 0 (a closed log, on the other ranks, writes nothing) and throws Error when the file cannot be
// written, naming the last checkpoint, which is intact.
#pragma once
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
  // The context ring's causally visible chunk pairs of this rank's passes and, of those, the
  // ones the document mask let it skip (StepProfile::ring_pairs; both 0 without the ring).
  int64_t ring_pairs = 0, ring_pairs_doc_skipped = 0;
  double hidden_fraction() const {
    return comm_issued > 0 ? std::max(0.0, 1.0 - comm_exposed / comm_issued) : 0.0;
  }
};

// What a step record holds.
struct StepMetrics {
  int64_t step = 0;  // the global step count after it (1-based)
  double loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_s = 0, mfu = 0, hfu = 0;
  bool report_hfu = false;
  std::string peak_name;
  double peak_gflops = 0;
  double elapsed_s = 0, dropped_fraction = 0;
  StepBreakdown time;
  // A mixture of experts (moe false: a dense model, none of these written): the router's
  // auxiliary and z losses (means over layers and micro-batches, without their coefficients),
  // the least and most rows one expert computed in one layer of one micro-batch (this rank's)
  // and the choices dropped over capacity (every rank's) in the step.
  bool moe = false;
  double moe_aux_loss = 0, moe_z_loss = 0;
  int64_t expert_load_min = 0, expert_load_max = 0, expert_dropped = 0;
  // The step's most loaded expert over the mean load (1: balanced), the worst layer of this
  // rank's stage, over the global batch (what the expert bias evens out).
  double expert_load_imbalance = 0;
};

nlohmann::json start_record(int64_t step, bool resumed, int64_t max_steps);
nlohmann::json step_record(const StepMetrics& m);
nlohmann::json skipped_record(int64_t step);
nlohmann::json val_record(int64_t step, double val_loss);
nlohmann::json data_change_record(int64_t step, const std::vector<std::string>& changes);

class MetricsLog {
 public:
  MetricsLog() = default;  // closed: writes nothing
  // Opens run_dir/metrics.jsonl for appending. last_checkpoint: read at each failure, for its
  // message (the caller's string, which must outlive the log).
  void open(const std::string& run_dir, const std::string* last_checkpoint);
  bool is_open() const { return file_.is_open(); }
  void write(const nlohmann::json& record);  // one line, flushed; no-op when closed

 private:
  std::ofstream file_;
  std::string path_;
  const std::string* last_checkpoint_ = nullptr;
};

}  // namespace tetrad
