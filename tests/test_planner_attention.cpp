// The attention core's time in the planner (issue 30; planner.hpp, AttentionKernel and
// attention_core_seconds; docs/planner.md, "The attention kernel"): the fused kernel as before,
// the materialized one (Megatron-LM's scores in memory) against a hand count, and what it does
// to a plan. Pure arithmetic: no MPI, no timing.
#include <gtest/gtest.h>

#include <utility>

#include "expect_error.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/planner/machine.hpp"
#include "tetrad/planner/planner.hpp"
#include "tetrad/planner/validate.hpp"

using namespace tetrad;
using namespace tetrad::planner;
using tetrad_test::expect_error;

namespace {

// Megatron-LM's 1.7B row (SC21 table 1): 24 layers, hidden 2304, 24 heads of 96, S = 2048.
PlanInput megatron_1p7b(AttentionKernel k) {
  PlanInput in;
  in.model = planner_model("gpt-5b");
  in.model.n_layer = 24;
  in.model.n_embd = 2304;
  in.model.n_head = in.model.n_kv_head = 24;
  in.model.ffn = 4 * 2304;
  in.model.validate();
  in.model_name = "gpt-1.7b";
  in.seq = 2048;
  in.global_batch = 512;
  in.micro_batch_per_replica = 1;
  in.precision = Precision::BF16;
  in.recompute = Recompute::Full;
  in.memory_model = MemoryModel::Reference;
  in.attention_kernel = k;
  in.allow_context = false;
  in.ranks = 32;
  return in;
}

}  // namespace

TEST(PlannerAttention, MaterializedAgainstHandCount) {
  // One sequence (T = S = 2048 tokens) of the 1.7B layer on one DGX A100 GPU, bf16:
  //   GEMMs Q·Kᵀ and P·V over every score: 4·T·S·A = 4·2048·2048·2304 = 38.655 GFLOP forward;
  //   one head's [2048, 2048] x [2048, 96] reads 2·2048·96 and writes (or reads) 2048² bf16
  //   elements: intensity 2·2048²·96 / (2·(2048² + 2·2048·96)) = 87.77 FLOP/byte, so
  //   87.77 x 2039 GB/s = 179.0 TFLOP/s, below 0.7 x 312 = 218.4: 0.2160 ms forward.
  //   Scores: 24 heads x 2048² = 100.66M; forward softmax (2 x 2 bytes) and dropout (2 x 2 + 1)
  //   = 9 bytes each: 0.4443 ms; backward 11 bytes each: 0.5430 ms, GEMMs twice the forward's.
  const Machine m = load_machine("dgx-a100");
  const PlanInput in = megatron_1p7b(AttentionKernel::Materialized);
  const AttentionSeconds a = attention_core_seconds(in, m, 2048, 1);
  const double scores = 24.0 * 2048 * 2048;
  const double rate = (2048.0 * 96 / (2048 + 2 * 96)) * 2039e9;  // FLOP/s at the roofline
  ASSERT_LT(rate, 0.7 * 312e12);
  const double gemm = 4.0 * 2048 * 2048 * 2304 / rate;
  EXPECT_NEAR(gemm, 0.2160e-3, 0.0005e-3);
  EXPECT_NEAR(a.fwd, gemm + scores * 9 / 2039e9, 1e-12);
  EXPECT_NEAR(a.bwd, 2 * gemm + scores * 11 / 2039e9, 1e-12);
  EXPECT_NEAR(a.fwd, 0.6603e-3, 0.001e-3);
  EXPECT_NEAR(a.bwd, 0.9750e-3, 0.001e-3);
  // Heads split over Y: each rank's share of the heads, the same intensity.
  const AttentionSeconds y4 = attention_core_seconds(in, m, 2048, 4);
  EXPECT_NEAR(y4.fwd, a.fwd / 4, 1e-12);
  EXPECT_NEAR(y4.bwd, a.bwd / 4, 1e-12);
  // fp32 scores: 4 bytes an element (the mask stays one byte), the roofline at 4 bytes.
  PlanInput f32 = in;
  f32.precision = Precision::FP32;
  const AttentionSeconds a32 = attention_core_seconds(f32, m, 2048, 1);
  const double eff32 = std::min(0.7, (2048.0 * 96 / (2048 + 2 * 96)) / 2 * 2039e9 / 19.5e12);
  EXPECT_NEAR(a32.fwd, 4.0 * 2048 * 2048 * 2304 / (19.5e12 * eff32) + scores * 17 / 2039e9, 1e-12);
}

