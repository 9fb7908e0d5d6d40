// Sharded checkpoints (checkpoint/sharded.hpp) without MPI: every rank of a grid is simulated in
// this process (its ShardPlan, its local buffers, its shard file), so a checkpoint of every grid
// of 1, 2 and 4 ranks is loaded on every grid of 1, 2 and 4 ranks and compared bit for bit;
// and damage (a flipped byte, a truncated shard, missing metadata, another model) is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <chrono>
#include <thread>
#include <sys/wait.h>
#include <unistd.h>

#include "support/test_files.hpp"
#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/checkpoint/run_lock.hpp"
#include "tetrad/checkpoint/sharded_saver.hpp"
#include "tetrad/comm/communicator.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/sharding.hpp"

namespace fs = std::filesystem;
using namespace tetrad;
using parallel::GridCoord;
using parallel::GridShape;
using parallel::ShardPlan;

namespace {

std::string test_dir() { return tetrad_test::test_dir("test_sharded_checkpoint"); }
using tetrad_test::random_floats;

// A rank's local buffer (laid out by its plan) cut from the whole tensors, as
// ParallelTransformer::scatter_tensor does.
std::vector<float> local_of(const ShardPlan& plan, const std::vector<float>& full) {
  std::vector<float> local(size_t(plan.local_total));
  for (const auto& t : plan.tensors) {
    if (!t.stored) continue;  // another pipeline stage's layer
    std::vector<float> block(size_t(t.z_sharded ? t.shard_numel * plan.grid.z() : t.block_numel));
    parallel::extract_block(t, full.data() + t.spec->offset, block.data());
    const int64_t first = t.z_sharded ? t.shard_numel * plan.coord.z() : 0;
    std::memcpy(local.data() + t.offset, block.data() + first, size_t(t.shard_numel) * 4);
  }
  return local;
}

struct Model {
  ModelConfig cfg;
  ParamTable table;
  std::vector<float> p, m, v;
  explicit Model(const std::string& name, uint32_t seed = 1) : Model(named_model(name), seed) {}
  Model(const ModelConfig& c, uint32_t seed) : cfg(c), table(build_param_table(cfg)) {
    p = random_floats(size_t(table.total), seed);
    m = random_floats(size_t(table.total), seed + 1);
    v = random_floats(size_t(table.total), seed + 2);
  }
};

// Writes the checkpoint every rank of `grid` would write (in one process) into `dir`.
void write_simulated(const std::string& dir, const Model& md, const GridShape& grid, int64_t step,
                     const nlohmann::json& data = nlohmann::json::object(), int virtual_stages = 1,
                     const std::vector<int>& layer_counts = {}) {
  // The pipeline's layer split: the given counts, else the even split over Gp x v (what the
  // checkpoint records when info.pipeline_layers is left empty).
  const parallel::LayerSplit split =
      grid.p() == 1 ? parallel::LayerSplit{}
      : layer_counts.empty()
          ? parallel::LayerSplit::even(md.cfg.n_layer, grid.p() * virtual_stages)
          : parallel::LayerSplit::from_counts(layer_counts, md.cfg.n_layer);
  fs::create_directories(dir);
  const uint64_t id = 0x1234567890abcdefull + uint64_t(step);
  std::vector<int64_t> bytes(size_t(grid.size()));
  std::vector<std::vector<uint64_t>> hashes(size_t(grid.size()));
  for (int r = 0; r < grid.size(); ++r) {
    const ShardPlan plan =
        ShardPlan::build(md.cfg, md.table, grid, parallel::coord_of(r, grid), split);
    const auto lp = local_of(plan, md.p), lm = local_of(plan, md.m), lv = local_of(plan, md.v);
    const ShardSnapshot s = snapshot_shards(plan, lp.data(), lm.data(), lv.data(), true);
    bytes[size_t(r)] = int64_t(s.data.size());
    if (!s.pieces.empty())
      hashes[size_t(r)] = write_shard_file(dir + "/" + shard_file_name(r), s, r, step, id);
  }
  ShardedCheckpointInfo info;
  info.step = step;
  info.grid = grid;
  info.virtual_stages = virtual_stages;
  info.pipeline_layers = layer_counts;
  info.tokenizer_identity = 0xabcdef;
  info.data = data;
  write_sharded_meta_files(dir, build_sharded_meta(md.cfg, md.table, info, id, bytes, hashes),
                           md.cfg, "");
}

std::vector<GridShape> grids_1_2_4() {
  std::vector<GridShape> all;
  for (int n : {1, 2, 4})
    for (const auto& g : parallel::factorizations(n)) all.push_back(g);
  return all;
}

}  // namespace

