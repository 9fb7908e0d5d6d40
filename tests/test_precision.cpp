// bf16 mixed precision (issue 5): the bf16 conversion by hand, the bf16 GEMM against an fp32
// reference (error of the size bf16 operands give, and exactly "bf16 operands, fp32
// accumulation"), the precision chosen per GEMM call (GemmArgs::precision of the CPU backend),
// and a tiny model trained 200 steps in bf16 tracking the fp32 loss curve.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <tuple>
#include <vector>

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/backend/backend.hpp"
#include "tetrad/backend/ceilings.hpp"
#include "tetrad/backend/cpu/ops.hpp"
#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/backend/cpu/precision_auto.hpp"
#include "support/transformer.hpp"
#include "tetrad/model/gemm_shapes.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/train/config.hpp"
#include "tetrad/train/optimizer.hpp"

using namespace tetrad;
using namespace tetrad::kernels;
using backend::parse_precision;

namespace {

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

// There is no process-wide precision: each GEMM call says its own (GemmArgs::precision). BF16
// is exactly gemm_bf16, FP32 exactly the fp32 gemm<float>, whatever the call before asked.
TEST(Bf16, GemmPrecisionIsChosenPerCall) {
  const int64_t M = 16, N = 24, K = 64;
  const auto A = normal(size_t(M * K), 7), B = normal(size_t(K * N), 8);
  std::vector<float> want(size_t(M * N)), want32(size_t(M * N)), got(size_t(M * N)),
      fp32(size_t(M * N));
  gemm_bf16(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, want.data(), N);
  gemm<float>(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, want32.data(), N);
  backend::Backend& be = backend::cpu_backend();
  backend::GemmArgs g;
  g.M = M, g.N = N, g.K = K;
  g.A = A.data(), g.lda = K, g.B = B.data(), g.ldb = N, g.ldc = N;
  g.precision = backend::Precision::BF16;
  g.C = got.data();
  be.ops().gemm(be.queue(), g);
  g.precision = backend::Precision::FP32;
  g.C = fp32.data();
  be.ops().gemm(be.queue(), g);
  be.queue().synchronize();
  EXPECT_EQ(got, want);
  EXPECT_EQ(fp32, want32);
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

// precision "auto": fp32 where bf16 GEMMs are emulated, the measured faster one where they are
// native, unless TETRAD_PRECISION_AUTO
// forces a branch (tests/CMakeLists.txt runs test_train with each). Asked of the CPU backend, as
// the trainer, the planner's query and the benchmark ask their device (backend/precision.hpp).
TEST(Bf16, PrecisionAutoFollowsTheMeasurementUnlessForced) {
  auto resolve_precision = [](const std::string& s) {
    return backend::resolve_precision(s, backend::cpu_backend()).precision;
  };
  auto auto_precision_reason = [] { return backend::cpu_backend().auto_precision().why; };
  const char* saved = std::getenv("TETRAD_PRECISION_AUTO");
  const std::string keep = saved ? saved : "";
  ::unsetenv("TETRAD_PRECISION_AUTO");
  // Where bf16 is native, the faster one measured (tests/test_precision_auto.cpp).
  EXPECT_EQ(resolve_precision("auto"),
            native_bf16_matmul() ? measured_precision().choice.precision : Precision::FP32);
  EXPECT_EQ(resolve_precision("fp32"), Precision::FP32);
  EXPECT_EQ(resolve_precision("bf16"), Precision::BF16);
  EXPECT_EQ(backend::resolve_precision("bf16", backend::cpu_backend()).why, "");
  EXPECT_EQ(auto_precision_reason(), kernels::auto_precision_reason());
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
  if ((e && std::string(e) == "emulate") || (!f.use_amx_bf16() && !f.use_avx512_bf16())) {
    EXPECT_FALSE(native_bf16_matmul()) << bf16_matmul_path();
  }
  std::cout << "bf16 GEMMs: " << bf16_matmul_path() << "\n";
}

// A learnable stream: x[t+1] = (5 x[t] + 7 + r) mod V with r uniform in {0..3}, so the best
// possible loss is ln 4 and the curve has room to fall from ln V.
TEST(Bf16, TinyModelTrainedInBf16TracksFp32) {
  const ModelConfig mc = named_model("tiny");
  const int B = 4, T = 32, steps = 200;
  auto run = [&](Precision p) {
    Transformer<float> m(mc, B, T, p);
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
      // In bf16 the update writes the bf16 weight copy as well (params_bf16() is null in fp32).
      opt.update(m.params(), m.params_bf16(), m.grads(), learning_rate(tc, s),
                 gn > 1 ? 1 / gn : 1, s + 1);
      m.params_bf16_written();
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

// ---------------------------------------------------------------------------------------------
// Issue 19: bf16 operands stored by their producers, layout choices, the bf16 kernels, the bf16
// model.

namespace {

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = float_to_bf16(x[i]);
  return y;
}

double rel_l2(const float* a, const float* b, size_t n) {
  double e = 0, s = 0;
  for (size_t i = 0; i < n; ++i) {
    e += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    s += double(b[i]) * double(b[i]);
  }
  return std::sqrt(e / std::max(s, 1e-300));
}

struct LayoutGuard {
  GemmLayoutPolicy saved = gemm_layout_policy();
  ~LayoutGuard() {
    set_gemm_layout_policy(saved);
    set_bf16_emulation_forced(false);
  }
};

}  // namespace

// Every layout (NN, NT, TN, TT) x every way of computing it (the plain product, its transpose,
// the fixed rule, timed once) x operands given in fp32 or stored in bf16 with padded rows x the
// native and the emulated path: against the double-precision product of the bf16-rounded
// operands (only fp32 summation error may remain) and, for the layout choice, against the plain
// product.
TEST(Bf16, EveryLayoutChoiceAndOperandFormMatchesThePlainProduct) {
  LayoutGuard guard;
  const int64_t M = 45, N = 70, K = 96;
  const GemmLayoutPolicy policies[] = {GemmLayoutPolicy::kPlain, GemmLayoutPolicy::kTransposed,
                                       GemmLayoutPolicy::kRule, GemmLayoutPolicy::kTune};
  for (int emulate = 0; emulate < 2; ++emulate) {
    if (!emulate && !native_bf16_matmul()) continue;  // this CPU has only the emulated path
    set_bf16_emulation_forced(emulate == 1);
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 6, ldc = N + 3;
        const auto A = normal(size_t((ta ? K : M) * lda), 11 + ta);
        const auto B = normal(size_t((tb ? N : K) * ldb), 13 + tb);
        const auto C0 = normal(size_t(M * ldc), 17);
        const auto A16 = to_bf16(A), B16 = to_bf16(B);
        const float alpha = 1.0f, beta = 1.0f;  // the weight-gradient form: accumulate
        std::vector<double> ref(size_t(M * ldc));
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k)
              s += double(bf16_to_float(ta ? A16[k * lda + i] : A16[i * lda + k])) *
                   double(bf16_to_float(tb ? B16[j * ldb + k] : B16[k * ldb + j]));
            ref[i * ldc + j] = alpha * s + beta * double(C0[i * ldc + j]);
          }
        std::vector<float> plain;
        for (GemmLayoutPolicy pol : policies) {
          set_gemm_layout_policy(pol);
          for (int form = 0; form < 3; ++form) {  // fp32 operands, bf16 operands, mixed
            std::vector<float> c = C0;
            const Bf16Operand a = form == 0 ? Bf16Operand::fp32(A.data(), lda)
                                            : Bf16Operand::bf16_stored(A16.data(), lda);
            const Bf16Operand b = form == 1 ? Bf16Operand::bf16_stored(B16.data(), ldb)
                                            : Bf16Operand::fp32(B.data(), ldb);
            gemm_bf16(ta, tb, M, N, K, alpha, a, b, beta, c.data(), ldc);
            double err = 0, norm = 0;
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < N; ++j) {
                ASSERT_FALSE(std::isnan(c[i * ldc + j]));
                err += std::pow(double(c[i * ldc + j]) - ref[i * ldc + j], 2);
                norm += ref[i * ldc + j] * ref[i * ldc + j];
              }
            const std::string where = "emulate=" + std::to_string(emulate) + " ta=" +
                                      std::to_string(ta) + " tb=" + std::to_string(tb) +
                                      " policy=" + std::to_string(int(pol)) +
                                      " form=" + std::to_string(form);
            EXPECT_LT(std::sqrt(err / norm), 1e-5) << where;
            for (int64_t i = 0; i < M; ++i)  // padding of C untouched, whatever the form
              for (int64_t j = N; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], C0[i * ldc + j]) << where;
            if (plain.empty()) plain = c;
            EXPECT_LT(rel_l2(c.data(), plain.data(), c.size()), 1e-5) << where;
          }
        }
      }
  }
  // The report names each shape (native: the form chosen; emulated: that no choice applies).
  const std::string rep = gemm_layout_report();
  for (const char* shape : {"NN 45x70x96", "NT 45x70x96", "TN 45x70x96", "TT 45x70x96"})
    EXPECT_NE(rep.find(shape), std::string::npos) << shape << " missing from:\n" << rep;
}

