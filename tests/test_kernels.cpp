// Tests of the CPU kernels in backend/cpu/ops.hpp and backend/cpu/fast_math.hpp.
//
//  * Gradients: every backward against central differences of its forward, in double, with the
//    scalar loss L = Σ out ⊙ R (R random, fixed), for the input and every parameter.
//  * Forwards against direct formulas (naive GEMM, HF rotate_half RoPE, log-sum-exp, AdamW by
//    hand) and the documented accumulate (+=) / overwrite semantics.
//  * float against double on a realistic shape (ntok=37, C=96, V=300): this is what exercises the
//    float fast paths (oneDNN sgemm, fast_exp / fast_tanh / fast_sigmoid), which double never uses.
//  * Error paths (token / target ids outside the vocabulary) and determinism (repeat runs, and
//    1 vs 2 OpenMP threads for the kernels whose reductions are thread-count independent).
//
// Not here: attention and the parallel layers (their own tests), and performance.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradcheck.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/backend/cpu/fast_math.hpp"
#include "tetrad/backend/cpu/ops.hpp"

namespace tetrad::kernels {
namespace {

using tetrad::testing::gradient_matches;
using tetrad::testing::weighted_sum;
using Vec = std::vector<double>;
using Outputs = std::vector<std::pair<std::string, Vec>>;  // named outputs of one op run

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------------------------------------
// Helpers

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * std::uniform_real_distribution<double>(0.0, 1.0)(gen_);
  }
  Vec vec(int64_t n, double lo = -1.0, double hi = 1.0) {
    Vec v(n);
    for (double& x : v) x = uniform(lo, hi);
    return v;
  }
  // Rounded to float, so that the float and double kernels see exactly the same inputs.
  Vec fvec(int64_t n, double lo = -1.0, double hi = 1.0) {
    Vec v = vec(n, lo, hi);
    for (double& x : v) x = double(float(x));
    return v;
  }
  int32_t index(int32_t n) { return std::uniform_int_distribution<int32_t>(0, n - 1)(gen_); }

 private:
  std::mt19937_64 gen_;
};

template <typename T>
std::vector<T> cast(const Vec& v) {
  return std::vector<T>(v.begin(), v.end());
}
template <typename T>
Vec widen(const std::vector<T>& v) {
  return Vec(v.begin(), v.end());
}

// max_i |a_i - b_i| / (|b_i| + rms(b)): relative for entries of typical size, absolute (in units
// of the tensor's rms) for entries near zero, where a relative error says nothing about the kernel.
::testing::AssertionResult agree(const std::string& what, const Vec& a, const Vec& b, double tol) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << what << ": sizes " << a.size() << " vs " << b.size();
  long double ss = 0;
  for (double x : b) ss += (long double)x * x;
  const double rms = b.empty() ? 0.0 : std::sqrt(double(ss / b.size()));
  double worst = 0;
  size_t wi = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double den = std::max(std::abs(b[i]) + rms, 1e-300);
    const double e = std::abs(a[i] - b[i]) / den;
    if (!(e <= worst)) {  // NaN counts as worst
      worst = std::isnan(e) ? INFINITY : e;
      wi = i;
    }
  }
  if (worst < tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": scaled error " << worst << " at index " << wi << " (" << a[wi] << " vs "
         << b[wi] << ", rms " << rms << "), tolerance " << tol;
}

void expect_agree(const std::string& op, const Outputs& f, const Outputs& d, double tol) {
  ASSERT_EQ(f.size(), d.size());
  for (size_t k = 0; k < f.size(); ++k) {
    ASSERT_EQ(f[k].first, d[k].first);
    EXPECT_TRUE(agree(op + "/" + f[k].first, f[k].second, d[k].second, tol));
  }
}

::testing::AssertionResult bit_identical(const std::string& what, const Vec& a, const Vec& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << what << ": sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0)
      return ::testing::AssertionFailure() << what << ": first difference at index " << i << " ("
                                           << a[i] << " vs " << b[i] << ")";
  return ::testing::AssertionSuccess();
}

void expect_bit_identical(const std::string& op, const Outputs& a, const Outputs& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k)
    EXPECT_TRUE(bit_identical(op + "/" + a[k].first, a[k].second, b[k].second));
}

// Runs fn with the given OpenMP thread count, restoring the previous one.
template <typename Fn>
auto with_threads(int n, Fn fn) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(n);
  EXPECT_EQ(omp_get_max_threads(), n);
  auto r = fn();
  omp_set_num_threads(before);
  return r;
}

// Calls fn, which must throw tetrad::Error whose message contains `needle`.
template <typename Fn>
::testing::AssertionResult throws_error_naming(Fn fn, const std::string& needle) {
  try {
    fn();
  } catch (const tetrad::Error& e) {
    if (std::string(e.what()).find(needle) != std::string::npos)
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "message \"" << e.what() << "\" does not name \"" << needle << "\"";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure()
           << "threw something other than tetrad::Error: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// ---------------------------------------------------------------------------------------------
// The finite-difference checker itself: it must pass a right gradient and catch a wrong one.

TEST(GradCheck, PassesExactGradientAndCatchesAWrongEntry) {
  Rng rng(99);
  Vec x = rng.vec(10, 0.5, 1.5);
  const Vec x0 = x;
  auto loss = [&] {  // Σ x_i³ / 3 + x_0 x_1
    long double s = 0;
    for (double v : x) s += (long double)v * v * v / 3;
    return double(s + (long double)x[0] * x[1]);
  };
  Vec g(10);
  for (int i = 0; i < 10; ++i) g[i] = x[i] * x[i];
  g[0] += x[1];
  g[1] += x[0];
  const auto good = tetrad::testing::check_gradient(x, g, loss);
  EXPECT_EQ(good.checked, 10);
  EXPECT_LT(good.worst_rel, 1e-8);
  EXPECT_TRUE(bit_identical("input restored", x, x0));
  Vec bad = g;
  bad[7] *= 1 + 1e-5;  // a 1e-5 relative error must not pass
  const auto r = tetrad::testing::check_gradient(x, bad, loss);
  EXPECT_EQ(r.worst_index, 7);
  EXPECT_GT(r.worst_rel, 1e-6);
  EXPECT_FALSE(gradient_matches("bad", x, bad, loss));
  bad = g;
  bad[3] = kNaN;  // NaN is a failure, not skipped
  EXPECT_FALSE(gradient_matches("nan", x, bad, loss));
  // A subset check visits max_checks evenly spaced elements.
  tetrad::testing::GradCheckOptions opt;
  opt.max_checks = 4;
  EXPECT_EQ(tetrad::testing::check_gradient(x, g, loss, opt).checked, 4);
}

// ---------------------------------------------------------------------------------------------
// GEMM against a naive loop

// Naive C = alpha op(A) op(B) + beta C in long double over the logical region; also returns
// |alpha| Σ|a||b| + |beta c| per element, the scale of the rounding error bound.
template <typename T>
void naive_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                const std::vector<T>& A, int64_t lda, const std::vector<T>& B, int64_t ldb,
                double beta, const std::vector<T>& C0, int64_t ldc, Vec& ref, Vec& mag) {
  ref.assign(C0.size(), 0.0);
  mag.assign(C0.size(), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      long double s = 0, m = 0;
      for (int64_t k = 0; k < K; ++k) {
        const long double a = ta ? A[k * lda + i] : A[i * lda + k];
        const long double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
        m += std::abs(a * b);
      }
      const double c0 = beta == 0 ? 0.0 : double(C0[i * ldc + j]);
      ref[i * ldc + j] = double(alpha * s + beta * c0);
      mag[i * ldc + j] = double(std::abs(alpha) * m + std::abs(beta * c0));
    }
}

template <typename T>
void check_gemm_all_transposes(int64_t M, int64_t N, int64_t K, double alpha, double beta,
                               bool nan_in_c) {
  const double u = std::numeric_limits<T>::epsilon() / 2;
  const T kPad = T(777.0);  // C's padding must come back untouched
  Rng rng(42 + M * 7 + N * 3 + K);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE("trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb));
      // Leading dimensions larger than the minimum; A's and B's padding is NaN so that reading
      // outside the logical matrix shows up.
      const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, lda = a_cols + 3;
      const int64_t b_rows = tb ? N : K, b_cols = tb ? K : N, ldb = b_cols + 2;
      const int64_t ldc = N + 4;
      std::vector<T> A(a_rows * lda, T(kNaN)), B(b_rows * ldb, T(kNaN)), C(M * ldc, kPad);
      for (int64_t r = 0; r < a_rows; ++r)
        for (int64_t c = 0; c < a_cols; ++c) A[r * lda + c] = T(rng.uniform(-1, 1));
      for (int64_t r = 0; r < b_rows; ++r)
        for (int64_t c = 0; c < b_cols; ++c) B[r * ldb + c] = T(rng.uniform(-1, 1));
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = nan_in_c ? T(kNaN) : T(rng.uniform(-1, 1));
      Vec ref, mag;
      naive_gemm<T>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ref, mag);
      gemm<T>(ta, tb, M, N, K, T(alpha), A.data(), lda, B.data(), ldb, T(beta), C.data(), ldc);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
          const int64_t idx = i * ldc + j;
          if (j >= N) {
            ASSERT_EQ(C[idx], kPad) << "padding of C written at (" << i << ", " << j << ")";
            continue;
          }
          // Standard bound for a K-term dot product, plus the alpha / beta operations.
          const double bound = double(K + 3) * u * mag[idx];
          ASSERT_LE(std::abs(double(C[idx]) - ref[idx]), bound)
              << "C(" << i << ", " << j << ") = " << C[idx] << ", reference " << ref[idx];
        }
    }
}

