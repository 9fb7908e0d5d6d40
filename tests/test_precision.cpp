// bf16 mixed precision (issue 5): the bf16 conversion by hand, the bf16 GEMM against an fp32
// reference (error of the size bf16 operands give, and exactly "bf16 operands, fp32
// accumulation"), the process-wide switch of kernels::gemm<float>, and a tiny model trained 200
// steps in bf16 tracking the fp32 loss curve.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <vector>

#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/backend/cpu/ops.hpp"
#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/model/transformer.hpp"
#include "tetrad/train/config.hpp"
#include "tetrad/train/optimizer.hpp"

using namespace tetrad;
using namespace tetrad::kernels;

namespace {

struct PrecisionGuard {
  Precision saved = gemm_precision();
  ~PrecisionGuard() { set_gemm_precision(saved); }
};

std::vector<float> normal(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(r.normal());
  return v;
}

}  // namespace

TEST(Bf16, ConversionRoundsToNearestEvenByHand) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  // bf16 keeps 7 mantissa bits: the spacing at 1 is 2^-7.
  EXPECT_EQ(round_to_bf16(1.0f + 0x1p-7f), 1.0f + 0x1p-7f);         // representable
  EXPECT_EQ(round_to_bf16(1.0f + 0x1p-8f), 1.0f);                   // tie -> even (down)
  EXPECT_EQ(round_to_bf16(1.0f + 0x1p-7f + 0x1p-8f), 1.0f + 0x1p-6f);  // tie -> even (up)
  EXPECT_EQ(round_to_bf16(1.0f + 0x1p-8f + 0x1p-12f), 1.0f + 0x1p-7f);  // above the tie -> up
  EXPECT_EQ(round_to_bf16(-(1.0f + 0x1p-8f + 0x1p-12f)), -(1.0f + 0x1p-7f));
  EXPECT_EQ(round_to_bf16(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(round_to_bf16(-0.0f)));
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round_to_bf16(inf), inf);
  EXPECT_EQ(round_to_bf16(-inf), -inf);
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::max()), inf);  // past the largest bf16
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload sits only in the low 16 bits must not become inf.
  uint32_t u = 0x7F800001u;
  float snan;
  std::memcpy(&snan, &u, 4);
  EXPECT_TRUE(std::isnan(round_to_bf16(snan)));
  // Relative rounding error is at most 2^-8 (8 significant bits) over a range of magnitudes.
  Rng r(3);
  for (int i = 0; i < 10000; ++i) {
    const float x = float(r.normal() * std::exp(4 * r.normal()));
    if (x == 0) continue;
    EXPECT_LE(std::fabs(round_to_bf16(x) - x) / std::fabs(x), 0x1p-8f) << x;
  }
}

TEST(Bf16, GemmMatchesFp32WithinBf16ErrorInEveryLayout) {
  const int64_t M = 37, N = 53, K = 256;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      // Leading dimensions wider than the rows, to check strides are honoured.
      const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 7;
      const auto A = normal(size_t((ta ? K : M) * lda), 1 + ta);
      const auto B = normal(size_t((tb ? N : K) * ldb), 3 + tb);
      const auto C0 = normal(size_t(M * ldc), 5);
      const float alpha = 0.75f, beta = 0.5f;
      std::vector<float> c32 = C0, c16 = C0;
      gemm<float>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, c32.data(), ldc);
      gemm_bf16(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, c16.data(), ldc);
      // Reference of the bf16 arithmetic: operands rounded, products and sums in double.
      double err32 = 0, err_ref = 0, norm = 0;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k) {
            const float a = ta ? A[k * lda + i] : A[i * lda + k];
            const float b = tb ? B[j * ldb + k] : B[k * ldb + j];
            s += double(round_to_bf16(a)) * double(round_to_bf16(b));
          }
          const double ref = alpha * s + beta * double(C0[i * ldc + j]);
          const double d32 = double(c16[i * ldc + j]) - double(c32[i * ldc + j]);
          err32 += d32 * d32;
          err_ref += (double(c16[i * ldc + j]) - ref) * (double(c16[i * ldc + j]) - ref);
          norm += double(c32[i * ldc + j]) * double(c32[i * ldc + j]);
          ASSERT_FALSE(std::isnan(c16[i * ldc + j]));
        }
      const double rel32 = std::sqrt(err32 / norm), rel_ref = std::sqrt(err_ref / norm);
      const std::string where = std::string("ta=") + char('0' + ta) + " tb=" + char('0' + tb);
      // Against fp32: the error bf16 operands give (not zero: the rounding happened).
      EXPECT_GT(rel32, 1e-3) << where;
      EXPECT_LT(rel32, 1e-2) << where;
      // Against bf16 operands with exact accumulation: only fp32 summation error remains.
      EXPECT_LT(rel_ref, 1e-5) << where;
      // Padding between rows of C is left alone.
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = N; j < ldc; ++j) ASSERT_EQ(c16[i * ldc + j], C0[i * ldc + j]);
    }
}

