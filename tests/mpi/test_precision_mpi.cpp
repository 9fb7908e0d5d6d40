// bf16 mixed precision on a grid (issue 5): a model trained 200 steps in bf16 on a grid of 4 ranks
// (X = 2 and Z = 2, so both the tensor-parallel GEMM blocks and the sharded weights are involved)
// tracks the fp32 loss curve of the serial model: the mean loss of the last 10 steps within 2%.
// Only the 4-rank launch runs it; the 2- and 8-rank launches skip.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include "contract.hpp"
#include "learnable_stream.hpp"
#include "tetrad/backend/backend.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/backend/cpu/precision.hpp"
#include "support/transformer.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/optimizer.hpp"
#include "tetrad/train/step_runner.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

// kB sequences of kT tokens a step from a learnable stream (best loss ln 4), kSteps steps.
using namespace learnable_stream;
using tetrad_test::rank_share;

ModelConfig test_model() { return contract::tiny_model(Family::GPT2, 2); }

// The groups of `shape` over the world, or this rank alone where the shape is the trivial grid.
struct GridOrOne {
  explicit GridOrOne(const GridShape& shape) {
    if (shape.size() > 1) grid.emplace(comm::Communicator::world(), shape);
  }
  ProcessGroups& groups() { return grid ? *grid : one; }
  std::optional<ProcessGroups> grid;
  ProcessGroups one;  // this rank alone
};

std::vector<double> serial_fp32(const ModelConfig& mc) {
  Transformer<float> m(mc, kB, kT, backend::Precision::FP32);
  m.init_weights(7);
  const TrainConfig tc = train_config();
  AdamW opt(m.table(), tc);
  std::vector<double> losses;
  std::vector<int32_t> x(size_t(kB) * kT), y(x.size());
  for (int s = 0; s < kSteps; ++s) {
    rank_share(batch(s, mc.vocab_size), kT, kB, 0, 0, x.data(), y.data());
    m.zero_grads();
    const double loss = m.forward_backward(x.data(), y.data(), kB, kT, 1.0f / (kB * kT));
    const double gn = grad_norm(m.grads(), m.num_params());
    opt.update(m.params(), m.grads(), learning_rate(tc, s), gn > 1 ? 1 / gn : 1.0, s + 1);
    losses.push_back(loss / (kB * kT));
  }
  return losses;
}

std::vector<double> grid_bf16(const ModelConfig& mc, ProcessGroups& g, bool bf16_attention = false) {
  const int Bl = kB / (g.shape.z() * g.shape.d());
  const int slot = g.coord.z() + g.shape.z() * g.coord.d();
  ParallelOptions po;
  po.precision = backend::Precision::BF16;
  // Forced either way (unset, it would follow the GEMM precision where bf16 attention is the
  // faster kernel: the test below).
  po.attention_precision = bf16_attention ? backend::Precision::BF16 : backend::Precision::FP32;
  ParallelTransformer m(mc, g, Bl, kT, po);
  m.init_weights(7);
  const TrainConfig tc = train_config();
  std::vector<int64_t> off, size;
  for (const auto& t : m.plan().tensors) {
    off.push_back(t.offset);
    size.push_back(t.shard_numel);
  }
  AdamW opt(decay_ranges(m.table(), tc, off, size), m.num_local_params(), tc);
  // The trainer's own step (train/step_runner.hpp), one micro-batch, clipped at norm 1.
  StepRunner runner(m, opt, g, tetrad_test::step_options(tc, 1, Bl, kT));
  std::vector<double> losses;
  std::vector<int32_t> x(size_t(Bl) * kT), y(x.size());
  for (int s = 0; s < kSteps; ++s) {
    rank_share(batch(s, mc.vocab_size), kT, Bl, slot, 0, x.data(), y.data());
    losses.push_back(runner.run(x.data(), y.data(), double(kB * kT), learning_rate(tc, s), s).loss);
  }
  m.finish_communication();
  return losses;
}

}  // namespace