// A mixture of experts multiplies a new row count almost every step: the primitives kept stay
// bounded (least recently used dropped), and a shape multiplied again after its primitive was
// dropped is made again and still right.
TEST(Bf16, GemmPrimitiveCacheStaysBoundedOverManyRowCounts) {
  if (!native_bf16_matmul()) GTEST_SKIP() << "no native bf16 matmul here: " << bf16_matmul_path();
  LayoutGuard guard;
  set_gemm_layout_policy(GemmLayoutPolicy::kRule);
  const int64_t N = 16, K = 32, Mmax = 1100;  // past the report's 1024 lines too
  const auto A = normal(size_t(Mmax * K), 31), B = normal(size_t(K * N), 32);
  auto check = [&](int64_t M) {
    std::vector<float> c(size_t(M * N));
    gemm_bf16(false, false, M, N, K, 1.0f, Bf16Operand::fp32(A.data(), K),
              Bf16Operand::fp32(B.data(), N), 0.0f, c.data(), N);
    double err = 0, norm = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double r = 0;
        for (int64_t k = 0; k < K; ++k)
          r += double(round_to_bf16(A[size_t(i * K + k)])) * double(round_to_bf16(B[size_t(k * N + j)]));
        err += std::pow(double(c[size_t(i * N + j)]) - r, 2), norm += r * r;
      }
    EXPECT_LT(std::sqrt(err / norm), 1e-5) << "M = " << M;
  };
  for (int64_t M = 1; M <= Mmax; ++M) check(M);
  EXPECT_LE(gemm_bf16_cached_primitives(), size_t(256));
  EXPECT_GE(gemm_bf16_cached_primitives(), size_t(200));  // the recent ones are kept
  check(1);  // dropped long ago: made again
  EXPECT_LE(gemm_bf16_cached_primitives(), size_t(256));
  const std::string rep = gemm_layout_report();  // the report stops listing, and counts
  EXPECT_LE(std::count(rep.begin(), rep.end(), '\n'), 1025);
  EXPECT_NE(rep.find("more shapes"), std::string::npos);
}

