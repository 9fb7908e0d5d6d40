// The training loop end to end on a small prepared corpus: losses fall, a resumed run continues
// with exactly the losses of the uninterrupted one, and bad input stops with a clear message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/data/prepare.hpp"
#include "tetrad/tools/report.hpp"
#include "tetrad/train/trainer.hpp"
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using namespace tetrad;

namespace {

fs::path g_root;

// A synthetic corpus with real structure (a tiny grammar), so a model has something to learn.
std::string synthetic_corpus(int docs, uint64_t seed) {
  const char* subj[] = {"the king", "a shepherd", "the people", "my son", "the prophet", "a woman"};
  const char* verb[] = {"went up to", "spake unto", "looked upon", "came into", "blessed", "feared"};
  const char* obj[] = {"the city", "the mountain", "his brethren", "the temple", "the river", "the land"};
  Rng r(seed);
  std::ostringstream os;
  for (int d = 0; d < docs; ++d) {
    const int sentences = 3 + int(r.next_u64() % 5);
    for (int s = 0; s < sentences; ++s)
      os << subj[r.next_u64() % 6] << " " << verb[r.next_u64() % 6] << " " << obj[r.next_u64() % 6]
         << (s + 1 < sentences ? ", and " : ".\n");
    os << "\n";
  }
  return os.str();
}

class TrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_root = fs::temp_directory_path() / ("tetrad_train_test_" + std::to_string(getpid()));
    fs::create_directories(g_root);
    std::ofstream(g_root / "corpus.txt") << synthetic_corpus(400, 1);
    data::PrepareOptions p;
    p.inputs = {(g_root / "corpus.txt").string()};
    p.out_dir = (g_root / "data").string();
    p.vocab_size = 300;
    p.val_fraction = 0.1;
    std::ostringstream log;
    data::prepare_data(p, log);
  }
  static void TearDownTestSuite() { fs::remove_all(g_root); }

  static RunConfig tiny(const std::string& run) {
    RunConfig c = load_run_config("", {"model.name=tiny"});
    c.data_dir = (g_root / "data").string();
    c.run_dir = (g_root / run).string();
    c.train.micro_batch = 4;
    c.train.seq_len = 32;
    c.train.max_steps = 12;
    c.train.lr = 3e-3;
    c.train.warmup_steps = 2;
    c.train.eval_interval = 6;
    c.train.eval_batches = 2;
    c.train.checkpoint_interval = 6;
    c.train.grad_accum = 2;
    return c;
  }
  static TrainResult run(const RunConfig& c, bool resume = false) {
    TrainOptions o;
    o.resume = resume;
    o.quiet = true;
    o.peak_gflops = 100;  // skip measuring the machine in tests
    std::ostringstream log;
    return train(c, o, log);
  }
};

}  // namespace

TEST_F(TrainTest, LossFallsAndRunFolderIsComplete) {
  RunConfig c = tiny("basic");
  c.train.max_steps = 40;
  c.train.checkpoint_interval = 0;
  c.train.eval_interval = 20;
  TrainResult r = run(c);
  ASSERT_EQ(r.losses.size(), 40u);
  EXPECT_NEAR(r.losses.front(), std::log(512.0), 0.5);
  EXPECT_LT(r.losses.back(), r.losses.front() - 1.0);
  ASSERT_EQ(r.val_losses.size(), 2u);
  EXPECT_LT(r.val_losses.back(), r.losses.front());
  EXPECT_TRUE(fs::exists(c.run_dir + "/config.toml"));
  EXPECT_TRUE(fs::exists(r.last_checkpoint + "/meta.json"));  // a sharded checkpoint
  EXPECT_TRUE(fs::exists(r.last_checkpoint + "/shard_00000.bin"));
  EXPECT_TRUE(fs::exists(r.last_checkpoint + "/tokenizer.model"));
  // metrics.jsonl: one line per step and per validation, after the run's "start" line.
  std::ifstream m(c.run_dir + "/metrics.jsonl");
  int lines = 0;
  for (std::string l; std::getline(m, l);) ++lines;
  EXPECT_EQ(lines, 43);  // + the "start" event line
}

// Two processes' runs: with train.gemm_layouts = rule (tune times each run on its own and may
// choose another plan: the same sums in another order).
TEST_F(TrainTest, SameSeedSameLosses) {
  RunConfig a = tiny("det_a"), b = tiny("det_b");
  a.train.gemm_layouts = b.train.gemm_layouts = "rule";
  EXPECT_EQ(run(a).losses, run(b).losses);
}