TEST(Gemm, DoubleMatchesNaiveLoopAllTransposes) {
  check_gemm_all_transposes<double>(5, 7, 6, 0.75, -0.5, false);
  check_gemm_all_transposes<double>(33, 17, 40, 1.0, 1.0, false);
}

TEST(Gemm, FloatMatchesNaiveLoopAllTransposes) {
  check_gemm_all_transposes<float>(5, 7, 6, 0.75, -0.5, false);
  check_gemm_all_transposes<float>(33, 17, 40, 1.0, 1.0, false);
  check_gemm_all_transposes<float>(70, 129, 96, -1.25, 0.5, false);
}

// beta = 0 must not read C (BLAS semantics): linear_forward without bias relies on it to
// overwrite uninitialised output.
TEST(Gemm, BetaZeroIgnoresGarbageInC) {
  check_gemm_all_transposes<double>(6, 5, 7, 1.0, 0.0, true);
  check_gemm_all_transposes<float>(6, 5, 7, 1.0, 0.0, true);
  check_gemm_all_transposes<float>(40, 33, 64, 0.5, 0.0, true);
}

// ---------------------------------------------------------------------------------------------
// Linear

void check_linear_gradients(bool with_bias) {
  const int64_t ntok = 4, IC = 5, OC = 3;
  Rng rng(with_bias ? 1 : 2);
  Vec x = rng.vec(ntok * IC), W = rng.vec(OC * IC), b = rng.vec(OC), R = rng.vec(ntok * OC);
  Vec out(ntok * OC, kNaN);  // overwritten
  const double* bias = with_bias ? b.data() : nullptr;
  auto loss = [&] {
    linear_forward(out.data(), x.data(), W.data(), bias, ntok, IC, OC);
    return weighted_sum(out, R);
  };
  loss();
  for (int64_t t = 0; t < ntok; ++t)
    for (int64_t o = 0; o < OC; ++o) {
      double ref = with_bias ? b[o] : 0.0;
      for (int64_t i = 0; i < IC; ++i) ref += x[t * IC + i] * W[o * IC + i];
      EXPECT_NEAR(out[t * OC + o], ref, 1e-14) << "out(" << t << ", " << o << ")";
    }
  Vec dx(ntok * IC, 123.0);  // din is overwritten, not accumulated
  Vec dW(OC * IC, 0.0), db(OC, 0.0);
  linear_backward(dx.data(), dW.data(), with_bias ? db.data() : nullptr, R.data(), x.data(),
                  W.data(), ntok, IC, OC);
  EXPECT_TRUE(gradient_matches("din", x, dx, loss));
  EXPECT_TRUE(gradient_matches("dW", W, dW, loss));
  if (with_bias) {
    EXPECT_TRUE(gradient_matches("dbias", b, db, loss));
  }
}

TEST(Linear, GradientsWithBias) { check_linear_gradients(true); }
TEST(Linear, GradientsWithoutBias) { check_linear_gradients(false); }

// accumulate=true: out += in·Wᵀ (+ bias, added once); accumulate=false overwrites even NaN.
template <typename T>
void check_linear_forward_modes() {
  const int64_t ntok = 6, IC = 9, OC = 11;
  Rng rng(3);
  const Vec x = rng.fvec(ntok * IC), W = rng.fvec(OC * IC), b = rng.fvec(OC);
  const Vec prev = rng.fvec(ntok * OC);
  const std::vector<T> xt = cast<T>(x), Wt = cast<T>(W), bt = cast<T>(b);
  const double tol = std::is_same_v<T, float> ? 2e-6 : 1e-14;
  for (int with_bias = 0; with_bias < 2; ++with_bias)
    for (int accumulate = 0; accumulate < 2; ++accumulate) {
      SCOPED_TRACE("bias=" + std::to_string(with_bias) +
                   " accumulate=" + std::to_string(accumulate));
      std::vector<T> out = accumulate ? cast<T>(prev) : std::vector<T>(ntok * OC, T(kNaN));
      linear_forward<T>(out.data(), xt.data(), Wt.data(), with_bias ? bt.data() : nullptr, ntok, IC,
                        OC, accumulate);
      for (int64_t t = 0; t < ntok; ++t)
        for (int64_t o = 0; o < OC; ++o) {
          double ref = (accumulate ? prev[t * OC + o] : 0.0) + (with_bias ? b[o] : 0.0);
          for (int64_t i = 0; i < IC; ++i) ref += x[t * IC + i] * W[o * IC + i];
          ASSERT_NEAR(double(out[t * OC + o]), ref, tol) << "out(" << t << ", " << o << ")";
        }
    }
}

TEST(Linear, ForwardAccumulateAndOverwriteDouble) { check_linear_forward_modes<double>(); }
TEST(Linear, ForwardAccumulateAndOverwriteFloat) { check_linear_forward_modes<float>(); }

TEST(Linear, NullDinSkipsInputGradientOnly) {
  const int64_t ntok = 5, IC = 4, OC = 6;
  Rng rng(4);
  const Vec x = rng.vec(ntok * IC), W = rng.vec(OC * IC), R = rng.vec(ntok * OC);
  Vec dx(ntok * IC), dW1(OC * IC, 0.0), db1(OC, 0.0), dW2(OC * IC, 0.0), db2(OC, 0.0);
  linear_backward(dx.data(), dW1.data(), db1.data(), R.data(), x.data(), W.data(), ntok, IC, OC);
  linear_backward<double>(nullptr, dW2.data(), db2.data(), R.data(), x.data(), W.data(), ntok, IC,
                          OC);
  EXPECT_TRUE(bit_identical("dW", dW1, dW2));
  EXPECT_TRUE(bit_identical("dbias", db1, db2));
}

// ---------------------------------------------------------------------------------------------
// Embedding

void check_embedding(bool gpt2) {
  const int64_t V = 7, C = 4, T = 3, B = 2, ntok = B * T;
  const std::vector<int32_t> tokens = {3, 1, 3, 0, 3, 6};  // token 3 three times; 2, 4, 5 unused
  Rng rng(gpt2 ? 5 : 6);
  Vec wte = rng.vec(V * C), wpe = rng.vec(T * C), R = rng.vec(ntok * C);
  Vec out(ntok * C, kNaN);
  const double* pe = gpt2 ? wpe.data() : nullptr;
  auto loss = [&] {
    embedding_forward(out.data(), tokens.data(), wte.data(), pe, ntok, T, C, V);
    return weighted_sum(out, R);
  };
  loss();
  for (int64_t t = 0; t < ntok; ++t)
    for (int64_t c = 0; c < C; ++c)
      EXPECT_EQ(out[t * C + c], wte[tokens[t] * C + c] + (gpt2 ? wpe[(t % T) * C + c] : 0.0))
          << "out(" << t << ", " << c << ")";
  Vec dwte(V * C, 0.0), dwpe(T * C, 0.0);
  embedding_backward(dwte.data(), gpt2 ? dwpe.data() : nullptr, R.data(), tokens.data(), ntok, T,
                     C);
  EXPECT_TRUE(gradient_matches("dwte", wte, dwte, loss));
  for (int64_t v : {2, 4, 5})
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dwte[v * C + c], 0.0) << "unused token " << v;
  if (gpt2) {
    EXPECT_TRUE(gradient_matches("dwpe", wpe, dwpe, loss));
  }
}

