// Writing sharded checkpoints (sharded.hpp: the format) into a run folder: the serial writer (a
// whole model on one process: import of a Hugging Face model, tests) and the collective
// ShardedSaver of a parallel run. Both name, publish and prune the run folder's checkpoints by
// its rules (run_checkpoint.hpp), which in turn read both formats (sharded and Hugging Face
// folders) to judge what to keep; hence this module above both, and no circle.
//
// Thread-safety: ShardedSaver is used from the main thread (it owns a background writer thread
// and, on rank 0, a pruning thread). MPI is only called from the calling thread.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tetrad/checkpoint/sharded.hpp"
#include "tetrad/comm/communicator.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/sharding.hpp"

namespace tetrad {

// Writes a complete sharded checkpoint from one process (grid 1x1x1x1) into run_dir's
// checkpoints folder, published as the latest (import of a Hugging Face model, tests).
std::string save_sharded_checkpoint_serial(const std::string& run_dir, const ModelConfig& model,
                                           const ParamTable& table, const float* params,
                                           const float* adam_m, const float* adam_v,
                                           const ShardedCheckpointInfo& info,
                                           const std::string& tokenizer_path, int keep_last);

// Timings of one save, for the log and the benchmark.
struct SaveTimings {
  double blocked_s = 0;   // time the caller (training) was stopped: snapshot + commit
  double snapshot_s = 0;  // copy into host buffers (+ agreeing on the folder)
  double write_s = 0;     // this rank's file write + fsync (background when async)
  double commit_s = 0;    // blocked after begin(): polls, gathering checksums (and, when
                          // finished synchronously, metadata, fsyncs, rename, latest)
  double total_s = 0;     // start to visible
  int64_t bytes = 0;      // bytes of shard files written by all ranks
};

// The collective saver of a parallel run. begin() snapshots this rank's shards and writes them
// (on a background thread when async); poll() / finish() commit the checkpoint once every
// rank's file is on disk: checksums gathered to rank 0, which writes the metadata, fsyncs and
// renames the folder from step_N.tmp to step_N, replaces `latest` and prunes (on its background
// thread when polled), and then every rank is told it is visible. Every rank must call begin, poll and finish at the same points (they are
// collective over `world`).
class ShardedSaver {
 public:
  struct Options {
    std::string run_dir;
    std::string tokenizer_path;
    int keep_last = 3;
    bool async = true;
  };
  ShardedSaver(const comm::Communicator& world, Options opts);
  ~ShardedSaver();  // waits for a running writer thread (does not commit)
  ShardedSaver(const ShardedSaver&) = delete;
  ShardedSaver& operator=(const ShardedSaver&) = delete;

  // Finishes a pending save first (blocking), then snapshots and starts the next.
  void begin(const ModelConfig& model, const ParamTable& table, const parallel::ShardPlan& plan,
             const float* params, const float* adam_m, const float* adam_v,
             const ShardedCheckpointInfo& info);
  // Commits the pending save if every rank's write has finished; returns true when nothing is
  // pending afterwards. One small all-reduce while a save is pending.
  bool poll();
  // Blocks until the pending save (if any) is committed.
  void finish();
  bool pending() const { return pending_; }
  // The last committed checkpoint folder and its timings.
  const std::string& last_dir() const { return last_dir_; }
  const SaveTimings& last_timings() const { return last_; }

 private:
  enum class Phase { Writing, Publishing };
  void gather(bool background);
  bool settle(bool block);
  void finalize_timings();
  const comm::Communicator& world_;
  Phase phase_ = Phase::Writing;
  std::atomic<bool> published_{false};
  double begin_s_ = 0;
  Options opts_;
  bool pending_ = false;
  std::thread writer_;
  std::thread pruner_;  // rank 0: deletes checkpoints beyond keep_last after a publish
  std::atomic<bool> written_{false};
  std::string write_error_;
  std::vector<uint64_t> hashes_;
  int64_t bytes_ = 0;
  double write_s_ = 0;
  // what commit needs
  ModelConfig model_;
  const ParamTable* table_ = nullptr;
  ShardedCheckpointInfo info_;
  uint64_t id_ = 0;
  std::string tmp_dir_;
  ShardSnapshot snap_;
  double started_ = 0, blocked_ = 0, snapshot_s_ = 0;
  std::string last_dir_;
  SaveTimings last_;
};

}  // namespace tetrad