// The runs describe exactly the elements of the rank's shard, in its local order, for every
// layout (a whole tensor filled with its own indices makes each element name its position).
TEST(ShardedCheckpoint, IndexRunsListEveryLocalElementInOrder) {
  const ModelConfig cfg = named_model("tiny");
  const ParamTable table = build_param_table(cfg);
  std::vector<float> iota(size_t(table.total));
  for (const auto& s : table.specs)
    for (int64_t i = 0; i < s.numel; ++i) iota[size_t(s.offset + i)] = float(i);
  int checked = 0;
  for (const GridShape& g : {GridShape{2, 2, 1, 1}, GridShape{1, 2, 2, 1}, GridShape{2, 1, 2, 1},
                             GridShape{1, 1, 4, 1}, GridShape{4, 1, 1, 1}}) {
    for (int r = 0; r < g.size(); ++r) {
      const ShardPlan plan = ShardPlan::build(cfg, table, g, parallel::coord_of(r, g));
      const auto local = local_of(plan, iota);
      for (const auto& t : plan.tensors) {
        std::vector<float> listed;
        for (const IndexRun& run : shard_index_runs(t, g, plan.coord))
          for (int64_t k = 0; k < run.count; ++k)
            for (int64_t e = 0; e < run.len; ++e) listed.push_back(float(run.start + k * run.stride + e));
        ASSERT_EQ(int64_t(listed.size()), t.shard_numel) << t.spec->name;
        ASSERT_EQ(0, std::memcmp(listed.data(), local.data() + t.offset, listed.size() * 4))
            << t.spec->name << " on grid " << g.to_string() << " rank " << r;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(ShardedCheckpoint, RunsAreCompactForBlocks) {
  // A [R, K] weight split over X by columns is one strided run, not R segments.
  const ModelConfig cfg = named_model("tiny");
  const ParamTable table = build_param_table(cfg);
  const GridShape g{2, 1, 1, 1};
  const ShardPlan plan = ShardPlan::build(cfg, table, g, GridCoord{1, 0, 0, 0});
  for (const auto& t : plan.tensors)
    if (t.spec->name == "transformer.h.0.mlp.c_fc.weight") {
      const auto runs = shard_index_runs(t, g, plan.coord);
      ASSERT_EQ(runs.size(), 1u);
      EXPECT_EQ(runs[0], (IndexRun{cfg.n_embd / 2, cfg.n_embd / 2, cfg.n_embd, cfg.ffn}));
    }
}

// Replicated shards are written once: data replicas and Y/Z copies of ColsX tensors write nothing.
TEST(ShardedCheckpoint, ReplicasWriteOnce) {
  const Model md("tiny");
  const std::string dir = test_dir();
  write_simulated(dir, md, GridShape{1, 1, 1, 4}, 3);
  EXPECT_TRUE(fs::exists(dir + "/" + shard_file_name(0)));
  for (int r = 1; r < 4; ++r) EXPECT_FALSE(fs::exists(dir + "/" + shard_file_name(r))) << r;
  // Grid 1x2x1x1: ColsX tensors (norms, positions) only by y = 0, so rank 1 writes less.
  const std::string dir2 = dir + "/y";
  write_simulated(dir2, md, GridShape{1, 2, 1, 1}, 3);
  const auto s0 = fs::file_size(dir2 + "/" + shard_file_name(0));
  const auto s1 = fs::file_size(dir2 + "/" + shard_file_name(1));
  EXPECT_GT(s0, s1);
  // Every element of every array is in the files exactly once.
  EXPECT_EQ(s0 + s1 - 2 * kShardHeaderBytes, uint64_t(3 * 4 * md.table.total));
  EXPECT_EQ(sharded_checkpoint_problem(dir2), std::nullopt);
}

// The matrix: saved on each of the 15 grids of 1, 2, 4 ranks, loaded on each of them; every
// rank's params and moments equal the shard of the original whole tensors, bit for bit.
TEST(ShardedCheckpoint, EveryGridLoadsEveryOtherGridBitIdentical) {
  for (const char* name : {"tiny", "llama-tiny"}) {
    const Model md(name, 7);
    const std::string base = test_dir() + "/" + name;
    int pairs = 0;
    for (const GridShape& a : grids_1_2_4()) {
      try {
        parallel::validate_grid_for_model(md.cfg, a);
      } catch (const Error&) {
        continue;  // llama-tiny's 2 kv heads do not split 4 ways
      }
      const std::string dir = base + "/" + a.to_string();
      write_simulated(dir, md, a, 10);
      ASSERT_EQ(sharded_checkpoint_problem(dir), std::nullopt);
      for (const GridShape& b : grids_1_2_4()) {
        try {
          parallel::validate_grid_for_model(md.cfg, b);
        } catch (const Error&) {
          continue;
        }
        for (int r = 0; r < b.size(); ++r) {
          const ShardPlan plan = ShardPlan::build(md.cfg, md.table, b, parallel::coord_of(r, b));
          std::vector<float> p(size_t(plan.local_total), -1.f), m(p), v(p);
          const auto info = load_sharded_checkpoint(dir, md.cfg, 0xabcdef, plan, p.data(), m.data(), v.data());
          EXPECT_EQ(info.step, 10);
          EXPECT_EQ(info.grid, a);
          ASSERT_EQ(p, local_of(plan, md.p)) << name << " " << a.to_string() << " -> " << b.to_string() << " rank " << r;
          ASSERT_EQ(m, local_of(plan, md.m));
          ASSERT_EQ(v, local_of(plan, md.v));
        }
        ++pairs;
      }
    }
    EXPECT_GE(pairs, std::string(name) == "tiny" ? 225 : 36) << name;
  }
}

// Pipeline grids (each stage stores and writes only its layers; the first stage the top-level
// tensors): saved on a pipeline grid, loaded on every grid of 1, 2, 4 ranks and on every pipeline
// grid, and the other way round; bit-identical; every element written exactly once.
TEST(ShardedCheckpoint, PipelineGridsSaveTheirStagesAndLoadAnywhere) {
  ModelConfig cfg = named_model("tiny");
  cfg.n_layer = 4;
  const Model md(cfg, 11);
  struct Layout {
    GridShape grid;
    int v;
    std::vector<int> layers = {};  // uneven split (layer counts per virtual stage); {}: even
    parallel::LayerSplit split(int n_layer) const {
      if (grid.p() == 1) return {};
      return layers.empty() ? parallel::LayerSplit::even(n_layer, grid.p() * v)
                            : parallel::LayerSplit::from_counts(layers, n_layer);
    }
    std::string name() const {
      std::string s = grid.to_string() + "-v" + std::to_string(v);
      // append, not "-" + std::to_string(n): GCC 12 warns -Wrestrict there (a false positive)
      for (int n : layers) s.append("-").append(std::to_string(n));
      return s;
    }
  };
  // One uneven split (stage 0 stores 3 layers, stage 1 one) among the even layouts.
  const std::vector<Layout> pipes = {{GridShape::xyzpd(1, 1, 1, 2, 1), 1}, {GridShape::xyzpd(1, 1, 1, 2, 1), 2},
                                     {GridShape::xyzpd(1, 1, 1, 4, 1), 1}, {GridShape::xyzpd(2, 1, 1, 2, 1), 2},
                                     {GridShape::xyzpd(1, 1, 2, 2, 1), 1}, {GridShape::xyzpd(1, 1, 1, 2, 2), 1},
                                     {GridShape::xyzpd(1, 1, 1, 2, 1), 1, {3, 1}}};
  std::vector<Layout> all = pipes;
  for (const GridShape& g : grids_1_2_4()) all.push_back({g, 1});
  const std::string base = test_dir() + "/pipeline";
  int pairs = 0;
  for (const Layout& a : all) {
    const std::string dir = base + "/" + a.name();
    write_simulated(dir, md, a.grid, 10, nlohmann::json::object(), a.v, a.layers);
    ASSERT_EQ(sharded_checkpoint_problem(dir), std::nullopt) << dir;
    uint64_t bytes = 0;
    for (const auto& f : fs::directory_iterator(dir))
      if (f.path().filename().string().rfind("shard_", 0) == 0) bytes += fs::file_size(f.path()) - kShardHeaderBytes;
    EXPECT_EQ(bytes, uint64_t(3 * 4 * md.table.total)) << dir << ": every element once";
    const bool a_pipe = a.grid.p() > 1;
    for (const Layout& b : all) {
      if (!a_pipe && b.grid.p() == 1) continue;  // the p = 1 matrix is the test above
      for (int r = 0; r < b.grid.size(); ++r) {
        const ShardPlan plan = ShardPlan::build(md.cfg, md.table, b.grid,
                                                parallel::coord_of(r, b.grid), b.split(cfg.n_layer));
        std::vector<float> p(size_t(plan.local_total), -1.f), m(p), v(p);
        const auto info = load_sharded_checkpoint(dir, md.cfg, 0xabcdef, plan, p.data(), m.data(), v.data());
        EXPECT_EQ(info.grid, a.grid);
        EXPECT_EQ(info.virtual_stages, a.v);
        // The saving grid's split is recorded (the even one when none was given).
        EXPECT_EQ(info.pipeline_layers, a.split(cfg.n_layer).counts());
        const std::string where = a.name() + " -> " + b.name() + " rank " + std::to_string(r);
        ASSERT_EQ(p, local_of(plan, md.p)) << where;
        ASSERT_EQ(m, local_of(plan, md.m)) << where;
        ASSERT_EQ(v, local_of(plan, md.v)) << where;
      }
      ++pairs;
    }
  }
  EXPECT_EQ(pairs, 7 * 22 + 15 * 7);
}

TEST(ShardedCheckpoint, DamageIsRefusedWithAClearMessage) {
  const Model md("tiny");
  const std::string base = test_dir();
  const GridShape g{2, 1, 1, 1};
  auto fresh = [&](const std::string& name) {
    const std::string dir = base + "/" + name;
    write_simulated(dir, md, g, 5);
    return dir;
  };
  auto load_error = [&](const std::string& dir, const ModelConfig& cfg) -> std::string {
    const ParamTable table = build_param_table(cfg);  // the plan points into it
    const ShardPlan plan = ShardPlan::build(cfg, table, GridShape{}, GridCoord{});
    std::vector<float> p(size_t(plan.local_total)), m(p), v(p);
    try {
      load_sharded_checkpoint(dir, cfg, 0, plan, p.data(), m.data(), v.data());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  // A flipped byte in a shard's data: the structure is fine, the load refuses the chunk.
  {
    const std::string dir = fresh("flip");
    const std::string shard = dir + "/" + shard_file_name(1);
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kShardHeaderBytes + 1000);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(kShardHeaderBytes + 1000);
    f.write(&c, 1);
    f.close();
    const std::string e = load_error(dir, md.cfg);
    EXPECT_NE(e.find("checksum of chunk 0"), std::string::npos) << e;
    EXPECT_NE(e.find(shard_file_name(1)), std::string::npos) << e;
    EXPECT_THROW(verify_sharded_checkpoint(dir), Error);
  }
  // A truncated shard.
  {
    const std::string dir = fresh("truncate");
    const std::string shard = dir + "/" + shard_file_name(0);
    fs::resize_file(shard, fs::file_size(shard) - 7);
    const auto p = sharded_checkpoint_problem(dir);
    ASSERT_TRUE(p.has_value());
    EXPECT_NE(p->find("truncated"), std::string::npos) << *p;
    EXPECT_NE(load_error(dir, md.cfg).find("truncated"), std::string::npos);
  }
  // The metadata deleted: not a checkpoint any more (checkpoint_problem says what is missing).
  {
    const std::string dir = fresh("nometa");
    fs::remove(dir + "/" + kShardedMetaFile);
    const auto p = checkpoint_problem(dir);
    ASSERT_TRUE(p.has_value());
    EXPECT_NE(p->find("meta.json is missing"), std::string::npos) << *p;
  }
  // The metadata edited (one digit of a size): its checksum no longer matches.
  {
    const std::string dir = fresh("editmeta");
    std::string text = read_small_file(dir + "/meta.json");
    const size_t at = text.find("\"step\":5");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 8, "\"step\":6");
    std::ofstream(dir + "/meta.json") << text;
    const auto p = sharded_checkpoint_problem(dir);
    ASSERT_TRUE(p.has_value());
    EXPECT_NE(p->find("checksum"), std::string::npos) << *p;
  }
  // A shard from another checkpoint (same size, other id) put in place of the real one.
  {
    const std::string a = fresh("mix_a"), b = base + "/mix_b";
    write_simulated(b, md, g, 6);
    fs::copy_file(b + "/" + shard_file_name(0), a + "/" + shard_file_name(0),
                  fs::copy_options::overwrite_existing);
    const auto p = sharded_checkpoint_problem(a);
    ASSERT_TRUE(p.has_value());
    EXPECT_NE(p->find("belongs to another checkpoint"), std::string::npos) << *p;
  }
  // Another model in the config.
  {
    const std::string dir = fresh("config");
    ModelConfig other = md.cfg;
    other.n_layer = 3;
    const std::string e = load_error(dir, other);
    EXPECT_NE(e.find("model.n_layer: checkpoint 2, config 3"), std::string::npos) << e;
  }
  // Another tokenizer.
  {
    const std::string dir = fresh("tokenizer");
    const ShardPlan plan = ShardPlan::build(md.cfg, md.table, GridShape{}, GridCoord{});
    std::vector<float> p(size_t(plan.local_total)), m(p), v(p);
    try {
      load_sharded_checkpoint(dir, md.cfg, 0x999, plan, p.data(), m.data(), v.data());
      ADD_FAILURE() << "another tokenizer was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tokenizer"), std::string::npos) << e.what();
    }
  }
}

// Through the run folder: `latest` naming a damaged checkpoint falls back to the previous one.
TEST(ShardedCheckpoint, ResumeCandidatesSkipDamagedLatest) {
  const Model md("tiny");
  const std::string run = test_dir();
  ShardedCheckpointInfo info;
  info.step = 4;
  save_sharded_checkpoint_serial(run, md.cfg, md.table, md.p.data(), md.m.data(), md.v.data(), info, "", 3);
  info.step = 8;
  const std::string dir8 = save_sharded_checkpoint_serial(run, md.cfg, md.table, md.p.data(),
                                                          md.m.data(), md.v.data(), info, "", 3);
  std::ostringstream log;
  auto c = resume_candidates(run, log);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].step, 8);
  EXPECT_EQ(c[1].step, 4);
  fs::resize_file(dir8 + "/" + shard_file_name(0), 100);
  // An interrupted save's leftovers are skipped (finding only reads), and removed by the
  // lock holder's clean_run_folder.
  fs::create_directories(run + "/checkpoints/step_000012.tmp");
  std::ostringstream log2;
  c = resume_candidates(run, log2);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].step, 4);
  EXPECT_NE(log2.str().find("truncated"), std::string::npos) << log2.str();
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step_000012.tmp"));
  clean_run_folder(run, log2);
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step_000012.tmp"));
}

