// The pipeline schedules as pure functions: the order of forwards and backwards on each stage
// against the textbook schedules (PipeDream-Flush 1F1B; Megatron-LM's interleaved schedule, its
// Figure 4), every micro-batch and chunk run exactly once each way, and the bubble of the
// simulated schedule against (p - 1) / m and (p - 1) / (v m).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>

#include "tetrad/core/error.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/layer_split.hpp"
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

TEST(LayerSplit, EvenSplitGivesTheRemainderToTheFirstStages) {
  // 8 layers, p = 2, v = 2: virtual stages 0..3 take layers {0,1} {2,3} {4,5} {6,7} and run on
  // stages 0 1 0 1.
  const LayerSplit s8 = LayerSplit::even(8, 4);
  EXPECT_EQ(s8.counts(), (std::vector<int>{2, 2, 2, 2}));
  const int expected[8] = {0, 0, 1, 1, 0, 0, 1, 1};
  for (int l = 0; l < 8; ++l) EXPECT_EQ(s8.stage_of(l, 2), expected[l]) << l;
  const LayerSplit s5 = LayerSplit::even(5, 2);
  EXPECT_EQ(s5.layers(0), (std::pair{0, 3}));  // the first stages take the remainder
  EXPECT_EQ(s5.layers(1), (std::pair{3, 5}));
  for (int l = 0; l < 5; ++l) EXPECT_EQ(s5.stage_of(l, 2), l < 3 ? 0 : 1) << l;
  EXPECT_THROW(LayerSplit::even(4, 2).stage_of(4, 2), Error);
  EXPECT_THROW(LayerSplit::even(3, 4), Error);  // a virtual stage would get no layer
}

TEST(LayerSplit, ExplicitCountsAreCheckedAndNamed) {
  ModelConfig c = named_model("tiny");
  c.n_layer = 6;
  const LayerSplit s = resolve_layer_split("3, 1,1,1", c, 16, 2, 2);
  EXPECT_EQ(s.counts(), (std::vector<int>{3, 1, 1, 1}));
  EXPECT_EQ(s.to_string(), "3,1,1,1");
  // Virtual stages 0 (layers 0-2) and 2 (layer 4) on stage 0; 1 (layer 3) and 3 (layer 5) on 1.
  const int stage[6] = {0, 0, 0, 1, 0, 1};
  for (int l = 0; l < 6; ++l) EXPECT_EQ(s.stage_of(l, 2), stage[l]) << l;
  EXPECT_EQ(resolve_layer_split("even", c, 16, 2, 1), LayerSplit::even(6, 2));
  auto message = [&](const std::string& spec, int p, int v) -> std::string {
    try {
      resolve_layer_split(spec, c, 16, p, v);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  // Wrong length: names the expected count (Gp x v) and the sum.
  EXPECT_NE(message("3,3", 2, 2).find("expected one per virtual stage: Gp x "
                                      "parallel.virtual_stages = 2 x 2 = 4"), std::string::npos)
      << message("3,3", 2, 2);
  // Wrong sum, a stage without layers, bad syntax.
  EXPECT_NE(message("4,3", 2, 1).find("sum to 7, expected model.n_layer = 6"), std::string::npos)
      << message("4,3", 2, 1);
  EXPECT_NE(message("6,0", 2, 1).find("needs at least 1"), std::string::npos);
  for (const char* bad : {"", "3,,3", "3,3,", "three,3", "-1,7", "uneven"})
    EXPECT_NE(message(bad, 2, 1).find("expected \"even\", \"balanced\" or a comma list"),
              std::string::npos)
        << "'" << bad << "': " << message(bad, 2, 1);
  EXPECT_THROW(check_layer_split_spec("3,x"), Error);
  EXPECT_NO_THROW(check_layer_split_spec("balanced"));
}

// The smallest busiest-stage cost over every contiguous split with >= 1 layer per stage.
double brute_force_bottleneck(int L, int V, const StageCosts& costs) {
  double best = 1e300;
  std::vector<int> counts(size_t(V), 1);
  std::function<void(int, int)> place = [&](int j, int left) {
    if (j == V - 1) {
      counts[size_t(j)] = left;
      const auto c = virtual_stage_costs(LayerSplit::from_counts(counts, L), costs);
      best = std::min(best, *std::max_element(c.begin(), c.end()));
      return;
    }
    for (int n = 1; n <= left - (V - 1 - j); ++n) {
      counts[size_t(j)] = n;
      place(j + 1, left - n);
    }
  };
  place(0, L);
  return best;
}

TEST(LayerSplit, BalancedMinimisesTheBusiestVirtualStage) {
  // A head worth 1.15 layers (the small configuration's ratio): 12 layers over 2 stages go 7 | 5
  // (7 vs 6.15 layer-costs; the even 6 | 6 would make the last stage 7.15).
  const StageCosts head_heavy{1.0, 0.01, 1.15};
  EXPECT_EQ(balanced_split(12, 2, 1, head_heavy).counts(), (std::vector<int>{7, 5}));
  // Interleaved, p = v = 2: every split with a busiest virtual stage of 4 layers is as good on
  // that count; the ranks (virtual stages 0 + 2 and 1 + 3) decide: 3,3,4,2 gives them 7.01 and
  // 6.15 where 3,4,3,2 would give 6.01 and 7.15.
  EXPECT_EQ(balanced_split(12, 2, 2, head_heavy).counts(), (std::vector<int>{3, 3, 4, 2}));
  // Against exhaustive search on random costs: the same bottleneck, every stage >= 1 layer.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.0, 3.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int L = 2 + int(rng() % 9), v = 1 + int(rng() % 2), p = 1 + int(rng() % (L / v));
    const int V = p * v;
    const StageCosts costs{0.1 + u(rng), u(rng) * (trial % 3 == 0 ? 0 : 1), u(rng) * 4};
    const LayerSplit s = balanced_split(L, p, v, costs);
    ASSERT_EQ(s.virtual_stages(), V);
    ASSERT_EQ(s.n_layer(), L);
    for (int n : s.counts()) ASSERT_GE(n, 1) << s.to_string();
    const auto c = virtual_stage_costs(s, costs);
    EXPECT_NEAR(*std::max_element(c.begin(), c.end()), brute_force_bottleneck(L, V, costs), 1e-12)
        << "L " << L << " V " << V << " split " << s.to_string();
  }
  // Equal layers and free ends: the balanced split is the even one's counts in some order; with
  // ties broken towards the most even, it has the even split's counts.
  const LayerSplit flat = balanced_split(10, 4, 1, StageCosts{1.0, 0.0, 0.0});
  auto sorted = flat.counts();
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int>{2, 2, 3, 3}));
  // As many stages as layers: one each, whatever the costs.
  EXPECT_EQ(balanced_split(4, 2, 2, head_heavy).counts(), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_THROW(balanced_split(3, 4, 1, head_heavy), Error);
}

