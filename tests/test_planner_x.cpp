// The X axis in the planner (issue 29): the X ranks share attention's sequences as the trainer
// does (DenseBlock::sequence_share): attention's work per rank divided by Gx where Gx divides the
// micro-batch's sequences, the rows all-gathered over X (attention's output forward, dq|dk|dv
// backward), and on 2 X ranks without q/k norms the q|k|v sum a reduce-scatter of the rows
// (ParallelOps::normal_fwd_rows). Pure arithmetic: no MPI, no timing.
#include <gtest/gtest.h>

#include <string>

#include "support/test_machine.hpp"
#include "tetrad/planner/machine.hpp"
#include "tetrad/planner/planner.hpp"
#include "tetrad/planner/validate.hpp"

using namespace tetrad;
using namespace tetrad::planner;

namespace {

PlanInput input(const ModelConfig& model, const std::string& name, int ranks, int64_t micro) {
  PlanInput in;
  in.model = model;
  in.model_name = name;
  in.seq = model.max_seq;
  in.global_batch = micro;
  in.micro_batch = micro;
  in.ranks = ranks;
  return in;
}

const CollectiveCost* find(const Estimate& e, const std::string& what) {
  for (const CollectiveCost& c : e.collectives)
    if (c.what == what) return &c;
  return nullptr;
}

}  // namespace

TEST(PlannerX, AttentionIsSharedOverXWhereGxDividesTheSequences) {
  const Machine m = tetrad_test::test_machine(4);
  const ModelConfig small = planner_model("small");
  for (int64_t micro : {4, 2}) {
    // Every rank holds all `micro` sequences on 1x1x1x1 and on an X grid (X splits no tokens).
    const Estimate one = estimate(input(small, "small", 1, micro), GridShape::xyzpd(1, 1, 1, 1, 1), m);
    const Estimate x2 = estimate(input(small, "small", 2, micro), GridShape::xyzpd(2, 1, 1, 1, 1), m);
    const Estimate x4 = estimate(input(small, "small", 4, micro), GridShape::xyzpd(4, 1, 1, 1, 1), m);
    ASSERT_TRUE(one.valid && x2.valid && x4.valid) << one.reject << x2.reject << x4.reject;
    EXPECT_EQ(x2.tokens_per_rank, one.tokens_per_rank);
    EXPECT_NEAR(x2.compute_attention / one.compute_attention, 0.5, 1e-12) << micro;
    // 4 X ranks share 4 sequences; 2 sequences do not divide over them: every rank runs both.
    EXPECT_NEAR(x4.compute_attention / one.compute_attention, micro == 4 ? 0.25 : 1.0, 1e-12) << micro;
  }
  // One sequence: nothing to share over 2 X ranks.
  const Estimate one = estimate(input(small, "small", 1, 1), GridShape::xyzpd(1, 1, 1, 1, 1), m);
  const Estimate x2 = estimate(input(small, "small", 2, 1), GridShape::xyzpd(2, 1, 1, 1, 1), m);
  ASSERT_TRUE(one.valid && x2.valid) << one.reject << x2.reject;
  EXPECT_NEAR(x2.compute_attention / one.compute_attention, 1.0, 1e-12);
  EXPECT_EQ(find(x2, "fwd all-gather of attention output"), nullptr);
  EXPECT_EQ(find(x2, "bwd all-gather of dq|dk|dv"), nullptr);
  ASSERT_NE(find(x2, "fwd all-reduce of q|k|v output"), nullptr);
}