TEST(Bf16, GemmPrecisionSwitchesFloatGemm) {
  PrecisionGuard guard;
  const int64_t M = 16, N = 24, K = 64;
  const auto A = normal(size_t(M * K), 7), B = normal(size_t(K * N), 8);
  std::vector<float> want(size_t(M * N)), got(size_t(M * N)), fp32(size_t(M * N));
  gemm_bf16(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, want.data(), N);
  set_gemm_precision(Precision::BF16);
  gemm<float>(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, got.data(), N);
  set_gemm_precision(Precision::FP32);
  gemm<float>(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, fp32.data(), N);
  EXPECT_EQ(got, want);
  EXPECT_NE(fp32, want);
}

TEST(Bf16, PrecisionNamesAndThePathAreReported) {
  EXPECT_EQ(parse_precision("fp32"), Precision::FP32);
  EXPECT_EQ(parse_precision("bf16"), Precision::BF16);
  try {
    parse_precision("fp16");
    FAIL() << "fp16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"fp32\" or \"bf16\""), std::string::npos) << e.what();
  }
  const std::string path = bf16_matmul_path();
  EXPECT_EQ(path.rfind(native_bf16_matmul() ? "native" : "emulated", 0), 0u) << path;
}

// precision "auto": bf16 exactly where bf16 GEMMs are native, unless TETRAD_PRECISION_AUTO
// forces a branch (tests/CMakeLists.txt runs test_train with each).
TEST(Bf16, PrecisionAutoFollowsTheHardwareUnlessForced) {
  const char* saved = std::getenv("TETRAD_PRECISION_AUTO");
  const std::string keep = saved ? saved : "";
  ::unsetenv("TETRAD_PRECISION_AUTO");
  EXPECT_EQ(resolve_precision("auto"), native_bf16_matmul() ? Precision::BF16 : Precision::FP32);
  EXPECT_EQ(resolve_precision("fp32"), Precision::FP32);
  EXPECT_EQ(resolve_precision("bf16"), Precision::BF16);
  ::setenv("TETRAD_PRECISION_AUTO", "bf16", 1);
  EXPECT_EQ(resolve_precision("auto"), Precision::BF16);
  EXPECT_EQ(resolve_precision("fp32"), Precision::FP32);  // only "auto" is forced
  EXPECT_NE(auto_precision_reason().find("TETRAD_PRECISION_AUTO=bf16"), std::string::npos);
  ::setenv("TETRAD_PRECISION_AUTO", "fp32", 1);
  EXPECT_EQ(resolve_precision("auto"), Precision::FP32);
  ::setenv("TETRAD_PRECISION_AUTO", "fp16", 1);
  try {
    resolve_precision("auto");
    FAIL() << "fp16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TETRAD_PRECISION_AUTO = \"fp16\""), std::string::npos);
  }
  try {
    resolve_precision("half");
    FAIL() << "half accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"fp32\", \"bf16\" or \"auto\""), std::string::npos);
  }
  if (saved) ::setenv("TETRAD_PRECISION_AUTO", keep.c_str(), 1);
  else ::unsetenv("TETRAD_PRECISION_AUTO");
}