TEST(Embedding, Gpt2WithPositionsRepeatedTokens) { check_embedding(true); }
TEST(Embedding, LlamaWithoutPositionsRepeatedTokens) { check_embedding(false); }

TEST(Embedding, TokenOutsideVocabularyThrowsNamingIt) {
  const int64_t V = 50, C = 3, ntok = 4;
  const Vec wte(V * C, 1.0), wpe(ntok * C, 0.0);
  Vec out(ntok * C);
  const std::vector<int32_t> too_big = {1, 2, 1234, 3}, negative = {1, -3, 2, 3},
                             edge = {0, 49, 50, 1};
  EXPECT_TRUE(throws_error_naming(
      [&] {
        embedding_forward(out.data(), too_big.data(), wte.data(), wpe.data(), ntok, ntok, C, V);
      },
      "1234"));
  EXPECT_TRUE(throws_error_naming(
      [&] {
        embedding_forward(out.data(), negative.data(), wte.data(), wpe.data(), ntok, ntok, C, V);
      },
      "-3"));
  EXPECT_TRUE(throws_error_naming(
      [&] {
        embedding_forward<double>(out.data(), edge.data(), wte.data(), nullptr, ntok, ntok, C, V);
      },
      "50"));
  const std::vector<float> wtef(V * C, 1.0f);
  std::vector<float> outf(ntok * C);
  EXPECT_TRUE(throws_error_naming(
      [&] {
        embedding_forward<float>(outf.data(), too_big.data(), wtef.data(), nullptr, ntok, ntok, C,
                                 V);
      },
      "1234"));
  // The valid extremes 0 and V-1 do not throw.
  const std::vector<int32_t> ok = {0, 49, 0, 49};
  EXPECT_NO_THROW(
      embedding_forward(out.data(), ok.data(), wte.data(), wpe.data(), ntok, ntok, C, V));
}

// ---------------------------------------------------------------------------------------------
// Norms

TEST(LayerNorm, ForwardStatisticsAndGradients) {
  const int64_t ntok = 3, C = 7;
  const double eps = 1e-5;
  Rng rng(7);
  Vec x = rng.vec(ntok * C, -1.5, 2.5), w = rng.vec(C, 0.5, 1.5), b = rng.vec(C),
      R = rng.vec(ntok * C);
  Vec out(ntok * C), mean(ntok), rstd(ntok);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), ntok, C,
                      eps);
    return weighted_sum(out, R);
  };
  loss();
  for (int64_t t = 0; t < ntok; ++t) {
    long double s = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) s += x[t * C + c];
    const long double m = s / C;
    for (int64_t c = 0; c < C; ++c) v += (x[t * C + c] - m) * (x[t * C + c] - m);
    const long double r = 1.0L / std::sqrt(v / C + eps);
    EXPECT_NEAR(mean[t], double(m), 1e-15);
    EXPECT_NEAR(rstd[t], double(r), 1e-14 * double(r));
    for (int64_t c = 0; c < C; ++c)
      EXPECT_NEAR(out[t * C + c], double((x[t * C + c] - m) * r * w[c] + b[c]), 1e-14);
  }
  const Vec mean0 = mean, rstd0 = rstd;
  Vec dx(ntok * C, 0.0), dw(C, 0.0), db(C, 0.0);
  layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean0.data(),
                     rstd0.data(), ntok, C);
  EXPECT_TRUE(gradient_matches("dx", x, dx, loss));
  EXPECT_TRUE(gradient_matches("dw", w, dw, loss));
  EXPECT_TRUE(gradient_matches("db", b, db, loss));
}

TEST(RmsNorm, ForwardAndGradients) {
  const int64_t ntok = 3, C = 7;
  const double eps = 1e-5;
  Rng rng(8);
  Vec x = rng.vec(ntok * C, -1.5, 2.5), w = rng.vec(C, 0.5, 1.5), R = rng.vec(ntok * C);
  Vec out(ntok * C), rstd(ntok);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), ntok, C, eps);
    return weighted_sum(out, R);
  };
  loss();
  for (int64_t t = 0; t < ntok; ++t) {
    long double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += (long double)x[t * C + c] * x[t * C + c];
    const long double r = 1.0L / std::sqrt(ss / C + eps);
    EXPECT_NEAR(rstd[t], double(r), 1e-14 * double(r));
    for (int64_t c = 0; c < C; ++c)
      EXPECT_NEAR(out[t * C + c], double(x[t * C + c] * r * w[c]), 1e-14);
  }
  const Vec rstd0 = rstd;
  Vec dx(ntok * C, 0.0), dw(C, 0.0);
  rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd0.data(), ntok, C);
  EXPECT_TRUE(gradient_matches("dx", x, dx, loss));
  EXPECT_TRUE(gradient_matches("dw", w, dw, loss));
}

// ---------------------------------------------------------------------------------------------
// Activations

TEST(Gelu, ForwardIsTanhApproximationAndGradient) {
  const int64_t n = 24;
  Rng rng(9);
  Vec x = rng.vec(n, -4, 4), R = rng.vec(n);
  x[0] = 0.0;
  x[1] = -6.0;
  x[2] = 6.0;
  Vec out(n);
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), n);
    return weighted_sum(out, R);
  };
  loss();
  for (int64_t i = 0; i < n; ++i) {
    // GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))).
    const double v = x[i];
    const double ref =
        0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(out[i], ref, 1e-15 * (1.0 + std::abs(ref))) << "x = " << v;
  }
  Vec dx(n, 55.0);  // overwritten
  gelu_backward(dx.data(), R.data(), x.data(), n);
  EXPECT_TRUE(gradient_matches("dx", x, dx, loss));
}

TEST(Swiglu, ForwardIsSiluGateTimesUpAndGradient) {
  const int64_t ntok = 3, F = 5;
  Rng rng(10);
  Vec gu = rng.vec(ntok * 2 * F, -3, 3), R = rng.vec(ntok * F);
  Vec out(ntok * F);
  auto loss = [&] {
    swiglu_forward(out.data(), gu.data(), ntok, F);
    return weighted_sum(out, R);
  };
  loss();
  for (int64_t t = 0; t < ntok; ++t)
    for (int64_t j = 0; j < F; ++j) {
      const double g = gu[t * 2 * F + j], u = gu[t * 2 * F + F + j];
      EXPECT_NEAR(out[t * F + j], g / (1.0 + std::exp(-g)) * u, 1e-15)
          << "(" << t << ", " << j << ")";
    }
  Vec dgu(ntok * 2 * F, 77.0);  // overwritten
  swiglu_backward(dgu.data(), R.data(), gu.data(), ntok, F);
  EXPECT_TRUE(gradient_matches("dgu", gu, dgu, loss));
}

// ---------------------------------------------------------------------------------------------
// RoPE. Rows of a qkv-like buffer: 3 heads of hd = 8, the first 2 rotated, 4 padding columns.

struct RopeSetup {
  int64_t B = 2, T = 5, pos0 = 3, n_heads = 3, n_rot = 2, hd = 8;
  int64_t stride = 3 * 8 + 4, ntok = 2 * 5, max_pos = 3 + 5 + 2;
  double theta = 10000.0;
  Vec cos_t, sin_t;
  RopeSetup() {
    cos_t.resize(max_pos * hd / 2);
    sin_t.resize(max_pos * hd / 2);
    rope_tables(cos_t.data(), sin_t.data(), max_pos, hd, theta);
  }
  explicit RopeSetup(const RopeFrequencies& f) : theta(f.theta) {
    cos_t.resize(max_pos * hd / 2);
    sin_t.resize(max_pos * hd / 2);
    rope_tables(cos_t.data(), sin_t.data(), max_pos, hd, f);
  }
  void forward(double* x) const {
    rope_forward(x, ntok, T, pos0, n_rot, hd, stride, cos_t.data(), sin_t.data());
  }
  void backward(double* x) const {
    rope_backward(x, ntok, T, pos0, n_rot, hd, stride, cos_t.data(), sin_t.data());
  }
};