// One process: load_hf_params reads a sharded checkpoint as whole tensors; exporting that to a
// Hugging Face folder and importing it back (params only, zero moments) is bit-identical.
TEST(ShardedCheckpoint, ExportToHuggingFaceAndImportBackBitIdentical) {
  for (const char* name : {"tiny", "llama-tiny"}) {
    const Model md(name, 3);
    const std::string base = test_dir() + "/" + name;
    const std::string ck = base + "/ck";
    write_simulated(ck, md, GridShape{1, 2, 2, 1}, 9);
    std::vector<float> whole(size_t(md.table.total));
    EXPECT_EQ(read_hf_config(ck).n_embd, md.cfg.n_embd);
    load_hf_params(ck, md.cfg, md.table, whole.data());
    ASSERT_EQ(whole, md.p);
    save_hf(base + "/hf", md.cfg, md.table, whole.data());
    std::vector<float> back(size_t(md.table.total));
    load_hf_params(base + "/hf", md.cfg, md.table, back.data());
    ASSERT_EQ(back, md.p);
    ShardedCheckpointInfo info;
    info.has_moments = false;
    const std::string imported = save_sharded_checkpoint_serial(base + "/run", md.cfg, md.table,
                                                                back.data(), nullptr, nullptr, info, "", 1);
    const GridShape g{2, 1, 1, 2};
    const ShardPlan plan = ShardPlan::build(md.cfg, md.table, g, GridCoord{1, 0, 0, 1});
    std::vector<float> p(size_t(plan.local_total)), m(p.size(), 5.f), v(p.size(), 5.f);
    const auto got = load_sharded_checkpoint(imported, md.cfg, 0, plan, p.data(), m.data(), v.data());
    EXPECT_FALSE(got.has_moments);
    EXPECT_EQ(p, local_of(plan, md.p));
    EXPECT_EQ(m, std::vector<float>(m.size(), 0.f));
    EXPECT_EQ(v, std::vector<float>(v.size(), 0.f));
  }
}

