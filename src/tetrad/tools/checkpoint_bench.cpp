#include "tetrad/tools/checkpoint_bench.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <vector>

#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/checkpoint/sharded_saver.hpp"
#include "tetrad/comm/communicator.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/parallel/sharding.hpp"

namespace fs = std::filesystem;

namespace tetrad {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Drops a checkpoint's files from the page cache (they are clean after the fsync), so the read
// that follows comes from the disk, as a restart would.
void drop_cache(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Busy "training" for ms milliseconds: memory traffic like a step's, on this thread.
void simulated_step(std::vector<float>& work, double ms) {
  const double end = now_s() + ms / 1000;
  while (now_s() < end)
    for (size_t i = 0; i < work.size(); i += 16) work[i] = work[i] * 0.999f + 1.0f;
}

}  // namespace

void run_checkpoint_bench(const CheckpointBenchOptions& opt, std::ostream& log) {
  using namespace parallel;
  const ModelConfig cfg = named_model(opt.model);
  const ParamTable table = build_param_table(cfg);
  const GridShape shape = parse_grid(opt.grid);
  int mpi_ready = 0;
  MPI_Initialized(&mpi_ready);
  int world = 1;
  if (mpi_ready) MPI_Comm_size(MPI_COMM_WORLD, &world);
  validate_grid(shape, world);
  ProcessGroups groups = world > 1 ? ProcessGroups(comm::Communicator::world(), shape) : ProcessGroups();
  const bool root = groups.world.rank() == 0;
  std::ostream null_stream(nullptr);
  std::ostream& out = root ? log : null_stream;
  const ShardPlan plan = ShardPlan::build(cfg, table, shape, groups.coord);
  std::vector<float> p(size_t(plan.local_total)), m(p.size()), v(p.size());
  std::mt19937 rng(1 + groups.world.rank());
  std::normal_distribution<float> nd(0.f, 0.02f);
  for (auto* b : {&p, &m, &v})
    for (auto& x : *b) x = nd(rng);
  if (root) {
    std::error_code ec;
    fs::remove_all(opt.dir, ec);
  }
  groups.world.barrier();

  // One saver of each kind for the whole run, as training keeps one: the snapshot buffer is
  // allocated by the first save and reused (its page faults are paid once, in repeat 1).
  ShardedSaver::Options so;
  so.run_dir = opt.dir;
  so.keep_last = 1;
  so.async = false;
  ShardedSaver sync_saver(groups.world, so);
  so.async = true;
  ShardedSaver async_saver(groups.world, so);
  int64_t step = 0;
  std::vector<double> sync_s, async_blocked, async_total, async_write, read_s, async_snapshot;
  int64_t bytes = 0;
  std::vector<float> work(size_t(8) << 20);  // 32 MiB touched per simulated step
  for (int rep = 0; rep < opt.repeats; ++rep) {
    // Synchronous: training waits for the whole save (snapshot, write, fsync, metadata, rename).
    {
      ShardedCheckpointInfo info;
      info.step = ++step;
      groups.world.barrier();
      const double t0 = now_s();
      sync_saver.begin(cfg, table, plan, p.data(), m.data(), v.data(), info);
      sync_saver.finish();
      double dt = now_s() - t0;
      groups.world.allreduce_max(&dt, 1);
      sync_s.push_back(dt);
      bytes = sync_saver.last_timings().bytes;
    }
    // Asynchronous: simulated training steps go on while the background thread writes.
    {
      ShardedCheckpointInfo info;
      info.step = ++step;
      groups.world.barrier();
      async_saver.begin(cfg, table, plan, p.data(), m.data(), v.data(), info);
      do {
        simulated_step(work, opt.step_ms);
      } while (!async_saver.poll());
      double t[4] = {async_saver.last_timings().blocked_s, async_saver.last_timings().total_s,
                     async_saver.last_timings().write_s, async_saver.last_timings().snapshot_s};
      groups.world.allreduce_max(t, 4);
      async_snapshot.push_back(t[3]);
      async_blocked.push_back(t[0]);
      async_total.push_back(t[1]);
      async_write.push_back(t[2]);
    }
    // Read back from the disk (page cache dropped) on the same grid.
    {
      const std::string dir = opt.dir + "/checkpoints/" + checkpoint_folder_name(step);
      if (root) drop_cache(dir);
      groups.world.barrier();
      std::vector<float> p2(p.size()), m2(p.size()), v2(p.size());
      const double t0 = now_s();
      load_sharded_checkpoint(dir, cfg, 0, plan, p2.data(), m2.data(), v2.data());
      double dt = now_s() - t0;
      groups.world.allreduce_max(&dt, 1);
      read_s.push_back(dt);
      if (p2 != p || m2 != m || v2 != v) fail("bench-checkpoint: the checkpoint read back differs");
    }
  }
  const double mb = double(bytes) / 1e6;
  const double ws = median(sync_s), rs = median(read_s), ab = median(async_blocked);
  out << std::fixed << std::setprecision(3) << "checkpoint of " << opt.model << " on grid "
      << shape.to_string() << ": " << std::setprecision(1) << mb << " MB (params + AdamW moments)\n"
      << std::setprecision(3) << "  sync save    " << ws << " s  = " << std::setprecision(0)
      << mb / ws << " MB/s (write + fsync + metadata + rename)\n"
      << std::setprecision(3) << "  async save   blocked " << ab << " s (" << std::setprecision(1)
      << 100 * ab / ws << "% of sync; snapshot " << std::setprecision(3) << median(async_snapshot)
      << " s), visible after " << std::setprecision(3)
      << median(async_total) << " s, background write " << median(async_write) << " s\n"
      << "  read         " << rs << " s  = " << std::setprecision(0) << mb / rs
      << " MB/s (page cache dropped, every chunk verified)\n" << std::defaultfloat;
  out << "json: "
      << nlohmann::json{{"model", opt.model}, {"grid", shape.to_string()}, {"bytes", bytes},
                        {"sync_save_s", ws}, {"write_MBps", mb / ws}, {"async_blocked_s", ab},
                        {"async_blocked_fraction", ab / ws}, {"async_snapshot_s", median(async_snapshot)}, {"async_total_s", median(async_total)},
                        {"async_write_s", median(async_write)}, {"read_s", rs},
                        {"read_MBps", mb / rs}, {"repeats", opt.repeats}}
             .dump()
      << "\n";
}

}  // namespace tetrad