TEST(Bf16Grid, TrainingOnFourRanksTracksTheFp32Curve) {
  if (mpi_test::world_size() != 4) GTEST_SKIP() << "runs on 4 ranks only";
  const ModelConfig mc = test_model();
  const auto f32 = serial_fp32(mc);
  ProcessGroups g(comm::Communicator::world(), GridShape{2, 1, 2, 1});
  const auto b16 = grid_bf16(mc, g);
  double l32 = 0, l16 = 0;
  for (int s = kSteps - 10; s < kSteps; ++s) l32 += f32[s] / 10, l16 += b16[s] / 10;
  if (g.world.rank() == 0)
    std::printf("final loss (mean of last 10 of %d steps): fp32 serial %.4f, bf16 on 2x1x2x1 %.4f "
                "(%+.2f%%); first step %.4f\n", kSteps, l32, l16, 100 * (l16 / l32 - 1), f32[0]);
  EXPECT_LT(l32, 0.6 * f32[0]) << "the fp32 run did not learn; the comparison would be empty";
  EXPECT_NEAR(l16 / l32, 1.0, 0.02) << "fp32 serial " << l32 << ", bf16 on 2x1x2x1 " << l16;
  for (double l : b16) ASSERT_TRUE(std::isfinite(l));
}

// bf16 attention products as well (AttentionArgs::precision), on the 4-rank grid and on one rank
// (the model `tetrad train` runs, on the trivial grid), against the same serial fp32 curve.
TEST(Bf16Grid, Bf16AttentionOnFourRanksAndOneTracksTheFp32Curve) {
  if (mpi_test::world_size() != 4) GTEST_SKIP() << "runs on 4 ranks only";
  const ModelConfig mc = test_model();
  const auto f32 = serial_fp32(mc);
  ProcessGroups g(comm::Communicator::world(), GridShape{2, 1, 2, 1});
  const auto grid = grid_bf16(mc, g, true);
  ProcessGroups one;  // this rank alone
  const auto single = grid_bf16(mc, one, true);
  double l32 = 0, lg = 0, l1 = 0;
  for (int s = kSteps - 10; s < kSteps; ++s) l32 += f32[s] / 10, lg += grid[s] / 10, l1 += single[s] / 10;
  if (g.world.rank() == 0)
    std::printf("final loss (mean of last 10 of %d steps): fp32 serial %.4f; bf16 GEMMs and "
                "attention: 2x1x2x1 %.4f (%+.2f%%), one rank %.4f (%+.2f%%)\n", kSteps, l32, lg,
                100 * (lg / l32 - 1), l1, 100 * (l1 / l32 - 1));
  EXPECT_LT(l32, 0.6 * f32[0]) << "the fp32 run did not learn; the comparison would be empty";
  EXPECT_NEAR(lg / l32, 1.0, 0.02) << "fp32 serial " << l32 << ", bf16 on 2x1x2x1 " << lg;
  EXPECT_NEAR(l1 / l32, 1.0, 0.02) << "fp32 serial " << l32 << ", bf16 on one rank " << l1;
  for (double l : grid) ASSERT_TRUE(std::isfinite(l));
  for (double l : single) ASSERT_TRUE(std::isfinite(l));
}

// ParallelOptions::attention_precision unset follows the GEMM precision where the backend's bf16
// attention is the faster kernel (Capabilities::attention_bf16_faster: AMX here), else fp32; set,
// it is kept (forcing fp32 in a bf16 run, or bf16 products on any CPU).
TEST(Bf16Grid, AttentionPrecisionFollowsThePrecisionWhereFaster) {
  const ModelConfig mc = test_model();
  ProcessGroups one;
  const bool faster = backend::cpu_backend().capabilities().attention_bf16_faster;
  auto resolved = [&](backend::Precision p, std::optional<backend::Precision> a) {
    ParallelOptions po;
    po.precision = p;
    po.attention_precision = a;
    ParallelTransformer m(mc, one, 2, kT, po);
    return m.attention_precision();
  };
  using P = backend::Precision;
  EXPECT_EQ(resolved(P::BF16, std::nullopt), faster ? P::BF16 : P::FP32);
  EXPECT_EQ(resolved(P::FP32, std::nullopt), P::FP32);
  EXPECT_EQ(resolved(P::BF16, P::FP32), P::FP32);
  EXPECT_EQ(resolved(P::FP32, P::BF16), P::BF16);
}