// The saver on one process: the asynchronous write works from a snapshot (weights changed after
// begin() do not reach the file), the checkpoint appears only when committed, and the blocked
// time is reported.
TEST(ShardedCheckpoint, AsyncSaverSnapshotsAndCommits) {
  Model md("tiny");
  const std::string run = test_dir();
  const comm::Communicator self = comm::Communicator::self();
  ShardedSaver::Options o;
  o.run_dir = run;
  o.keep_last = 2;
  o.async = true;
  ShardedSaver saver(self, o);
  const ShardPlan plan = ShardPlan::build(md.cfg, md.table, GridShape{}, GridCoord{});
  const std::vector<float> before = md.p;
  for (int64_t step : {1, 2, 3}) {
    ShardedCheckpointInfo info;
    info.step = step;
    saver.begin(md.cfg, md.table, plan, md.p.data(), md.m.data(), md.v.data(), info);
    EXPECT_FALSE(fs::exists(run + "/checkpoints/" + checkpoint_folder_name(step)));
    if (step == 3) std::fill(md.p.begin(), md.p.end(), 42.f);  // training goes on
    while (!saver.poll()) {
    }
    EXPECT_TRUE(fs::exists(run + "/checkpoints/" + checkpoint_folder_name(step)));
    EXPECT_GE(saver.last_timings().total_s, saver.last_timings().write_s);
    EXPECT_EQ(saver.last_timings().bytes, 3 * 4 * md.table.total + 0 * kShardHeaderBytes);
  }
  EXPECT_EQ(read_small_file(run + "/checkpoints/latest"), "step_000003\n");
  // keep_last = 2: rank 0's pruner thread deletes step 1 soon after step 3 is published.
  for (int i = 0; i < 500 && fs::exists(run + "/checkpoints/step_000001"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step_000001"));
  std::vector<float> got(size_t(md.table.total));
  load_sharded_params(run + "/checkpoints/step_000003", md.cfg, md.table, got.data());
  EXPECT_EQ(got, before);
  verify_sharded_checkpoint(run + "/checkpoints/step_000003");
  // train.async_checkpoint = false: written from the live buffers before begin/finish return.
  o.async = false;
  ShardedSaver sync_saver(self, o);
  ShardedCheckpointInfo info;
  info.step = 4;
  sync_saver.begin(md.cfg, md.table, plan, md.p.data(), md.m.data(), md.v.data(), info);
  sync_saver.finish();
  EXPECT_EQ(sync_saver.last_timings().snapshot_s, 0.0);
  load_sharded_params(run + "/checkpoints/step_000004", md.cfg, md.table, got.data());
  EXPECT_EQ(got, md.p);
  verify_sharded_checkpoint(run + "/checkpoints/step_000004");
}

// ---- Issue 16: owning a run folder, pruning that keeps what matters -------------------------

TEST(RunFolder, LockRefusesASecondHolderNamingIt) {
  const std::string run = test_dir() + "/locked";
  {
    RunLock first(run);
    try {
      RunLock second(run);
      FAIL() << "a second lock on the same folder was granted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("is in use"), std::string::npos) << msg;
      EXPECT_NE(msg.find("pid " + std::to_string(getpid()) + " on host " + this_host_name()),
                std::string::npos) << msg;
    }
  }
  EXPECT_FALSE(fs::exists(run + "/train.lock"));  // released
  RunLock again(run);                              // and free again
}

TEST(RunFolder, StaleLockOfADeadProcessIsTakenOver) {
  const std::string run = test_dir() + "/stale";
  fs::create_directories(run);
  // A pid that is not running: a child that has exited and been reaped.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);
  std::ofstream(run + "/train.lock") << "pid=" << child << " host=" << this_host_name() << " start=1\n";
  std::string took;
  RunLock lock(run, &took);
  EXPECT_NE(took.find("no longer running; taking it over"), std::string::npos) << took;
  // A holder on another host cannot be checked: refused, with its name.
  const std::string run2 = test_dir() + "/remote";
  fs::create_directories(run2);
  std::ofstream(run2 + "/train.lock") << "pid=77 host=another-node start=5\n";
  try {
    RunLock remote(run2);
    FAIL() << "a lock held on another host was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pid 77 on host another-node"), std::string::npos) << e.what();
  }
}

