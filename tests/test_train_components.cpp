// The trainer's components that are pure functions, tested without MPI, data or a device: the
// run plan resolver (train/run_plan), the checkpointer's health and pruning record
// (train/checkpointer), the metrics log's records (train/metrics_log) and the stall hook's
// parsing (train/stop_control).
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <set>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "tetrad/backend/backend.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/train/auto_grid.hpp"
#include "tetrad/train/checkpointer.hpp"
#include "tetrad/train/metrics_log.hpp"
#include "tetrad/train/run_plan.hpp"
#include "tetrad/train/stop_control.hpp"

namespace tetrad {
namespace {

RunConfig config(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "model.name=tiny");
  return load_run_config("", overrides);
}

Launch launch(int world) {
  Launch l;
  l.world = world;
  l.ranks_per_node = world;
  l.threads = 1;
  return l;
}

TEST(RunPlan, OneRankSplitsNothing) {
  const RunConfig c = config({"train.micro_batch=4", "train.seq_len=32", "train.grad_accum=3",
                              "train.precision=\"fp32\""});
  const RunPlan p = resolve_run_plan(c, launch(1), backend::cpu_backend());
  EXPECT_EQ(p.grid, parallel::GridShape{});
  EXPECT_TRUE(p.grid_why.empty());
  EXPECT_EQ(p.replicas, 1);
  EXPECT_EQ(p.local_batch, 4);
  EXPECT_EQ(p.seq_len, 32);
  EXPECT_EQ(p.tokens_per_step, 4 * 32 * 3);
  EXPECT_FALSE(p.bf16());
  EXPECT_EQ(p.model.precision, backend::Precision::FP32);
  EXPECT_FALSE(p.model.attention_precision.has_value());
  EXPECT_EQ(p.model.gemm_layouts, parallel::GemmLayouts::Rule);  // fp32: one layout
  EXPECT_EQ(p.model.device, nullptr);
}

TEST(RunPlan, TheMicroBatchIsSplitOverZAndD) {
  const RunConfig c = config({"train.micro_batch=8", "parallel.grid=\"1,1,2,2\""});
  const RunPlan p = resolve_run_plan(c, launch(4), backend::cpu_backend());
  EXPECT_EQ(p.grid.z(), 2);
  EXPECT_EQ(p.grid.d(), 2);
  EXPECT_EQ(p.replicas, 4);
  EXPECT_EQ(p.local_batch, 2);
  EXPECT_EQ(p.tokens_per_step, int64_t(8) * c.train.seq_len * c.train.grad_accum);
}

TEST(RunPlan, RefusesWhatTheLaunchOrGridCannotRun) {
  // A grid that is not the rank count.
  tetrad_test::expect_error(
      [&] { resolve_run_plan(config({"parallel.grid=\"2,1,1,1\""}), launch(1), backend::cpu_backend()); },
      {});
  // A micro-batch the Z x D ranks cannot split.
  tetrad_test::expect_error(
      [&] {
        resolve_run_plan(config({"train.micro_batch=3", "parallel.grid=\"1,1,1,2\""}), launch(2),
                         backend::cpu_backend());
      },
      {"must be divisible by Gz x Gd = 2"});
}

TEST(RunPlan, SettingsBecomeTheModelsOptions) {
  const RunConfig c = config({"train.precision=\"bf16\"", "train.attention_precision=\"fp32\"",
                              "train.recompute=\"full\"", "train.grad_comm_precision=\"bf16\"",
                              "parallel.zero=1", "parallel.grid=\"1,1,1,2\"",
                              "parallel.progress_thread=\"false\"",
                              "parallel.overlap_backward_allreduce=true"});
  const RunPlan p = resolve_run_plan(c, launch(2), backend::cpu_backend());
  EXPECT_TRUE(p.bf16());
  ASSERT_TRUE(p.model.attention_precision.has_value());
  EXPECT_EQ(*p.model.attention_precision, backend::Precision::FP32);
  EXPECT_EQ(p.model.recompute, parallel::Recompute::Full);
  EXPECT_TRUE(p.model.grad_comm_bf16);
  EXPECT_EQ(p.model.zero, 1);
  EXPECT_TRUE(p.model.overlap.backward_allreduce);
  EXPECT_FALSE(p.model.overlap.progress_thread);
  EXPECT_FALSE(p.layouts_why.empty());
}

// The config's settings are resolved once (resolve_settings): the config's validation is that
// resolution, the run plan starts from it, and a config built by hand (as `tetrad bench` builds
// one from its flags) is refused by the same checks with the same messages.
TEST(RunPlan, ValidationIsTheSettingsResolution) {
  const RunSettings s = resolve_settings(
      config({"train.recompute=\"selective\"", "parallel.zero=2", "parallel.schedule=\"interleaved\"",
              "parallel.virtual_stages=2", "parallel.grid=\"1,1,1,2,1\"", "model.n_layer=4",
              "train.attention_precision=\"bf16\"", "train.gemm_layouts=\"rule\"",
              "parallel.sparse_embedding_grad=false", "train.precision=\"auto\""}));
  EXPECT_EQ(s.model.recompute, parallel::Recompute::Selective);
  EXPECT_EQ(s.model.zero, 2);
  EXPECT_EQ(s.schedule, parallel::PipelineSchedule::Interleaved);
  EXPECT_EQ(s.model.virtual_stages, 2);
  EXPECT_FALSE(s.model.sparse_embedding_grad);
  ASSERT_TRUE(s.model.attention_precision.has_value());
  EXPECT_EQ(*s.model.attention_precision, backend::Precision::BF16);
  EXPECT_EQ(s.gemm_layouts, "rule");
  EXPECT_TRUE(s.model.gemm_layout_plan.empty());
  EXPECT_EQ(s.precision, "auto");
  ASSERT_TRUE(s.grid.has_value());
  EXPECT_EQ(s.grid->p(), 2);
  EXPECT_FALSE(resolve_settings(config({"parallel.grid=\"auto\""})).grid.has_value());
  EXPECT_FALSE(resolve_settings(config({})).grid.has_value());
  // Each bad setting, through the config's loader and on a config built by hand.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"train.recompute=\"most\"", "train.recompute must be"},
      {"parallel.zero=3", "parallel.zero must be 0, 1 or 2"},
      {"parallel.schedule=\"gpipe\"", "parallel.schedule must be"},
      {"parallel.virtual_stages=2", "needs parallel.schedule = \"interleaved\""},
      {"train.attention_precision=\"fp16\"", "train.attention_precision = \"fp16\""},
      {"train.gemm_layouts=\"fast\"", "train.gemm_layouts = \"fast\""},
      {"train.grad_comm_precision=\"fp8\"", "train.grad_comm_precision = \"fp8\""},
      {"train.device=\"tpu\"", "train.device: expected"}};
  for (const auto& [set, message] : bad) {
    tetrad_test::expect_error([&] { config({set}); }, {message});
    RunConfig by_hand = config({});
    if (set.starts_with("train.recompute")) by_hand.train.recompute = "most";
    if (set.starts_with("parallel.zero")) by_hand.zero = 3;
    if (set.starts_with("parallel.schedule")) by_hand.schedule = "gpipe";
    if (set.starts_with("parallel.virtual_stages")) by_hand.virtual_stages = 2;
    if (set.starts_with("train.attention_precision")) by_hand.train.attention_precision = "fp16";
    if (set.starts_with("train.gemm_layouts")) by_hand.train.gemm_layouts = "fast";
    if (set.starts_with("train.grad_comm_precision")) by_hand.train.grad_comm_precision = "fp8";
    if (set.starts_with("train.device")) by_hand.train.device = "tpu";
    tetrad_test::expect_error([&] { resolve_settings(by_hand); }, {message});
    tetrad_test::expect_error([&] { resolve_run_plan(by_hand, launch(1), backend::cpu_backend()); },
                              {message});
  }
  // An explicit layer split that does not fit the named pipeline grid.
  tetrad_test::expect_error(
      [&] { config({"parallel.grid=\"1,1,1,2,1\"", "parallel.pipeline_layers=\"1,1,1\""}); }, {});
}