namespace {

// kSteps_short steps of the tiny model in bf16 on `g` through apply_update (as the trainer:
// the 4-argument form whose AdamW pass writes the bf16 weight copy), with or without the copy.
std::vector<double> bf16_losses(const ModelConfig& mc, ProcessGroups& g, ParallelOptions po,
                                int steps) {
  po.precision = backend::Precision::BF16;
  const int Bl = kB / (g.shape.z() * g.shape.d());
  const int slot = g.coord.z() + g.shape.z() * g.coord.d();
  ParallelTransformer m(mc, g, Bl, kT, po);
  m.init_weights(7);
  const TrainConfig tc = train_config();
  AdamW opt = tetrad_test::layout_adamw(m, tc, &backend::cpu_backend());
  std::vector<double> losses;
  std::vector<int32_t> x(size_t(Bl) * kT), y(x.size());
  for (int s = 0; s < steps; ++s) {
    rank_share(batch(s, mc.vocab_size), kT, Bl, slot, 0, x.data(), y.data());
    m.begin_step(1);
    double loss = m.forward_backward(x.data(), y.data(), Bl, kT, 1.0f / (kB * kT));
    m.reduce_gradients();
    if (g.tokens().size() > 1) g.tokens().allreduce_sum(&loss, 1);
    const double gn = std::sqrt(m.grad_sum_squares());
    const float* grads = m.grads();
    m.apply_update([&](float* p, uint16_t* p16, int64_t lo, int64_t hi) {
      EXPECT_EQ(p16 != nullptr, m.bf16_weights());
      opt.update(p, p16, grads, learning_rate(tc, s), gn > 1 ? 1 / gn : 1.0, s + 1, lo, hi);
    });
    losses.push_back(loss / (kB * kT));
  }
  m.finish_communication();
  return losses;
}

}  // namespace