TEST(Rope, TablesFollowHuggingFaceInvFreq) {
  const RopeSetup s;
  const int64_t half = s.hd / 2;
  for (int64_t p = 0; p < s.max_pos; ++p)
    for (int64_t i = 0; i < half; ++i) {
      // HF: inv_freq = 1 / theta^(arange(0, hd, 2) / hd); angle = position * inv_freq.
      const double ang = double(p) * std::pow(s.theta, -double(2 * i) / double(s.hd));
      EXPECT_NEAR(s.cos_t[p * half + i], std::cos(ang), 1e-14) << "p=" << p << " i=" << i;
      EXPECT_NEAR(s.sin_t[p * half + i], std::sin(ang), 1e-14) << "p=" << p << " i=" << i;
    }
}

TEST(Rope, ForwardMatchesRotateHalfFormula) {
  const RopeSetup s;
  const int64_t half = s.hd / 2;
  Rng rng(11);
  const Vec x = rng.vec(s.ntok * s.stride);
  Vec y = x;
  s.forward(y.data());
  for (int64_t t = 0; t < s.ntok; ++t) {
    const int64_t pos = s.pos0 + t % s.T;
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const double* xh = x.data() + t * s.stride + h * s.hd;
      const double* yh = y.data() + t * s.stride + h * s.hd;
      for (int64_t i = 0; i < s.hd; ++i) {
        if (h >= s.n_rot) {
          EXPECT_EQ(yh[i], xh[i]) << "head " << h << " is not rotated";
          continue;
        }
        // out = x * cos + rotate_half(x) * sin, cos/sin repeated over both halves,
        // rotate_half(x) = cat(-x[half:], x[:half]).
        const double ang = double(pos) / std::pow(s.theta, double(2 * (i % half)) / double(s.hd));
        const double rot = i < half ? -xh[i + half] : xh[i - half];
        EXPECT_NEAR(yh[i], xh[i] * std::cos(ang) + rot * std::sin(ang), 1e-14)
            << "t=" << t << " h=" << h << " i=" << i;
      }
    }
    for (int64_t c = s.n_heads * s.hd; c < s.stride; ++c)
      EXPECT_EQ(y[t * s.stride + c], x[t * s.stride + c]) << "padding column " << c;
  }
}

TEST(Rope, BackwardIsTheAdjointAndTheInverse) {
  const RopeSetup s;
  Rng rng(12);
  const Vec x = rng.vec(s.ntok * s.stride), y = rng.vec(s.ntok * s.stride);
  Vec fx = x, by = y;
  s.forward(fx.data());
  s.backward(by.data());
  // <rope(x), y> == <x, rope_backward(y)>
  const double lhs = weighted_sum(fx, y), rhs = weighted_sum(x, by);
  EXPECT_NEAR(lhs, rhs, 1e-13 * (std::abs(lhs) + 1.0));
  // A rotation's adjoint is its inverse.
  Vec round_trip = fx;
  s.backward(round_trip.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(round_trip[i], x[i], 1e-15) << i;
  // And as a gradient: d/dx Σ rope(x) ⊙ R = rope_backward(R).
  Vec xv = x, R = rng.vec(x.size()), out;
  auto loss = [&] {
    out = xv;
    s.forward(out.data());
    return weighted_sum(out, R);
  };
  Vec dx = R;
  s.backward(dx.data());
  EXPECT_TRUE(gradient_matches("dx", xv, dx, loss));
}

// Llama 3.1's scaling (rope type "llama3"), with the bands placed so that hd = 8 has one
// frequency in each: theta 100 gives inv_freq 1, 0.316, 0.1, 0.0316 (wavelengths 6.3, 19.9,
// 62.8, 199); original context 64 with low/high factors 2 and 8 puts the band edges at
// wavelengths 32 and 8: i = 0 unchanged, i = 1 in the smooth band, i = 2 and 3 divided by 8.
RopeFrequencies llama3_test_frequencies() {
  RopeFrequencies f;
  f.theta = 100;
  f.factor = 8;
  f.low_freq_factor = 2;
  f.high_freq_factor = 8;
  f.original_max_position = 64;
  return f;
}

TEST(Rope, Llama3FrequenciesByHand) {
  const RopeFrequencies f = llama3_test_frequencies();
  const std::vector<double> inv = rope_inv_freq(8, f);
  ASSERT_EQ(inv.size(), 4u);
  const double pi = 3.14159265358979323846;
  const double base1 = std::pow(100.0, -2.0 / 8);  // 0.3162
  // i = 0: wavelength 2 pi < 64 / 8: a high frequency, unchanged.
  EXPECT_NEAR(inv[0], 1.0, 1e-15);
  // i = 1: wavelength 2 pi / 0.3162 = 19.87, between 8 and 32: the smooth band,
  // s = (64 / 19.87 - 2) / (8 - 2) = 0.2034; inv = (1 - s) base / 8 + s base.
  const double s = (64.0 / (2 * pi / base1) - 2.0) / 6.0;
  EXPECT_NEAR(s, 0.20342, 1e-4);
  EXPECT_NEAR(inv[1], (1 - s) * base1 / 8 + s * base1, 1e-15);
  EXPECT_GT(inv[1], base1 / 8);  // strictly inside the band: between the two limits
  EXPECT_LT(inv[1], base1);
  // i = 2, 3: wavelengths 62.8 and 198.7 > 32: low frequencies, divided by the factor.
  EXPECT_NEAR(inv[2], 0.1 / 8, 1e-15);
  EXPECT_NEAR(inv[3], std::pow(100.0, -6.0 / 8) / 8, 1e-15);
  // No scaling (factor 0) is the default rope.
  RopeFrequencies plain;
  plain.theta = 100;
  const std::vector<double> p = rope_inv_freq(8, plain);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(p[i], std::pow(100.0, -2.0 * i / 8), 1e-15);
  // The tables use these frequencies.
  const RopeSetup st(f);
  for (int64_t pos = 0; pos < st.max_pos; ++pos)
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(st.cos_t[pos * 4 + i], std::cos(pos * inv[i]), 1e-14);
      EXPECT_NEAR(st.sin_t[pos * 4 + i], std::sin(pos * inv[i]), 1e-14);
    }
}