TEST(LayerSplit, BalancedOnTheSmallModelPutsFewerLayersOnTheHeadStage) {
  ModelConfig c = named_model("small");
  c.n_layer = 12;  // as bench/pipeline.sh runs it
  const StageCosts costs = stage_costs(c, c.max_seq);
  // The cost model: a layer's GEMM weights at 6 FLOPs each plus attention 12 C T; the head 6 C V
  // plus the loss; the embedding a few FLOPs per hidden element.
  EXPECT_GT(costs.head, 6.0 * c.n_embd * c.vocab_size);
  EXPECT_LT(costs.embedding, costs.layer / 100);
  for (int p : {2, 4}) {
    const LayerSplit s = resolve_layer_split("balanced", c, c.max_seq, p, 1);
    const auto counts = s.counts();
    // The head's stage gets fewer layers than the even split gives it (12 / p).
    EXPECT_LT(counts.back(), c.n_layer / p) << "p " << p << ": " << s.to_string();
    const auto bal = virtual_stage_costs(s, costs);
    const auto even = virtual_stage_costs(LayerSplit::even(c.n_layer, p), costs);
    EXPECT_LE(*std::max_element(bal.begin(), bal.end()), *std::max_element(even.begin(), even.end()));
  }
}

// simulate_pipeline with unequal stages: the slow stage sets the pace. 1F1B, p = 2, m = 4, the
// last stage twice as slow (its head): it runs without a gap once its first input arrives, so
// the step is stage 0's first forward + stage 1's m (t_f + t_b) + stage 0's last backward.
TEST(PipelineSchedule, SimulationWithUnequalStagesFollowsTheSlowestStage) {
  const double tf[2] = {1.0, 2.0}, tb[2] = {2.0, 4.0};
  const int m = 4;
  const PipelineTiming t = simulate_pipeline(
      k1F1B, 2, m, 1, [&](int st, size_t, const PipeOp& op) { return op.forward ? tf[st] : tb[st]; });
  EXPECT_DOUBLE_EQ(t.makespan, tf[0] + m * (tf[1] + tb[1]) + tb[0]);
  EXPECT_DOUBLE_EQ(t.ideal, m * (tf[1] + tb[1]));  // the busiest stage
  ASSERT_EQ(t.busy.size(), 2u);
  EXPECT_DOUBLE_EQ(t.busy[0], m * (tf[0] + tb[0]));
  // Mean idle-over-busy: stage 0 idles most of the step.
  const double idle0 = (t.makespan - t.busy[0]) / t.busy[0], idle1 = (t.makespan - t.busy[1]) / t.busy[1];
  EXPECT_DOUBLE_EQ(t.mean_bubble(), (idle0 + idle1) / 2);
  // Balancing the same work (equal stages of 1.5 / 3) gives the textbook bubble (p - 1) / m.
  const PipelineTiming even = simulate_pipeline(k1F1B, 2, m, 1, 1.5, 3.0);
  EXPECT_NEAR(even.bubble(), 1.0 / m, 1e-12);
  EXPECT_LT(even.makespan, t.makespan);
}