// What the plan resolved is what the planner is asked (plan_input_of: --grid auto, the memory
// check, `tetrad plan` on a config) and what `bench` builds its models with: one resolution.
TEST(RunPlan, ThePlannerQueryIsThePlansSettings) {
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{"train.precision=\"auto\""},
        {"train.precision=\"bf16\"", "train.recompute=\"full\"", "parallel.zero=1"},
        {"parallel.schedule=\"interleaved\"", "parallel.virtual_stages=2", "model.n_layer=4",
         "parallel.grid=\"1,1,1,2,1\"", "parallel.pipeline_layers=\"balanced\""}}) {
    const RunConfig c = config(sets);
    const int world = resolve_settings(c).grid ? resolve_settings(c).grid->size() : 1;
    const RunPlan p = resolve_run_plan(c, launch(world), backend::cpu_backend());
    const planner::PlanInput in = plan_input_of(c, world, backend::cpu_backend());
    EXPECT_EQ(in.precision, p.model.precision);
    EXPECT_EQ(run_precision(c, backend::cpu_backend()).precision, p.model.precision);
    EXPECT_EQ(in.recompute, p.model.recompute);
    EXPECT_EQ(in.zero, p.model.zero);
    EXPECT_EQ(in.virtual_stages, p.model.virtual_stages);
    EXPECT_EQ(in.pipeline_layers, p.model.pipeline_layers);
    EXPECT_EQ(in.schedule, resolve_settings(c).schedule);
    EXPECT_EQ(in.sparse_embedding_grad, p.model.sparse_embedding_grad);
  }
}

