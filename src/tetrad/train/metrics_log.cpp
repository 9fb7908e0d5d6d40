#include "tetrad/train/metrics_log.hpp"

#include "tetrad/core/error.hpp"

namespace tetrad {

nlohmann::json start_record(int64_t step, bool resumed, int64_t max_steps) {
  return {{"event", "start"}, {"step", step}, {"resumed", resumed}, {"max_steps", max_steps}};
}

nlohmann::json step_record(const StepMetrics& m) {
  const StepBreakdown& bd = m.time;
  nlohmann::json line{{"step", m.step}, {"loss", m.loss}, {"lr", m.lr}, {"grad_norm", m.grad_norm},
                      {"tokens_per_s", m.tokens_per_s}, {"mfu", m.mfu},
                      {"mfu_peak", m.peak_name}, {"mfu_peak_gflops", m.peak_gflops},
                      {"mfu_attention", "causal"},  // the count (AttentionFlops::Causal, planner's)
                      {"step_time_s", bd.step}, {"elapsed_s", m.elapsed_s},
                      {"dropped_fraction", m.dropped_fraction},
                      {"t_compute_s", bd.compute}, {"t_comm_exposed_s", bd.comm_exposed},
                      {"t_wait_s", bd.wait}, {"t_optimizer_s", bd.optimizer},
                      {"t_data_s", bd.data}, {"t_comm_issued_s", bd.comm_issued},
                      {"comm_hidden_fraction", bd.hidden_fraction()}};
  if (bd.ring_pairs > 0) {  // the context ring (rank 0's pairs, forward and backward)
    line["ring_pairs"] = bd.ring_pairs;
    line["ring_pairs_doc_skipped"] = bd.ring_pairs_doc_skipped;
  }
  if (m.report_hfu) line["hfu"] = m.hfu;  // hardware FLOPs (with recomputation) / the same peak
  if (m.moe) {
    line["moe_aux_loss"] = m.moe_aux_loss;
    line["moe_z_loss"] = m.moe_z_loss;
    line["expert_load_min"] = m.expert_load_min;
    line["expert_load_max"] = m.expert_load_max;
    line["expert_dropped"] = m.expert_dropped;
    line["expert_load_imbalance"] = m.expert_load_imbalance;
  }
  return line;
}

nlohmann::json skipped_record(int64_t step) { return {{"step", step}, {"skipped", true}}; }

nlohmann::json val_record(int64_t step, double val_loss) {
  return {{"step", step}, {"val_loss", val_loss}};
}

nlohmann::json data_change_record(int64_t step, const std::vector<std::string>& changes) {
  return {{"event", "data_change"}, {"step", step}, {"changes", changes},
          {"allowed_by", "--allow-data-change"}};
}

void MetricsLog::open(const std::string& run_dir, const std::string* last_checkpoint) {
  path_ = run_dir + "/metrics.jsonl";
  last_checkpoint_ = last_checkpoint;
  file_.open(path_, std::ios::app);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!file_.is_open() && path_.empty()) return;
  file_ << record.dump() << "\n";
  file_.flush();
  if (!file_) {
    const bool none = !last_checkpoint_ || last_checkpoint_->empty();
    fail("cannot write '", path_, "' (is the disk full?); the last checkpoint (",
         none ? "none written by this run" : *last_checkpoint_, ") is intact");
  }
}

}  // namespace tetrad