TEST(Rope, Llama3ForwardAndBackward) {
  const RopeSetup s(llama3_test_frequencies());
  const std::vector<double> inv = rope_inv_freq(s.hd, llama3_test_frequencies());
  const int64_t half = s.hd / 2;
  Rng rng(21);
  const Vec x = rng.vec(s.ntok * s.stride);
  Vec y = x;
  s.forward(y.data());
  for (int64_t t = 0; t < s.ntok; ++t) {
    const int64_t pos = s.pos0 + t % s.T;
    for (int64_t h = 0; h < s.n_rot; ++h) {
      const double* xh = x.data() + t * s.stride + h * s.hd;
      const double* yh = y.data() + t * s.stride + h * s.hd;
      for (int64_t i = 0; i < s.hd; ++i) {
        const double ang = double(pos) * inv[size_t(i % half)];
        const double rot = i < half ? -xh[i + half] : xh[i - half];
        EXPECT_NEAR(yh[i], xh[i] * std::cos(ang) + rot * std::sin(ang), 1e-14);
      }
    }
  }
  // Backward: the gradient of Σ rope(x) ⊙ R against finite differences.
  Vec xv = x, R = rng.vec(x.size()), out;
  auto loss = [&] {
    out = xv;
    s.forward(out.data());
    return weighted_sum(out, R);
  };
  Vec dx = R;
  s.backward(dx.data());
  EXPECT_TRUE(gradient_matches("dx", xv, dx, loss));
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

TEST(CrossEntropy, FusedLossGradientAndMasking) {
  const int64_t ntok = 6, V = 9;
  const double grad_scale = 0.37;
  const std::vector<int32_t> targets = {2, -1, 8, 0, -100, 2};  // rows 1 and 4 masked
  Rng rng(13);
  Vec logits = rng.vec(ntok * V, -3, 3);
  Vec losses(ntok, kNaN), d = logits;
  const double total =
      cross_entropy_fused(d.data(), losses.data(), targets.data(), ntok, V, grad_scale);
  double sum = 0;
  for (int64_t t = 0; t < ntok; ++t) {
    if (targets[t] < 0) {
      EXPECT_EQ(losses[t], 0.0) << "masked row " << t;
      for (int64_t j = 0; j < V; ++j) EXPECT_EQ(d[t * V + j], 0.0) << "masked row " << t;
    } else {
      long double se = 0;
      for (int64_t j = 0; j < V; ++j) se += std::exp((long double)logits[t * V + j]);
      const double ref = double(std::log(se) - logits[t * V + targets[t]]);
      EXPECT_NEAR(losses[t], ref, 1e-14) << "row " << t;
    }
    sum += losses[t];
  }
  EXPECT_NEAR(total, sum, 1e-14 * sum);
  // d/dlogits of grad_scale * Σ losses, by finite differences (masked rows included: zero).
  auto loss = [&] {
    Vec tmp = logits, ls(ntok);
    return grad_scale *
           cross_entropy_fused(tmp.data(), ls.data(), targets.data(), ntok, V, grad_scale);
  };
  EXPECT_TRUE(gradient_matches("dlogits", logits, d, loss));
}

template <typename T>
void check_forward_equals_fused() {
  const int64_t ntok = 37, V = 300;
  Rng rng(14);
  const std::vector<T> logits = cast<T>(rng.fvec(ntok * V, -6, 6));
  std::vector<int32_t> targets(ntok);
  for (auto& t : targets) t = rng.index(V);
  targets[3] = targets[20] = -1;
  std::vector<T> fused = logits, lf(ntok, T(kNaN)), lo(ntok, T(kNaN));
  const double sf = cross_entropy_fused<T>(fused.data(), lf.data(), targets.data(), ntok, V, T(1));
  const double so = cross_entropy_forward<T>(lo.data(), logits.data(), targets.data(), ntok, V);
  const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-14;
  for (int64_t t = 0; t < ntok; ++t)
    EXPECT_NEAR(double(lo[t]), double(lf[t]), tol * (1.0 + std::abs(double(lf[t])))) << t;
  EXPECT_NEAR(so, sf, tol * sf);
  EXPECT_EQ(lo[3], T(0));
  EXPECT_EQ(lo[20], T(0));
}

TEST(CrossEntropy, ForwardEqualsFusedLossesDouble) { check_forward_equals_fused<double>(); }
TEST(CrossEntropy, ForwardEqualsFusedLossesFloat) { check_forward_equals_fused<float>(); }

// Large logits must not overflow: the loss is invariant under a shift of the row.
TEST(CrossEntropy, LargeLogitsAreStable) {
  const int64_t ntok = 4, V = 50;
  Rng rng(15);
  const Vec logits = rng.fvec(ntok * V, -4, 4);
  std::vector<int32_t> targets = {0, 7, 49, 13};
  Vec l0(ntok), l1(ntok), d0 = logits, d1 = logits;
  for (double& v : d1) v += 1000.0;
  cross_entropy_fused(d0.data(), l0.data(), targets.data(), ntok, V, 1.0);
  cross_entropy_fused(d1.data(), l1.data(), targets.data(), ntok, V, 1.0);
  for (int64_t t = 0; t < ntok; ++t) EXPECT_NEAR(l1[t], l0[t], 1e-11) << t;
  for (int64_t i = 0; i < ntok * V; ++i) ASSERT_NEAR(d1[i], d0[i], 1e-12) << i;
  // float: logits around 1000 and -1000 (exactly representable) give finite, correct losses.
  for (double shift : {1000.0, -1000.0}) {
    std::vector<float> f = cast<float>(logits), lf(ntok);
    for (float& v : f) v += float(shift);
    const double s = cross_entropy_fused<float>(f.data(), lf.data(), targets.data(), ntok, V, 1.0f);
    EXPECT_TRUE(std::isfinite(s));
    for (int64_t t = 0; t < ntok; ++t) EXPECT_NEAR(double(lf[t]), l0[t], 2e-4) << t;
    for (float v : f) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST(CrossEntropy, TargetOutsideVocabularyThrows) {
  const int64_t ntok = 3, V = 50;
  const std::vector<int32_t> targets = {1, 77, 2};
  Vec logits(ntok * V, 0.5), losses(ntok);
  EXPECT_TRUE(throws_error_naming(
      [&] { cross_entropy_fused(logits.data(), losses.data(), targets.data(), ntok, V, 1.0); },
      "77"));
  EXPECT_TRUE(throws_error_naming(
      [&] { cross_entropy_forward(losses.data(), logits.data(), targets.data(), ntok, V); }, "77"));
  std::vector<float> lf(ntok * V, 0.5f), lsf(ntok);
  const std::vector<int32_t> edge = {1, 50, 2};  // V itself is outside
  EXPECT_TRUE(throws_error_naming(
      [&] { cross_entropy_fused<float>(lf.data(), lsf.data(), edge.data(), ntok, V, 1.0f); },
      "50"));
}

// ---------------------------------------------------------------------------------------------
// Optimizer and reductions

// AdamW written out by hand, one scalar at a time.
struct ScalarAdamW {
  double lr, b1, b2, eps, wd, scale;
  void step(double& p, double g, double& m, double& v, int t) const {
    const double gs = g * scale;
    m = b1 * m + (1 - b1) * gs;
    v = b2 * v + (1 - b2) * gs * gs;
    const double m_hat = m / (1 - std::pow(b1, t));
    const double v_hat = v / (1 - std::pow(b2, t));
    p = p - lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * p);
  }
};

TEST(AdamW, ThreeStepsMatchScalarReference) {
  const ScalarAdamW ref{0.01, 0.9, 0.95, 1e-8, 0.1, 0.5};
  const int64_t n = 6;
  Vec p = {0.5, -1.25, 2.0, 0.0, 3.0, -0.1}, m(n, 0.0), v(n, 0.0);
  Vec rp = p, rm = m, rv = v;
  const Vec grads[3] = {{0.3, -0.2, 0.0, 1.5, -4.0, 1e-3},
                        {-0.1, -0.2, 0.7, 1.0, 2.0, 1e-3},
                        {0.2, 0.4, -0.7, 0.0, 1.0, -2e-3}};
  for (int t = 1; t <= 3; ++t) {
    const Vec p_before = p;
    adamw_update(p.data(), grads[t - 1].data(), m.data(), v.data(), n, ref.lr, ref.b1, ref.b2,
                 ref.eps, ref.wd, ref.scale, t);
    for (int64_t i = 0; i < n; ++i) {
      ref.step(rp[i], grads[t - 1][i], rm[i], rv[i], t);
      EXPECT_NEAR(p[i], rp[i], 1e-15 * (1 + std::abs(rp[i]))) << "step " << t << " p[" << i << "]";
      EXPECT_NEAR(m[i], rm[i], 1e-15 * std::abs(rm[i])) << "step " << t << " m[" << i << "]";
      EXPECT_NEAR(v[i], rv[i], 1e-15 * std::abs(rv[i])) << "step " << t << " v[" << i << "]";
      if (t == 1) {
        // Closed form of the first step: m_hat = g', v_hat = g'^2, so the Adam part is
        // g' / (|g'| + eps), about sign(g').
        const double gs = grads[0][i] * ref.scale;
        const double expect =
            p_before[i] - ref.lr * (gs / (std::abs(gs) + ref.eps) + ref.wd * p_before[i]);
        EXPECT_NEAR(p[i], expect, 1e-15 * (1 + std::abs(expect))) << "first step p[" << i << "]";
      }
    }
  }
}

// Decoupled weight decay: it shrinks p by lr * wd * p without entering the moments (Adam with L2
// regularisation would add wd * p to the gradient and move m and v).
TEST(AdamW, WeightDecayIsDecoupledFromMoments) {
  const int64_t n = 3;
  Vec p = {1.0, -2.0, 0.5}, g(n, 0.0), m(n, 0.0), v(n, 0.0);
  const Vec p0 = p;
  adamw_update(p.data(), g.data(), m.data(), v.data(), n, 0.01, 0.9, 0.999, 1e-8, 0.1, 1.0, 1);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(m[i], 0.0);
    EXPECT_EQ(v[i], 0.0);
    EXPECT_NEAR(p[i], p0[i] * (1 - 0.01 * 0.1), 1e-16);
  }
}

TEST(SumSquares, ExactOnKnownValues) {
  const Vec small = {0.5, -1.5, 3.0, 0.25};
  EXPECT_EQ(sum_squares(small.data(), 4), 0.25 + 2.25 + 9.0 + 0.0625);
  EXPECT_EQ(sum_squares<double>(nullptr, 0), 0.0);
  // 1..n spans several internal chunks; every partial sum is an integer below 2^53, so exact.
  const int64_t n = 40000;
  Vec d(n);
  std::vector<float> f(n);
  for (int64_t i = 0; i < n; ++i) d[i] = f[i] = float(i + 1);
  const double expect = double(n) * double(n + 1) * double(2 * n + 1) / 6.0;
  EXPECT_EQ(sum_squares(d.data(), n), expect);
  EXPECT_EQ(sum_squares(f.data(), n), expect);  // accumulated in double, not float
}

TEST(AddInplace, AddsElementwise) {
  const int64_t n = 40000;  // several internal chunks
  Rng rng(16);
  const Vec x0 = rng.vec(n), y = rng.vec(n);
  Vec x = x0;
  add_inplace(x.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], x0[i] + y[i]) << i;
}

