// The pipeline schedules as pure functions: the order of forwards and backwards on each stage
// against the textbook schedules (PipeDream-Flush 1F1B; Megatron-LM's interleaved schedule, its
// Figure 4), every micro-batch and chunk run exactly once each way, and the bubble of the
// simulated schedule against (p - 1) / m and (p - 1) / (v m).
#include <gtest/gtest.h>

#include <set>

#include "tetrad/core/error.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/pipeline_schedule.hpp"
#include "tetrad/parallel/sharding.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {
constexpr auto k1F1B = PipelineSchedule::OneFOneB;
constexpr auto kInter = PipelineSchedule::Interleaved;
}  // namespace

TEST(PipelineSchedule, OneFOneBMatchesTheTextbookOrder) {
  // p = 4, m = 8: stage s warms up with p - s - 1 forwards, then one forward, one backward.
  EXPECT_EQ(to_string(pipeline_schedule(k1F1B, 4, 0, 8, 1), 1),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(to_string(pipeline_schedule(k1F1B, 4, 1, 8, 1), 1),
            "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(to_string(pipeline_schedule(k1F1B, 4, 3, 8, 1), 1),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Fewer micro-batches than stages: all forwards, then all backwards.
  EXPECT_EQ(to_string(pipeline_schedule(k1F1B, 4, 0, 2, 1), 1), "F0 F1 B0 B1");
  // One stage: forward and backward of each micro-batch in turn (plain gradient accumulation).
  EXPECT_EQ(to_string(pipeline_schedule(k1F1B, 1, 0, 3, 1), 1), "F0 B0 F1 B1 F2 B2");
}

TEST(PipelineSchedule, InterleavedMatchesMegatronFigure4) {
  // p = 4, v = 2, m = 8, device 1 (stage 0): micro-batches 1-4 through chunk 0, 1-4 through
  // chunk 1, 5 and 6 through chunk 0; then 1F1B; backwards start with the last chunk.
  EXPECT_EQ(to_string(pipeline_schedule(kInter, 4, 0, 8, 2), 2),
            "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 "
            "F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 "
            "B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0");
  // The last stage warms up with (v - 1) p forwards only.
  const auto last = pipeline_schedule(kInter, 4, 3, 8, 2);
  EXPECT_EQ(to_string({last.begin(), last.begin() + 6}, 2), "F0.0 F1.0 F2.0 F3.0 F0.1 B0.1");
}

TEST(PipelineSchedule, EveryMicroBatchAndChunkRunsOnceEachWay) {
  for (auto [s, p, m, v] : {std::tuple{k1F1B, 4, 8, 1}, {k1F1B, 2, 5, 1}, {k1F1B, 4, 3, 1},
                            {kInter, 2, 4, 2}, {kInter, 4, 8, 3}, {kInter, 2, 2, 4}}) {
    for (int st = 0; st < p; ++st) {
      std::set<std::tuple<bool, int, int>> seen;
      for (const PipeOp& op : pipeline_schedule(s, p, st, m, v)) {
        EXPECT_TRUE(seen.insert({op.forward, op.micro, op.chunk}).second);
        EXPECT_TRUE(op.micro >= 0 && op.micro < m && op.chunk >= 0 && op.chunk < v);
      }
      EXPECT_EQ(seen.size(), size_t(2 * m * v));
    }
  }
}

TEST(PipelineSchedule, BubbleIsTheTextbookFraction) {
  // Forward and backward of one chunk take t_f and t_b (a backward ~2 forwards).
  for (auto [p, m] : {std::pair{2, 4}, {4, 8}, {4, 16}, {8, 32}}) {
    const PipelineTiming t = simulate_pipeline(k1F1B, p, m, 1, 1.0, 2.0);
    EXPECT_NEAR(t.bubble(), double(p - 1) / m, 1e-12) << "p " << p << " m " << m;
    EXPECT_EQ(t.max_in_flight, std::min(p, m));  // 1F1B bounds the stashed activations by p
  }
  for (auto [p, m, v] : {std::tuple{2, 4, 2}, {4, 8, 2}, {4, 16, 4}}) {
    const PipelineTiming t = simulate_pipeline(kInter, p, m, v, 1.0 / v, 2.0 / v);
    EXPECT_NEAR(t.bubble(), double(p - 1) / (v * m), 1e-12) << "p " << p << " m " << m << " v " << v;
  }
}

// Unequal stages (the last one 1.5x slower, as a head and loss make it): the replay by op times
// gives the bubble worked out by hand. p = 2, m = 2, stage 0 t_f = 1, t_b = 2, stage 1 1.5 and 3:
// stage 0 runs F0 [0,1] F1 [1,2] B0 [5.5,7.5] B1 [10,12]; stage 1 F0 [1,2.5] B0 [2.5,5.5]
// F1 [5.5,7] B1 [7,10]. Idle / busy: 6/6 and 3/9; mean 2/3, against (p - 1)/m = 1/2 for equal
// stages.
TEST(PipelineSchedule, ReplayWithUnequalStagesGivesTheHandWorkedBubble) {
  const PipelineTiming t = simulate_pipeline(k1F1B, 2, 2, 1, [](int st, size_t, const PipeOp& op) {
    return (op.forward ? 1.0 : 2.0) * (st == 0 ? 1.0 : 1.5);
  });
  EXPECT_DOUBLE_EQ(t.makespan, 12.0);
  ASSERT_EQ(t.busy.size(), 2u);
  EXPECT_DOUBLE_EQ(t.busy[0], 6.0);
  EXPECT_DOUBLE_EQ(t.busy[1], 9.0);
  EXPECT_DOUBLE_EQ(t.ideal, 9.0);
  EXPECT_NEAR(t.mean_bubble(), 2.0 / 3.0, 1e-12);
  // Equal stages: the mean over stages is the textbook fraction too.
  EXPECT_NEAR(simulate_pipeline(k1F1B, 4, 8, 1, 1.0, 2.0).mean_bubble(), 3.0 / 8.0, 1e-12);
}

TEST(PipelineSchedule, RefusesWhatItCannotSchedule) {
  EXPECT_THROW(pipeline_schedule(kInter, 4, 0, 6, 2), Error);  // m not a multiple of p
  EXPECT_THROW(pipeline_schedule(k1F1B, 4, 0, 8, 2), Error);   // chunks need interleaving
  EXPECT_THROW(pipeline_schedule(k1F1B, 0, 0, 8, 1), Error);
  EXPECT_THROW(parse_pipeline_schedule("gpipe"), Error);
  EXPECT_EQ(parse_pipeline_schedule("interleaved"), kInter);
}

TEST(PipelineSchedule, StageOfLayerFollowsTheVirtualStages) {
  // 8 layers, p = 2, v = 2: virtual stages 0..3 take layers {0,1} {2,3} {4,5} {6,7} and run on
  // stages 0 1 0 1.
  const int expected[8] = {0, 0, 1, 1, 0, 0, 1, 1};
  for (int l = 0; l < 8; ++l) EXPECT_EQ(stage_of_layer(8, 2, 2, l), expected[l]) << l;
  for (int l = 0; l < 5; ++l) EXPECT_EQ(stage_of_layer(5, 2, 1, l), l < 3 ? 0 : 1) << l;
  EXPECT_THROW(stage_of_layer(4, 2, 1, 4), Error);
}

// A pipeline stage stores only its layers' shards (plus the top-level tensors, which every stage
// keeps): the stages' local sizes add up to the whole local shard plus (Gp - 1) extra copies of
// the top-level tensors, for 1F1B and interleaved layouts, alone and with X and Z.
TEST(PipelineSchedule, EachStageStoresOnlyItsLayers) {
  ModelConfig c = named_model("tiny");
  c.n_layer = 4;
  const ParamTable table = build_param_table(c);
  for (const auto& [xyz, p, v] : {std::tuple{GridShape{1, 1, 1, 1, 1}, 2, 1},
                                  std::tuple{GridShape{1, 1, 1, 1, 1}, 4, 1},
                                  std::tuple{GridShape{1, 1, 1, 1, 1}, 2, 2},
                                  std::tuple{GridShape{2, 1, 2, 1, 1}, 2, 2}}) {
    GridShape g = xyz;
    const ShardPlan whole = ShardPlan::build(c, table, g, GridCoord{});
    int64_t top = 0;
    for (const TensorShard& t : whole.tensors)
      if (t.spec->layer < 0) top += t.shard_numel;
    g.p = p;
    int64_t sum = 0;
    for (int s = 0; s < p; ++s) {
      GridCoord at;
      at.p = s;
      const ShardPlan plan = ShardPlan::build(c, table, g, at, v);
      ASSERT_EQ(plan.tensors.size(), whole.tensors.size());
      int64_t expect_total = 0;
      for (size_t i = 0; i < plan.tensors.size(); ++i) {
        const TensorShard& t = plan.tensors[i];
        const bool mine = t.spec->layer < 0 || stage_of_layer(c.n_layer, p, v, t.spec->layer) == s;
        EXPECT_EQ(t.stored, mine) << t.spec->name << " stage " << s;
        EXPECT_EQ(t.shard_numel, mine ? whole.tensors[i].shard_numel : 0) << t.spec->name;
        EXPECT_EQ(t.offset, expect_total) << t.spec->name;  // stored shards packed in table order
        expect_total += t.shard_numel;
      }
      EXPECT_EQ(plan.local_total, expect_total);
      EXPECT_LT(plan.local_total, whole.local_total);
      sum += plan.local_total;
    }
    EXPECT_EQ(sum, whole.local_total + (p - 1) * top) << g.to_string() << " v " << v;
  }
  GridShape g{1, 1, 1, 1, 4};
  EXPECT_THROW(ShardPlan::build(c, table, g, GridCoord{}, 2), Error);  // 8 virtual stages, 4 layers
}