// alpha != 1 goes through oneDNN's scales (a different mechanism in oneDNN 2 and 3).
TEST(Bf16, GemmScalesByAlphaInBothForms) {
  LayoutGuard guard;
  const int64_t M = 20, N = 33, K = 64;
  const auto A = normal(size_t(M * K), 21), B = normal(size_t(N * K), 22);
  for (GemmLayoutPolicy pol : {GemmLayoutPolicy::kPlain, GemmLayoutPolicy::kTransposed}) {
    set_gemm_layout_policy(pol);
    std::vector<float> c1(size_t(M * N)), c2(size_t(M * N));
    gemm_bf16(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, c1.data(), N);
    gemm_bf16(false, true, M, N, K, -0.375f, A.data(), K, B.data(), K, 0.0f, c2.data(), N);
    for (size_t i = 0; i < c1.size(); ++i) EXPECT_NEAR(c2[i], -0.375f * c1[i], 1e-5f * (1 + std::fabs(c1[i])));
  }
}

// Each bf16-output kernel against its fp32 kernel: the stored result is the fp32 result rounded
// (relative error at most 2^-8 per element, never NaN).
TEST(Bf16, FusedCastKernelsRoundTheFp32Result) {
  const int64_t n = 37, C = 96, F = 80;
  const auto x = normal(size_t(n * C), 31), w = normal(size_t(C), 32), b = normal(size_t(C), 33);
  auto check = [&](const std::vector<float>& ref, const std::vector<uint16_t>& got, const char* what) {
    ASSERT_EQ(ref.size(), got.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const float g = bf16_to_float(got[i]);
      ASSERT_FALSE(std::isnan(g)) << what << " " << i;
      EXPECT_LE(std::fabs(g - ref[i]), 0x1p-8f * std::fabs(ref[i]) + 1e-30f) << what << " " << i;
    }
  };
  {
    std::vector<float> out(x.size()), mean(n), rstd(n), mean16(n), rstd16(n);
    std::vector<uint16_t> out16(x.size());
    layernorm_forward<float>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, C, 1e-5f);
    layernorm_forward_bf16(out16.data(), mean16.data(), rstd16.data(), x.data(), w.data(), b.data(), n, C, 1e-5f);
    check(out, out16, "layernorm");
    EXPECT_EQ(mean, mean16);
    EXPECT_EQ(rstd, rstd16);
  }
  {
    std::vector<float> out(x.size()), rstd(n), rstd16(n);
    std::vector<uint16_t> out16(x.size());
    rmsnorm_forward<float>(out.data(), rstd.data(), x.data(), w.data(), n, C, 1e-5f);
    rmsnorm_forward_bf16(out16.data(), rstd16.data(), x.data(), w.data(), n, C, 1e-5f);
    check(out, out16, "rmsnorm");
    EXPECT_EQ(rstd, rstd16);
  }
  {
    const auto d = normal(x.size(), 34);
    std::vector<float> out(x.size()), dx(x.size());
    std::vector<uint16_t> out16(x.size()), dx16(x.size());
    gelu_forward<float>(out.data(), x.data(), int64_t(x.size()));
    gelu_forward_bf16(out16.data(), x.data(), int64_t(x.size()));
    check(out, out16, "gelu forward");
    gelu_backward<float>(dx.data(), d.data(), x.data(), int64_t(x.size()));
    gelu_backward_bf16(dx16.data(), d.data(), x.data(), int64_t(x.size()));
    check(dx, dx16, "gelu backward");
  }
  {
    const auto gu = normal(size_t(n * 2 * F), 35), d = normal(size_t(n * F), 36);
    std::vector<float> out(size_t(n * F)), dgu(gu.size());
    std::vector<uint16_t> out16(out.size()), dgu16(gu.size());
    swiglu_forward<float>(out.data(), gu.data(), n, F);
    swiglu_forward_bf16(out16.data(), gu.data(), n, F);
    check(out, out16, "swiglu forward");
    swiglu_backward<float>(dgu.data(), d.data(), gu.data(), n, F);
    swiglu_backward_bf16(dgu16.data(), d.data(), gu.data(), n, F);
    check(dgu, dgu16, "swiglu backward");
  }
  {
    const int64_t V = 300;
    auto logits = normal(size_t(n * V), 37);
    for (auto& v : logits) v *= 3;
    std::vector<int32_t> tgt(n);
    for (int64_t t = 0; t < n; ++t) tgt[t] = t == 5 ? -1 : int32_t((t * 37) % V);
    std::vector<float> l32 = logits, l16 = logits, losses(n), losses16(n);
    std::vector<uint16_t> d16(size_t(n * V), 0xFFFF);
    const double s32 = cross_entropy_fused<float>(l32.data(), losses.data(), tgt.data(), n, V, 0.25f);
    const double s16 = cross_entropy_fused_bf16(l16.data(), d16.data(), losses16.data(), tgt.data(), n, V, 0.25f);
    EXPECT_EQ(s32, s16);
    EXPECT_EQ(losses, losses16);
    for (size_t i = 0; i < d16.size(); ++i) {
      const float g = bf16_to_float(d16[i]);
      ASSERT_FALSE(std::isnan(g)) << i;
      EXPECT_LE(std::fabs(g - l32[i]), 0x1p-8f * std::fabs(l32[i]) + 1e-30f) << i;
    }
  }
  {
    const int64_t m = 5000;
    auto p = normal(size_t(m), 41), g = normal(size_t(m), 42);
    std::vector<float> p2 = p, mo(m), vo(m), mo2(m), vo2(m);
    std::vector<uint16_t> p16(m);
    for (int step = 1; step <= 3; ++step) {
      adamw_update<float>(p.data(), g.data(), mo.data(), vo.data(), m, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step);
      adamw_update_bf16(p2.data(), p16.data(), g.data(), mo2.data(), vo2.data(), m, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step);
    }
    EXPECT_EQ(p, p2);  // the fused pass changes nothing in the fp32 update
    EXPECT_EQ(mo, mo2);
    EXPECT_EQ(vo, vo2);
    for (int64_t i = 0; i < m; ++i) ASSERT_EQ(p16[i], float_to_bf16(p[i])) << i;
  }
  {
    const auto big = normal(200000, 43);
    std::vector<uint16_t> h(big.size());
    std::vector<float> back(big.size());
    convert_to_bf16(big.data(), h.data(), int64_t(big.size()));
    convert_from_bf16(h.data(), back.data(), int64_t(big.size()));
    for (size_t i = 0; i < big.size(); ++i) {
      ASSERT_EQ(h[i], float_to_bf16(big[i])) << i;
      ASSERT_EQ(back[i], round_to_bf16(big[i])) << i;
    }
  }
}