TEST(PlannerX, SharedSequencesGatherTheirRowsAndScatterTheQkvSumOnTwoRanks) {
  const Machine m = tetrad_test::test_machine(4);
  const ModelConfig small = planner_model("small");
  PlanInput in = input(small, "small", 2, 4);
  const Estimate x2 = estimate(in, GridShape::xyzpd(2, 1, 1, 1, 1), m);
  ASSERT_TRUE(x2.valid) << x2.reject;
  // small: 4 sequences of 512 tokens on every rank, C = 512, q|k|v 3C wide; fp32 (4 bytes).
  const double T = 4 * 512, bytes = in.precision == Precision::BF16 ? 2 : 4;
  const CollectiveCost* rs = find(x2, "fwd reduce-scatter of q|k|v output");
  ASSERT_NE(rs, nullptr);
  EXPECT_EQ(rs->op, Op::ReduceScatter);
  EXPECT_EQ(rs->axis.name(), "x");
  EXPECT_DOUBLE_EQ(rs->bytes, T * 3 * 512 * bytes);
  EXPECT_EQ(find(x2, "fwd all-reduce of q|k|v output"), nullptr);
  const CollectiveCost* att = find(x2, "fwd all-gather of attention output");
  const CollectiveCost* dqkv = find(x2, "bwd all-gather of dq|dk|dv");
  ASSERT_NE(att, nullptr);
  ASSERT_NE(dqkv, nullptr);
  EXPECT_EQ(att->op, Op::AllGather);
  EXPECT_DOUBLE_EQ(att->bytes, T * 512 * bytes);
  EXPECT_DOUBLE_EQ(dqkv->bytes, T * 3 * 512 * bytes);
  // Recomputation runs attention (and its gather) again before the backward.
  in.recompute = Recompute::Selective;
  const Estimate sel = estimate(in, GridShape::xyzpd(2, 1, 1, 1, 1), m);
  ASSERT_TRUE(sel.valid) << sel.reject;
  ASSERT_NE(find(sel, "fwd all-gather of attention output"), nullptr);
  EXPECT_DOUBLE_EQ(find(sel, "fwd all-gather of attention output")->calls, 2 * att->calls);
  // Other group sizes keep the all-reduce (a sum of more than two values in the all-reduce's
  // order); so do the q/k norms, which read every row.
  const Estimate x4 = estimate(input(small, "small", 4, 4), GridShape::xyzpd(4, 1, 1, 1, 1), m);
  ASSERT_TRUE(x4.valid) << x4.reject;
  EXPECT_NE(find(x4, "fwd all-reduce of q|k|v output"), nullptr);
  EXPECT_NE(find(x4, "bwd all-gather of dq|dk|dv"), nullptr);
  const ModelConfig qwen3 = named_model("qwen3-tiny");
  const Estimate q2 = estimate(input(qwen3, "qwen3-tiny", 2, 4), GridShape::xyzpd(2, 1, 1, 1, 1), m);
  ASSERT_TRUE(q2.valid) << q2.reject;
  EXPECT_NE(find(q2, "fwd all-reduce of q|k|v output"), nullptr);
  EXPECT_EQ(find(q2, "fwd reduce-scatter of q|k|v output"), nullptr);
}

TEST(PlannerX, CrossEntropyRowsAreSharedOverX) {
  // The trainer's cross-entropy runs on each X rank's 1/Gx of the rows and all-gathers their
  // gradient (vocab_parallel.cpp): the loss's passes shrink with Gx and the gather is listed.
  const Machine m = tetrad_test::test_machine(4);
  const ModelConfig small = planner_model("small");
  const Estimate x2 = estimate(input(small, "small", 2, 4), GridShape::xyzpd(2, 1, 1, 1, 1), m);
  const Estimate y2 = estimate(input(small, "small", 2, 4), GridShape::xyzpd(1, 2, 1, 1, 1), m);
  ASSERT_TRUE(x2.valid && y2.valid) << x2.reject << y2.reject;
  const CollectiveCost* g = find(x2, "bwd all-gather of dlogits");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->op, Op::AllGather);
  EXPECT_DOUBLE_EQ(g->bytes, 4.0 * 512 * small.vocab_size * 4);  // T x V fp32, V whole on X
  EXPECT_EQ(find(y2, "bwd all-gather of dlogits"), nullptr);
  // On 2 X ranks the logits' sum over X is a reduce-scatter of the loss's rows (head_forward);
  // 4 X ranks keep the all-reduce.
  const CollectiveCost* rs = find(x2, "fwd reduce-scatter of logits");
  ASSERT_NE(rs, nullptr);
  EXPECT_EQ(rs->op, Op::ReduceScatter);
  EXPECT_DOUBLE_EQ(rs->bytes, 4.0 * 512 * small.vocab_size * 4);
  EXPECT_EQ(find(x2, "fwd all-reduce of logits"), nullptr);
  const Estimate x4 = estimate(input(small, "small", 4, 4), GridShape::xyzpd(4, 1, 1, 1, 1), m);
  ASSERT_TRUE(x4.valid) << x4.reject;
  EXPECT_NE(find(x4, "fwd all-reduce of logits"), nullptr);
}