// The bf16 weight copy (written by the fused AdamW pass, gathered over Z in bf16) and the bf16
// activations (written by their producers, the gradients cast once per linear backward) give the
// same bits as rounding every operand at every GEMM: on the trivial grid, with Z and X (bf16
// gathers, prefetched across steps), and with ZeRO 1 over D (the copy remade after the pieces
// are gathered), with the block's stored tensors in fp32 (bf16_stash = false). The NN
// weight-gradient form on the transposed cast sums in another order, and the stash rounds the
// backward's inputs: the same losses within 2e-3.
TEST(Bf16Grid, WeightCopyAndBf16ActivationsGiveTheBitsOfPerCallRounding) {
  if (mpi_test::world_size() != 4) GTEST_SKIP() << "runs on 4 ranks only";
  const ModelConfig mc = test_model();
  constexpr int kShort = 12;
  struct Case {
    const char* name;
    GridShape shape;
    int zero;
    bool across;
  };
  for (const Case& c : {Case{"1x1x1x1", {1, 1, 1, 1}, 0, false},
                        Case{"2x1x2x1 prefetch across steps", {2, 1, 2, 1}, 0, true},
                        Case{"1x1x2x2 ZeRO 1", {1, 1, 2, 2}, 1, false}}) {
    SCOPED_TRACE(c.name);
    GridOrOne groups(c.shape);
    ProcessGroups& g = groups.groups();
    ParallelOptions po;
    po.zero = c.zero;
    if (c.across) {
      po.overlap.prefetch_depth = 1;
      po.overlap.prefetch_across_steps = true;
    }
    ParallelOptions tn = po, off = po;
    tn.bf16_weight_grad_nn = false;
    off.bf16_weight_copy = false;
    off.bf16_activations = false;
    ParallelOptions unstashed = tn;
    unstashed.bf16_stash = false;
    const auto stored = bf16_losses(mc, g, unstashed, kShort);
    const auto per_call = bf16_losses(mc, g, off, kShort);
    const auto stashed = bf16_losses(mc, g, tn, kShort);
    const auto fastest = bf16_losses(mc, g, po, kShort);
    ASSERT_EQ(stored.size(), per_call.size());
    ASSERT_EQ(stashed.size(), per_call.size());
    // Without the stash (bf16_stash = false: the block's stored tensors in fp32) the bf16 copy
    // and activations are per-call rounding's bits at every step. With it (the default) the
    // forward still is (step 0's loss); from step 1 the runs part: the backward reads q|k|v,
    // the attention output, the mid-block sum and the MLP input projection (issue 28) rounded to
    // bf16, where per-call rounding reads them in fp32.
    EXPECT_EQ(stashed[0], per_call[0]) << "step 0: the forward, stash on";
    for (size_t s = 0; s < stored.size(); ++s) {
      EXPECT_EQ(stored[s], per_call[s]) << "step " << s;
      EXPECT_NEAR(stashed[s], per_call[s], 2e-3 * per_call[s]) << "step " << s << " (stash on)";
      EXPECT_NEAR(fastest[s], per_call[s], 2e-3 * per_call[s]) << "step " << s << " (NN weight gradients)";
    }
    EXPECT_LT(stored.back(), stored.front() - 0.05) << "the run did not learn";
    EXPECT_LT(stashed.back(), stashed.front() - 0.05) << "the run did not learn (stash on)";
  }
}

namespace {

// One forward_backward of the tiny model in bf16 on `g` under `po`: this rank's gradients (and
// the loss summed over the data ranks).
std::pair<double, std::vector<float>> one_step_grads(const ModelConfig& mc, ProcessGroups& g,
                                                     ParallelOptions po, std::string* plan = nullptr) {
  po.precision = backend::Precision::BF16;
  po.attention_precision = backend::Precision::FP32;
  const int Bl = kB / (g.shape.z() * g.shape.d());
  const int slot = g.coord.z() + g.shape.z() * g.coord.d();
  ParallelTransformer m(mc, g, Bl, kT, po);
  m.init_weights(7);
  std::vector<int32_t> x(size_t(Bl) * kT), y(x.size());
  rank_share(batch(3, mc.vocab_size), kT, Bl, slot, 0, x.data(), y.data());
  m.zero_grads();
  double loss = m.forward_backward(x.data(), y.data(), Bl, kT, 1.0f / (kB * kT));
  m.reduce_gradients();
  if (g.tokens().size() > 1) g.tokens().allreduce_sum(&loss, 1);
  if (plan) *plan = m.gemm_layout_plan().to_string();
  m.finish_communication();
  return {loss, std::vector<float>(m.grads(), m.grads() + m.num_local_params())};
}

double rel_dev(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    s += double(b[i]) * b[i];
  }
  return std::sqrt(e / std::max(s, 1e-300));
}

std::string plan_of_forms(const char* fwd, const char* dx, const char* dw) {
  std::string s;
  for (const char* site : kGemmSiteNames)
    s += std::string(s.empty() ? "" : " ") + site + ":*:*:*:" + fwd + ":" + dx + ":" + dw;
  return s;
}

}  // namespace