// The native path exactly where tetrad may use bf16 hardware (TETRAD_MAX_CPU_ISA and
// TETRAD_BF16=emulate lower it; tests/CMakeLists.txt runs this binary under each).
TEST(Bf16, NativeOnlyWhereAllowed) {
  const CpuFeatures& f = cpu_features();
  const char* e = std::getenv("TETRAD_BF16");
  if ((e && std::string(e) == "emulate") || (!f.use_amx_bf16() && !f.use_avx512_bf16()))
    EXPECT_FALSE(native_bf16_matmul()) << bf16_matmul_path();
  std::cout << "bf16 GEMMs: " << bf16_matmul_path() << "\n";
}

// A learnable stream: x[t+1] = (5 x[t] + 7 + r) mod V with r uniform in {0..3}, so the best
// possible loss is ln 4 and the curve has room to fall from ln V.
TEST(Bf16, TinyModelTrainedInBf16TracksFp32) {
  PrecisionGuard guard;
  const ModelConfig mc = named_model("tiny");
  const int B = 4, T = 32, steps = 200;
  auto run = [&](Precision p) {
    set_gemm_precision(p);
    Transformer<float> m(mc, B, T);
    m.init_weights(5);
    TrainConfig tc;
    tc.lr = 3e-3;
    tc.warmup_steps = 10;
    tc.max_steps = steps;
    AdamW opt(m.table(), tc);
    Rng data(11);
    std::vector<int32_t> seq(size_t(B) * (T + 1)), x(size_t(B) * T), y(x.size());
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
      for (int b = 0; b < B; ++b) {
        int32_t v = int32_t(data.next_u64() % uint64_t(mc.vocab_size));
        for (int t = 0; t <= T; ++t) {
          seq[size_t(b) * (T + 1) + t] = v;
          v = int32_t((5 * int64_t(v) + 7 + int64_t(data.next_u64() % 4)) % mc.vocab_size);
        }
        for (int t = 0; t < T; ++t) {
          x[size_t(b) * T + t] = seq[size_t(b) * (T + 1) + t];
          y[size_t(b) * T + t] = seq[size_t(b) * (T + 1) + t + 1];
        }
      }
      m.zero_grads();
      const double loss = m.forward_backward(x.data(), y.data(), B, T, 1.0f / (B * T)) / (B * T);
      const double gn = grad_norm(m.grads(), m.num_params());
      opt.update(m.params(), m.grads(), learning_rate(tc, s), gn > 1 ? 1 / gn : 1, s + 1);
      losses.push_back(loss);
    }
    return losses;
  };
  const auto f32 = run(Precision::FP32);
  const auto b16 = run(Precision::BF16);
  // "Final loss": the mean of the last 10 steps (same batches in both runs).
  double l32 = 0, l16 = 0;
  for (int s = steps - 10; s < steps; ++s) l32 += f32[s] / 10, l16 += b16[s] / 10;
  std::printf("final loss (mean of last 10 of %d steps): fp32 %.4f, bf16 %.4f (%+.2f%%)\n", steps,
              l32, l16, 100 * (l16 / l32 - 1));
  EXPECT_LT(l32, 0.6 * f32[0]) << "the fp32 run did not learn; the comparison would be empty";
  EXPECT_NEAR(l16 / l32, 1.0, 0.02) << "fp32 " << l32 << " bf16 " << l16;
  EXPECT_NE(f32, b16) << "bf16 run identical to fp32: the precision switch did nothing";
  for (double l : b16) ASSERT_TRUE(std::isfinite(l));
}
