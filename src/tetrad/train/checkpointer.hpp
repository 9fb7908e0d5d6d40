// The run's checkpoints: resume or initialise (the latest usable checkpoint of the run folder in
// either format, agreed by every rank, else run.init_from or fresh weights), save (sharded, every
// rank its own shards, on a background thread unless train.async_checkpoint is off; with ZeRO,
// streamed tensor by tensor through rank 0), poll a pending save once a step, and finish. A
// checkpoint records the run's health (loss_record): an unhealthy one only changes pruning (the
// newest healthy one is kept besides the newest train.keep_checkpoints; run_checkpoint.hpp), and
// weights that are no longer finite are never written over a good checkpoint.
//
// Collective: every call on every rank of `world`, in the same order.
#pragma once
#include <cmath>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tetrad/backend/backend.hpp"
#include "tetrad/checkpoint/sharded_saver.hpp"
#include "tetrad/comm/communicator.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/train/config.hpp"
#include "tetrad/train/optimizer.hpp"
#include "tetrad/train/run_plan.hpp"
#include "tetrad/train/training_data.hpp"
#include "tetrad/train/watchdog.hpp"

namespace tetrad {

// A checkpoint's loss record: the mean training loss of the last 20 steps before it, and whether
// it is healthy (finite, no worse than a uniform guess over the vocabulary plus 1 nat, and not
// more than twice the best such mean of the run). Pure.
struct LossRecord {
  double loss = NAN;
  bool known = false, healthy = true;  // known: some step was taken
};
LossRecord loss_record(const std::vector<double>& losses, double best, int vocab);

// The health fields of a checkpoint's record ("loss", "healthy", "best_loss", each where known)
// for the losses so far; `best` (the best healthy loss of the run, INFINITY if none) is lowered
// by a healthy record. Pure.
nlohmann::json health_record(const std::vector<double>& losses, double& best, int vocab);

class Checkpointer {
 public:
  struct Parts {
    const RunConfig& cfg;
    const RunPlan& plan;
    parallel::ParallelTransformer& model;
    AdamW& adam;
    backend::Backend& device;
    const comm::Communicator& world;
    TrainingData& data;
    Watchdog& watchdog;
    std::ostream& out;  // rank 0's log (a null stream elsewhere)
    bool quiet = false;
  };
  explicit Checkpointer(const Parts& parts);

  struct Start {
    int64_t step = 0;             // the step training continues from
    bool loaded = false;          // from a checkpoint of the run folder
    std::string resumed_from;     // its folder
    std::string layouts_resumed;  // what became of its tuned GEMM layouts ("" if nothing)
    std::vector<std::string> data_changes;  // allowed differences of seed or data, in words
    std::vector<std::string> data_unchecked;  // what an older checkpoint lacks to compare, in words
  };
  // resume: the latest checkpoint every rank loads (refused ones named, the previous one tried);
  // none there: a fresh start, said so. Otherwise, or then: run.init_from's weights, or
  // initialised ones. Throws Error when checkpoints exist and none loads, and at once when the
  // latest was trained on other data or another seed (TrainingData::check_continuity) unless
  // allow_data_change.
  Start resume_or_init(bool resume, bool allow_data_change = false);

  // A checkpoint of step `step` from the losses so far; wait: committed before returning (else
  // when async, committed by a later poll/save). Skipped (said so, and false returned) when the
  // weights are not finite: a pending save of earlier, finite weights is committed first, so
  // `latest` names the last finite checkpoint.
  bool save(int64_t step, bool wait, const std::vector<double>& losses);
  void poll();  // commits a pending save whose files are all written

  const std::string& last_checkpoint() const { return last_checkpoint_; }
  double blocked_s() const { return blocked_s_; }  // total time training waited for checkpoints

 private:
  void load_sharded(const std::string& dir, Start& s, bool allow_data_change);
  void load_legacy(const std::string& dir, Start& s, bool allow_data_change);
  void say_unchecked(const std::string& dir, const std::vector<std::string>& what);
  void init_fresh();
  void restore_records(const nlohmann::json& extra, Start& s);
  void save_streamed(int64_t step, const nlohmann::json& health);
  void save_sharded(int64_t step, bool wait, const nlohmann::json& health);
  void report_save();
  void to_device(float* dev, const float* host, size_t n);

  Parts p_;
  ShardedSaver saver_;
  double best_loss_ = INFINITY;  // the best healthy checkpoint loss of the run
  std::string last_checkpoint_;
  double blocked_s_ = 0;
};

}  // namespace tetrad