// linear_forward_bf16 / linear_backward_bf16 against the fp32 linear layer: bf16 tolerances.
TEST(Bf16, LinearOnBf16OperandsTracksFp32ForwardAndBackward) {
  const int64_t n = 64, IC = 96, OC = 72;
  const auto x = normal(size_t(n * IC), 51), W = normal(size_t(OC * IC), 52),
             bias = normal(size_t(OC), 53), dy = normal(size_t(n * OC), 54);
  const auto x16 = to_bf16(x), W16 = to_bf16(W), dy16 = to_bf16(dy);
  std::vector<float> y(size_t(n * OC)), y16(y.size());
  linear_forward<float>(y.data(), x.data(), W.data(), bias.data(), n, IC, OC);
  linear_forward_bf16(y16.data(), x16.data(), W16.data(), bias.data(), n, IC, OC);
  const double ef = rel_l2(y16.data(), y.data(), y.size());
  EXPECT_GT(ef, 1e-4);
  EXPECT_LT(ef, 1e-2);
  std::vector<float> dx(size_t(n * IC)), dW(W.size(), 0.5f), db(OC, 0.25f);
  std::vector<float> dx16(dx.size()), dW16(W.size(), 0.5f), db16(OC, 0.25f);
  linear_backward<float>(dx.data(), dW.data(), db.data(), dy.data(), x.data(), W.data(), n, IC, OC);
  linear_backward_bf16(dx16.data(), dW16.data(), db16.data(), dy16.data(), dy.data(), x16.data(),
                       W16.data(), n, IC, OC);
  for (auto [got, want, what] : {std::tuple{&dx16, &dx, "dx"}, std::tuple{&dW16, &dW, "dW"}}) {
    const double e = rel_l2(got->data(), want->data(), got->size());
    EXPECT_LT(e, 1e-2) << what;
    for (float v : *got) ASSERT_FALSE(std::isnan(v)) << what;
  }
  EXPECT_EQ(db, db16);  // the bias gradient sums the fp32 dout given
  std::vector<float> db_b(OC, 0.25f);
  linear_backward_bf16(nullptr, nullptr, db_b.data(), dy16.data(), nullptr, x16.data(), W16.data(), n, IC, OC);
  EXPECT_LT(rel_l2(db_b.data(), db.data(), db.size()), 1e-2);
}