TEST_F(TrainTest, ResumedRunContinuesExactly) {
  RunConfig c = tiny("full");
  TrainResult full = run(c);
  ASSERT_EQ(full.losses.size(), 12u);
  // Interrupted run: the same run folder as it was after step 6 (its step-6 checkpoint only).
  RunConfig r = tiny("resumed");
  fs::create_directories(r.run_dir + "/checkpoints");
  fs::copy(c.run_dir + "/checkpoints/step_000006", r.run_dir + "/checkpoints/step_000006",
           fs::copy_options::recursive);
  std::ofstream(r.run_dir + "/checkpoints/latest") << "step_000006\n";
  TrainResult rest = run(r, /*resume=*/true);
  EXPECT_EQ(rest.first_step, 6);
  ASSERT_EQ(rest.losses.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(rest.losses[i], full.losses[6 + i]) << "step " << 7 + i;
}

// bf16 with tuned GEMM layouts: the checkpoint keeps the plan, the resumed run runs it (said in
// its log) and continues bit-identically (the uninterrupted run's plan, whatever its own timing
// would choose). Where bf16 GEMMs are emulated, tune is the rule and the log says so.
TEST_F(TrainTest, ResumedTunedRunReusesTheCheckpointsPlan) {
  RunConfig c = tiny("tuned_full");
  c.train.precision = "bf16";
  c.train.gemm_layouts = "tune";
  TrainResult full = run(c);
  ASSERT_EQ(full.losses.size(), 12u);
  RunConfig r = c;
  r.run_dir = (g_root / "tuned_resumed").string();
  fs::create_directories(r.run_dir + "/checkpoints");
  fs::copy(c.run_dir + "/checkpoints/step_000006", r.run_dir + "/checkpoints/step_000006",
           fs::copy_options::recursive);
  std::ofstream(r.run_dir + "/checkpoints/latest") << "step_000006\n";
  TrainOptions o;
  o.resume = true;
  o.peak_gflops = 100;
  std::ostringstream log;
  TrainResult rest = train(r, o, log);
  ASSERT_EQ(rest.losses.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(rest.losses[i], full.losses[6 + i]) << "step " << 7 + i;
  const std::string text = log.str();
  if (kernels::native_bf16_matmul())
    EXPECT_NE(text.find("gemm layouts (checkpoint)"), std::string::npos) << text;
  else
    EXPECT_NE(text.find("gemm layouts: rule (tune: bf16 GEMMs are emulated"), std::string::npos) << text;
}

TEST_F(TrainTest, MissingDataFolderIsExplained) {
  RunConfig c = tiny("nodata");
  c.data_dir = (g_root / "does_not_exist").string();
  try {
    run(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tetrad prepare"), std::string::npos) << e.what();
  }
}

TEST_F(TrainTest, VocabularySmallerThanTheTokenizerIsRefused) {
  RunConfig c = tiny("smallvocab");
  c.model.vocab_size = 100;
  try {
    run(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.vocab_size"), std::string::npos) << e.what();
  }
}

TEST_F(TrainTest, NonFiniteStepsAreSkippedThenTheRunStopsWithTheLastCheckpointIntact) {
  RunConfig c = tiny("diverge");
  c.train.max_steps = 6;
  run(c);  // a good checkpoint at step 6
  c.train.max_steps = 12;
  c.train.lr = 1e30;  // the next update sends the weights to infinity
  c.train.grad_clip = 0;
  c.train.max_bad_steps = 3;
  try {
    run(c, /*resume=*/true);
    FAIL() << "a diverging run must stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 consecutive non-finite steps"), std::string::npos) << e.what();
  }
  std::ostringstream log;
  auto found = find_latest_checkpoint(c.run_dir, log);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 6);
  EXPECT_FALSE(checkpoint_problem(found->dir).has_value());
}

// The time breakdown (compute, exposed communication, waiting, optimizer, data) adds up to the
// measured step time within 5%, in the result and in metrics.jsonl; the trace is valid JSON.
TEST_F(TrainTest, TimeBreakdownAddsUpToTheStepTime) {
  RunConfig c = tiny("breakdown");
  c.train.max_steps = 6;
  c.train.checkpoint_interval = 0;
  c.train.eval_interval = 0;
  TrainOptions o;
  o.quiet = true;
  o.peak_gflops = 100;
  o.trace_path = c.run_dir + "/trace.json";
  o.trace_steps = 2;
  std::ostringstream log;
  TrainResult r = train(c, o, log);
  ASSERT_EQ(r.breakdowns.size(), 6u);
  // Compute is most of a step (nothing of it is booked elsewhere), and the phases add up to the
  // step, both judged on the median step: one step that the scheduler stalls for 100+ ms (seen on
  // a loaded 2-core machine: compute 0.0029 of 0.0097 s; once a stall in the glue between phases)
  // says nothing about the accounting. No step may book more than its own time (phases overlap in
  // the accounting), and a gap that every step has (a phase not booked) fails the median.
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  std::vector<double> compute_share, unbooked_share;
  for (size_t i = 1; i < r.breakdowns.size(); ++i) {
    const StepBreakdown& b = r.breakdowns[i];
    const double parts = b.compute + b.comm_exposed + b.wait + b.optimizer + b.data;
    EXPECT_GT(b.compute, 0.0) << "step " << i;
    EXPECT_GT(b.optimizer, 0.0);
    EXPECT_GT(b.data, 0.0);
    EXPECT_LE(parts, 1.05 * b.step) << "step " << i << ": parts " << parts << " s of " << b.step;
    compute_share.push_back(b.compute / b.step);
    unbooked_share.push_back(std::abs(b.step - parts) / b.step);
  }
  EXPECT_GT(median(compute_share), 0.5) << "median compute share of a step";
  EXPECT_LT(median(unbooked_share), 0.05) << "median share of a step booked to no phase";
  std::ifstream m(c.run_dir + "/metrics.jsonl");
  int steps = 0;
  std::vector<double> logged_unbooked;
  for (std::string l; std::getline(m, l);) {
    const auto j = nlohmann::json::parse(l);
    if (!j.contains("loss")) continue;
    ++steps;
    const double parts = j.at("t_compute_s").get<double>() + j.at("t_comm_exposed_s").get<double>() +
                         j.at("t_wait_s").get<double>() + j.at("t_optimizer_s").get<double>() +
                         j.at("t_data_s").get<double>();
    const double step = j.at("step_time_s").get<double>();
    EXPECT_LE(parts, 1.05 * step);
    logged_unbooked.push_back(std::abs(step - parts) / step);
    EXPECT_TRUE(j.contains("comm_hidden_fraction"));
  }
  EXPECT_EQ(steps, 6);
  if (!logged_unbooked.empty()) {
    EXPECT_LT(median(logged_unbooked), 0.05) << "metrics.jsonl: median unbooked share";
  }
  std::ifstream t(o.trace_path);
  nlohmann::json trace;
  ASSERT_NO_THROW(t >> trace);
  int gemms = 0;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("name").get<std::string>().rfind("gemm", 0) == 0) ++gemms;
  EXPECT_GT(gemms, 0);
}