// ---------------------------------------------------------------------------------------------
// Accumulation semantics: parameter gradients (and the norms' dx) are +=, a second backward
// doubles them; activation gradients are overwritten.

TEST(Accumulation, BackwardTwiceDoublesParameterGradients) {
  const int64_t ntok = 5, C = 6, OC = 4, V = 8, T = 5;
  Rng rng(17);
  const Vec x = rng.vec(ntok * C, -1, 2), W = rng.vec(OC * C), w = rng.vec(C, 0.5, 1.5);
  const Vec dlin = rng.vec(ntok * OC), dout = rng.vec(ntok * C);
  const std::vector<int32_t> tokens = {1, 4, 1, 7, 1};
  auto once_twice = [](const std::string& what, const std::function<void(Vec&)>& backward,
                       size_t n) {
    Vec once(n, 0.0), twice(n, 0.0);
    backward(once);
    backward(twice);
    backward(twice);
    bool nonzero = false;
    for (size_t i = 0; i < n; ++i) {
      nonzero |= once[i] != 0;
      // Not bit-exact: a second pass adds the same terms onto a non-zero start.
      EXPECT_NEAR(twice[i], 2 * once[i], 1e-14 * (1 + std::abs(once[i])))
          << what << "[" << i << "]";
    }
    EXPECT_TRUE(nonzero) << what << " is all zero";
  };
  Vec din(ntok * C), scratch_w(OC * C), scratch_b(OC);
  once_twice(
      "linear dW",
      [&](Vec& g) {
        linear_backward(din.data(), g.data(), scratch_b.data(), dlin.data(), x.data(), W.data(),
                        ntok, C, OC);
      },
      OC * C);
  once_twice(
      "linear dbias",
      [&](Vec& g) {
        linear_backward(din.data(), scratch_w.data(), g.data(), dlin.data(), x.data(), W.data(),
                        ntok, C, OC);
      },
      OC);
  Vec scratch_pe(T * C), scratch_te(V * C);
  once_twice(
      "embedding dwte",
      [&](Vec& g) {
        embedding_backward(g.data(), scratch_pe.data(), dout.data(), tokens.data(), ntok, T, C);
      },
      V * C);
  once_twice(
      "embedding dwpe",
      [&](Vec& g) {
        embedding_backward(scratch_te.data(), g.data(), dout.data(), tokens.data(), ntok, T, C);
      },
      T * C);
  Vec out(ntok * C), mean(ntok), rstd(ntok), b = rng.vec(C);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), ntok, C,
                    1e-5);
  Vec s1(ntok * C), s2(C), s3(C);
  once_twice(
      "layernorm dx",
      [&](Vec& g) {
        layernorm_backward(g.data(), s2.data(), s3.data(), dout.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), ntok, C);
      },
      ntok * C);
  once_twice(
      "layernorm dw",
      [&](Vec& g) {
        layernorm_backward(s1.data(), g.data(), s3.data(), dout.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), ntok, C);
      },
      C);
  once_twice(
      "layernorm db",
      [&](Vec& g) {
        layernorm_backward(s1.data(), s2.data(), g.data(), dout.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), ntok, C);
      },
      C);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), ntok, C, 1e-5);
  once_twice(
      "rmsnorm dx",
      [&](Vec& g) {
        rmsnorm_backward(g.data(), s2.data(), dout.data(), x.data(), w.data(), rstd.data(), ntok,
                         C);
      },
      ntok * C);
  once_twice(
      "rmsnorm dw",
      [&](Vec& g) {
        rmsnorm_backward(s1.data(), g.data(), dout.data(), x.data(), w.data(), rstd.data(), ntok,
                         C);
      },
      C);
}

// The norms' dx is documented as +=: starting from D gives D + dx.
TEST(Accumulation, NormInputGradientsAddToExistingValues) {
  const int64_t ntok = 4, C = 9;
  Rng rng(18);
  const Vec x = rng.vec(ntok * C, -1, 2), w = rng.vec(C, 0.5, 1.5), b = rng.vec(C),
            dout = rng.vec(ntok * C), D = rng.vec(ntok * C, -5, 5);
  Vec out(ntok * C), mean(ntok), rstd(ntok), dw(C), db(C);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), ntok, C,
                    1e-5);
  Vec fresh(ntok * C, 0.0), acc = D;
  layernorm_backward(fresh.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                     mean.data(), rstd.data(), ntok, C);
  layernorm_backward(acc.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), ntok, C);
  for (int64_t i = 0; i < ntok * C; ++i)
    EXPECT_NEAR(acc[i], D[i] + fresh[i], 1e-14) << "layernorm " << i;
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), ntok, C, 1e-5);
  fresh.assign(ntok * C, 0.0);
  acc = D;
  rmsnorm_backward(fresh.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), ntok, C);
  rmsnorm_backward(acc.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), ntok, C);
  for (int64_t i = 0; i < ntok * C; ++i)
    EXPECT_NEAR(acc[i], D[i] + fresh[i], 1e-14) << "rmsnorm " << i;
}

TEST(Accumulation, ActivationGradientsAreOverwritten) {
  const int64_t ntok = 4, C = 6, OC = 5;
  Rng rng(19);
  const Vec x = rng.vec(ntok * C), W = rng.vec(OC * C), dlin = rng.vec(ntok * OC),
            gu = rng.vec(ntok * 2 * C), dout = rng.vec(ntok * C);
  auto twice_same = [](const std::string& what, const std::function<void(Vec&)>& backward,
                       size_t n) {
    Vec clean(n, 0.0), dirty(n, 0.0);
    for (size_t i = 0; i < n; ++i) dirty[i] = 1000.0 + double(i);
    backward(clean);
    backward(dirty);
    EXPECT_TRUE(bit_identical(what, dirty, clean));
  };
  Vec dW(OC * C), db(OC);
  twice_same(
      "linear din",
      [&](Vec& g) {
        linear_backward(g.data(), dW.data(), db.data(), dlin.data(), x.data(), W.data(), ntok, C,
                        OC);
      },
      ntok * C);
  twice_same(
      "gelu dx", [&](Vec& g) { gelu_backward(g.data(), dout.data(), x.data(), ntok * C); },
      ntok * C);
  twice_same(
      "swiglu dgu", [&](Vec& g) { swiglu_backward(g.data(), dout.data(), gu.data(), ntok, C); },
      ntok * 2 * C);
}

// ---------------------------------------------------------------------------------------------
// One run of each op in T on a realistic shape, inputs generated from fixed seeds and rounded to
// float, outputs widened to double. Shared by the float-vs-double and determinism tests.

struct Shape {
  int64_t ntok = 37, C = 96, V = 300;
};