// A pipeline grid's layer split is resolved with the plan (named or chosen), as the model and the
// planner resolve it; none without a pipeline axis.
TEST(RunPlan, ThePipelinesLayerSplit) {
  const RunConfig c = config({"model.n_layer=4", "parallel.grid=\"1,1,1,2,1\"",
                              "parallel.pipeline_layers=\"3,1\""});
  const RunPlan p = resolve_run_plan(c, launch(2), backend::cpu_backend());
  EXPECT_EQ(p.layer_split, parallel::LayerSplit::from_counts({3, 1}, 4));
  EXPECT_EQ(p.layer_split,
            parallel::resolve_layer_split("3,1", c.model, c.train.seq_len, 2, 1));
  EXPECT_TRUE(resolve_run_plan(config({}), launch(1), backend::cpu_backend()).layer_split.bounds.empty());
}

TEST(CheckpointHealth, MeanOfTheLastTwentyStepsJudgedAgainstTheVocabularyAndTheBest) {
  EXPECT_FALSE(loss_record({}, INFINITY, 100).known);
  std::vector<double> losses(30, 9.0);
  for (int i = 10; i < 30; ++i) losses[size_t(i)] = 2.0;  // the last 20
  LossRecord r = loss_record(losses, INFINITY, 100);
  EXPECT_TRUE(r.known);
  EXPECT_DOUBLE_EQ(r.loss, 2.0);
  EXPECT_TRUE(r.healthy);
  EXPECT_FALSE(loss_record(losses, 0.9, 100).healthy);   // more than twice the best
  EXPECT_TRUE(loss_record(losses, 1.0, 100).healthy);    // exactly twice: still healthy
  // No better than a uniform guess over 5 tokens plus one nat: unhealthy.
  EXPECT_FALSE(loss_record({std::log(5.0) + 1.01}, INFINITY, 5).healthy);
  // Non-finite losses are left out of the mean; none finite: unknown loss, unhealthy.
  r = loss_record({NAN, 3.0, INFINITY}, INFINITY, 100);
  EXPECT_DOUBLE_EQ(r.loss, 3.0);
  r = loss_record({NAN}, INFINITY, 100);
  EXPECT_TRUE(r.known);
  EXPECT_TRUE(std::isnan(r.loss));
  EXPECT_FALSE(r.healthy);
}