// Forced GEMM layout plans (every dx and dw form, the forward plain and transposed, and a mixed
// plan) on one rank and on grids that split both layer kinds (2x2x1x1: X and Y) and shard the
// weights (1x1x2x2, ZeRO 1): each rank's gradients equal the rule's within fp32 summation
// error (the same bf16 operands in another summation order), never NaN.
TEST(Bf16Grid, EveryGemmLayoutPlanMatchesTheRuleOnOneRankAndFour) {
  if (mpi_test::world_size() != 4) GTEST_SKIP() << "runs on 4 ranks only";
  const ModelConfig mc = test_model();
  std::vector<std::string> plans;
  for (const char* fwd : {"NT", "NT/tr"})
    for (const char* dx : {"NN", "TN", "NN/tr", "TN/tr"})
      for (const char* dw : {"NN", "TN", "NN/tr", "TN/tr"}) plans.push_back(plan_of_forms(fwd, dx, dw));
  plans.push_back("qkv:*:*:*:NT:TN:NN proj:*:*:*:NT/tr:NN/tr:TN fc:*:*:*:NT:TN/tr:TN/tr "
                  "fcproj:*:*:*:NT/tr:NN:NN/tr head:*:*:*:NT:TN:TN");
  struct Case {
    const char* name;
    GridShape shape;
    int zero;
  };
  for (const Case& c : {Case{"1x1x1x1", {1, 1, 1, 1}, 0}, Case{"2x2x1x1", {2, 2, 1, 1}, 0},
                        Case{"1x1x2x2 ZeRO 1", {1, 1, 2, 2}, 1}}) {
    SCOPED_TRACE(c.name);
    GridOrOne groups(c.shape);
    ProcessGroups& g = groups.groups();
    ParallelOptions po;
    po.zero = c.zero;
    const auto rule = one_step_grads(mc, g, po);
    for (const std::string& p : plans) {
      SCOPED_TRACE(p);
      ParallelOptions forced = po;
      forced.gemm_layout_plan = p;
      const auto got = one_step_grads(mc, g, forced);
      for (float v : got.second) ASSERT_FALSE(std::isnan(v));
      EXPECT_NEAR(got.first, rule.first, 1e-5 * std::fabs(rule.first));
      EXPECT_LT(rel_dev(got.second, rule.second), 1e-4);
    }
  }
}

// tune on a grid: every rank runs rank 0's plan (each rank timed its own; the broadcast makes
// them one), and the tuned grid's gradients match the rule's. Where bf16 GEMMs are emulated
// (forced), tune runs the rule on every rank.
TEST(Bf16Grid, TunedGemmLayoutsAreTheSameOnEveryRank) {
  if (mpi_test::world_size() != 4) GTEST_SKIP() << "runs on 4 ranks only";
  const ModelConfig mc = test_model();
  ProcessGroups g(comm::Communicator::world(), GridShape{2, 1, 2, 1});
  for (int emulate = 0; emulate < 2; ++emulate) {
    if (!emulate && !kernels::native_bf16_matmul()) continue;
    kernels::set_bf16_emulation_forced(emulate == 1);
    SCOPED_TRACE(emulate ? "emulated" : "native");
    ParallelOptions po;
    const auto rule = one_step_grads(mc, g, po);
    po.gemm_layouts = GemmLayouts::Tune;
    std::string plan;
    const auto tuned = one_step_grads(mc, g, po, &plan);
    std::vector<int32_t> mine(1024, 0);
    ASSERT_LT(plan.size(), mine.size());
    std::copy(plan.begin(), plan.end(), mine.begin());
    std::vector<int32_t> root = mine;
    g.world.broadcast(root.data(), root.size(), 0);
    EXPECT_EQ(mine, root) << "rank " << g.world.rank() << " runs " << plan;
    const GemmLayoutPlan parsed = GemmLayoutPlan::parse(plan, "given");
    if (emulate)
      for (const GemmSiteLayout& s : parsed.site) {
        EXPECT_EQ(s.dx, (GemmForm{false, false}));
        EXPECT_EQ(s.dw, (GemmForm{false, false}));
        EXPECT_EQ(s.fwd, (GemmForm{false, false}));
      }
    EXPECT_LT(rel_dev(tuned.second, rule.second), 1e-4);
  }
  kernels::set_bf16_emulation_forced(false);
}
