#include "tetrad/checkpoint/sharded_saver.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/core/error.hpp"

namespace fs = std::filesystem;

namespace tetrad {

using parallel::GridCoord;
using parallel::GridShape;
using parallel::ShardPlan;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string save_sharded_checkpoint_serial(const std::string& run_dir, const ModelConfig& model,
                                           const ParamTable& table, const float* params,
                                           const float* adam_m, const float* adam_v,
                                           const ShardedCheckpointInfo& info_in,
                                           const std::string& tokenizer_path, int keep_last) {
  ShardedCheckpointInfo info = info_in;
  info.grid = GridShape{};
  const ShardPlan plan = ShardPlan::build(model, table, info.grid, GridCoord{});
  const fs::path ckdir = fs::path(run_dir) / "checkpoints";
  const std::string name = checkpoint_folder_name(info.step);
  const fs::path tmp = ckdir / (name + ".tmp");
  std::error_code ec;
  fs::create_directories(ckdir, ec);
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) fail("cannot create '", tmp.string(), "': ", ec.message());
  const uint64_t id = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ uint64_t(now_s() * 1e9);
  try {
    const ShardSnapshot s = snapshot_shards(plan, params, adam_m, adam_v, info.has_moments);
    const auto hashes = write_shard_file((tmp / shard_file_name(0)).string(), s, 0, info.step, id);
    const nlohmann::json meta = build_sharded_meta(model, table, info, id, {int64_t(s.data.size())}, {hashes});
    write_sharded_meta_files(tmp.string(), meta, model, tokenizer_path);
    fsync_dir(tmp.string());
    replace_dir(tmp.string(), (ckdir / name).string());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  publish_checkpoint(run_dir, info.step, keep_last);
  return (ckdir / name).string();
}

// ---- ShardedSaver ------------------------------------------------------------------------------

ShardedSaver::ShardedSaver(const comm::Communicator& world, Options opts)
    : world_(world), opts_(std::move(opts)) {}

ShardedSaver::~ShardedSaver() {
  if (writer_.joinable()) writer_.join();
  if (pruner_.joinable()) pruner_.join();
}

void ShardedSaver::begin(const ModelConfig& model, const ParamTable& table, const ShardPlan& plan,
                         const float* params, const float* adam_m, const float* adam_v,
                         const ShardedCheckpointInfo& info) {
  finish();
  const double t0 = now_s();
  started_ = t0;
  if (pruner_.joinable()) pruner_.join();  // it must not see this save's folder
  model_ = model;
  table_ = &table;
  info_ = info;
  info_.grid = plan.grid;
  const fs::path ckdir = fs::path(opts_.run_dir) / "checkpoints";
  tmp_dir_ = (ckdir / (checkpoint_folder_name(info.step) + ".tmp")).string();
  // Rank 0 makes an empty temporary folder and chooses the checkpoint id; the broadcast is also
  // the barrier before anyone writes into the folder.
  uint64_t msg[2] = {0, 0};  // id, error
  if (world_.rank() == 0) {
    std::error_code ec;
    fs::create_directories(ckdir, ec);
    fs::remove_all(tmp_dir_, ec);
    fs::create_directory(tmp_dir_, ec);
    msg[1] = ec ? 1 : 0;
    msg[0] = (uint64_t(std::random_device{}()) << 32 ^ std::random_device{}()) ^ uint64_t(t0 * 1e9);
    if (ec) write_error_ = "cannot create '" + tmp_dir_ + "': " + ec.message();
  }
  world_.broadcast(msg, 2, 0);
  if (msg[1]) fail(world_.rank() == 0 ? write_error_ : "rank 0 could not create " + tmp_dir_);
  id_ = msg[0];
  const double s0 = now_s();
  const int rank = world_.rank();
  if (!opts_.async) {
    // Synchronous: training waits anyway, so the shards are written straight from the live
    // buffers, without a snapshot copy.
    int64_t bytes = 0;
    std::vector<ShardPiece> pieces = shard_file_pieces(plan, &bytes);
    if (!info.has_moments)
      pieces.erase(std::remove_if(pieces.begin(), pieces.end(),
                                  [](const ShardPiece& p) { return p.array != 0; }),
                   pieces.end());
    const float* src[kShardedArrays] = {params, adam_m, adam_v};
    std::vector<std::pair<const char*, size_t>> parts;
    bytes_ = 0;
    for (const ShardPiece& p : pieces) {
      parts.push_back({reinterpret_cast<const char*>(src[p.array] + p.local_offset), size_t(p.numel) * 4});
      bytes_ += p.numel * 4;
    }
    snap_.pieces = pieces;  // only whether this rank writes is used from here on
    snap_.data.clear();
    snapshot_s_ = 0;
    pending_ = true;
    phase_ = Phase::Writing;
    published_.store(false);
    write_error_.clear();
    hashes_.clear();
    const double w0 = now_s();
    try {
      if (!parts.empty())
        hashes_ = write_shard_file((fs::path(tmp_dir_) / shard_file_name(rank)).string(), parts,
                                   rank, info_.step, id_);
    } catch (const std::exception& e) {
      write_error_ = e.what();
    }
    write_s_ = now_s() - w0;
    written_.store(true);
    blocked_ = now_s() - t0;
    begin_s_ = blocked_;
    return;
  }
  // Reuse the snapshot buffer of the previous save (no page faults on a fresh allocation).
  {
    int64_t bytes = 0;
    snap_.pieces = shard_file_pieces(plan, &bytes);
    if (!info.has_moments) {
      snap_.pieces.erase(std::remove_if(snap_.pieces.begin(), snap_.pieces.end(),
                                        [](const ShardPiece& p) { return p.array != 0; }),
                         snap_.pieces.end());
      bytes = snap_.pieces.empty() ? 0 : snap_.pieces.back().offset + snap_.pieces.back().numel * 4;
    }
    snap_.data.resize(size_t(bytes));
    const float* src[kShardedArrays] = {params, adam_m, adam_v};
    // The copy is the time training is blocked: split into 4 MiB blocks over the OpenMP threads
    // (the training threads, idle meanwhile).
    struct Block {
      char* dst;
      const char* src;
      size_t n;
    };
    std::vector<Block> blocks;
    constexpr size_t kBlock = size_t(4) << 20;
    for (const ShardPiece& p : snap_.pieces) {
      const char* from = reinterpret_cast<const char*>(src[p.array] + p.local_offset);
      for (size_t o = 0; o < size_t(p.numel) * 4; o += kBlock)
        blocks.push_back({snap_.data.data() + p.offset + o, from + o,
                          std::min(kBlock, size_t(p.numel) * 4 - o)});
    }
#pragma omp parallel for schedule(dynamic)
    for (size_t b = 0; b < blocks.size(); ++b) std::memcpy(blocks[b].dst, blocks[b].src, blocks[b].n);
  }
  snapshot_s_ = now_s() - s0;
  pending_ = true;
  phase_ = Phase::Writing;
  published_.store(false);
  written_.store(false);
  write_error_.clear();
  hashes_.clear();
  bytes_ = int64_t(snap_.data.size());
  auto work = [this, rank] {
    const double w0 = now_s();
    try {
      if (!snap_.pieces.empty())
        hashes_ = write_shard_file((fs::path(tmp_dir_) / shard_file_name(rank)).string(), snap_,
                                   rank, info_.step, id_);
    } catch (const std::exception& e) {
      write_error_ = e.what();
    }
    write_s_ = now_s() - w0;
    written_.store(true);
  };
  writer_ = std::thread(work);
  blocked_ = now_s() - t0;
  begin_s_ = blocked_;
}

// The save after begin(), in phases (every rank calls poll / finish at the same points):
//   Writing     each rank's background thread writes its shard file;
//   gather      (main thread, once every rank's file is written) sizes, statuses and chunk
//               checksums all-gathered; rank 0 starts publishing on its background thread;
//   Publishing  rank 0 writes meta.json, config.json, tokenizer.model, fsyncs, renames the folder,
//               replaces `latest`, prunes — fsyncs whose latency must not stop training;
//   done        every rank learns (one all-reduce) that the checkpoint is visible, or that it
//               failed, with rank 0's reason.
// Training is blocked only in begin() (snapshot) and inside poll()/finish() calls.
bool ShardedSaver::poll() {
  if (!pending_) return true;
  const double t0 = now_s();
  bool done = false;
  if (phase_ == Phase::Writing) {
    int not_done = written_.load() ? 0 : 1;
    world_.allreduce_max(&not_done, 1);
    if (!not_done) gather(/*background=*/true);
  } else {
    done = settle(/*block=*/false);
  }
  blocked_ += now_s() - t0;
  if (done) finalize_timings();
  return done;
}

void ShardedSaver::finish() {
  if (!pending_) return;
  const double t0 = now_s();
  if (phase_ == Phase::Writing) gather(/*background=*/false);
  settle(/*block=*/true);
  blocked_ += now_s() - t0;
  finalize_timings();
}

void ShardedSaver::gather(bool background) {
  if (writer_.joinable()) writer_.join();
  const int n = world_.size(), me = world_.rank();
  // Everyone's status, size and checksum count, then the checksums (padded to the longest list).
  int64_t mine[3] = {write_error_.empty() ? 0 : 1, snap_.pieces.empty() ? -1 : bytes_,
                     int64_t(hashes_.size())};
  std::vector<int64_t> all(size_t(3 * n));
  world_.allgather(mine, all.data(), 3);
  int64_t longest = 0;
  std::vector<int> failed;
  for (int r = 0; r < n; ++r) {
    longest = std::max(longest, all[size_t(3 * r + 2)]);
    if (all[size_t(3 * r)]) failed.push_back(r);
  }
  std::vector<uint64_t> padded(size_t(std::max<int64_t>(longest, 1)), 0), hashes(padded.size() * size_t(n));
  std::copy(hashes_.begin(), hashes_.end(), padded.begin());
  world_.allgather(padded.data(), hashes.data(), padded.size());
  if (!failed.empty()) {
    pending_ = false;
    std::error_code ec;
    if (me == 0) fs::remove_all(tmp_dir_, ec);
    std::string who;
    for (int r : failed) who += (who.empty() ? "" : ", ") + std::to_string(r);
    fail("checkpoint of step ", info_.step, " not written: rank(s) ", who,
         " could not write their shard", write_error_.empty() ? "" : ": " + write_error_);
  }
  phase_ = Phase::Publishing;
  published_.store(me != 0);
  if (me != 0) return;
  std::vector<int64_t> sizes(static_cast<size_t>(n));
  std::vector<std::vector<uint64_t>> per_rank(static_cast<size_t>(n));
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    sizes[size_t(r)] = std::max<int64_t>(all[size_t(3 * r + 1)], 0);
    total += sizes[size_t(r)];
    const size_t k = size_t(all[size_t(3 * r + 2)]);
    per_rank[size_t(r)].assign(hashes.begin() + ptrdiff_t(size_t(r) * padded.size()),
                               hashes.begin() + ptrdiff_t(size_t(r) * padded.size() + k));
  }
  bytes_ = total;
  auto publish = [this, sizes = std::move(sizes), per_rank = std::move(per_rank)] {
    try {
      const nlohmann::json meta = build_sharded_meta(model_, *table_, info_, id_, sizes, per_rank);
      write_sharded_meta_files(tmp_dir_, meta, model_, opts_.tokenizer_path);
      fsync_dir(tmp_dir_);
      const std::string final_dir =
          (fs::path(opts_.run_dir) / "checkpoints" / checkpoint_folder_name(info_.step)).string();
      replace_dir(tmp_dir_, final_dir);
      publish_checkpoint(opts_.run_dir, info_.step, opts_.keep_last, /*prune=*/false);
    } catch (const std::exception& e) {
      write_error_ = e.what();
      std::error_code ec;
      fs::remove_all(tmp_dir_, ec);
    }
    published_.store(true);
  };
  if (background) {
    writer_ = std::thread(publish);
  } else {
    publish();
  }
}