// `tetrad report` on a real run folder: one HTML page with the loss curves (a point per step and
// per validation), speed charts, the time breakdown and the resolved config, fetching nothing.
TEST_F(TrainTest, ReportRendersFromARunFolderWithItsCurves) {
  RunConfig c = tiny("report");
  c.train.max_steps = 8;
  c.train.checkpoint_interval = 0;
  c.train.eval_interval = 4;
  TrainResult r = run(c);
  const std::string out = c.run_dir + "/report.html";
  write_run_report(c.run_dir, out);
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string html = ss.str();
  auto count = [&](const std::string& needle) {
    int n = 0;
    for (size_t p = html.find(needle); p != std::string::npos; p = html.find(needle, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(count("id=\"loss-chart\""), 1);
  EXPECT_EQ(count("id=\"tokens-chart\""), 1);
  EXPECT_EQ(count("id=\"mfu-chart\""), 1);
  EXPECT_EQ(count("id=\"breakdown\""), 1);
  // One marker per training step and per validation, titled with its value.
  EXPECT_EQ(count("<title>train loss step "), 8);
  EXPECT_EQ(count("<title>validation loss step "), 2);
  char last[64];
  std::snprintf(last, sizeof last, "train loss step 8: %.5g", r.losses.back());
  EXPECT_NE(html.find(last), std::string::npos) << "the last step's loss is on the curve";
  EXPECT_NE(html.find("grid <b id=\"grid\">1,1,1,1</b>"), std::string::npos);
  EXPECT_NE(html.find("[parallel]"), std::string::npos) << "the resolved config is shown";
  EXPECT_EQ(html.find("<script src"), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
  EXPECT_THROW(write_run_report(c.run_dir + "/nope", out + "2"), Error);
  EXPECT_EQ(count("id=\"exposed\""), 0) << "no trace, no exposed-communication table";
}

// The exposed communication of a trace, grouped by collective without the layer: per rank
// (2 ranks here), largest first, shares of the whole; only the compute track's communication
// events count (the communication tracks show transfers, hidden or not).
TEST(Report, ExposedCommunicationGroupsTheTracesWaitsByCollective) {
  const std::string dir = ::testing::TempDir() + "/tetrad_exposed_trace";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/trace.json";
  {
    std::ofstream f(path);
    f << R"({"traceEvents":[
      {"ph":"M","name":"process_name","pid":0,"tid":0,"args":{"name":"rank 0"}},
      {"ph":"X","pid":0,"tid":0,"name":"gemm qkv L0","ts":0,"dur":9000},
      {"ph":"X","pid":0,"tid":0,"name":"communication allgather L1","ts":1,"dur":3000},
      {"ph":"X","pid":0,"tid":0,"name":"communication allgather L2","ts":2,"dur":1000},
      {"ph":"X","pid":0,"tid":0,"name":"communication wait all","ts":3,"dur":2000},
      {"ph":"X","pid":0,"tid":1,"name":"allgather W L1","ts":1,"dur":50000},
      {"ph":"X","pid":1,"tid":0,"name":"communication allgather top","ts":1,"dur":1000},
      {"ph":"X","pid":1,"tid":0,"name":"communication L3","ts":4,"dur":1000},
      {"ph":"X","pid":1,"tid":0,"name":"communication wait all","ts":5,"dur":4000}]})";
  }
  int ranks = 0;
  const std::vector<ExposedComm> rows = exposed_communication(path, &ranks);
  EXPECT_EQ(ranks, 2);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].what, "wait all");  // 6 of the 12 ms, over 2 ranks
  EXPECT_NEAR(rows[0].seconds, 0.003, 1e-12);
  EXPECT_DOUBLE_EQ(rows[0].count, 1.0);
  EXPECT_NEAR(rows[0].share, 0.5, 1e-12);
  EXPECT_EQ(rows[1].what, "allgather");  // L1 and L2 together, not "allgather top"
  EXPECT_NEAR(rows[1].seconds, 0.002, 1e-12);
  EXPECT_DOUBLE_EQ(rows[1].count, 1.0);
  EXPECT_NEAR(rows[1].share, 1.0 / 3, 1e-12);
  std::vector<std::string> rest = {rows[2].what, rows[3].what};
  std::sort(rest.begin(), rest.end());
  EXPECT_EQ(rest, (std::vector<std::string>{"(unnamed)", "allgather top"}));
  {
    std::ofstream f(dir + "/bad.json");
    f << "{\"traceEvents\": 3}";
  }
  EXPECT_THROW(exposed_communication(dir + "/bad.json"), Error);
  EXPECT_THROW(exposed_communication(dir + "/missing.json"), Error);
}

// parallel.progress_thread = "auto": the helper thread only when every rank on the node has a
// core to spare for it; true / false as given; anything else refused.
TEST(ProgressThread, AutoTakesTheThreadOnlyWithACoreToSparePerRank) {
  const int cores = num_cores();
  EXPECT_TRUE(progress_thread_wins("true", 64, 64));
  EXPECT_FALSE(progress_thread_wins("false", 1, 1));
  EXPECT_EQ(progress_thread_wins("auto", 1, cores - 1), cores >= 2);
  EXPECT_FALSE(progress_thread_wins("auto", 1, cores));     // every core computes
  EXPECT_FALSE(progress_thread_wins("auto", cores, 1));     // one rank per core, 1 thread each
  if (cores >= 2) {
    EXPECT_TRUE(progress_thread_wins("auto", cores / 2, 1));
  }
  EXPECT_THROW(progress_thread_wins("sometimes", 1, 1), Error);
  OverlapConfig c;
  EXPECT_EQ(overlap_options(c, cores, 1).progress_thread, false);
  c.progress_thread = "true";
  EXPECT_EQ(overlap_options(c, cores, 1).progress_thread, true);
}