// A holder killed but not yet reaped (a zombie: the ranks of a killed mpirun job until their
// parent collects them) holds nothing: its lock is taken over, not refused as "still running".
TEST(RunFolder, LockOfAnExitedButUnreapedHolderIsTakenOver) {
  const std::string run = test_dir() + "/zombie";
  fs::create_directories(run);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    new RunLock(run);  // never released: the process ends holding it, as under kill -9
    char c = 'l';
    _exit(write(ready[1], &c, 1) == 1 ? 0 : 1);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  // Until the child has exited, without reaping it: a zombie from here on.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, id_t(child), &info, WEXITED | WNOWAIT), 0);
  std::string took;
  try {
    RunLock lock(run, &took);
    EXPECT_NE(took.find("no longer running; taking it over"), std::string::npos) << took;
    EXPECT_NE(took.find("pid " + std::to_string(child)), std::string::npos) << took;
  } catch (const Error& e) {
    ADD_FAILURE() << "the lock of an exited (unreaped) holder was refused: " << e.what();
  }
  waitpid(child, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
}

TEST(RunFolder, PruningKeepsTheLastHealthyCheckpointAndRenamesFirst) {
  const Model md("tiny");
  const std::string run = test_dir() + "/healthy";
  ShardedCheckpointInfo info;
  // Steps 2, 4 healthy; 6, 8, 10 diverged; keep_last = 2.
  for (int s = 2; s <= 10; s += 2) {
    info.step = s;
    info.extra = {{"loss", s <= 4 ? 3.0 : 19000.0}, {"healthy", s <= 4}};
    save_sharded_checkpoint_serial(run, md.cfg, md.table, md.p.data(), md.m.data(), md.v.data(), info, "", 2);
  }
  EXPECT_EQ(checkpoint_steps(run), (std::vector<int64_t>{10, 8, 4}));
  EXPECT_TRUE(checkpoint_healthy(run + "/checkpoints/step_000004") == std::optional<bool>(true));
  EXPECT_TRUE(checkpoint_healthy(run + "/checkpoints/step_000010") == std::optional<bool>(false));
  // Healthy again: the old healthy one is no longer needed.
  info.step = 12;
  info.extra = {{"loss", 2.5}, {"healthy", true}};
  save_sharded_checkpoint_serial(run, md.cfg, md.table, md.p.data(), md.m.data(), md.v.data(), info, "", 2);
  EXPECT_EQ(checkpoint_steps(run), (std::vector<int64_t>{12, 10}));
  // Nothing of a pruned folder is left under its step name, and a half-pruned one is cleaned.
  for (const auto& e : fs::directory_iterator(run + "/checkpoints"))
    EXPECT_EQ(e.path().filename().string().find(".pruning"), std::string::npos);
  fs::create_directories(run + "/checkpoints/step_000002.pruning");
  std::ostringstream log;
  EXPECT_EQ(resume_candidates(run, log).front().step, 12);  // readers ignore it
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step_000002.pruning"));
  clean_run_folder(run, log);
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step_000002.pruning"));
  EXPECT_NE(log.str().find("interrupted prune"), std::string::npos) << log.str();
  // A folder no resume can use (its meta.json gone, as an older prune left them) does not hold a
  // place among the kept: with keep_last = 3, steps 14 and 12 stay, 10 goes.
  fs::remove(run + "/checkpoints/step_000010/meta.json");
  info.step = 14;
  save_sharded_checkpoint_serial(run, md.cfg, md.table, md.p.data(), md.m.data(), md.v.data(), info, "", 3);
  EXPECT_EQ(checkpoint_steps(run), (std::vector<int64_t>{14, 12}));
}