// A pipeline stage stores only its layers' shards (plus the top-level tensors, which every stage
// keeps): the stages' local sizes add up to the whole local shard plus (Gp - 1) extra copies of
// the top-level tensors, for 1F1B and interleaved layouts, alone and with X and Z.
TEST(PipelineSchedule, EachStageStoresOnlyItsLayers) {
  ModelConfig c = named_model("tiny");
  c.n_layer = 4;
  const ParamTable table = build_param_table(c);
  for (const auto& [xyz, p, v] : {std::tuple{GridShape::xyzpd(1, 1, 1, 1, 1), 2, 1},
                                  std::tuple{GridShape::xyzpd(1, 1, 1, 1, 1), 4, 1},
                                  std::tuple{GridShape::xyzpd(1, 1, 1, 1, 1), 2, 2},
                                  std::tuple{GridShape::xyzpd(2, 1, 2, 1, 1), 2, 2}}) {
    GridShape g = xyz;
    const ShardPlan whole = ShardPlan::build(c, table, g, GridCoord{});
    int64_t top = 0;
    for (const TensorShard& t : whole.tensors)
      if (t.spec->layer < 0) top += t.shard_numel;
    g[Axis::P] = p;
    int64_t sum = 0;
    for (int s = 0; s < p; ++s) {
      GridCoord at;
      at[Axis::P] = s;
      const LayerSplit split = LayerSplit::even(c.n_layer, p * v);
      const ShardPlan plan = ShardPlan::build(c, table, g, at, split);
      ASSERT_EQ(plan.tensors.size(), whole.tensors.size());
      int64_t expect_total = 0;
      for (size_t i = 0; i < plan.tensors.size(); ++i) {
        const TensorShard& t = plan.tensors[i];
        const bool mine = t.spec->layer < 0 || split.stage_of(t.spec->layer, p) == s;
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
  GridShape g = GridShape::xyzpd(1, 1, 1, 4, 1);
  EXPECT_THROW(LayerSplit::even(c.n_layer, 8), Error);  // 8 virtual stages, 4 layers
  // A split that does not fit the grid: 3 virtual stages on Gp = 2, or another layer count.
  g[Axis::P] = 2;
  EXPECT_THROW(ShardPlan::build(c, table, g, GridCoord{}, LayerSplit::from_counts({2, 1, 1}, 4)),
               Error);
  EXPECT_THROW(ShardPlan::build(c, table, g, GridCoord{}, LayerSplit::from_counts({3, 2}, 5)), Error);
}

// An uneven split stores each layer on the stage the split names: 3,1 puts layers 0-2 on
// stage 0 and layer 3 on stage 1.
TEST(PipelineSchedule, AnUnevenSplitStoresTheLayersWhereTheSplitSays) {
  ModelConfig c = named_model("tiny");
  c.n_layer = 4;
  const ParamTable table = build_param_table(c);
  const LayerSplit split = LayerSplit::from_counts({3, 1}, 4);
  GridShape g = GridShape::xyzpd(1, 1, 1, 2, 1);
  for (int s = 0; s < 2; ++s) {
    GridCoord at;
    at[Axis::P] = s;
    const ShardPlan plan = ShardPlan::build(c, table, g, at, split);
    for (const TensorShard& t : plan.tensors)
      EXPECT_EQ(t.stored, t.spec->layer < 0 || (t.spec->layer < 3) == (s == 0))
          << t.spec->name << " stage " << s;
  }
}