bool ShardedSaver::settle(bool block) {
  const int me = world_.rank();
  if (me == 0 && block && writer_.joinable()) writer_.join();
  // [rank 0 still publishing, rank 0 failed]
  int64_t state[2] = {published_.load() ? 0 : 1, 0};
  if (me == 0 && !state[0]) {
    if (writer_.joinable()) writer_.join();
    state[1] = write_error_.empty() ? 0 : 1;
  }
  world_.allreduce_max(state, 2);
  if (state[0]) return false;
  pending_ = false;
  const std::string final_dir =
      (fs::path(opts_.run_dir) / "checkpoints" / checkpoint_folder_name(info_.step)).string();
  if (state[1])
    fail("checkpoint of step ", info_.step, " not written: ",
         me == 0 ? write_error_ : std::string("rank 0 could not publish it (see its message)"));
  last_dir_ = final_dir;
  if (me == 0) {
    // Deleting old checkpoints (on a disk mounted with `discard`, a large unlink is slow) is not
    // on anyone's critical path; joined before the next save publishes anything.
    if (pruner_.joinable()) pruner_.join();
    pruner_ = std::thread([run_dir = opts_.run_dir, step = info_.step, keep = opts_.keep_last] {
      try {
        prune_checkpoints(run_dir, step, keep);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tetrad: warning: pruning old checkpoints: %s\n", e.what());
      }
    });
  }
  return true;
}

void ShardedSaver::finalize_timings() {
  last_.snapshot_s = snapshot_s_;
  last_.blocked_s = blocked_;
  last_.commit_s = blocked_ - begin_s_;
  last_.write_s = write_s_;
  last_.total_s = now_s() - started_;
  // The total bytes: rank 0 summed them; the others count their own only (logged on rank 0).
  last_.bytes = bytes_;
}

}  // namespace tetrad
