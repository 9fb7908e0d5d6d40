// The planner's choices beyond the grid (issue 30): the micro-batch and accumulation searched
// with the grid (planner.hpp, PlanInput::search_micro_batch), `--model` lists of names and TOML
// run configs (train/auto_grid.hpp, planner_model_list), and the named llama-405b. Pure
// arithmetic: no MPI, no timing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "expect_error.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/planner/machine.hpp"
#include "tetrad/planner/planner.hpp"
#include "tetrad/planner/report.hpp"
#include "tetrad/planner/scaling.hpp"
#include "tetrad/planner/validate.hpp"
#include "tetrad/train/auto_grid.hpp"

using namespace tetrad;
using namespace tetrad::planner;
using tetrad_test::expect_error;

namespace {

PlanInput searched(const std::string& model, int ranks, int64_t batch) {
  PlanInput in;
  in.model = planner_model(model);
  in.model_name = model;
  in.seq = in.model.max_seq;
  in.global_batch = batch;
  in.search_micro_batch = true;
  in.ranks = ranks;
  return in;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("tetrad_planner_search_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

}  // namespace

TEST(PlannerSearch, CandidatesAreEveryWholeMicroBatchPerReplica) {
  PlanInput in = searched("small", 4, 12);
  // Gz x Gd = 2: 6 sequences per replica per step, so 1, 2, 3 or 6 per replica.
  EXPECT_EQ(micro_batch_candidates(in, GridShape::xyzpd(1, 2, 1, 1, 2)), (std::vector<int64_t>{2, 4, 6, 12}));
  EXPECT_EQ(micro_batch_candidates(in, GridShape::xyzpd(4, 1, 1, 1, 1)),
            (std::vector<int64_t>{1, 2, 3, 4, 6, 12}));
  // Gz x Gd = 8 does not divide 12 sequences: no candidate, and the grid says why.
  in.ranks = 8;
  EXPECT_TRUE(micro_batch_candidates(in, GridShape::xyzpd(1, 1, 2, 1, 4)).empty());
  const Estimate e = estimate(in, GridShape::xyzpd(1, 1, 2, 1, 4), load_machine("perlmutter"));
  EXPECT_FALSE(e.valid);
  EXPECT_NE(e.reject.find("not divisible by Gz x Gd = 8"), std::string::npos) << e.reject;
}

TEST(PlannerSearch, AMicroBatchIsGivenOrSearchedNotBoth) {
  PlanInput in = searched("small", 4, 8);
  in.micro_batch = 4;
  expect_error([&] { in.validate(); }, {"not searched", "not both"});
  in.search_micro_batch = false;
  in.micro_batch = 0;
  expect_error([&] { in.validate(); }, {"--micro-batch", "none to let the planner choose"});
}

TEST(PlannerSearch, ChoosesALargerMicroBatchThanTheConfigsWhenThatIsFaster) {
  // The case: gpt-5b on 512 Perlmutter GPUs, 2048 sequences a step. With a config's
  // micro-batch of 8 sequences only grids with Gz x Gd <= 8 divide it, and they accumulate 256
  // times; searching, every grid gets its own micro-batch and the best one is many times faster.
  const Machine m = load_machine("perlmutter");
  PlanInput fixed = searched("gpt-5b", 512, 2048);
  fixed.search_micro_batch = false;
  fixed.micro_batch = 8;
  fixed.precision = Precision::BF16;
  fixed.recompute = Recompute::Full;
  fixed.overlap = Overlap::Tensor;
  fixed.memory_model = MemoryModel::Reference;
  fixed.allow_pipeline = false;
  PlanInput search = fixed;
  search.micro_batch = 0;
  search.search_micro_batch = true;
  const Estimate a = plan(fixed, m).front(), b = plan(search, m).front();
  ASSERT_TRUE(a.valid && b.valid);
  EXPECT_EQ(a.micro_batch, 8);
  EXPECT_GT(b.micro_batch, 8);
  EXPECT_EQ(b.micro_batch * b.micro_batches, 2048);
  EXPECT_LT(b.step, a.step / 5) << grid_label(a.grid) << " " << a.step << " s vs " << grid_label(b.grid)
                                << " " << b.step << " s";
  // The searched grid at its chosen micro-batch is exactly the fixed plan of that micro-batch.
  PlanInput at = fixed;
  at.micro_batch = b.micro_batch;
  const Estimate c = estimate(at, b.grid, m);
  EXPECT_DOUBLE_EQ(c.step, b.step);
  // And no other candidate of that grid is faster.
  for (int64_t mb : micro_batch_candidates(search, b.grid)) {
    at.micro_batch = mb;
    const Estimate o = estimate(at, b.grid, m);
    if (o.valid) {
      EXPECT_GE(o.step, b.step) << mb;
    }
  }
}

TEST(PlannerSearch, MemoryForcesASmallerMicroBatch) {
  // gpt2-124m in fp32 without recomputation on one 40 GB GPU: 64 sequences of 1024 tokens do not
  // fit as one micro-batch; the search takes the largest that fits (on one rank a larger
  // micro-batch is never slower: the same work in wider GEMMs) and accumulates the rest.
  const Machine m = load_machine("perlmutter");
  PlanInput in = searched("gpt2-124m", 1, 64);
  const GridShape one;
  PlanInput whole = in;
  whole.search_micro_batch = false;
  whole.micro_batch = 64;
  const Estimate all = estimate(whole, one, m);
  EXPECT_FALSE(all.valid);
  EXPECT_TRUE(all.reject.starts_with("does not fit")) << all.reject;
  const Estimate e = estimate(in, one, m);
  ASSERT_TRUE(e.valid) << e.reject;
  EXPECT_LT(e.micro_batch, 64);
  EXPECT_EQ(e.micro_batch * e.micro_batches, 64);
  EXPECT_LE(e.memory.total(), m.memory_bytes);
  whole.micro_batch = 2 * e.micro_batch;  // the next candidate
  EXPECT_TRUE(estimate(whole, one, m).reject.starts_with("does not fit"));
  // Nothing fits: the reason is the smallest micro-batch's, said so.
  PlanInput huge = searched("gpt-80b", 1, 64);
  const Estimate h = estimate(huge, one, m);
  EXPECT_FALSE(h.valid);
  EXPECT_NE(h.reject.find("does not fit"), std::string::npos);
  EXPECT_NE(h.reject.find("the smallest micro-batch, 1 sequences"), std::string::npos) << h.reject;
}

TEST(PlannerSearch, ReportsShowTheChosenMicroBatchPerGrid) {
  const Machine m = load_machine("perlmutter");
  const PlanInput in = searched("small", 8, 64);
  const auto p = plan(in, m);
  ASSERT_TRUE(p.front().valid);
  const std::string text = plan_text(in, m, p, 0, 5);
  EXPECT_NE(text.find("micro-batch chosen per grid"), std::string::npos);
  EXPECT_NE(text.find("micro x m"), std::string::npos);
  EXPECT_NE(text.find(micro_label(p.front())), std::string::npos);
  const auto j = plan_json(in, m, p);
  EXPECT_TRUE(j["run"]["micro_batch_searched"].get<bool>());
  const auto& g0 = j["grids"][0];
  EXPECT_EQ(g0["micro_batch"].get<int64_t>(), p.front().micro_batch);
  EXPECT_EQ(g0["micro_batch_per_replica"].get<int64_t>() * p.front().grid.z() * p.front().grid.d(),
            p.front().micro_batch);
  EXPECT_EQ(g0["micro_batches"].get<int64_t>(), p.front().micro_batches);
}

TEST(PlannerSearch, WeakScalingSeriesWithoutAMicroBatchPlansEachPointAtItsBest) {
  // `plan --scaling weak --model gpt-5b,... --global-batch 2048` without --micro-batch: each
  // point at its fastest micro-batch, as fast as the whole batch in one micro-batch (the best
  // fixed choice for this series), never the 2% MFU a small config micro-batch gave.
  ScalingSpec sp;
  sp.kind = ScalingKind::Weak;
  sp.ranks = {512, 1024};
  sp.model_names = {"gpt-5b", "gpt-10b"};
  for (const auto& n : sp.model_names) sp.models.push_back(planner_model(n));
  PlanInput& in = sp.base;
  in.model = sp.models[0];
  in.model_name = sp.model_names[0];
  in.seq = 2048;
  in.global_batch = 2048;
  in.search_micro_batch = true;
  in.precision = Precision::BF16;
  in.recompute = Recompute::Full;
  in.memory_model = MemoryModel::Reference;
  in.overlap = Overlap::Tensor;
  in.allow_pipeline = false;
  const Machine m = load_machine("perlmutter");
  const auto pts = scaling_curve(sp, m);
  ScalingSpec whole = sp;
  whole.base.search_micro_batch = false;
  whole.base.micro_batch = 2048;
  const auto ref = scaling_curve(whole, m);
  for (size_t i = 0; i < pts.size(); ++i) {
    ASSERT_TRUE(pts[i].valid && ref[i].valid);
    EXPECT_LE(pts[i].step, ref[i].step * (1 + 1e-12)) << pts[i].ranks;
    EXPECT_GT(pts[i].mfu, 0.3) << pts[i].ranks;
  }
  const auto j = scaling_json(sp, m, pts);
  EXPECT_TRUE(j["micro_batch_searched"].get<bool>());
  EXPECT_EQ(j["points"][0]["micro_batch"].get<int64_t>(), pts[0].estimate.micro_batch);
  EXPECT_NE(scaling_text(sp, m, pts).find("micro-batch chosen per point"), std::string::npos);
}

TEST(PlannerModels, ListTakesNamesAndTomlConfigs) {
  const std::string a = temp_path("a.toml"), b = temp_path("b.toml");
  std::ofstream(a) << "[model]\nname = \"small\"\nn_layer = 3\n";
  std::ofstream(b) << "[model]\nname = \"gpt2-124m\"\n[train]\nseq_len = 512\n";
  const auto list = planner_model_list(a + ",gpt-10b," + b);
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].model.n_layer, 3);
  EXPECT_EQ(list[0].model.n_embd, 512);
  EXPECT_EQ(list[0].name, std::filesystem::path(a).filename().string());
  EXPECT_EQ(list[1].name, "gpt-10b");
  EXPECT_EQ(list[1].model.n_embd, planner_model("gpt-10b").n_embd);
  EXPECT_EQ(list[2].model.n_embd, 768);
  // -s model.key=v applies to a TOML entry.
  EXPECT_EQ(planner_model_of(a, {"model.n_layer=5", "train.lr=1e-3"}).model.n_layer, 5);
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

TEST(PlannerModels, ListRefusesBadEntriesNamingThem) {
  const std::string bad = temp_path("bad.toml"), wrong = temp_path("wrong.toml");
  std::ofstream(bad) << "[model\nname = \n";
  std::ofstream(wrong) << "[model]\nn_embd = 100\nn_head = 3\n";
  expect_error([&] { planner_model_list("gpt-5b,nowhere.toml"); },
               {"entry 2 'nowhere.toml'", "does not exist"});
  expect_error([&] { planner_model_list("gpt-5b,a.tom"); },
               {"entry 2 'a.tom'", "unknown model", "TOML run config path"});
  expect_error([&] { planner_model_list("gpt-5b,,gpt-10b"); }, {"entry 2 is empty", "separated by commas"});
  expect_error([&] { planner_model_list("gpt-5b,gpt-10b,"); }, {"entry 3 is empty"});
  expect_error([&] { planner_model_list("gpt-5b," + bad); }, {"entry 2", "line"});
  expect_error([&] { planner_model_list(wrong + ",gpt-5b"); }, {"entry 1", "n_head"});
  std::filesystem::remove(bad);
  std::filesystem::remove(wrong);
}

TEST(PlannerModels, Llama405bIsLlama31sPublishedShape) {
  const ModelConfig c = planner_model("llama-405b");
  EXPECT_EQ(c.family, Family::Llama);
  EXPECT_EQ(c.n_layer, 126);
  EXPECT_EQ(c.n_embd, 16384);
  EXPECT_EQ(c.n_head, 128);
  EXPECT_EQ(c.n_kv_head, 8);
  EXPECT_EQ(c.ffn, 53248);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_FALSE(c.tie_embeddings);
  c.validate();
  // 405.8B parameters (Meta's "405B"): 126 x 3.19B per layer + two 2.1B embeddings.
  const double n = double(count_parameters(c));
  EXPECT_NEAR(n / 1e9, 405.85, 0.1);
  // Its fine-tune fits on Frontier: 1024 GCDs, 4096 tokens per sequence, bf16, full
  // recomputation, the micro-batch searched.
  PlanInput in = searched("llama-405b", 1024, 1024);
  in.seq = 4096;
  in.precision = Precision::BF16;
  in.recompute = Recompute::Full;
  const Machine fr = load_machine("frontier");
  in.allow_pipeline = true;
  const auto p = plan(in, fr);
  ASSERT_TRUE(p.front().valid) << p.front().reject;
  EXPECT_LE(p.front().memory.total(), fr.memory_bytes);
}

TEST(PlannerContention, MeasuredOverlapSlowdownSetsTheContendedFraction) {
  // compute.overlap_slowdown (Lee et al. 2025: 18.9% on A100, H100, MI250, MI210): compute beside
  // a collective takes 1 + s times as long, i.e. runs at 1 / (1 + s); the SMs' share alone is the
  // floor (the measurement includes them).
  Machine m = load_machine("perlmutter");
  EXPECT_DOUBLE_EQ(m.overlap_slowdown, 0.189);
  EXPECT_NEAR(m.contended_fraction(), 0.189 / 1.189, 1e-12);
  m.overlap_slowdown = 0;
  EXPECT_NEAR(m.contended_fraction(), 8.0 / 108.0, 1e-12);
  m.overlap_slowdown = 0.01;  // below the SM share: the SMs still count
  EXPECT_NEAR(m.contended_fraction(), 8.0 / 108.0, 1e-12);
  // Every shipped GPU file carries the one measured value; the CPU file does not.
  for (const char* n : {"perlmutter", "frontier", "alps", "dgx-a100", "h100-ib", "h200-ib"})
    EXPECT_DOUBLE_EQ(load_machine(n).overlap_slowdown, 0.189) << n;
  EXPECT_DOUBLE_EQ(load_machine("local").overlap_slowdown, 0.0);
  // The file round-trips it, and refuses a value outside [0, 1] naming the key.
  const std::string path = temp_path("slow.toml");
  Machine w = load_machine("perlmutter");
  std::ofstream(path) << machine_to_toml(w);
  EXPECT_DOUBLE_EQ(load_machine_file(path).overlap_slowdown, 0.189);
  w.overlap_slowdown = 1.5;
  expect_error([&] { w.validate(); }, {"compute.overlap_slowdown", "[0, 1]"});
  std::filesystem::remove(path);
  // In a plan: the same Z-sharded grid costs more with the measured slowdown than with the
  // SMs' share alone, by exactly the contention's difference.
  PlanInput in = searched("gpt2-124m", 8, 64);
  in.search_micro_batch = false;
  in.micro_batch_per_replica = 8;
  in.precision = Precision::BF16;
  in.overlap = Overlap::Tensor;
  Machine sm_only = load_machine("perlmutter");
  sm_only.overlap_slowdown = 0;
  const GridShape g = GridShape::xyzpd(1, 1, 8, 1, 1);
  const Estimate a = estimate(in, g, load_machine("perlmutter")), b = estimate(in, g, sm_only);
  ASSERT_TRUE(a.valid && b.valid);
  EXPECT_GT(a.contention, b.contention);
  EXPECT_NEAR(a.step - b.step, a.contention - b.contention, 1e-9 * a.step);
}

TEST(PlannerWhy, OneGridTermByTermValidOrRejected) {
  const Machine m = load_machine("perlmutter");
  PlanInput in = searched("gpt-5b", 512, 2048);
  in.precision = Precision::BF16;
  in.recompute = Recompute::Full;
  in.overlap = Overlap::Tensor;
  const Estimate e = estimate(in, GridShape::xyzpd(1, 1, 64, 1, 8), m);
  ASSERT_TRUE(e.valid) << e.reject;
  const std::string t = why_text(in, m, e);
  for (const char* part : {"1x1x64x1x8", "valid", "memory per rank", "activations", "micro-batch",
                           "GEMMs", "attention", "exposed communication", "contention", "optimizer",
                           "all-gather of layer weights (fwd)", "across nodes"})
    EXPECT_NE(t.find(part), std::string::npos) << part << "\n" << t;
  // A grid that does not fit says so and lists its memory items against the machine's, and
  // prints no step (it has none).
  PlanInput big = searched("gpt-80b", 4, 4);
  big.precision = Precision::BF16;
  const Estimate r = estimate(big, GridShape::xyzpd(1, 1, 1, 1, 4), m);
  ASSERT_FALSE(r.valid);
  const std::string rt = why_text(big, m, r);
  EXPECT_NE(rt.find("rejected: does not fit"), std::string::npos) << rt;
  EXPECT_NE(rt.find("of 40.0 GB: weights"), std::string::npos) << rt;
  EXPECT_EQ(rt.find("step "), std::string::npos) << rt;
}

TEST(PlannerMicroBatch, PerDataGroupIsDividedOverZ) {
  // AxoNN's --micro-batch-size: sequences per data-parallel group, each of its Gz depth ranks
  // taking 1/Gz of them (Megatron-AxoNN's input shape divides it by the depth size). With 16 per
  // group the whole job's micro-batch is 16 x Gd, a rank's 16 / Gz, and a grid whose Gz does not
  // divide 16 does not divide.
  const Machine m = load_machine("perlmutter");
  PlanInput in = searched("gpt-5b", 512, 2048);
  in.search_micro_batch = false;
  in.micro_batch_per_data_group = 16;
  in.precision = Precision::BF16;
  in.recompute = Recompute::Full;
  in.overlap = Overlap::Tensor;
  in.allow_context = false;
  const Estimate e = estimate(in, GridShape::xyzpd(1, 1, 8, 1, 64), m);
  ASSERT_TRUE(e.valid) << e.reject;
  EXPECT_EQ(e.micro_batch, 16 * 64);
  EXPECT_EQ(e.micro_batches, 2);                       // 2048 / (16 x 64)
  const Estimate y = estimate(in, GridShape::xyzpd(1, 4, 4, 1, 32), m);
  ASSERT_TRUE(y.valid) << y.reject;
  EXPECT_EQ(y.micro_batch, 16 * 32);                   // X and Y share the group's sequences
  const Estimate z32 = estimate(in, GridShape::xyzpd(1, 1, 32, 1, 16), m);
  EXPECT_FALSE(z32.valid);
  EXPECT_NE(z32.reject.find("does not divide"), std::string::npos) << z32.reject;
  // The same sequences per rank and accumulation as the whole-job form it stands for.
  PlanInput whole = in;
  whole.micro_batch_per_data_group = 0;
  whole.micro_batch = 16 * 64;
  EXPECT_DOUBLE_EQ(estimate(whole, GridShape::xyzpd(1, 1, 8, 1, 64), m).step, e.step);
  // One micro-batch form at a time, and none when it is searched.
  PlanInput two = in;
  two.micro_batch = 1024;
  expect_error([&] { two.validate(); }, {"exactly one", "--micro-batch-per-data-group"});
  PlanInput searched_too = in;
  searched_too.search_micro_batch = true;
  expect_error([&] { searched_too.validate(); }, {"not searched"});
}