// The bf16 model (bf16 weight copy, bf16 activations) against the fp32 model on the same weights:
// loss and every parameter gradient within bf16 tolerances, GPT-2, Llama and Qwen3; its activation
// memory is smaller; the optimizer-written weight copy gives the same bits as the model's own.
TEST(Bf16, ModelInBf16TracksFp32LossAndGradients) {
  for (const char* name : {"tiny", "llama-tiny", "qwen3-tiny"}) {
    const ModelConfig mc = named_model(name);
    const int B = 2, T = 32;
    std::vector<int32_t> x(size_t(B) * T), y(x.size());
    Rng r(3);
    for (auto& v : x) v = int32_t(r.next_u64() % uint64_t(mc.vocab_size));
    for (auto& v : y) v = int32_t(r.next_u64() % uint64_t(mc.vocab_size));
    Transformer<float> m32(mc, B, T, Precision::FP32);
    m32.init_weights(9);
    Transformer<float> m16(mc, B, T, Precision::BF16);
    m16.init_weights(9);
    ASSERT_FALSE(m32.bf16());
    ASSERT_TRUE(m16.bf16());
    EXPECT_LT(m16.activation_bytes(), m32.activation_bytes());
    m32.zero_grads();
    m16.zero_grads();
    const double l32 = m32.forward_backward(x.data(), y.data(), B, T, 1.0f / (B * T));
    const double l16 = m16.forward_backward(x.data(), y.data(), B, T, 1.0f / (B * T));
    EXPECT_NEAR(l16 / l32, 1.0, 2e-3) << name;
    for (const ParamSpec& s : m32.table().specs) {
      const double e = rel_l2(m16.grads() + s.offset, m32.grads() + s.offset, size_t(s.numel));
      EXPECT_LT(e, 3e-2) << name << " " << s.name;
      for (int64_t i = 0; i < s.numel; ++i) ASSERT_FALSE(std::isnan(m16.grads()[s.offset + i])) << s.name;
    }
    // An optimizer step writing the bf16 copy, against the same step followed by the model's own
    // conversion: the next forward sees identical weights.
    TrainConfig tc;
    AdamW o1(m16.table(), tc);
    Transformer<float> m16b(mc, B, T, Precision::BF16);
    m16b.init_weights(9);
    m16b.zero_grads();
    m16b.forward_backward(x.data(), y.data(), B, T, 1.0f / (B * T));
    AdamW o2(m16b.table(), tc);
    o1.update(m16.params(), m16.params_bf16(), m16.grads(), 1e-3, 1.0, 1);
    m16.params_bf16_written();
    o2.update(m16b.params(), m16b.grads(), 1e-3, 1.0, 1);
    const double a = m16.forward_loss(x.data(), y.data(), B, T);
    const double b = m16b.forward_loss(x.data(), y.data(), B, T);
    EXPECT_EQ(a, b) << name;
  }
}