template <typename T>
Outputs run_linear(Shape s = {}) {
  Rng rng(101);
  const auto x = cast<T>(rng.fvec(s.ntok * s.C)), W = cast<T>(rng.fvec(s.V * s.C)),
             b = cast<T>(rng.fvec(s.V)), dout = cast<T>(rng.fvec(s.ntok * s.V));
  std::vector<T> out(s.ntok * s.V), din(s.ntok * s.C), dW(s.V * s.C, T(0)), db(s.V, T(0));
  linear_forward<T>(out.data(), x.data(), W.data(), b.data(), s.ntok, s.C, s.V);
  linear_backward<T>(din.data(), dW.data(), db.data(), dout.data(), x.data(), W.data(), s.ntok, s.C,
                     s.V);
  return {{"out", widen(out)}, {"din", widen(din)}, {"dW", widen(dW)}, {"dbias", widen(db)}};
}

template <typename T>
Outputs run_embedding(Shape s = {}) {
  Rng rng(102);
  std::vector<int32_t> tokens(s.ntok);
  for (auto& t : tokens) t = rng.index(int32_t(s.V));
  tokens[5] = tokens[9] = tokens[30] = tokens[0];  // repeats
  const int64_t T_seq = 16;                        // positions wrap: t % 16
  const auto wte = cast<T>(rng.fvec(s.V * s.C)), wpe = cast<T>(rng.fvec(T_seq * s.C)),
             dout = cast<T>(rng.fvec(s.ntok * s.C));
  std::vector<T> out(s.ntok * s.C), dwte(s.V * s.C, T(0)), dwpe(T_seq * s.C, T(0));
  embedding_forward<T>(out.data(), tokens.data(), wte.data(), wpe.data(), s.ntok, T_seq, s.C, s.V);
  embedding_backward<T>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.ntok, T_seq, s.C);
  return {{"out", widen(out)}, {"dwte", widen(dwte)}, {"dwpe", widen(dwpe)}};
}

template <typename T>
Outputs run_layernorm(Shape s = {}) {
  Rng rng(103);
  const auto x = cast<T>(rng.fvec(s.ntok * s.C, -2, 3)), w = cast<T>(rng.fvec(s.C, 0.5, 1.5)),
             b = cast<T>(rng.fvec(s.C)), dout = cast<T>(rng.fvec(s.ntok * s.C));
  std::vector<T> out(s.ntok * s.C), mean(s.ntok), rstd(s.ntok), dx(s.ntok * s.C, T(0)),
      dw(s.C, T(0)), db(s.C, T(0));
  layernorm_forward<T>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), s.ntok,
                       s.C, T(1e-5));
  layernorm_backward<T>(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                        mean.data(), rstd.data(), s.ntok, s.C);
  return {{"out", widen(out)}, {"mean", widen(mean)}, {"rstd", widen(rstd)},
          {"dx", widen(dx)},   {"dw", widen(dw)},     {"db", widen(db)}};
}

template <typename T>
Outputs run_rmsnorm(Shape s = {}) {
  Rng rng(104);
  const auto x = cast<T>(rng.fvec(s.ntok * s.C, -2, 3)), w = cast<T>(rng.fvec(s.C, 0.5, 1.5)),
             dout = cast<T>(rng.fvec(s.ntok * s.C));
  std::vector<T> out(s.ntok * s.C), rstd(s.ntok), dx(s.ntok * s.C, T(0)), dw(s.C, T(0));
  rmsnorm_forward<T>(out.data(), rstd.data(), x.data(), w.data(), s.ntok, s.C, T(1e-5));
  rmsnorm_backward<T>(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), s.ntok,
                      s.C);
  return {{"out", widen(out)}, {"rstd", widen(rstd)}, {"dx", widen(dx)}, {"dw", widen(dw)}};
}

template <typename T>
Outputs run_gelu(Shape s = {}) {
  Rng rng(105);
  const int64_t n = s.ntok * 4 * s.C;
  const auto x = cast<T>(rng.fvec(n, -6, 6)), dout = cast<T>(rng.fvec(n));
  std::vector<T> out(n), dx(n);
  gelu_forward<T>(out.data(), x.data(), n);
  gelu_backward<T>(dx.data(), dout.data(), x.data(), n);
  return {{"out", widen(out)}, {"dx", widen(dx)}};
}

template <typename T>
Outputs run_swiglu(Shape s = {}) {
  Rng rng(106);
  const int64_t F = 256;
  const auto gu = cast<T>(rng.fvec(s.ntok * 2 * F, -8, 8)), dout = cast<T>(rng.fvec(s.ntok * F));
  std::vector<T> out(s.ntok * F), dgu(s.ntok * 2 * F);
  swiglu_forward<T>(out.data(), gu.data(), s.ntok, F);
  swiglu_backward<T>(dgu.data(), dout.data(), gu.data(), s.ntok, F);
  return {{"out", widen(out)}, {"dgu", widen(dgu)}};
}

template <typename T>
Outputs run_rope(Shape s = {}) {
  Rng rng(107);
  const int64_t hd = 32, n_heads = s.C / hd, stride = 3 * s.C, n_rot = 2 * n_heads;  // q and k
  const int64_t T_seq = 37, pos0 = 5, max_pos = 64;
  std::vector<T> cos_t(max_pos * hd / 2), sin_t(max_pos * hd / 2);
  rope_tables<T>(cos_t.data(), sin_t.data(), max_pos, hd, 500000.0);
  std::vector<T> x = cast<T>(rng.fvec(s.ntok * stride)), d = cast<T>(rng.fvec(s.ntok * stride));
  rope_forward<T>(x.data(), s.ntok, T_seq, pos0, n_rot, hd, stride, cos_t.data(), sin_t.data());
  rope_backward<T>(d.data(), s.ntok, T_seq, pos0, n_rot, hd, stride, cos_t.data(), sin_t.data());
  return {
      {"forward", widen(x)}, {"backward", widen(d)}, {"cos", widen(cos_t)}, {"sin", widen(sin_t)}};
}

template <typename T>
Outputs run_cross_entropy(Shape s = {}) {
  Rng rng(108);
  std::vector<int32_t> targets(s.ntok);
  for (auto& t : targets) t = rng.index(int32_t(s.V));
  targets[4] = targets[17] = targets[36] = -1;
  const auto logits = cast<T>(rng.fvec(s.ntok * s.V, -8, 8));
  std::vector<T> d = logits, lf(s.ntok), lo(s.ntok);
  const double sf =
      cross_entropy_fused<T>(d.data(), lf.data(), targets.data(), s.ntok, s.V, T(1.0 / 34));
  const double so = cross_entropy_forward<T>(lo.data(), logits.data(), targets.data(), s.ntok, s.V);
  return {{"losses", widen(lf)},
          {"dlogits", widen(d)},
          {"sum", {sf}},
          {"forward losses", widen(lo)},
          {"forward sum", {so}}};
}

template <typename T>
Outputs run_adamw(Shape s = {}) {
  Rng rng(109);
  const int64_t n = s.ntok * s.C;
  std::vector<T> p = cast<T>(rng.fvec(n, -2, 2)), m(n, T(0)), v(n, T(0));
  for (int step = 1; step <= 3; ++step) {
    const auto g = cast<T>(rng.fvec(n, -0.1, 0.1));
    // Hyperparameters rounded to float, as the float optimizer gets them.
    adamw_update<T>(p.data(), g.data(), m.data(), v.data(), n, T(float(1e-3)), T(float(0.9)),
                    T(float(0.95)), T(float(1e-8)), T(float(0.1)), T(float(0.5)), step);
  }
  return {{"p", widen(p)}, {"m", widen(m)}, {"v", widen(v)}};
}

template <typename T>
Outputs run_sum_squares(Shape s = {}) {
  Rng rng(110);
  const int64_t n = 3 * 16384 + s.ntok;  // several fixed chunks and a ragged tail
  const auto x = cast<T>(rng.fvec(n));
  return {{"sum", {sum_squares<T>(x.data(), n)}}};
}

// Tolerance of the float kernels against the double ones (scaled error, see agree()). float
// rounding is ~6e-8 and fast_exp / fast_tanh ~2e-7; reductions over C=96 or V=300 terms keep the
// worst case well under 1e-5.
constexpr double kFloatTol = 1e-5;