TEST(PlannerAttention, FusedIsTheCausalHalfAtTheAttentionRate) {
  // FlashAttention's way (tetrad's kernel, the default): half of 4·T·S·A forward at peak x
  // attention_efficiency (0.5 on the A100 files), twice that backward.
  const Machine m = load_machine("dgx-a100");
  PlanInput in = megatron_1p7b(AttentionKernel::Fused);
  EXPECT_EQ(PlanInput{}.attention_kernel, AttentionKernel::Fused);
  const AttentionSeconds a = attention_core_seconds(in, m, 4096, 2);
  const double fwd = 0.5 * 4 * 4096.0 * 2048 * 2304 / 2 / (312e12 * 0.5);
  EXPECT_NEAR(a.fwd, fwd, 1e-12);
  EXPECT_NEAR(a.bwd, 2 * fwd, 1e-12);
  // The materialized kernel costs several times more at this shape (S / H = 0.89).
  in.attention_kernel = AttentionKernel::Materialized;
  const AttentionSeconds b = attention_core_seconds(in, m, 4096, 2);
  EXPECT_GT(b.fwd + b.bwd, 3 * (a.fwd + a.bwd));
}

TEST(PlannerAttention, MaterializedScoresWeighLessAsTheModelWidens) {
  // The scores' cost per token is heads·S, the GEMMs' 12·H²: Megatron's 1.7B row (H = 2304) has
  // its step grow by a quarter, the 1T row's (H = 25600, 160 heads, t = 8) by about 2%.
  const Machine m = load_machine("dgx-a100");
  // The same input and grid with either kernel.
  auto both = [&](PlanInput in, const GridShape& g) {
    in.attention_kernel = AttentionKernel::Fused;
    const Estimate fused = estimate(in, g, m);
    in.attention_kernel = AttentionKernel::Materialized;
    const Estimate mat = estimate(in, g, m);
    EXPECT_TRUE(fused.valid && mat.valid) << fused.reject << mat.reject;
    return std::make_pair(fused, mat);
  };
  const auto [fused_small, mat_small] = both(megatron_1p7b(AttentionKernel::Fused), GridShape::xyzpd(1, 1, 1, 1, 32));
  const double grow_small = mat_small.step / fused_small.step - 1;
  EXPECT_GT(grow_small, 0.2);
  EXPECT_LT(grow_small, 0.35);
  // Only the attention moved: the GEMMs are the same.
  EXPECT_DOUBLE_EQ(mat_small.compute_gemm, fused_small.compute_gemm);
  EXPECT_NEAR(mat_small.step - fused_small.step, mat_small.compute_attention - fused_small.compute_attention,
              1e-6 * mat_small.step);

  PlanInput big = megatron_1p7b(AttentionKernel::Fused);
  big.model = planner_model("gpt-1t");
  big.global_batch = 3072;
  big.ranks = 3072;
  const auto [fused_big, mat_big] = both(big, GridShape::xyzpd(1, 8, 1, 64, 6));
  const double grow_big = mat_big.step / fused_big.step - 1;
  EXPECT_GT(grow_big, 0.005);
  EXPECT_LT(grow_big, 0.04);
}

TEST(PlannerAttention, NamesAndRefusals) {
  EXPECT_EQ(parse_attention_kernel("fused"), AttentionKernel::Fused);
  EXPECT_EQ(parse_attention_kernel("materialized"), AttentionKernel::Materialized);
  EXPECT_STREQ(name(AttentionKernel::Materialized), "materialized");
  expect_error([] { parse_attention_kernel("flash"); }, {"attention kernel 'flash'", "fused", "materialized"});
  // The scores are a sequence's own: no context-parallel form, refused rather than mispriced.
  PlanInput in = megatron_1p7b(AttentionKernel::Materialized);
  in.allow_context = true;
  expect_error([&] { in.validate(); }, {"materialized attention", "--no-context"});
  in.allow_context = false;
  EXPECT_NO_THROW(in.validate());
}