// oneDNN's own packed weight format against the plain layouts the step calls (issue 19): on the
// GEMMs whose B operand is a model weight (forward Y = X·Wᵀ, NT; input gradient dX = dY·W, NN),
// gpt2-124m's (1024 tokens) and small's (4 x 512) shapes from model_gemm_shapes, random bf16
// operands (zeros run faster than real data). The packed form is the matmul created with
// weights format_tag::any on a copy reordered into the format it asks for; the reorder is what
// a packed weight costs per update. Plain and packed in alternating order, then the reorder, in
// TETRAD_BENCH_ROUNDS rounds (default 9); medians of wall time and of the process's CPU time.
// Prints per shape, and per model the time one step would save with each weight packed once
// per update and used once (a step of one micro-batch) against the reorders it costs, and the
// uses per update that repay them; then the forward shapes at decoding's 1 and 16 rows. Those
// rows reuse each weight from cache round after round (five weights, 87 MB, fit this CPU's
// L3); a decoding step reads every weight once per token from memory, where packing does not
// change the bytes read, so they bound what packing could do for decoding, not what it does.
//   OMP_NUM_THREADS=1 build/tests/test_precision --gtest_also_run_disabled_tests
//     --gtest_filter='DISABLED_Benchmark.Bf16PackedWeightsAgainstPlain'   (one command line)
TEST(DISABLED_Benchmark, Bf16PackedWeightsAgainstPlain) {
  if (!native_bf16_matmul()) GTEST_SKIP() << "no native bf16 matmul here: " << bf16_matmul_path();
  using dnnl::memory;
  using dt = memory::data_type;
  const char* env = std::getenv("TETRAD_BENCH_ROUNDS");
  const int rounds = env && *env ? std::max(1, std::atoi(env)) : 9;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  auto wall = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  auto cpu = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto make_pd = [&](const memory::desc& a, const memory::desc& w, const memory::desc& c) {
#if DNNL_VERSION_MAJOR >= 3
    return dnnl::matmul::primitive_desc(eng, a, w, c);
#else
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, w, c), eng);
#endif
  };
  std::printf("threads %d, %d rounds, load average at start: ", omp_get_max_threads(), rounds);
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) std::printf("%s", buf);
    std::fclose(f);
  }
  struct Case {
    GemmShape s;
    dnnl::matmul plain, packed;
    memory a, w, wp, c;
    dnnl::reorder pack;
    std::vector<double> wall_plain, wall_packed, wall_pack, cpu_plain, cpu_packed, cpu_pack;
    double max_rel_diff = 0;
  };
  struct Run {
    std::string model;
    int tokens;
    bool forward_only;  // decoding's row counts: the weights' forward GEMMs only
  };
  for (const auto& [model, tokens, forward_only] :
       {Run{"gpt2-124m", 1024, false}, Run{"small", 2048, false}, Run{"gpt2-124m", 1, true},
        Run{"gpt2-124m", 16, true}}) {
    std::vector<Case> cases;
    for (const GemmShape& s : model_gemm_shapes(named_model(model), tokens)) {
      if (s.transa != 'N') continue;  // the weight gradient: B is an activation
      if (forward_only && s.transb != 'T') continue;
      Case c;
      c.s = s;
      const int64_t M = s.M, N = s.N, K = s.K;
      const bool tb = s.transb == 'T';  // forward: W [N, K] read transposed
      const memory::desc a_md({M, K}, dt::bf16, memory::dims{K, 1});
      const memory::desc w_md({K, N}, dt::bf16, tb ? memory::dims{1, K} : memory::dims{N, 1});
      const memory::desc c_md({M, N}, dt::f32, memory::dims{N, 1});
      const memory::desc any_md({K, N}, dt::bf16, memory::format_tag::any);
      const auto pd_plain = make_pd(a_md, w_md, c_md), pd_packed = make_pd(a_md, any_md, c_md);
      c.plain = dnnl::matmul(pd_plain);
      c.packed = dnnl::matmul(pd_packed);
      c.a = memory(a_md, eng);
      c.w = memory(w_md, eng);
      c.wp = memory(pd_packed.weights_desc(), eng);
      c.c = memory(c_md, eng);
      for (auto [mem, n, seed] : {std::tuple{&c.a, M * K, 1}, std::tuple{&c.w, K * N, 2}}) {
        const std::vector<float> v = normal(size_t(n), uint64_t(seed) + 10 * cases.size());
        convert_to_bf16(v.data(), static_cast<uint16_t*>(mem->get_data_handle()), n, true);
      }
      c.pack = dnnl::reorder(c.w, c.wp);
      cases.push_back(std::move(c));
    }
    auto run_plain = [&](Case& c) {
      c.plain.execute(strm, {{DNNL_ARG_SRC, c.a}, {DNNL_ARG_WEIGHTS, c.w}, {DNNL_ARG_DST, c.c}});
      strm.wait();
    };
    auto run_packed = [&](Case& c) {
      c.packed.execute(strm, {{DNNL_ARG_SRC, c.a}, {DNNL_ARG_WEIGHTS, c.wp}, {DNNL_ARG_DST, c.c}});
      strm.wait();
    };
    auto run_pack = [&](Case& c) {
      c.pack.execute(strm, c.w, c.wp);
      strm.wait();
    };
    for (Case& c : cases) {  // warm-up, and the two products against each other
      run_pack(c);
      run_plain(c);
      const float* out = static_cast<const float*>(c.c.get_data_handle());
      const std::vector<float> ref(out, out + int64_t(c.s.M) * c.s.N);
      run_packed(c);
      double scale = 0, diff = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        ASSERT_FALSE(std::isnan(out[i])) << c.s.to_string();
        scale = std::max(scale, double(std::fabs(ref[i])));
        diff = std::max(diff, double(std::fabs(out[i] - ref[i])));
      }
      c.max_rel_diff = diff / scale;
      EXPECT_LT(c.max_rel_diff, 1e-5) << c.s.to_string();  // summation order only
    }
    for (int r = 0; r < rounds; ++r)
      for (size_t i = 0; i < cases.size(); ++i) {
        Case& c = cases[i];
        for (int k = 0; k < 2; ++k) {
          const bool packed = (k == 0) == bool((r + i) & 1);
          const double w0 = wall(), c0 = cpu();
          packed ? run_packed(c) : run_plain(c);
          (packed ? c.wall_packed : c.wall_plain).push_back(wall() - w0);
          (packed ? c.cpu_packed : c.cpu_plain).push_back(cpu() - c0);
        }
        const double w0 = wall(), c0 = cpu();
        run_pack(c);
        c.wall_pack.push_back(wall() - w0);
        c.cpu_pack.push_back(cpu() - c0);
      }
    std::printf("%s, %d tokens%s: ms per call, wall | CPU\n", model.c_str(), tokens,
                forward_only ? " (forward shapes at decoding's row count, weights in cache)" : "");
    std::printf("  %-30s %17s %17s %9s %15s  %s\n", "shape", "plain", "packed", "plain/pk",
                "reorder", "packed vs plain");
    double saved_w = 0, saved_c = 0, pack_w = 0, pack_c = 0, plain_w = 0, plain_c = 0;
    double sel_saved_c = 0, sel_pack_c = 0;  // only the shapes whose packed product ran faster
    for (Case& c : cases) {
      const double pw = median(c.wall_plain), kw = median(c.wall_packed), rw = median(c.wall_pack);
      const double pc = median(c.cpu_plain), kc = median(c.cpu_packed), rc = median(c.cpu_pack);
      // A weight of L layers is one tensor per layer: the step runs the shape n_layer times
      // (the head once).
      const int n = c.s.name.rfind("lm_head", 0) == 0 ? 1 : named_model(model).n_layer;
      saved_w += n * (pw - kw), saved_c += n * (pc - kc);
      pack_w += n * rw, pack_c += n * rc;
      plain_w += n * pw, plain_c += n * pc;
      if (kc < pc) sel_saved_c += n * (pc - kc), sel_pack_c += n * rc;
      std::printf("  %-30s %8.2f | %6.2f %8.2f | %6.2f %4.2f|%4.2f %6.2f | %6.2f  max rel diff %.1e\n",
                  c.s.to_string().c_str(), pw * 1e3, pc * 1e3, kw * 1e3, kc * 1e3, pw / kw,
                  pc / kc, rw * 1e3, rc * 1e3, c.max_rel_diff);
    }
    std::printf("  per %s (each weight packed once, used once): plain %.1f | %.1f ms, packed "
                "saves %.1f | %.1f ms, reorders cost %.1f | %.1f ms: net %+.1f | %+.1f ms\n",
                forward_only ? "call" : "step", plain_w * 1e3, plain_c * 1e3, saved_w * 1e3, saved_c * 1e3, pack_w * 1e3,
                pack_c * 1e3, (saved_w - pack_w) * 1e3, (saved_c - pack_c) * 1e3);
    // Uses per update (micro-batches of gradient accumulation or of a pipeline) at which the
    // reorders are paid back, in CPU time: every weight packed, and only the shapes that gained.
    std::printf("  uses per update to repay the reorders (CPU): all packed %s; only the shapes "
                "where packed ran faster (%s ms saved per use): %.1f\n",
                saved_c > 0 ? std::to_string(pack_c / saved_c).substr(0, 4).c_str() : "never",
                std::to_string(sel_saved_c * 1e3).substr(0, 5).c_str(),
                sel_saved_c > 0 ? sel_pack_c / sel_saved_c : 0.0);
  }
}