TEST(CheckpointHealth, RecordKeepsTheBestHealthyLoss) {
  double best = INFINITY;
  nlohmann::json h = health_record({}, best, 100);
  EXPECT_TRUE(h.empty());  // no step taken, no best: nothing recorded
  h = health_record({3.0}, best, 100);
  EXPECT_EQ(h["loss"], 3.0);
  EXPECT_EQ(h["healthy"], true);
  EXPECT_EQ(h["best_loss"], 3.0);
  EXPECT_EQ(best, 3.0);
  h = health_record({7.0}, best, 100);  // more than twice the best: unhealthy, best kept
  EXPECT_EQ(h["healthy"], false);
  EXPECT_EQ(h["best_loss"], 3.0);
  EXPECT_EQ(best, 3.0);
  h = health_record({NAN}, best, 100);
  EXPECT_TRUE(h["loss"].is_null());
  EXPECT_EQ(h["healthy"], false);
}

std::set<std::string> keys(const nlohmann::json& j) {
  std::set<std::string> k;
  for (auto it = j.begin(); it != j.end(); ++it) k.insert(it.key());
  return k;
}

TEST(MetricsLogSchema, EachRecordHasItsKeys) {
  EXPECT_EQ(start_record(5, true, 100).dump(),
            R"({"event":"start","max_steps":100,"resumed":true,"step":5})");
  EXPECT_EQ(skipped_record(7).dump(), R"({"skipped":true,"step":7})");
  EXPECT_EQ(val_record(8, 2.5).dump(), R"({"step":8,"val_loss":2.5})");
  StepMetrics m;
  m.step = 3;
  m.loss = 4.25;
  m.peak_name = "fp32 FMA peak (given)";
  m.time.step = 2;
  m.time.comm_exposed = 0.5;
  m.time.comm_issued = 1;
  const std::set<std::string> step_keys = {
      "step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mfu_peak", "mfu_peak_gflops",
      "mfu_attention", "step_time_s", "elapsed_s", "dropped_fraction", "t_compute_s", "t_comm_exposed_s",
      "t_wait_s", "t_optimizer_s", "t_data_s", "t_comm_issued_s", "comm_hidden_fraction"};
  nlohmann::json r = step_record(m);
  EXPECT_EQ(keys(r), step_keys);
  EXPECT_EQ(r["step"], 3);
  EXPECT_EQ(r["loss"], 4.25);
  EXPECT_EQ(r["step_time_s"], 2.0);
  EXPECT_EQ(r["comm_hidden_fraction"], 0.5);
  EXPECT_EQ(r["mfu_peak"], "fp32 FMA peak (given)");
  EXPECT_EQ(r["mfu_attention"], "causal");  // the planner's count: causal attention as half
  m.report_hfu = true;  // with recomputation
  m.hfu = 0.25;
  r = step_record(m);
  EXPECT_EQ(keys(r).size(), step_keys.size() + 1);
  EXPECT_EQ(r["hfu"], 0.25);
}

TEST(MetricsLogSchema, AClosedLogWritesNothing) {
  MetricsLog log;
  EXPECT_FALSE(log.is_open());
  log.write(val_record(1, 1.0));  // a rank other than 0: no file, no error
}

TEST(MetricsLogSchema, AnUnwritableLogNamesTheLastCheckpoint) {
  MetricsLog log;
  const std::string last = "/x/checkpoints/step_00000010";
  log.open("/nonexistent/tetrad_no_such_dir", &last);
  tetrad_test::expect_error([&] { log.write(val_record(1, 1.0)); }, {"step_00000010) is intact"});
}

TEST(StopControl, StallHookParsesRankAndStep) {
  EXPECT_FALSE(stall_hook(""));
  EXPECT_FALSE(stall_hook("garbage"));
  const StepHook h = stall_hook("1:5");
  ASSERT_TRUE(h);
  h(0, 5);  // another rank: returns
  h(1, 4);  // another step: returns
  EXPECT_NE(StopControl::stop_line(SIGTERM, 12).find("received SIGTERM: writing a final "
                                                     "checkpoint and stopping at step 12"),
            std::string::npos);
}

}  // namespace
}  // namespace tetrad