TEST(FloatVsDouble, Linear) {
  expect_agree("linear", run_linear<float>(), run_linear<double>(), kFloatTol);
}
TEST(FloatVsDouble, Embedding) {
  expect_agree("embedding", run_embedding<float>(), run_embedding<double>(), kFloatTol);
}
TEST(FloatVsDouble, LayerNorm) {
  expect_agree("layernorm", run_layernorm<float>(), run_layernorm<double>(), kFloatTol);
}
TEST(FloatVsDouble, RmsNorm) {
  expect_agree("rmsnorm", run_rmsnorm<float>(), run_rmsnorm<double>(), kFloatTol);
}
TEST(FloatVsDouble, Gelu) {
  expect_agree("gelu", run_gelu<float>(), run_gelu<double>(), kFloatTol);
}
TEST(FloatVsDouble, Swiglu) {
  expect_agree("swiglu", run_swiglu<float>(), run_swiglu<double>(), kFloatTol);
}
TEST(FloatVsDouble, Rope) {
  expect_agree("rope", run_rope<float>(), run_rope<double>(), kFloatTol);
}
TEST(FloatVsDouble, CrossEntropy) {
  expect_agree("cross_entropy", run_cross_entropy<float>(), run_cross_entropy<double>(), kFloatTol);
}
TEST(FloatVsDouble, AdamW) {
  expect_agree("adamw", run_adamw<float>(), run_adamw<double>(), kFloatTol);
}
TEST(FloatVsDouble, SumSquares) {
  expect_agree("sum_squares", run_sum_squares<float>(), run_sum_squares<double>(), 1e-12);
}

// ---------------------------------------------------------------------------------------------
// fast_math.hpp (float) against libm.

// Points covering [lo, hi] densely plus the endpoints.
std::vector<float> sweep(float lo, float hi, int n) {
  std::vector<float> xs;
  for (int i = 0; i <= n; ++i) xs.push_back(lo + (hi - lo) * float(i) / float(n));
  Rng rng(111);
  for (int i = 0; i < n / 4; ++i) xs.push_back(float(rng.uniform(lo, hi)));
  return xs;
}

TEST(FastMath, ExpMatchesLibm) {
  double worst = 0;
  float at = 0;
  for (float x : sweep(-87.0f, 88.0f, 200000)) {
    const double ref = std::exp(double(x));
    const double rel = std::abs(double(fast_exp(x)) - ref) / ref;
    if (!(rel <= worst)) worst = rel, at = x;
  }
  EXPECT_LT(worst, 3e-7) << "worst relative error at x = " << at;
  // Saturates instead of overflowing or going subnormal over [-100, 100].
  for (float x : sweep(-100.0f, 100.0f, 20000)) {
    const float e = fast_exp(x);
    ASSERT_TRUE(std::isfinite(e)) << x;
    ASSERT_GT(e, 0.0f) << x;
    ASSERT_GE(e, std::numeric_limits<float>::min()) << x;
    if (x < -87.0f) {
      ASSERT_LE(e, 2e-38f) << x;
    }
    if (x > 88.0f) {
      ASSERT_GE(e, 1.6e38f) << x;
    }
  }
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
}

TEST(FastMath, TanhMatchesLibm) {
  double worst_abs = 0, worst_rel = 0;
  float at_abs = 0, at_rel = 0;
  for (float x : sweep(-100.0f, 100.0f, 400000)) {
    const float t = fast_tanh(x);
    ASSERT_TRUE(std::isfinite(t)) << x;
    ASSERT_LE(std::abs(t), 1.0f) << x;
    const double ref = std::tanh(double(x));
    const double e = std::abs(double(t) - ref);
    if (!(e <= worst_abs)) worst_abs = e, at_abs = x;
    // Relative accuracy away from 0 (near 0, 1 - 2/(e^2x + 1) cancels; only the absolute error
    // matters for GELU's 1 + tanh).
    if (std::abs(x) >= 0.25f && !(e / std::abs(ref) <= worst_rel))
      worst_rel = e / std::abs(ref), at_rel = x;
  }
  // Rounding bound of 1 - 2/(e + 1) near |tanh| = 1 is a few ulp of 1 (ulp = 1.2e-7).
  EXPECT_LT(worst_abs, 4e-7) << "at x = " << at_abs;
  EXPECT_LT(worst_rel, 1e-6) << "at x = " << at_rel;
  EXPECT_EQ(fast_tanh(50.0f), 1.0f);
  EXPECT_EQ(fast_tanh(-50.0f), -1.0f);
}

TEST(FastMath, SigmoidMatchesLibm) {
  double worst_abs = 0, worst_rel = 0;
  float at_abs = 0, at_rel = 0;
  for (float x : sweep(-100.0f, 100.0f, 400000)) {
    const float s = fast_sigmoid(x);
    ASSERT_TRUE(std::isfinite(s)) << x;
    ASSERT_GE(s, 0.0f) << x;
    ASSERT_LE(s, 1.0f) << x;
    const double ref = 1.0 / (1.0 + std::exp(-double(x)));
    const double e = std::abs(double(s) - ref);
    if (!(e <= worst_abs)) worst_abs = e, at_abs = x;
    if (std::abs(x) <= 80.0f && !(e / ref <= worst_rel)) worst_rel = e / ref, at_rel = x;
  }
  EXPECT_LT(worst_abs, 2e-7) << "at x = " << at_abs;
  EXPECT_LT(worst_rel, 5e-7) << "at x = " << at_rel;
}

// ---------------------------------------------------------------------------------------------
// Determinism

TEST(Determinism, FloatOpsRepeatBitIdentically) {
  expect_bit_identical("linear", run_linear<float>(), run_linear<float>());
  expect_bit_identical("embedding", run_embedding<float>(), run_embedding<float>());
  expect_bit_identical("layernorm", run_layernorm<float>(), run_layernorm<float>());
  expect_bit_identical("rmsnorm", run_rmsnorm<float>(), run_rmsnorm<float>());
  expect_bit_identical("gelu", run_gelu<float>(), run_gelu<float>());
  expect_bit_identical("swiglu", run_swiglu<float>(), run_swiglu<float>());
  expect_bit_identical("rope", run_rope<float>(), run_rope<float>());
  expect_bit_identical("cross_entropy", run_cross_entropy<float>(), run_cross_entropy<float>());
  expect_bit_identical("adamw", run_adamw<float>(), run_adamw<float>());
  expect_bit_identical("sum_squares", run_sum_squares<float>(), run_sum_squares<float>());
}

// Keeps only the named outputs.
Outputs select(const Outputs& all, const std::vector<std::string>& names) {
  Outputs r;
  for (const auto& o : all)
    if (std::find(names.begin(), names.end(), o.first) != names.end()) r.push_back(o);
  EXPECT_EQ(r.size(), names.size());
  return r;
}

// The reductions across tokens are parallel over channel blocks with the token order fixed, and
// sum_squares sums fixed chunks in order: the result must not depend on the thread count. The
// shape is wide enough (C = 768, V = 1000) for many channel blocks per thread.
TEST(Determinism, ThreadCountIndependentReductions) {
  const Shape wide{37, 768, 1000};
  auto bias_grad = [&] {
    Rng rng(112);
    const auto dout = cast<float>(rng.fvec(wide.ntok * wide.V));
    std::vector<float> db(wide.V, 0.0f);
    linear_backward<float>(nullptr, nullptr, db.data(), dout.data(), nullptr, nullptr, wide.ntok,
                           wide.C, wide.V);
    return Outputs{{"dbias", widen(db)}};
  };
  auto run_all = [&] {
    Outputs r;
    for (auto& o : select(run_layernorm<float>(wide), {"dw", "db"})) r.push_back(o);
    for (auto& o : select(run_rmsnorm<float>(wide), {"dw"})) r.push_back(o);
    for (auto& o : select(run_embedding<float>(wide), {"dwte", "dwpe"})) r.push_back(o);
    for (auto& o : bias_grad()) r.push_back(o);
    for (auto& o : run_sum_squares<float>(wide)) r.push_back(o);
    return r;
  };
  const Outputs one = with_threads(1, run_all);
  const Outputs two = with_threads(2, run_all);
  expect_bit_identical("1 vs 2 threads", one, two);
}

}  // namespace
}  // namespace tetrad::kernels
