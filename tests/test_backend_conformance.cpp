// The backend conformance suite: every op of the table (backend/ops.hpp) on every backend this
// build has (backend::backends()), against a double-precision reference written here, on fresh
// random inputs (the seed is printed with every failure; TETRAD_CONFORMANCE_SEED=N repeats one),
// with every overwritten output poisoned with NaN first (a NaN or an untouched element never
// passes), and every backward against central finite differences of the double reference
// forward. It is the suite a new backend (CUDA, HIP) must pass; a backend the build has but this
// machine cannot run (no GPU) reports GTEST_SKIP with the reason. An optional op a backend does
// not have (its Capabilities flag false) is skipped with a reason starting "[optional]", which
// scripts/gpu-check.sh tells apart from a backend that could not run.
//
// Tolerances (docs/precision.md): fp32 ops against the double reference, normwise
// max|got - ref| / max|ref| below 1e-5; backward against finite differences below 1e-4 (fp32
// accumulation over the reduced axis); bf16 GEMMs against the double product of the
// bf16-rounded operands below 1e-5, and against the unrounded product between 1e-4 and 2e-2 (so
// the rounding demonstrably happened); casts and data movement exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tetrad/backend/adamw_bias.hpp"
#include "tetrad/backend/backend.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::backend {
namespace {

constexpr double kFwdTol = 1e-5;
constexpr double kBwdTol = 1e-4;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

using VF = std::vector<float>;
using VD = std::vector<double>;
using VI = std::vector<int32_t>;

VD widen(const VF& v) { return VD(v.begin(), v.end()); }

// round to nearest even onto bf16, computed independently of the backends' own helpers.
float ref_bf16(float f) {
  if (std::isnan(f)) return f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  const double dlo = std::fabs(double(f) - double(flo));
  if (std::isinf(f)) return f;
  // Past the largest bf16 the next value up is 2^128 (rounds to infinity), as IEEE rounding does.
  const double dhi = std::isinf(fhi) ? std::ldexp(1.0, 128) - std::fabs(double(f))
                                     : std::fabs(double(fhi) - double(f));
  if (dlo < dhi) return flo;
  if (dhi < dlo) return fhi;
  return ((lo >> 16) & 1u) ? fhi : flo;  // tie: the even one
}

// Normwise comparison; every element must be finite where the reference is.
::testing::AssertionResult close(const std::string& what, const VF& got, const VD& ref,
                                 double tol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " elements, expected "
                                         << ref.size();
  double scale = 0, worst = 0;
  size_t at = 0;
  for (double r : ref) scale = std::max(scale, std::fabs(r));
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(ref[i]))
      return ::testing::AssertionFailure() << what << "[" << i << "] = " << got[i]
                                           << " (not written or not finite), expected " << ref[i];
    const double e = std::fabs(double(got[i]) - ref[i]);
    if (e > worst) worst = e, at = i;
  }
  const double rel = worst / std::max(scale, 1e-30);
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": relative error " << rel << " > " << tol
                                       << " (worst at [" << at << "]: " << got[at] << " vs "
                                       << ref[at] << ", scale " << scale << ")";
}

// The head columns of every q row of an attention call (B Tq rows of q_stride elements): what dq
// holds; the stride's padding columns are no output of the op.
template <typename V>
V q_head_columns(const V& rows, const AttentionArgs& d) {
  V out;
  for (int64_t r = 0; r < int64_t(d.B) * d.Tq; ++r)
    for (int64_t col = 0; col < int64_t(d.n_head) * d.head_dim; ++col)
      out.push_back(rows[size_t(r * d.q_stride + col)]);
  return out;
}

// Central differences of loss() with respect to every element of x (restored exactly).
VD numeric_grad(VD& x, const std::function<double()>& loss) {
  VD g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    const double h = 1e-6 * std::max(1.0, std::fabs(x0));
    x[i] = x0 + h;
    const double hp = x[i] - x0;
    const double lp = loss();
    x[i] = x0 - h;
    const double hm = x0 - x[i];
    const double lm = loss();
    x[i] = x0;
    g[i] = (lp - lm) / (hp + hm);
  }
  return g;
}

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    for (BackendInfo& info : backends()) {
      if (info.name != GetParam()) continue;
      if (!info.available) GTEST_SKIP() << "backend '" << info.name << "' is built but cannot run here: " << info.why_not;
      be_ = info.create(info.name);
    }
    ASSERT_TRUE(be_) << "no backend " << GetParam();
    q_ = &be_->queue();
    ops_ = &be_->ops();
    check_op_table(*ops_, GetParam().c_str());
    const char* env = std::getenv("TETRAD_CONFORMANCE_SEED");
    seed_ = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    rng_.seed(seed_);
  }
  std::string seed() const { return "seed " + std::to_string(seed_) + " (TETRAD_CONFORMANCE_SEED)"; }

  VF rand(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    VF v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }
  int64_t randint(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }

  template <typename T>
  DeviceBuffer up(const std::vector<T>& h) {
    DeviceBuffer b = be_->alloc(std::max<size_t>(1, h.size()) * sizeof(T));
    if (!h.empty()) q_->copy_to_device(b.data(), h.data(), h.size() * sizeof(T));
    return b;
  }
  DeviceBuffer poisoned(size_t n) { return up(VF(n, kNaN)); }
  DeviceBuffer poisoned_d(size_t n) { return up(VD(n, std::nan(""))); }
  template <typename T = float>
  std::vector<T> down(const DeviceBuffer& b, size_t n) {
    std::vector<T> h(n);
    if (n) q_->copy_to_host(h.data(), b.data(), n * sizeof(T));
    q_->synchronize();
    return h;
  }
  static float* F(DeviceBuffer& b) { return b.as<float>(); }
  static double* D(DeviceBuffer& b) { return b.as<double>(); }
  static int32_t* I(DeviceBuffer& b) { return b.as<int32_t>(); }

  std::unique_ptr<Backend> be_;
  Queue* q_ = nullptr;
  const OpTable* ops_ = nullptr;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

// ---- GEMM -------------------------------------------------------------------------------------

VD ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const VD& A,
            int64_t lda, const VD& B, int64_t ldb, double beta, const VD& C0, int64_t ldc) {
  VD C(static_cast<size_t>(M * ldc));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * C0[i * ldc + j]);
    }
  return C;
}

VF rows_of(const VF& C, int64_t M, int64_t N, int64_t ldc) {
  VF out;
  for (int64_t i = 0; i < M; ++i) out.insert(out.end(), C.begin() + i * ldc, C.begin() + i * ldc + N);
  return out;
}
VD rows_of(const VD& C, int64_t M, int64_t N, int64_t ldc) {
  VD out;
  for (int64_t i = 0; i < M; ++i) out.insert(out.end(), C.begin() + i * ldc, C.begin() + i * ldc + N);
  return out;
}

TEST_P(Conformance, GemmEveryLayoutFp32AndBf16) {
  const Capabilities& caps = be_->capabilities();
  for (int layout = 0; layout < 4; ++layout) {
    for (Precision prec : {Precision::FP32, Precision::BF16}) {
      if (prec == Precision::BF16 && !caps.gemm_bf16) continue;
      for (float beta : {0.0f, 0.5f}) {
        const bool ta = layout & 1, tb = layout & 2;
        const int64_t M = randint(1, 37), N = randint(1, 41), K = randint(1, 300);
        const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
        const int64_t lda = ac + randint(0, 3), ldb = bc + randint(0, 3), ldc = N + randint(0, 3);
        const float alpha = float(randint(1, 4)) * 0.5f;
        const VF A = rand(static_cast<size_t>(ar * lda)), B = rand(static_cast<size_t>(br * ldb));
        VF C0 = rand(static_cast<size_t>(M * ldc));
        if (beta == 0) std::fill(C0.begin(), C0.end(), kNaN);  // beta 0 must overwrite NaN
        DeviceBuffer dA = up(A), dB = up(B), dC = up(C0);
        GemmArgs g;
        g.trans_a = ta; g.trans_b = tb; g.M = M; g.N = N; g.K = K; g.alpha = alpha;
        g.A = dA.data(); g.lda = lda; g.B = dB.data(); g.ldb = ldb; g.beta = beta;
        g.C = F(dC); g.ldc = ldc; g.precision = prec;
        ops_->gemm(*q_, g);
        const VF got = rows_of(down(dC, C0.size()), M, N, ldc);
        std::ostringstream what;
        what << "gemm " << (ta ? 'T' : 'N') << (tb ? 'T' : 'N') << " " << M << "x" << N << "x" << K
             << " lda " << lda << " ldb " << ldb << " ldc " << ldc << " alpha " << alpha
             << " beta " << beta << (prec == Precision::BF16 ? " bf16" : " fp32") << ", " << seed();
        VD Ad = widen(A), Bd = widen(B);
        const VD exact = rows_of(ref_gemm(ta, tb, M, N, K, alpha, Ad, lda, Bd, ldb, beta, widen(C0), ldc), M, N, ldc);
        if (prec == Precision::FP32) {
          EXPECT_TRUE(close(what.str(), got, exact, kFwdTol));
          continue;
        }
        for (double& a : Ad) a = ref_bf16(float(a));
        for (double& b : Bd) b = ref_bf16(float(b));
        const VD rounded = rows_of(ref_gemm(ta, tb, M, N, K, alpha, Ad, lda, Bd, ldb, beta, widen(C0), ldc), M, N, ldc);
        EXPECT_TRUE(close(what.str() + " vs rounded operands", got, rounded, kFwdTol));
        if (K >= 16) {  // enough terms that the rounding must show
          EXPECT_FALSE(close(what.str() + " vs fp32 operands", got, exact, 1e-4));
          EXPECT_TRUE(close(what.str() + " vs fp32 operands", got, exact, 2e-2));
        }
      }
    }
  }
}

// Operands stored in bf16 (the weight copy, activations their producers stored in bf16), alone
// or beside an fp32 one, in every layout with padded leading dimensions and beta accumulation:
// the product of the stored values (exact in fp32) summed in fp32.
TEST_P(Conformance, GemmBf16StoredOperands) {
  if (!be_->capabilities().gemm_bf16_storage) GTEST_SKIP() << "[optional] backend has no bf16-stored GEMM operands";
  auto to16 = [](const VF& x) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) { uint32_t u; std::memcpy(&u, &x[i], 4); h[i] = uint16_t(u >> 16); }
    return h;
  };
  for (int layout = 0; layout < 4; ++layout)
    for (int form = 1; form < 4; ++form) {  // bit 0: A stored in bf16, bit 1: B stored in bf16
      const bool ta = layout & 1, tb = layout & 2, a16 = form & 1, b16 = form & 2;
      const int64_t M = randint(1, 37), N = randint(1, 41), K = randint(16, 300);
      const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
      const int64_t lda = ac + randint(0, 3), ldb = bc + randint(0, 3), ldc = N + randint(0, 3);
      VF A = rand(static_cast<size_t>(ar * lda)), B = rand(static_cast<size_t>(br * ldb));
      for (float& a : A) a = ref_bf16(a);  // stored values (and the fp32 operand: rounding it is exact)
      for (float& b : B) b = ref_bf16(b);
      const float beta = layout == 2 ? 1.0f : 0.0f;  // TN is the weight gradient: accumulates
      VF C0 = rand(static_cast<size_t>(M * ldc));
      if (beta == 0) std::fill(C0.begin(), C0.end(), kNaN);
      DeviceBuffer dA = a16 ? up(to16(A)) : up(A), dB = b16 ? up(to16(B)) : up(B), dC = up(C0);
      GemmArgs g;
      g.trans_a = ta; g.trans_b = tb; g.M = M; g.N = N; g.K = K; g.A = dA.data(); g.lda = lda;
      g.B = dB.data(); g.ldb = ldb; g.beta = beta; g.C = F(dC); g.ldc = ldc;
      g.precision = Precision::BF16;
      g.a_type = a16 ? DType::BF16 : DType::F32;
      g.b_type = b16 ? DType::BF16 : DType::F32;
      ops_->gemm(*q_, g);
      std::ostringstream what;
      what << "gemm " << (ta ? 'T' : 'N') << (tb ? 'T' : 'N') << " " << M << "x" << N << "x" << K
           << " lda " << lda << " ldb " << ldb << " ldc " << ldc << (a16 ? " A bf16" : " A fp32")
           << (b16 ? " B bf16" : " B fp32") << ", " << seed();
      const VF got = down(dC, C0.size());
      EXPECT_TRUE(close(what.str(), rows_of(got, M, N, ldc),
                        rows_of(ref_gemm(ta, tb, M, N, K, 1, widen(A), lda, widen(B), ldb, beta,
                                         widen(C0), ldc), M, N, ldc), kFwdTol));
      for (int64_t i = 0; i < M; ++i)  // C's padding untouched
        for (int64_t j = N; j < ldc; ++j)
          EXPECT_TRUE(std::isnan(C0[i * ldc + j]) ? std::isnan(got[i * ldc + j]) : got[i * ldc + j] == C0[i * ldc + j]) << what.str();
    }
}

// K = 0: no products; C = beta C (beta 0 overwrites C, NaN included), in every layout and
// precision, operands stored either way. (The CUDA backend once refused K = 0.)
TEST_P(Conformance, GemmWithKZeroScalesC) {
  const Capabilities& caps = be_->capabilities();
  for (int layout = 0; layout < 4; ++layout)
    for (int form = 0; form < 3; ++form) {  // 0 fp32, 1 bf16 math on fp32, 2 bf16-stored A and B
      if (form == 1 && !caps.gemm_bf16) continue;
      if (form == 2 && !caps.gemm_bf16_storage) continue;
      for (float beta : {0.0f, 0.5f, 1.0f}) {
        const bool ta = layout & 1, tb = layout & 2;
        const int64_t M = randint(1, 20), N = randint(1, 20), ldc = N + randint(0, 3);
        const int64_t lda = ta ? M : 1, ldb = tb ? 1 : N;  // the stored rows of a K = 0 operand
        VF C0 = rand(static_cast<size_t>(M * ldc));
        if (beta == 0) std::fill(C0.begin(), C0.end(), kNaN);
        DeviceBuffer dA = up(VF(64, 1.0f)), dB = up(VF(64, 1.0f)), dC = up(C0);
        GemmArgs g;
        g.trans_a = ta; g.trans_b = tb; g.M = M; g.N = N; g.K = 0; g.alpha = 1.5f;
        g.A = dA.data(); g.lda = lda; g.B = dB.data(); g.ldb = ldb; g.beta = beta;
        g.C = F(dC); g.ldc = ldc;
        g.precision = form == 0 ? Precision::FP32 : Precision::BF16;
        g.a_type = g.b_type = form == 2 ? DType::BF16 : DType::F32;
        ops_->gemm(*q_, g);
        const VF got = down(dC, C0.size());
        std::ostringstream what;
        what << "gemm K=0 " << (ta ? 'T' : 'N') << (tb ? 'T' : 'N') << " " << M << "x" << N
             << " ldc " << ldc << " beta " << beta << " form " << form << ", " << seed();
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const float c0 = C0[size_t(i * ldc + j)], v = got[size_t(i * ldc + j)];
            if (j >= N) {  // padding untouched
              EXPECT_TRUE(std::isnan(c0) ? std::isnan(v) : v == c0) << what.str();
              continue;
            }
            ASSERT_EQ(v, beta == 0 ? 0.0f : beta * c0) << what.str() << " at " << i << "," << j;
          }
      }
    }
}

// ---- bias, residual, add, sums --------------------------------------------------------------

TEST_P(Conformance, BiasResidualAddAndBiasGrad) {
  const int64_t N = randint(1, 9), n = randint(1, 600);
  const VF x = rand(static_cast<size_t>(N * n)), b = rand(static_cast<size_t>(n)), y = rand(static_cast<size_t>(N * n)), acc = rand(static_cast<size_t>(n));
  {  // bias_add: out += b
    DeviceBuffer d = up(x), db = up(b);
    ops_->bias_add(*q_, F(d), F(db), N, n);
    VD ref = widen(x);
    for (int64_t t = 0; t < N; ++t) for (int64_t j = 0; j < n; ++j) ref[t * n + j] += b[j];
    EXPECT_TRUE(close("bias_add, " + seed(), down(d, x.size()), ref, kFwdTol));
  }
  for (bool with_bias : {false, true}) {  // residual_add: out = resid + y (+ b)
    DeviceBuffer dr = up(x), dy = up(y), db = up(b), out = poisoned(x.size());
    ops_->residual_add(*q_, F(out), F(dr), F(dy), with_bias ? F(db) : nullptr, N, n);
    VD ref(x.size());
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < n; ++j) ref[t * n + j] = double(x[t * n + j]) + y[t * n + j] + (with_bias ? b[j] : 0.0);
    EXPECT_TRUE(close(std::string("residual_add") + (with_bias ? " + bias, " : ", ") + seed(), down(out, x.size()), ref, kFwdTol));
  }
  {  // add: x += y
    DeviceBuffer dx = up(x), dy = up(y);
    ops_->add(*q_, F(dx), F(dy), int64_t(x.size()));
    VD ref(x.size());
    for (size_t i = 0; i < x.size(); ++i) ref[i] = double(x[i]) + y[i];
    EXPECT_TRUE(close("add, " + seed(), down(dx, x.size()), ref, kFwdTol));
  }
  {  // bias_grad: db += Σ_t dout, checked as the adjoint of bias_add by finite differences
    DeviceBuffer dacc = up(acc), dy = up(y);
    ops_->bias_grad(*q_, F(dacc), F(dy), N, n);
    VD bd = widen(b);
    const VD dout = widen(y);
    auto loss = [&] {
      double L = 0;
      for (int64_t t = 0; t < N; ++t) for (int64_t j = 0; j < n; ++j) L += dout[t * n + j] * (x[t * n + j] + bd[j]);
      return L;
    };
    VD ref = numeric_grad(bd, loss);
    for (int64_t j = 0; j < n; ++j) ref[j] += acc[j];
    EXPECT_TRUE(close("bias_grad vs finite differences, " + seed(), down(dacc, static_cast<size_t>(n)), ref, kBwdTol));
  }
}

TEST_P(Conformance, SumSquares) {
  for (int64_t n : {int64_t(1), randint(2, 100), randint(5000, 70000)}) {
    const VF x = rand(static_cast<size_t>(n), -3, 3);
    DeviceBuffer dx = up(x), out = poisoned_d(1);
    ops_->sum_squares(*q_, D(out), F(dx), n);
    double ref = 0;
    for (float v : x) ref += double(v) * v;
    const double got = down<double>(out, 1)[0];
    EXPECT_NEAR(got, ref, 1e-12 * ref) << "sum_squares of " << n << ", " << seed();
  }
}

// ---- norms with split statistics --------------------------------------------------------------

struct NormRef {
  bool layer;  // LayerNorm (mean, bias) or RMSNorm
  int64_t N, C;
  double eps;
  VD forward(const VD& x, const VD& w, const VD& b) const {
    VD out(x.size());
    for (int64_t t = 0; t < N; ++t) {
      double m = 0, v = 0;
      if (layer) {
        for (int64_t c = 0; c < C; ++c) m += x[t * C + c];
        m /= double(C);
      }
      for (int64_t c = 0; c < C; ++c) v += (x[t * C + c] - m) * (x[t * C + c] - m);
      const double r = 1.0 / std::sqrt(v / double(C) + eps);
      for (int64_t c = 0; c < C; ++c)
        out[t * C + c] = (x[t * C + c] - m) * r * w[c] + (layer ? b[c] : 0.0);
    }
    return out;
  }
};

// Runs the split-statistics norm as the sharded model does: the C features cut into slices
// (as over X ranks), partial statistics per slice, summed on the host (the all-reduce).
TEST_P(Conformance, NormsWithSplitStatisticsForwardAndBackward) {
  for (bool layer : {true, false}) {
    const int64_t N = randint(1, 5), C = randint(4, 24);
    const int64_t cut = randint(1, C - 1);  // two uneven slices: [0, cut), [cut, C)
    const int64_t widths[2] = {cut, C - cut}, starts[2] = {0, cut};
    const float eps = 1e-5f;
    const VF x = rand(static_cast<size_t>(N * C), -2, 2), w = rand(static_cast<size_t>(C), 0.5f, 1.5f), b = rand(static_cast<size_t>(C));
    const VF dout = rand(static_cast<size_t>(N * C)), dx0 = rand(static_cast<size_t>(N * C)), dw0 = rand(static_cast<size_t>(C)), db0 = rand(static_cast<size_t>(C));
    auto slice = [&](const VF& v, int s, int64_t rows) {
      VF o;
      for (int64_t t = 0; t < rows; ++t)
        o.insert(o.end(), v.begin() + t * C + starts[s], v.begin() + t * C + starts[s] + widths[s]);
      return o;
    };
    auto vec_slice = [&](const VF& v, int s) { return VF(v.begin() + starts[s], v.begin() + starts[s] + widths[s]); };
    DeviceBuffer xs[2], ws[2], bs[2], outs[2], douts[2], dxs[2], dws[2], dbs[2];
    for (int s = 0; s < 2; ++s) {
      xs[s] = up(slice(x, s, N)); ws[s] = up(vec_slice(w, s)); bs[s] = up(vec_slice(b, s));
      outs[s] = poisoned(static_cast<size_t>(N * widths[s])); douts[s] = up(slice(dout, s, N));
      dxs[s] = up(slice(dx0, s, N)); dws[s] = up(vec_slice(dw0, s)); dbs[s] = up(vec_slice(db0, s));
    }
    // statistics: partial -> summed -> finished
    auto all_reduce = [&](DeviceBuffer* parts, size_t n) {
      VD sum(n, 0.0);
      for (int s = 0; s < 2; ++s) {
        const VD p = down<double>(parts[s], n);
        for (size_t i = 0; i < n; ++i) sum[i] += p[i];
      }
      return up(sum);
    };
    DeviceBuffer st[2], mean = poisoned(static_cast<size_t>(N)), rstd = poisoned(static_cast<size_t>(N));
    if (layer) {
      for (int s = 0; s < 2; ++s) {
        st[s] = poisoned_d(static_cast<size_t>(N));
        ops_->norm_row_stats(*q_, RowStat::Sum, D(st[s]), 1, F(xs[s]), nullptr, N, widths[s]);
      }
      DeviceBuffer sum = all_reduce(st, static_cast<size_t>(N));
      ops_->norm_finish_stats(*q_, StatFinish::Mean, F(mean), D(sum), N, C, eps);
      for (int s = 0; s < 2; ++s)
        ops_->norm_row_stats(*q_, RowStat::CenteredSquares, D(st[s]), 1, F(xs[s]), F(mean), N, widths[s]);
    } else {
      for (int s = 0; s < 2; ++s) {
        st[s] = poisoned_d(static_cast<size_t>(N));
        ops_->norm_row_stats(*q_, RowStat::Squares, D(st[s]), 1, F(xs[s]), nullptr, N, widths[s]);
      }
    }
    DeviceBuffer sum = all_reduce(st, static_cast<size_t>(N));
    ops_->norm_finish_stats(*q_, StatFinish::Rstd, F(rstd), D(sum), N, C, eps);
    for (int s = 0; s < 2; ++s)
      ops_->norm_apply(*q_, F(outs[s]), F(xs[s]), layer ? F(mean) : nullptr, F(rstd), F(ws[s]),
                       layer ? F(bs[s]) : nullptr, N, widths[s]);
    // backward: partials -> summed -> apply, parameter gradients
    DeviceBuffer parts[2];
    for (int s = 0; s < 2; ++s) {
      parts[s] = poisoned_d(static_cast<size_t>(2 * N));
      ops_->norm_backward_partials(*q_, D(parts[s]), F(douts[s]), F(xs[s]), layer ? F(mean) : nullptr,
                                   F(rstd), F(ws[s]), N, widths[s]);
    }
    DeviceBuffer psum = all_reduce(parts, static_cast<size_t>(2 * N));
    for (int s = 0; s < 2; ++s) {
      ops_->norm_backward_apply(*q_, F(dxs[s]), F(douts[s]), F(xs[s]), layer ? F(mean) : nullptr,
                                F(rstd), F(ws[s]), D(psum), N, widths[s], C);
      ops_->norm_param_grads(*q_, F(dws[s]), layer ? F(dbs[s]) : nullptr, F(douts[s]), F(xs[s]),
                             layer ? F(mean) : nullptr, F(rstd), N, widths[s]);
    }
    // reassemble
    VF out(static_cast<size_t>(N * C)), dx(static_cast<size_t>(N * C)), dw(static_cast<size_t>(C)), db(static_cast<size_t>(C));
    for (int s = 0; s < 2; ++s) {
      const VF o = down(outs[s], static_cast<size_t>(N * widths[s])), g = down(dxs[s], static_cast<size_t>(N * widths[s]));
      for (int64_t t = 0; t < N; ++t)
        for (int64_t c = 0; c < widths[s]; ++c) {
          out[t * C + starts[s] + c] = o[t * widths[s] + c];
          dx[t * C + starts[s] + c] = g[t * widths[s] + c];
        }
      const VF gw = down(dws[s], static_cast<size_t>(widths[s])), gb = down(dbs[s], static_cast<size_t>(widths[s]));
      std::copy(gw.begin(), gw.end(), dw.begin() + starts[s]);
      std::copy(gb.begin(), gb.end(), db.begin() + starts[s]);
    }
    const NormRef ref{layer, N, C, eps};
    VD xd = widen(x), wd = widen(w), bd = widen(b);
    const std::string name = std::string(layer ? "layernorm" : "rmsnorm") + " split " +
                             std::to_string(cut) + "+" + std::to_string(C - cut) + ", " + seed();
    EXPECT_TRUE(close(name + " forward", out, ref.forward(xd, wd, bd), kFwdTol));
    auto loss = [&] {
      const VD o = ref.forward(xd, wd, bd);
      double L = 0;
      for (size_t i = 0; i < o.size(); ++i) L += double(dout[i]) * o[i];
      return L;
    };
    auto plus = [](VD g, const VF& init) { for (size_t i = 0; i < g.size(); ++i) g[i] += init[i]; return g; };
    EXPECT_TRUE(close(name + " dx vs finite differences", dx, plus(numeric_grad(xd, loss), dx0), kBwdTol));
    EXPECT_TRUE(close(name + " dw vs finite differences", dw, plus(numeric_grad(wd, loss), dw0), kBwdTol));
    if (layer) {
      EXPECT_TRUE(close(name + " db vs finite differences", db, plus(numeric_grad(bd, loss), db0), kBwdTol));
    }
  }
}

// ---- attention ----------------------------------------------------------------------------------

struct AttnRef {
  AttentionArgs d;
  const VI* doc = nullptr;  // host copy of d.doc_start (the document mask), or null
  // out and lse in double from q, k, v laid out by d's strides (k, v from the block's key 0); a
  // query that sees no key of the block (causally or by the document mask): out 0, lse -inf.
  void forward(const VD& q, const VD& k, const VD& v, VD& out, VD& lse) const {
    const int hd = d.head_dim, group = d.n_head / d.n_kv_head;
    const int64_t off = d.relative_q_offset();
    out.assign(static_cast<size_t>(d.B) * d.out_batch_stride, 0.0);
    lse.assign(static_cast<size_t>(d.B) * d.n_head * d.Tq, 0.0);
    const double scale = 1.0 / std::sqrt(double(hd));
    for (int b = 0; b < d.B; ++b)
      for (int h = 0; h < d.n_head; ++h)
        for (int i = 0; i < d.Tq; ++i) {
          const int kvh = h / group;
          const double* qi = q.data() + b * d.q_batch_stride + i * d.q_stride + h * hd;
          const int64_t last = std::min<int64_t>(d.Tk - 1, off + i);
          const int64_t first =
              doc ? std::max<int64_t>(0, (*doc)[b * d.doc_batch_stride + i] - d.k_offset) : 0;
          if (first > last) {
            lse[(static_cast<size_t>(b) * d.n_head + h) * d.Tq + i] = -INFINITY;
            continue;
          }
          VD s(static_cast<size_t>(last + 1), -INFINITY);
          double mx = -1e300;
          for (int64_t j = first; j <= last; ++j) {
            const double* kj = k.data() + b * d.kv_batch_stride + j * d.kv_stride + kvh * hd;
            double dot = 0;
            for (int c = 0; c < hd; ++c) dot += qi[c] * kj[c];
            s[j] = dot * scale;
            mx = std::max(mx, s[j]);
          }
          double z = 0;
          for (double x : s) z += std::exp(x - mx);
          lse[(static_cast<size_t>(b) * d.n_head + h) * d.Tq + i] = mx + std::log(z);
          double* o = out.data() + b * d.out_batch_stride + i * d.out_stride + h * hd;
          for (int64_t j = first; j <= last; ++j) {
            const double p = std::exp(s[j] - mx) / z;
            const double* vj = v.data() + b * d.kv_batch_stride + j * d.kv_stride + kvh * hd;
            for (int c = 0; c < hd; ++c) o[c] += p * vj[c];
          }
        }
  }
  // Σ dout · out: the scalar whose gradient the backward computes (finite differences of it).
  double loss(const VD& q, const VD& k, const VD& v, const VF& dout) const {
    VD o, l;
    forward(q, k, v, o, l);
    double L = 0;
    for (size_t i = 0; i < o.size(); ++i) L += double(dout[i]) * o[i];
    return L;
  }
};

TEST_P(Conformance, AttentionCausalGqaForwardBackward) {
  struct Case { int B, Tq, Tk, nh, nkv, hd; };
  const Case cases[] = {{2, 5, 5, 4, 2, 8}, {1, 3, 7, 2, 1, 4}, {2, 1, 6, 4, 4, 8}, {1, 17, 17, 2, 1, 16}};
  for (const Case& c : cases) {
    AttentionArgs d;
    d.B = c.B; d.Tq = c.Tq; d.Tk = c.Tk; d.n_head = c.nh; d.n_kv_head = c.nkv; d.head_dim = c.hd;
    // q, k, v in one fused row per token as the model stores them: [q heads | k heads | v heads]
    // for the key block; the query block has its own buffer (its rows are the last Tq tokens).
    const int64_t qkv = int64_t(c.nh + 2 * c.nkv) * c.hd;
    d.q_stride = c.nh * c.hd + 3; d.q_batch_stride = c.Tq * d.q_stride;
    d.kv_stride = qkv; d.kv_batch_stride = c.Tk * qkv;
    d.out_stride = c.nh * c.hd; d.out_batch_stride = c.Tq * d.out_stride;
    const VF qf = rand(static_cast<size_t>(c.B * d.q_batch_stride), -1.5f, 1.5f);
    const VF kvf = rand(static_cast<size_t>(c.B * d.kv_batch_stride), -1.5f, 1.5f);
    const int64_t k_off = int64_t(c.nh) * c.hd, v_off = k_off + int64_t(c.nkv) * c.hd;
    DeviceBuffer dq = up(qf), dkv = up(kvf), out = poisoned(static_cast<size_t>(c.B * d.out_batch_stride)),
                 lse = poisoned(static_cast<size_t>(c.B * c.nh * c.Tq));
    ops_->attention_forward(*q_, d, F(out), F(lse), F(dq), F(dkv) + k_off, F(dkv) + v_off);
    VD qd = widen(qf), kvd = widen(kvf), ro, rl;
    AttnRef ref{d};
    auto fwd = [&](VD& o, VD& l) {
      ref.forward(qd, VD(kvd.begin() + k_off, kvd.end()), VD(kvd.begin() + v_off, kvd.end()), o, l);
    };
    fwd(ro, rl);
    std::ostringstream name;
    name << "attention B" << c.B << " Tq" << c.Tq << " Tk" << c.Tk << " heads " << c.nh << "/" << c.nkv
         << " hd" << c.hd << ", " << seed();
    EXPECT_TRUE(close(name.str() + " out", down(out, ro.size()), ro, kFwdTol));
    EXPECT_TRUE(close(name.str() + " lse", down(lse, rl.size()), rl, kFwdTol));
    // backward
    const VF dout = rand(ro.size());
    DeviceBuffer ddout = up(dout), gq = poisoned(qf.size()), gkv = poisoned(kvf.size());
    ops_->attention_backward(*q_, d, F(gq), F(gkv) + k_off, F(gkv) + v_off, F(ddout), F(dq),
                             F(dkv) + k_off, F(dkv) + v_off, F(out), F(lse));
    auto loss = [&] {
      VD o, l;
      fwd(o, l);
      double L = 0;
      for (size_t i = 0; i < o.size(); ++i) L += double(dout[i]) * o[i];
      return L;
    };
    // Only the elements the op owns: q's head columns, k and v columns (the padding and the
    // q columns of the kv rows are not the op's outputs).
    auto pick = [](const VF& g, const VD& n, int64_t rows, int64_t stride, int64_t lo, int64_t hi,
                   VF& go, VD& no) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = lo; c < hi; ++c) go.push_back(g[r * stride + c]), no.push_back(n[r * stride + c]);
    };
    const VD nq = numeric_grad(qd, loss), nkv = numeric_grad(kvd, loss);
    VF gq_sel, gk_sel; VD nq_sel, nk_sel;
    pick(down(gq, qf.size()), nq, c.B * c.Tq, d.q_stride, 0, k_off, gq_sel, nq_sel);
    pick(down(gkv, kvf.size()), nkv, c.B * c.Tk, qkv, k_off, qkv, gk_sel, nk_sel);
    EXPECT_TRUE(close(name.str() + " dq vs finite differences", gq_sel, nq_sel, kBwdTol));
    EXPECT_TRUE(close(name.str() + " dk|dv vs finite differences", gk_sel, nk_sel, kBwdTol));
  }
}

TEST_P(Conformance, AttentionKeyOffset) {
  // Query i at key position q_offset + i for q_offset other than (and equal to) Tk - Tq: queries at
  // the start of a longer key block (0), inside it, at its end, and after all of it (a query block
  // attending an earlier key block); causal, GQA, shapes across the CPU kernel's 64-row blocks.
  // Forward against the double reference, backward against its finite differences.
  struct Case { int B, Tq, Tk, nh, nkv, hd; int64_t off; };
  const Case cases[] = {{2, 5, 5, 4, 2, 8, 0},    {1, 4, 9, 4, 2, 8, 0},   {1, 9, 4, 2, 1, 4, 0},
                        {2, 5, 12, 4, 2, 8, 3},   {1, 3, 7, 2, 1, 4, 4},   {1, 3, 4, 2, 1, 4, 6},
                        {2, 3, 20, 4, 2, 8, 25},  {1, 20, 140, 2, 1, 4, 61}, {1, 70, 100, 2, 1, 4, 10},
                        {1, 3, 70, 4, 2, 4, 80}};
  if (!be_->capabilities().attention_any_q_offset) {
    AttentionArgs d;
    d.B = 1; d.Tq = 3; d.Tk = 4; d.n_head = 2; d.n_kv_head = 1; d.head_dim = 4; d.q_offset = 6;
    d.q_stride = d.out_stride = 8; d.kv_stride = 4;
    d.q_batch_stride = d.out_batch_stride = 24; d.kv_batch_stride = 16;
    DeviceBuffer dq = up(rand(24)), dk = up(rand(16)), dv = up(rand(16)), out = poisoned(24), lse = poisoned(6);
    EXPECT_THROW(ops_->attention_forward(*q_, d, F(out), F(lse), F(dq), F(dk), F(dv)), Error)
        << "a backend without attention_any_q_offset must refuse q_offset != Tk - Tq";
    return;
  }
  for (const Case& c : cases) {
    AttentionArgs d;
    d.B = c.B; d.Tq = c.Tq; d.Tk = c.Tk; d.n_head = c.nh; d.n_kv_head = c.nkv; d.head_dim = c.hd;
    d.q_offset = c.off;
    d.q_stride = c.nh * c.hd + 3; d.q_batch_stride = c.Tq * d.q_stride;
    d.kv_stride = c.nkv * c.hd; d.kv_batch_stride = c.Tk * d.kv_stride;
    d.out_stride = c.nh * c.hd; d.out_batch_stride = c.Tq * d.out_stride;
    const size_t nq = static_cast<size_t>(c.B * d.q_batch_stride), nkv = static_cast<size_t>(c.B * d.kv_batch_stride);
    const size_t no = static_cast<size_t>(c.B * d.out_batch_stride), nl = static_cast<size_t>(c.B * c.nh * c.Tq);
    const VF qf = rand(nq, -1.5f, 1.5f), kf = rand(nkv, -1.5f, 1.5f), vf = rand(nkv, -1.5f, 1.5f), dout = rand(no);
    DeviceBuffer dq = up(qf), dk = up(kf), dv = up(vf), ddout = up(dout), out = poisoned(no), lse = poisoned(nl);
    ops_->attention_forward(*q_, d, F(out), F(lse), F(dq), F(dk), F(dv));
    VD qd = widen(qf), kd = widen(kf), vd = widen(vf), ro, rl;
    AttnRef{d}.forward(qd, kd, vd, ro, rl);
    std::ostringstream name;
    name << "attention q_offset " << c.off << " B" << c.B << " Tq" << c.Tq << " Tk" << c.Tk << " heads "
         << c.nh << "/" << c.nkv << " hd" << c.hd << ", " << seed();
    EXPECT_TRUE(close(name.str() + " out", down(out, no), ro, kFwdTol));
    EXPECT_TRUE(close(name.str() + " lse", down(lse, nl), rl, kFwdTol));
    DeviceBuffer gq = poisoned(nq), gk = poisoned(nkv), gv = poisoned(nkv);
    ops_->attention_backward(*q_, d, F(gq), F(gk), F(gv), F(ddout), F(dq), F(dk), F(dv), F(out), F(lse));
    auto loss = [&] { return AttnRef{d}.loss(qd, kd, vd, dout); };
    EXPECT_TRUE(close(name.str() + " dq vs finite differences", q_head_columns(down(gq, nq), d),
                      q_head_columns(numeric_grad(qd, loss), d), kBwdTol));
    EXPECT_TRUE(close(name.str() + " dk vs finite differences", down(gk, nkv), numeric_grad(kd, loss), kBwdTol));
    EXPECT_TRUE(close(name.str() + " dv vs finite differences", down(gv, nkv), numeric_grad(vd, loss), kBwdTol));
  }
}

// Partial results over key blocks (AttentionArgs::k_offset, attention_merge): the keys of one
// sequence cut into 2..4 blocks, each attended on its own (fully visible, partially visible with
// queries before it, or invisible), checked against the double reference of that block (rows
// that see nothing: out 0 and lse -inf exactly), merged in a shuffled order and compared with the
// double reference over all the keys; then the block backward (each block's k, v with the merged
// out and lse) summed over the blocks against finite differences of the whole attention in
// double. FP32 within the fp32 tolerances; BF16 products (where the backend has them) within
// bf16's.
TEST_P(Conformance, AttentionKeyBlocksMerge) {
  if (!be_->capabilities().attention_any_q_offset) GTEST_SKIP() << "[optional] backend takes no key offsets";
  struct Case { int B, Tq, Tk, nh, nkv, hd; int64_t q_pos; std::vector<int> cuts; };
  const Case cases[] = {
      {2, 8, 8, 4, 2, 8, 0, {3, 5}},             // causal self-attention in 3 blocks
      {1, 5, 20, 2, 1, 4, 15, {7, 15}},          // queries at the end: 2 visible blocks, diagonal
      {1, 6, 16, 2, 1, 4, 4, {4, 10}},           // visible, diagonal, invisible (keys after all)
      {2, 7, 12, 2, 2, 4, 3, {2, 5, 9}},         // 4 blocks, queries straddling three of them
      {1, 70, 140, 2, 1, 4, 70, {35, 70, 101}},  // across the kernels' 32/64-row blocks
  };
  for (int bf = 0; bf < 2; ++bf) {
    const bool bf16 = bf == 1;
    if (bf16 && !be_->capabilities().attention_bf16_products) continue;
    const double fwd_tol = bf16 ? 2e-2 : kFwdTol, bwd_tol = bf16 ? 2e-2 : kBwdTol;
    for (const Case& c : cases) {
      AttentionArgs d;  // the whole key range
      d.B = c.B; d.Tq = c.Tq; d.Tk = c.Tk; d.n_head = c.nh; d.n_kv_head = c.nkv; d.head_dim = c.hd;
      d.q_offset = c.q_pos;
      d.q_stride = c.nh * c.hd + 3; d.q_batch_stride = c.Tq * d.q_stride;
      d.kv_stride = c.nkv * c.hd + 1; d.kv_batch_stride = c.Tk * d.kv_stride;
      d.out_stride = c.nh * c.hd; d.out_batch_stride = c.Tq * d.out_stride;
      d.precision = bf16 ? Precision::BF16 : Precision::FP32;
      const size_t nq = static_cast<size_t>(c.B * d.q_batch_stride), nkv = static_cast<size_t>(c.B * d.kv_batch_stride);
      const size_t no = static_cast<size_t>(c.B * d.out_batch_stride), nl = static_cast<size_t>(c.B * c.nh * c.Tq);
      const VF qf = rand(nq, -1.5f, 1.5f), kf = rand(nkv, -1.5f, 1.5f), vf = rand(nkv, -1.5f, 1.5f), dout = rand(no);
      DeviceBuffer dq = up(qf), dk = up(kf), dv = up(vf), ddout = up(dout);
      std::ostringstream name;
      name << (bf16 ? "bf16 " : "") << "attention key blocks B" << c.B << " Tq" << c.Tq << " at " << c.q_pos
           << " Tk" << c.Tk << " heads " << c.nh << "/" << c.nkv << " hd" << c.hd << " cuts";
      for (int cut : c.cuts) name << " " << cut;
      name << ", " << seed();
      std::vector<int> edges{0};
      edges.insert(edges.end(), c.cuts.begin(), c.cuts.end());
      edges.push_back(c.Tk);
      const int nb = int(edges.size()) - 1;
      auto block = [&](int b) {
        AttentionArgs a = d;
        a.Tk = edges[b + 1] - edges[b];
        a.k_offset = edges[b];
        return a;
      };
      auto at = [&](DeviceBuffer& buf, int b) { return F(buf) + int64_t(edges[b]) * d.kv_stride; };
      VD qd = widen(qf), kd = widen(kf), vd = widen(vf);
      // Each block alone against its own reference; then merged in a shuffled order.
      std::vector<int> order(nb);
      for (int b = 0; b < nb; ++b) order[b] = b;
      std::shuffle(order.begin(), order.end(), rng_);
      DeviceBuffer out = poisoned(no), lse = poisoned(nl);
      for (int n = 0; n < nb; ++n) {
        const int b = order[n];
        const AttentionArgs a = block(b);
        DeviceBuffer ob = poisoned(no), lb = poisoned(nl);
        ops_->attention_forward(*q_, a, F(ob), F(lb), F(dq), at(dk, b), at(dv, b));
        VD ro, rl;
        const size_t k0 = static_cast<size_t>(edges[b] * d.kv_stride);
        AttnRef{a}.forward(qd, VD(kd.begin() + k0, kd.end()), VD(vd.begin() + k0, vd.end()), ro, rl);
        const VF got_o = down(ob, no), got_l = down(lb, nl);
        VF seen_l; VD seen_rl;
        for (size_t r = 0; r < nl; ++r) {
          if (std::isinf(rl[r])) {
            EXPECT_TRUE(std::isinf(got_l[r]) && got_l[r] < 0) << name.str() << " block " << b << " lse[" << r << "] = " << got_l[r] << ", expected -inf (no key seen)";
          } else {
            seen_l.push_back(got_l[r]), seen_rl.push_back(rl[r]);
          }
        }
        EXPECT_TRUE(close(name.str() + " block " + std::to_string(b) + " out", got_o, ro, fwd_tol));
        EXPECT_TRUE(close(name.str() + " block " + std::to_string(b) + " lse", seen_l, seen_rl, fwd_tol));
        if (n == 0) {
          q_->copy_on_device(out.data(), ob.data(), no * sizeof(float));
          q_->copy_on_device(lse.data(), lb.data(), nl * sizeof(float));
        } else {
          ops_->attention_merge(*q_, a, F(out), F(lse), F(ob), F(lb));
        }
      }
      VD ro, rl;
      AttnRef{d}.forward(qd, kd, vd, ro, rl);
      EXPECT_TRUE(close(name.str() + " merged out", down(out, no), ro, fwd_tol));
      EXPECT_TRUE(close(name.str() + " merged lse", down(lse, nl), rl, fwd_tol));
      // Block backward with the merged out and lse, dq summed over the blocks.
      VF gq_sum(nq, 0.0f);
      DeviceBuffer gk = poisoned(nkv), gv = poisoned(nkv);
      for (int b = 0; b < nb; ++b) {
        DeviceBuffer gq = poisoned(nq);
        ops_->attention_backward(*q_, block(b), F(gq), at(gk, b), at(gv, b), F(ddout), F(dq),
                                 at(dk, b), at(dv, b), F(out), F(lse));
        const VF g = down(gq, nq);
        for (int64_t r = 0; r < int64_t(c.B) * c.Tq; ++r)
          for (int64_t col = 0; col < int64_t(c.nh) * c.hd; ++col)
            gq_sum[r * d.q_stride + col] += g[r * d.q_stride + col];
      }
      auto loss = [&] { return AttnRef{d}.loss(qd, kd, vd, dout); };
      // Only the elements the ops write (each row's head columns, not the strides' padding).
      auto pick = [](const auto& g, int64_t rows, int64_t stride, int64_t width) {
        std::vector<std::decay_t<decltype(g[0])>> o;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t col = 0; col < width; ++col) o.push_back(g[r * stride + col]);
        return o;
      };
      const int64_t qw = int64_t(c.nh) * c.hd, kw = int64_t(c.nkv) * c.hd, nrk = int64_t(c.B) * c.Tk;
      EXPECT_TRUE(close(name.str() + " dq (sum over blocks) vs finite differences",
                        pick(gq_sum, int64_t(c.B) * c.Tq, d.q_stride, qw),
                        pick(numeric_grad(qd, loss), int64_t(c.B) * c.Tq, d.q_stride, qw), bwd_tol));
      EXPECT_TRUE(close(name.str() + " dk vs finite differences", pick(down(gk, nkv), nrk, d.kv_stride, kw),
                        pick(numeric_grad(kd, loss), nrk, d.kv_stride, kw), bwd_tol));
      EXPECT_TRUE(close(name.str() + " dv vs finite differences", pick(down(gv, nkv), nrk, d.kv_stride, kw),
                        pick(numeric_grad(vd, loss), nrk, d.kv_stride, kw), bwd_tol));
    }
  }
}

// attention_merge alone: against the double formula on random partial results; a second result
// that saw nothing (lse_b = -inf) leaves the first bit for bit, a first that saw nothing takes
// the second as it is; in another order the result differs by rounding only.
TEST_P(Conformance, AttentionMerge) {
  AttentionArgs d;
  d.B = 2; d.Tq = 5; d.Tk = 1; d.n_head = 3; d.n_kv_head = 1; d.head_dim = 6;
  d.out_stride = d.n_head * d.head_dim + 2; d.out_batch_stride = d.Tq * d.out_stride + 1;
  const size_t no = static_cast<size_t>(d.B * d.out_batch_stride), nl = static_cast<size_t>(d.B * d.n_head * d.Tq);
  const VF oa = rand(no), ob = rand(no);
  VF la = rand(nl, -3.0f, 6.0f), lb = rand(nl, -3.0f, 6.0f);
  la[1] = -INFINITY;                  // row 1: only the second block saw keys
  lb[2] = -INFINITY;                  // row 2: only the first
  la[3] = lb[3] = -INFINITY;          // row 3: neither
  VD ro(oa.begin(), oa.end()), rl(nl);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.n_head; ++h)
      for (int64_t i = 0; i < d.Tq; ++i) {
        const size_t li = static_cast<size_t>((b * d.n_head + h) * d.Tq + i);
        const double a = la[li], bb = lb[li];
        const double m = std::max(a, bb);
        rl[li] = m;
        if (std::isinf(m)) continue;
        const double wa = std::exp(a - m), wb = std::exp(bb - m);
        rl[li] = m + std::log(wa + wb);
        for (int64_t e = 0; e < d.head_dim; ++e) {
          const size_t at = static_cast<size_t>(b * d.out_batch_stride + i * d.out_stride + h * d.head_dim + e);
          ro[at] = (wa * oa[at] + wb * ob[at]) / (wa + wb);
        }
      }
  DeviceBuffer out = up(oa), lse = up(la), out_b = up(ob), lse_b = up(lb);
  ops_->attention_merge(*q_, d, F(out), F(lse), F(out_b), F(lse_b));
  const VF got_o = down(out, no), got_l = down(lse, nl);
  EXPECT_TRUE(close("attention_merge out, " + seed(), got_o, ro, kFwdTol));
  VF fl; VD fr;
  for (size_t r = 0; r < nl; ++r) {
    if (std::isinf(rl[r])) {
      EXPECT_TRUE(std::isinf(got_l[r]) && got_l[r] < 0) << "attention_merge lse[" << r << "] = " << got_l[r] << ", expected -inf";
    } else {
      fl.push_back(got_l[r]), fr.push_back(rl[r]);
    }
  }
  EXPECT_TRUE(close("attention_merge lse, " + seed(), fl, fr, kFwdTol));
  // Rows 1 and 2 of sequence 0, head 0: exact copies.
  for (int64_t e = 0; e < d.head_dim; ++e) {
    EXPECT_EQ(got_o[1 * d.out_stride + e], ob[1 * d.out_stride + e]) << "row that only the second block saw";
    EXPECT_EQ(got_o[2 * d.out_stride + e], oa[2 * d.out_stride + e]) << "row the second block did not see";
  }
  EXPECT_EQ(got_l[1], lb[1]);
  EXPECT_EQ(got_l[2], la[2]);
  // The other order, (b, a): the rows some block saw, head columns only (the padding and the
  // rows neither saw keep what the first operand held).
  DeviceBuffer out2 = up(ob), lse2 = up(lb), out_a = up(oa), lse_a = up(la);
  ops_->attention_merge(*q_, d, F(out2), F(lse2), F(out_a), F(lse_a));
  const VF got2 = down(out2, no);
  VF g2; VD r2;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t i = 0; i < d.Tq; ++i)
      for (int64_t h = 0; h < d.n_head; ++h) {
        if (std::isinf(rl[static_cast<size_t>((b * d.n_head + h) * d.Tq + i)])) continue;
        for (int64_t e = 0; e < d.head_dim; ++e) {
          const size_t at = static_cast<size_t>(b * d.out_batch_stride + i * d.out_stride + h * d.head_dim + e);
          g2.push_back(got2[at]), r2.push_back(ro[at]);
        }
      }
  EXPECT_TRUE(close("attention_merge out in the other order, " + seed(), g2, r2, kFwdTol));
}

// bf16 products (AttentionArgs::precision): forward against the double reference and backward
// against the backend's own fp32 backward (checked against finite differences above), both within
// bf16 tolerances and demonstrably rounded; shapes across the kernel's 128-row blocks (tails,
// decode-like Tq < Tk, GQA groups, several sequences, padded strides); then a query block after
// its keys (q_offset) with its backward against finite differences.
TEST_P(Conformance, AttentionBf16ProductsAgainstFp32) {
  if (!be_->capabilities().attention_bf16_products) GTEST_SKIP() << "[optional] backend has no bf16 attention products";
  struct Case { int B, Tq, Tk, nh, nkv, hd; };
  const Case cases[] = {{2, 5, 5, 4, 2, 8}, {1, 150, 150, 4, 2, 16}, {2, 1, 140, 4, 1, 8},
                        {1, 130, 257, 2, 2, 32}, {1, 300, 300, 2, 1, 64}};
  constexpr double kLo = 1e-5, kHi = 2e-2;  // rounding shows, and stays at bf16 size
  for (const Case& c : cases) {
    AttentionArgs d;
    d.B = c.B; d.Tq = c.Tq; d.Tk = c.Tk; d.n_head = c.nh; d.n_kv_head = c.nkv; d.head_dim = c.hd;
    const int64_t qkv = int64_t(c.nh + 2 * c.nkv) * c.hd;
    d.q_stride = c.nh * c.hd + 3; d.q_batch_stride = c.Tq * d.q_stride;
    d.kv_stride = qkv; d.kv_batch_stride = c.Tk * qkv;
    d.out_stride = c.nh * c.hd + 1; d.out_batch_stride = c.Tq * d.out_stride;
    const VF qf = rand(static_cast<size_t>(c.B * d.q_batch_stride), -1.5f, 1.5f);
    const VF kvf = rand(static_cast<size_t>(c.B * d.kv_batch_stride), -1.5f, 1.5f);
    const VF dout = rand(static_cast<size_t>(c.B * d.out_batch_stride));
    const int64_t k_off = int64_t(c.nh) * c.hd, v_off = k_off + int64_t(c.nkv) * c.hd;
    const size_t n_out = static_cast<size_t>(c.B * d.out_batch_stride), n_lse = static_cast<size_t>(c.B * c.nh * c.Tq);
    DeviceBuffer dq = up(qf), dkv = up(kvf), ddout = up(dout);
    VF out[2], lse[2], gq[2], gkv[2];
    for (int bf = 0; bf < 2; ++bf) {
      d.precision = bf ? Precision::BF16 : Precision::FP32;
      DeviceBuffer o = poisoned(n_out), l = poisoned(n_lse), g1 = poisoned(qf.size()), g2 = poisoned(kvf.size());
      ops_->attention_forward(*q_, d, F(o), F(l), F(dq), F(dkv) + k_off, F(dkv) + v_off);
      ops_->attention_backward(*q_, d, F(g1), F(g2) + k_off, F(g2) + v_off, F(ddout), F(dq),
                               F(dkv) + k_off, F(dkv) + v_off, F(o), F(l));
      out[bf] = down(o, n_out), lse[bf] = down(l, n_lse), gq[bf] = down(g1, qf.size()), gkv[bf] = down(g2, kvf.size());
    }
    std::ostringstream name;
    name << "bf16 attention B" << c.B << " Tq" << c.Tq << " Tk" << c.Tk << " heads " << c.nh << "/"
         << c.nkv << " hd" << c.hd << ", " << seed();
    VD ro, rl;
    AttnRef{d}.forward(widen(qf), VD(kvf.begin() + k_off, kvf.end()), VD(kvf.begin() + v_off, kvf.end()), ro, rl);
    // Only the elements the ops write (head columns of each row; the strides' padding is not theirs).
    auto pick = [](const VF& g, int64_t rows, int64_t stride, int64_t lo, int64_t hi) {
      VF o;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t col = lo; col < hi; ++col) o.push_back(g[r * stride + col]);
      return o;
    };
    auto pickd = [](const VD& g, int64_t rows, int64_t stride, int64_t lo, int64_t hi) {
      VD o;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t col = lo; col < hi; ++col) o.push_back(g[r * stride + col]);
      return o;
    };
    const VF o16 = pick(out[1], c.B * c.Tq, d.out_stride, 0, k_off);
    const VD oref = pickd(ro, c.B * c.Tq, d.out_stride, 0, k_off);
    EXPECT_TRUE(close(name.str() + " out", o16, oref, kHi));
    EXPECT_FALSE(close(name.str() + " out (rounded?)", o16, oref, kLo));
    EXPECT_TRUE(close(name.str() + " lse", lse[1], rl, kHi));
    const VF q16 = pick(gq[1], c.B * c.Tq, d.q_stride, 0, k_off), q32 = pick(gq[0], c.B * c.Tq, d.q_stride, 0, k_off);
    const VF kv16 = pick(gkv[1], c.B * c.Tk, qkv, k_off, qkv), kv32 = pick(gkv[0], c.B * c.Tk, qkv, k_off, qkv);
    EXPECT_TRUE(close(name.str() + " dq vs fp32", q16, widen(q32), kHi));
    EXPECT_FALSE(close(name.str() + " dq vs fp32 (rounded?)", q16, widen(q32), kLo));
    EXPECT_TRUE(close(name.str() + " dk|dv vs fp32", kv16, widen(kv32), kHi));
    EXPECT_FALSE(close(name.str() + " dk|dv vs fp32 (rounded?)", kv16, widen(kv32), kLo));
    // Bit-identical when repeated (fixed block order).
    d.precision = Precision::BF16;
    DeviceBuffer o = poisoned(n_out), l = poisoned(n_lse);
    ops_->attention_forward(*q_, d, F(o), F(l), F(dq), F(dkv) + k_off, F(dkv) + v_off);
    const VF again = down(o, n_out);
    EXPECT_EQ(0, std::memcmp(again.data(), out[1].data(), n_out * sizeof(float))) << name.str();
  }
  // q_offset (queries after their keys; bf16 products take any q_offset >= 0): the backward
  // against finite differences of the reference.
  AttentionArgs d;
  d.B = 1; d.Tq = 3; d.Tk = 20; d.n_head = 2; d.n_kv_head = 1; d.head_dim = 8;
  d.q_offset = 25;
  d.q_stride = d.out_stride = 16; d.kv_stride = 8;
  d.q_batch_stride = d.out_batch_stride = 48; d.kv_batch_stride = 160;
  d.precision = Precision::BF16;
  const VF qf = rand(48), kf = rand(160), vf = rand(160), dout = rand(48);
  DeviceBuffer dq = up(qf), dk = up(kf), dv = up(vf), ddout = up(dout), out = poisoned(48), lse = poisoned(6);
  ops_->attention_forward(*q_, d, F(out), F(lse), F(dq), F(dk), F(dv));
  VD qd = widen(qf), kd = widen(kf), vd = widen(vf), ro, rl;
  AttnRef{d}.forward(qd, kd, vd, ro, rl);
  EXPECT_TRUE(close("bf16 attention q_offset out, " + seed(), down(out, 48), ro, kHi));
  DeviceBuffer gq = poisoned(48), gk = poisoned(160), gv = poisoned(160);
  ops_->attention_backward(*q_, d, F(gq), F(gk), F(gv), F(ddout), F(dq), F(dk), F(dv), F(out), F(lse));
  auto loss = [&] {
    VD o, l;
    AttnRef{d}.forward(qd, kd, vd, o, l);
    double L = 0;
    for (size_t i = 0; i < o.size(); ++i) L += double(dout[i]) * o[i];
    return L;
  };
  EXPECT_TRUE(close("bf16 attention q_offset dq, " + seed(), down(gq, 48), numeric_grad(qd, loss), kHi));
  EXPECT_TRUE(close("bf16 attention q_offset dk, " + seed(), down(gk, 160), numeric_grad(kd, loss), kHi));
  EXPECT_TRUE(close("bf16 attention q_offset dv, " + seed(), down(gv, 160), numeric_grad(vd, loss), kHi));
}

// The document mask (AttentionArgs::doc_start): packed documents attend only inside themselves,
// for query blocks at the training offset and at others (a context-parallel chunk: queries inside
// or after their key block, documents that began before it, queries whose document starts after
// every key of the block and so see none: out 0, lse -inf), boundaries on and off the kernels'
// block edges (CPU 64, bf16 32, CUDA tiles), GQA, several sequences; fp32 forward against the
// double reference and backward against its finite differences, then bf16 products within bf16
// tolerances. One document everywhere is the unmasked kernel bit for bit.
TEST_P(Conformance, AttentionDocumentMask) {
  if (!be_->capabilities().attention_document_mask)
    GTEST_SKIP() << "[optional] backend has no document mask (Capabilities::attention_document_mask)";
  struct Case { int B, Tq, Tk, nh, nkv, hd; int64_t off; std::vector<int64_t> starts; int64_t k_off = 0; };
  // starts: document starts (positions counted from key 0; below 0: before the key block) after
  // the first document at 0; sequence b shifts them by b so the sequences differ. k_off: key 0's
  // position (AttentionArgs::k_offset: a later key block of the sequence, as in context
  // parallelism); every position moves with it.
  const std::vector<Case> cases = {
      {2, 9, 9, 4, 2, 8, 0, {3, 4, 7}},            {1, 150, 150, 2, 1, 8, 0, {1, 63, 64, 100, 129}},
      {2, 5, 12, 4, 2, 8, 7, {5, 9}},              {1, 20, 70, 2, 1, 4, 61, {30, 66, 75}},
      {1, 6, 10, 2, 1, 8, 12, {4, 15}},            {1, 70, 100, 2, 2, 16, 10, {40, 71}},
      {1, 40, 40, 2, 1, 8, 0, {1, 2, 3, 5, 8, 13, 21, 34}},
      {1, 20, 70, 2, 1, 4, 61, {30, 66, 75}, 100}, {2, 6, 10, 2, 1, 8, 3, {-5, 6}, 50}};
  const bool any_off = be_->capabilities().attention_any_q_offset;
  for (const Case& c : cases) {
    if (c.off != c.Tk - c.Tq && !any_off) continue;
    AttentionArgs d;
    d.B = c.B; d.Tq = c.Tq; d.Tk = c.Tk; d.n_head = c.nh; d.n_kv_head = c.nkv; d.head_dim = c.hd;
    d.q_offset = c.off + c.k_off;
    d.k_offset = c.k_off;
    d.q_stride = c.nh * c.hd + 3; d.q_batch_stride = c.Tq * d.q_stride;
    d.kv_stride = c.nkv * c.hd; d.kv_batch_stride = c.Tk * d.kv_stride;
    d.out_stride = c.nh * c.hd; d.out_batch_stride = c.Tq * d.out_stride;
    d.doc_batch_stride = c.Tq + 2;
    VI doc(static_cast<size_t>(c.B * d.doc_batch_stride), -7);  // (padding: never read)
    for (int b = 0; b < c.B; ++b)
      for (int i = 0; i < c.Tq; ++i) {
        int64_t start = 0;
        for (int64_t s0 : c.starts)
          if (s0 + b <= c.off + i) start = s0 + b;
        doc[b * d.doc_batch_stride + i] = int32_t(start + c.k_off);
      }
    DeviceBuffer ddoc = up(doc);
    d.doc_start = I(ddoc);
    const size_t nq = static_cast<size_t>(c.B * d.q_batch_stride), nkv = static_cast<size_t>(c.B * d.kv_batch_stride);
    const size_t no = static_cast<size_t>(c.B * d.out_batch_stride), nl = static_cast<size_t>(c.B * c.nh * c.Tq);
    const VF qf = rand(nq, -1.5f, 1.5f), kf = rand(nkv, -1.5f, 1.5f), vf = rand(nkv, -1.5f, 1.5f), dout = rand(no);
    DeviceBuffer dq = up(qf), dk = up(kf), dv = up(vf), ddout = up(dout), out = poisoned(no), lse = poisoned(nl);
    ops_->attention_forward(*q_, d, F(out), F(lse), F(dq), F(dk), F(dv));
    VD qd = widen(qf), kd = widen(kf), vd = widen(vf), ro, rl;
    const AttnRef ref{d, &doc};
    ref.forward(qd, kd, vd, ro, rl);
    std::ostringstream name;
    name << "document-masked attention q_offset " << c.off << " k_offset " << c.k_off << " B" << c.B << " Tq" << c.Tq << " Tk"
         << c.Tk << " heads " << c.nh << "/" << c.nkv << " hd" << c.hd << ", " << seed();
    const VF got_out = down(out, no), got_lse = down(lse, nl);
    // Rows that see no key: out exactly 0, lse -inf; the rest against the reference.
    VF lse_seen;
    VD rl_seen;
    for (size_t r = 0; r < nl; ++r) {
      if (std::isinf(rl[r])) {
        EXPECT_TRUE(std::isinf(got_lse[r]) && got_lse[r] < 0) << name.str() << " lse[" << r << "] = " << got_lse[r] << ", expected -inf (the query sees no key)";
      } else {
        lse_seen.push_back(got_lse[r]), rl_seen.push_back(rl[r]);
      }
    }
    EXPECT_TRUE(close(name.str() + " out", got_out, ro, kFwdTol));
    EXPECT_TRUE(close(name.str() + " lse", lse_seen, rl_seen, kFwdTol));
    DeviceBuffer gq = poisoned(nq), gk = poisoned(nkv), gv = poisoned(nkv);
    ops_->attention_backward(*q_, d, F(gq), F(gk), F(gv), F(ddout), F(dq), F(dk), F(dv), F(out), F(lse));
    auto loss = [&] {
      VD o, l;
      ref.forward(qd, kd, vd, o, l);
      double L = 0;
      for (size_t i = 0; i < o.size(); ++i) L += double(dout[i]) * o[i];
      return L;
    };
    const VD nq_sel = q_head_columns(numeric_grad(qd, loss), d);
    EXPECT_TRUE(close(name.str() + " dq vs finite differences", q_head_columns(down(gq, nq), d),
                      nq_sel, kBwdTol));
    const VD nkd = numeric_grad(kd, loss), nvd = numeric_grad(vd, loss);
    EXPECT_TRUE(close(name.str() + " dk vs finite differences", down(gk, nkv), nkd, kBwdTol));
    EXPECT_TRUE(close(name.str() + " dv vs finite differences", down(gv, nkv), nvd, kBwdTol));

    if (be_->capabilities().attention_bf16_products) {  // bf16 products: the same mask
      // Outputs within AttentionBf16ProductsAgainstFp32's 2e-2; gradients (P and dS rounded to
      // bf16, summed over up to 70 keys, norms of a few short documents) within 4e-2.
      constexpr double kHi = 2e-2, kHiGrad = 4e-2;
      AttentionArgs d16 = d;
      d16.precision = Precision::BF16;
      DeviceBuffer o16 = poisoned(no), l16 = poisoned(nl), g1 = poisoned(nq), g2 = poisoned(nkv), g3 = poisoned(nkv);
      ops_->attention_forward(*q_, d16, F(o16), F(l16), F(dq), F(dk), F(dv));
      ops_->attention_backward(*q_, d16, F(g1), F(g2), F(g3), F(ddout), F(dq), F(dk), F(dv), F(o16), F(l16));
      EXPECT_TRUE(close(name.str() + " bf16 out", down(o16, no), ro, kHi));
      const VF l16v = down(l16, nl);
      VF l16_seen;
      for (size_t r = 0; r < nl; ++r) {
        if (std::isinf(rl[r])) EXPECT_TRUE(std::isinf(l16v[r]) && l16v[r] < 0) << name.str() << " bf16 lse[" << r << "] = " << l16v[r];
        else l16_seen.push_back(l16v[r]);
      }
      EXPECT_TRUE(close(name.str() + " bf16 lse", l16_seen, rl_seen, kHi));
      EXPECT_TRUE(close(name.str() + " bf16 dq vs finite differences",
                        q_head_columns(down(g1, nq), d), nq_sel, kHiGrad));
      EXPECT_TRUE(close(name.str() + " bf16 dk vs finite differences", down(g2, nkv), nkd, kHiGrad));
      EXPECT_TRUE(close(name.str() + " bf16 dv vs finite differences", down(g3, nkv), nvd, kHiGrad));
    }

    // One document from position 0 on (every start 0): the unmasked kernels bit for bit.
    VI one(doc.size(), 0);
    DeviceBuffer done = up(one);
    for (int bf = 0; bf < (be_->capabilities().attention_bf16_products ? 2 : 1); ++bf) {
      AttentionArgs masked = d, plain = d;
      masked.doc_start = I(done);
      plain.doc_start = nullptr;
      masked.precision = plain.precision = bf ? Precision::BF16 : Precision::FP32;
      DeviceBuffer o1 = poisoned(no), l1 = poisoned(nl), o2 = poisoned(no), l2 = poisoned(nl);
      DeviceBuffer a1 = poisoned(nq), a2 = poisoned(nkv), a3 = poisoned(nkv), b1 = poisoned(nq), b2 = poisoned(nkv), b3 = poisoned(nkv);
      ops_->attention_forward(*q_, masked, F(o1), F(l1), F(dq), F(dk), F(dv));
      ops_->attention_forward(*q_, plain, F(o2), F(l2), F(dq), F(dk), F(dv));
      ops_->attention_backward(*q_, masked, F(a1), F(a2), F(a3), F(ddout), F(dq), F(dk), F(dv), F(o1), F(l1));
      ops_->attention_backward(*q_, plain, F(b1), F(b2), F(b3), F(ddout), F(dq), F(dk), F(dv), F(o2), F(l2));
      const char* what = bf ? " bf16" : " fp32";
      EXPECT_EQ(0, std::memcmp(down(o1, no).data(), down(o2, no).data(), no * 4)) << name.str() << what << " out: one document differs from no mask";
      EXPECT_EQ(0, std::memcmp(down(l1, nl).data(), down(l2, nl).data(), nl * 4)) << name.str() << what << " lse";
      // dq rows' padding columns are not written: compare the head columns.
      const VF x1 = down(a1, nq), x2 = down(b1, nq);
      for (int64_t r = 0; r < int64_t(c.B) * c.Tq; ++r)
        EXPECT_EQ(0, std::memcmp(&x1[r * d.q_stride], &x2[r * d.q_stride], size_t(c.nh) * c.hd * 4)) << name.str() << what << " dq row " << r;
      EXPECT_EQ(0, std::memcmp(down(a2, nkv).data(), down(b2, nkv).data(), nkv * 4)) << name.str() << what << " dk";
      EXPECT_EQ(0, std::memcmp(down(a3, nkv).data(), down(b3, nkv).data(), nkv * 4)) << name.str() << what << " dv";
    }
  }
}

// ---- rotary -----------------------------------------------------------------------------------

TEST_P(Conformance, RopeForwardAndAdjoint) {
  const int64_t B = 2, T = randint(1, 6), hd = 2 * randint(1, 6), heads = randint(1, 3);
  const int64_t stride = heads * hd + 5, pos0 = randint(0, 3), max_pos = pos0 + T, half = hd / 2;
  const int64_t N = B * T;
  VF cs(static_cast<size_t>(max_pos * half)), sn(static_cast<size_t>(max_pos * half));
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(p) * std::pow(10000.0, -double(2 * i) / double(hd));
      cs[p * half + i] = float(std::cos(a));
      sn[p * half + i] = float(std::sin(a));
    }
  const VF x = rand(static_cast<size_t>(N * stride));
  auto ref = [&](const VD& in, bool inverse) {
    VD o = in;
    for (int64_t r = 0; r < N; ++r)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const int64_t p = pos0 + r % T;
          const double c = cs[p * half + i], s = inverse ? -double(sn[p * half + i]) : double(sn[p * half + i]);
          const double a = in[r * stride + h * hd + i], b = in[r * stride + h * hd + i + half];
          o[r * stride + h * hd + i] = a * c - b * s;
          o[r * stride + h * hd + i + half] = b * c + a * s;
        }
    return o;
  };
  DeviceBuffer dx = up(x), dc = up(cs), ds = up(sn);
  RopeArgs r;
  r.x = F(dx); r.N = N; r.T_seq = T; r.pos0 = pos0; r.n_heads = heads; r.head_dim = hd;
  r.stride = stride; r.cos = F(dc); r.sin = F(ds);
  ops_->rope_forward(*q_, r);
  EXPECT_TRUE(close("rope forward, " + seed(), down(dx, x.size()), ref(widen(x), false), kFwdTol));
  // backward = adjoint: d/dx Σ dout · rope(x)
  const VF dout = rand(x.size());
  DeviceBuffer dg = up(dout);
  r.x = F(dg);
  ops_->rope_backward(*q_, r);
  VD xd = widen(x);
  auto loss = [&] { const VD o = ref(xd, false); double L = 0; for (size_t i = 0; i < o.size(); ++i) L += dout[i] * o[i]; return L; };
  EXPECT_TRUE(close("rope backward vs finite differences, " + seed(), down(dg, x.size()), numeric_grad(xd, loss), kBwdTol));
}

// Per-head RMSNorm (Qwen3's q_norm / k_norm) in place on some heads of strided rows (the other
// columns untouched): forward, rstd and the saved input against the double reference; backward
// (dx in place, dw accumulated) against central finite differences of the reference forward.
TEST_P(Conformance, HeadNormForwardAndBackward) {
  for (int rep = 0; rep < 3; ++rep) {
    const int64_t N = randint(1, 7), heads = randint(1, 4), hd = randint(1, 3) * randint(1, 12);
    const int64_t stride = heads * hd + randint(0, 5), width = heads * hd;
    const float eps = rep == 0 ? 1e-6f : 1e-3f;
    const VF x = rand(static_cast<size_t>(N * stride), -2, 2), w = rand(static_cast<size_t>(hd), 0.5f, 1.5f);
    const VF dy = rand(x.size()), dw0 = rand(static_cast<size_t>(hd));
    auto ref = [&](const VD& in, const VD& wd) {
      VD o = in;
      for (int64_t r = 0; r < N; ++r)
        for (int64_t h = 0; h < heads; ++h) {
          const double* v = in.data() + r * stride + h * hd;
          double ss = 0;
          for (int64_t d = 0; d < hd; ++d) ss += v[d] * v[d];
          const double rs = 1 / std::sqrt(ss / double(hd) + double(eps));
          for (int64_t d = 0; d < hd; ++d) o[size_t(r * stride + h * hd + d)] = v[d] * rs * wd[size_t(d)];
        }
      return o;
    };
    DeviceBuffer dx = up(x), dwb = up(w), rstd = poisoned(static_cast<size_t>(N * heads)),
                 saved = poisoned(static_cast<size_t>(N * width)), dwg = up(dw0);
    HeadNormArgs a;
    a.x = F(dx); a.N = N; a.n_heads = heads; a.head_dim = hd; a.stride = stride;
    a.w = F(dwb); a.rstd = F(rstd); a.saved = F(saved); a.eps = eps;
    ops_->head_norm_forward(*q_, a);
    VD xd = widen(x), wd = widen(w);
    const std::string name = "head norm N=" + std::to_string(N) + " heads=" + std::to_string(heads) +
                             " hd=" + std::to_string(hd) + " stride=" + std::to_string(stride) + ", " + seed();
    EXPECT_TRUE(close(name + " forward", down(dx, x.size()), ref(xd, wd), kFwdTol));
    VD want_rstd, want_saved;
    for (int64_t r = 0; r < N; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        double ss = 0;
        for (int64_t d = 0; d < hd; ++d) {
          const double v = x[size_t(r * stride + h * hd + d)];
          ss += v * v;
          want_saved.push_back(v);
        }
        want_rstd.push_back(1 / std::sqrt(ss / double(hd) + double(eps)));
      }
    EXPECT_TRUE(close(name + " rstd", down(rstd, want_rstd.size()), want_rstd, kFwdTol));
    EXPECT_TRUE(close(name + " saved input", down(saved, want_saved.size()), want_saved, 0.0));
    // backward: dy in place -> dx; dw accumulates onto dw0
    DeviceBuffer g = up(dy);
    a.x = F(g); a.dw = F(dwg);
    ops_->head_norm_backward(*q_, a);
    auto loss = [&] {
      const VD o = ref(xd, wd);
      double L = 0;
      for (size_t i = 0; i < o.size(); ++i) L += double(dy[i]) * o[i];
      return L;
    };
    VD want_dx = numeric_grad(xd, loss), want_dw = numeric_grad(wd, loss);
    for (int64_t r = 0; r < N; ++r)  // the columns past the heads are not the op's: dy stays
      for (int64_t c = width; c < stride; ++c) want_dx[size_t(r * stride + c)] = dy[size_t(r * stride + c)];
    for (size_t i = 0; i < want_dw.size(); ++i) want_dw[i] += dw0[i];
    EXPECT_TRUE(close(name + " dx vs finite differences", down(g, x.size()), want_dx, kBwdTol));
    EXPECT_TRUE(close(name + " dw vs finite differences", down(dwg, static_cast<size_t>(hd)), want_dw, kBwdTol));
  }
}

// Per-document positions (RopeArgs::doc_start, data.document_positions): row r at position
// pos0 + r % T - doc_start[r], restarting at 0 where each document of a sequence begins; forward
// against the reference and the backward against finite differences; all-zero starts equal the
// plain op bit for bit.
TEST_P(Conformance, RopePerDocumentPositions) {
  const int64_t B = 2, T = 9, hd = 2 * randint(1, 5), heads = randint(1, 3), pos0 = 0;
  const int64_t stride = heads * hd + 3, max_pos = T, half = hd / 2, N = B * T;
  const VI doc = {0, 0, 0, 3, 3, 5, 5, 5, 5,  0, 1, 1, 1, 1, 1, 6, 6, 8};
  VF cs(static_cast<size_t>(max_pos * half)), sn(cs.size());
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(p) * std::pow(10000.0, -double(2 * i) / double(hd));
      cs[p * half + i] = float(std::cos(a)), sn[p * half + i] = float(std::sin(a));
    }
  auto ref = [&](const VD& in) {
    VD o = in;
    for (int64_t r = 0; r < N; ++r)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const int64_t p = pos0 + r % T - doc[r];
          const double c = cs[p * half + i], sv = sn[p * half + i];
          const double a = in[r * stride + h * hd + i], b = in[r * stride + h * hd + i + half];
          o[r * stride + h * hd + i] = a * c - b * sv;
          o[r * stride + h * hd + i + half] = b * c + a * sv;
        }
    return o;
  };
  const VF x = rand(static_cast<size_t>(N * stride)), dout = rand(x.size());
  DeviceBuffer dx = up(x), dc = up(cs), ds = up(sn), dd = up(doc), zeros = up(VI(doc.size(), 0));
  RopeArgs r;
  r.x = F(dx); r.N = N; r.T_seq = T; r.pos0 = pos0; r.n_heads = heads; r.head_dim = hd;
  r.stride = stride; r.cos = F(dc); r.sin = F(ds); r.doc_start = I(dd);
  ops_->rope_forward(*q_, r);
  EXPECT_TRUE(close("rope per-document forward, " + seed(), down(dx, x.size()), ref(widen(x)), kFwdTol));
  DeviceBuffer dg = up(dout);
  r.x = F(dg);
  ops_->rope_backward(*q_, r);
  VD xd = widen(x);
  auto loss = [&] { const VD o = ref(xd); double L = 0; for (size_t i = 0; i < o.size(); ++i) L += dout[i] * o[i]; return L; };
  EXPECT_TRUE(close("rope per-document backward vs finite differences, " + seed(), down(dg, x.size()), numeric_grad(xd, loss), kBwdTol));
  // One document per sequence (every start 0): the plain op's bits.
  DeviceBuffer a = up(x), b = up(x);
  r.x = F(a); r.doc_start = I(zeros);
  ops_->rope_forward(*q_, r);
  r.x = F(b); r.doc_start = nullptr;
  ops_->rope_forward(*q_, r);
  EXPECT_EQ(0, std::memcmp(down(a, x.size()).data(), down(b, x.size()).data(), x.size() * 4));
}

// ---- activations ------------------------------------------------------------------------------

double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double silu(double x) { return x / (1 + std::exp(-x)); }

TEST_P(Conformance, GeluAndSwigluForwardBackward) {
  {
    const int64_t n = randint(1, 3000);
    const VF x = rand(static_cast<size_t>(n), -5, 5), dout = rand(static_cast<size_t>(n));
    DeviceBuffer dx = up(x), out = poisoned(static_cast<size_t>(n)), dd = up(dout), g = poisoned(static_cast<size_t>(n));
    ops_->gelu_forward(*q_, F(out), F(dx), n);
    ops_->gelu_backward(*q_, F(g), F(dd), F(dx), n);
    VD ref(static_cast<size_t>(n)), xd = widen(x);
    for (int64_t i = 0; i < n; ++i) ref[i] = gelu(x[i]);
    EXPECT_TRUE(close("gelu forward, " + seed(), down(out, static_cast<size_t>(n)), ref, kFwdTol));
    // elementwise: the finite difference of each element's own output
    VD num(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const double h = 1e-6;
      num[i] = dout[i] * (gelu(xd[i] + h) - gelu(xd[i] - h)) / (2 * h);
    }
    EXPECT_TRUE(close("gelu backward vs finite differences, " + seed(), down(g, static_cast<size_t>(n)), num, kBwdTol));
  }
  {
    const int64_t N = randint(1, 6), Fw = randint(1, 200);
    const VF gu = rand(static_cast<size_t>(N * 2 * Fw), -4, 4), dout = rand(static_cast<size_t>(N * Fw));
    DeviceBuffer dgu = up(gu), out = poisoned(static_cast<size_t>(N * Fw)), dd = up(dout), g = poisoned(gu.size());
    ops_->swiglu_forward(*q_, F(out), F(dgu), N, Fw);
    ops_->swiglu_backward(*q_, F(g), F(dd), F(dgu), N, Fw);
    VD gud = widen(gu);
    auto fwd = [&] {
      VD o(static_cast<size_t>(N * Fw));
      for (int64_t t = 0; t < N; ++t)
        for (int64_t j = 0; j < Fw; ++j) o[t * Fw + j] = silu(gud[t * 2 * Fw + j]) * gud[t * 2 * Fw + Fw + j];
      return o;
    };
    EXPECT_TRUE(close("swiglu forward, " + seed(), down(out, static_cast<size_t>(N * Fw)), fwd(), kFwdTol));
    auto loss = [&] { const VD o = fwd(); double L = 0; for (size_t i = 0; i < o.size(); ++i) L += dout[i] * o[i]; return L; };
    EXPECT_TRUE(close("swiglu backward vs finite differences, " + seed(), down(g, gu.size()), numeric_grad(gud, loss), kBwdTol));
  }
}

// ---- mixture of experts: grouped GEMM, tokens to experts and back --------------------------------

// Groups of every size, zero included (an expert that received no tokens: M = 0; its weight
// gradient: K = 0, which scales C by beta), in every layout, fp32 and bf16 (fp32-stored operands
// rounded, and bf16-stored A, B or both where the backend reads them: the experts' bf16 weight
// copy and SwiGLU output): each group against the double product and bit for bit against one
// gemm call of its shape (the contract).
TEST_P(Conformance, GroupedGemmGroupsOfAnySizeEveryLayout) {
  const Capabilities& caps = be_->capabilities();
  auto to16 = [](const VF& x) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) { uint32_t u; std::memcpy(&u, &x[i], 4); h[i] = uint16_t(u >> 16); }
    return h;
  };
  for (int layout = 0; layout < 4; ++layout)
    for (int form = 0; form < 5; ++form) {  // 0 fp32; 1 bf16 on fp32; 2-4: A, B, both bf16-stored
      const Precision prec = form == 0 ? Precision::FP32 : Precision::BF16;
      const bool a16 = form == 2 || form == 4, b16 = form == 3 || form == 4;
      if (prec == Precision::BF16 && !caps.gemm_bf16) continue;
      if ((a16 || b16) && !caps.gemm_bf16_storage) continue;
      for (float beta : {0.0f, 1.0f}) {
        const bool ta = layout & 1, tb = layout & 2;
        const int64_t G = randint(1, 6);
        std::vector<int64_t> M(G), N(G), K(G);
        // Shared leading dimensions (the experts' weights and rows of one buffer each).
        const int64_t maxd = 48, lda = maxd + randint(0, 3), ldb = maxd + randint(0, 3),
                      ldc = maxd + randint(0, 3);
        for (int64_t g = 0; g < G; ++g) {
          M[g] = randint(0, 40); N[g] = randint(1, maxd); K[g] = randint(1, maxd);
        }
        M[randint(0, G - 1)] = 0;  // an expert without tokens
        K[randint(0, G - 1)] = 0;  // a weight gradient over no tokens
        const float alpha = float(randint(1, 4)) * 0.5f;
        std::vector<VF> A(G), B(G), C0(G);
        std::vector<DeviceBuffer> dA, dB, dC, dC1;
        std::vector<const void*> pA(G), pB(G);
        std::vector<float*> pC(G);
        for (int64_t g = 0; g < G; ++g) {
          const int64_t ar = ta ? K[g] : M[g], br = tb ? N[g] : K[g];
          A[g] = rand(size_t(std::max<int64_t>(ar, 1) * lda));
          B[g] = rand(size_t(std::max<int64_t>(br, 1) * ldb));
          C0[g] = rand(size_t(std::max<int64_t>(M[g], 1) * ldc));
          if (beta == 0) std::fill(C0[g].begin(), C0[g].end(), kNaN);
          if (a16) for (float& x : A[g]) x = ref_bf16(x);  // the stored values
          if (b16) for (float& x : B[g]) x = ref_bf16(x);
          dA.push_back(a16 ? up(to16(A[g])) : up(A[g]));
          dB.push_back(b16 ? up(to16(B[g])) : up(B[g]));
          dC.push_back(up(C0[g]));
          dC1.push_back(up(C0[g]));
          pA[g] = dA[g].data(); pB[g] = dB[g].data(); pC[g] = F(dC[g]);
        }
        GroupedGemmArgs a;
        a.trans_a = ta; a.trans_b = tb; a.groups = G; a.M = M.data(); a.N = N.data(); a.K = K.data();
        a.alpha = alpha; a.beta = beta; a.A = pA.data(); a.lda = lda; a.B = pB.data(); a.ldb = ldb;
        a.C = pC.data(); a.ldc = ldc; a.precision = prec;
        a.a_type = a16 ? DType::BF16 : DType::F32;
        a.b_type = b16 ? DType::BF16 : DType::F32;
        ops_->grouped_gemm(*q_, a);
        for (int64_t g = 0; g < G; ++g) {
          std::ostringstream what;
          what << "grouped_gemm " << (ta ? 'T' : 'N') << (tb ? 'T' : 'N') << " group " << g << " of "
               << G << " " << M[g] << "x" << N[g] << "x" << K[g] << " beta " << beta
               << (prec == Precision::BF16 ? " bf16" : " fp32") << (a16 ? " A bf16-stored" : "")
               << (b16 ? " B bf16-stored" : "") << ", " << seed();
          const VF got = rows_of(down(dC[g], C0[g].size()), M[g], N[g], ldc);
          VD Ad = widen(A[g]), Bd = widen(B[g]);
          if (prec == Precision::BF16) {
            for (double& x : Ad) x = ref_bf16(float(x));
            for (double& x : Bd) x = ref_bf16(float(x));
          }
          const VD ref = rows_of(ref_gemm(ta, tb, M[g], N[g], K[g], alpha, Ad, lda, Bd, ldb, beta,
                                          widen(C0[g]), ldc), M[g], N[g], ldc);
          EXPECT_TRUE(close(what.str(), got, ref, kFwdTol));
          GemmArgs one;
          one.trans_a = ta; one.trans_b = tb; one.M = M[g]; one.N = N[g]; one.K = K[g];
          one.alpha = alpha; one.A = dA[g].data(); one.lda = lda; one.B = dB[g].data(); one.ldb = ldb;
          one.beta = beta; one.C = F(dC1[g]); one.ldc = ldc; one.precision = prec;
          one.a_type = a.a_type; one.b_type = a.b_type;
          ops_->gemm(*q_, one);
          const VF single = rows_of(down(dC1[g], C0[g].size()), M[g], N[g], ldc);
          EXPECT_EQ(0, std::memcmp(got.data(), single.data(), got.size() * sizeof(float)))
              << what.str() << ": not bit for bit one gemm of its shape";
        }
      }
    }
}

// A routing of N tokens to k of E experts each: slots (N * k) give the row of the expert-ordered
// buffer (experts one after the other, tokens in order within an expert), -1 for a dropped choice
// (drop_percent of them); expert E - 1 receives no token when E > k. R: the rows used.
VI moe_routing(std::mt19937_64& rng, int64_t N, int64_t k, int64_t E, int drop_percent,
               int64_t* R) {
  std::vector<std::vector<int64_t>> choice(static_cast<size_t>(N));
  const int64_t usable = E > k ? E - 1 : E;
  for (auto& c : choice) {
    std::vector<int64_t> experts(static_cast<size_t>(usable));
    for (int64_t e = 0; e < usable; ++e) experts[size_t(e)] = e;
    std::shuffle(experts.begin(), experts.end(), rng);
    c.assign(experts.begin(), experts.begin() + k);
  }
  VI slots(size_t(N * k), -1);
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (choice[size_t(t)][size_t(j)] == e &&
            std::uniform_int_distribution<int>(0, 99)(rng) >= drop_percent)
          slots[size_t(t * k + j)] = int32_t(row++);
  *R = row;
  return slots;
}

// The permutation forward exact (data movement), its adjoint, the weighted combine and its
// backward against the double reference and its finite differences: dropless and with drops,
// k = 1..3, an expert that receives nothing.
TEST_P(Conformance, MoePermuteAndCombineForwardBackward) {
  for (int drop : {0, 25}) {
    const int64_t E = randint(2, 6), k = randint(1, std::min<int64_t>(3, E - 1));
    const int64_t N = randint(1, 40), C = randint(1, 70);
    int64_t R = 0;
    const VI slots = moe_routing(rng_, N, k, E, drop, &R);
    const std::string what = "N " + std::to_string(N) + " k " + std::to_string(k) + " C " +
                             std::to_string(C) + " drop " + std::to_string(drop) + "%, " + seed();
    const VF x = rand(size_t(N * C)), e = rand(size_t(std::max<int64_t>(R, 1) * C)),
             w = rand(size_t(N * k), 0.0f, 1.0f), dy = rand(size_t(N * C)),
             dx0 = rand(size_t(N * C));
    DeviceBuffer ds = up(slots), dx_in = up(x), out = poisoned(size_t(std::max<int64_t>(R, 1) * C));
    ops_->moe_permute(*q_, F(out), F(dx_in), I(ds), N, k, C);
    {  // exact copies
      const VF got = down(out, size_t(R * C));
      VD ref(size_t(R * C));
      for (int64_t t = 0; t < N; ++t)
        for (int64_t j = 0; j < k; ++j)
          if (slots[t * k + j] >= 0)
            for (int64_t c = 0; c < C; ++c) ref[size_t(slots[t * k + j] * C + c)] = x[t * C + c];
      EXPECT_TRUE(close("moe_permute " + what, got, ref, 0.0));
    }
    const VF dout = rand(size_t(std::max<int64_t>(R, 1) * C));
    DeviceBuffer dd = up(dout), ddx = up(dx0);
    ops_->moe_permute_backward(*q_, F(ddx), F(dd), I(ds), N, k, C);
    {
      VD ref = widen(dx0);
      for (int64_t t = 0; t < N; ++t)
        for (int64_t j = 0; j < k; ++j)
          if (slots[t * k + j] >= 0)
            for (int64_t c = 0; c < C; ++c) ref[t * C + c] += dout[slots[t * k + j] * C + c];
      EXPECT_TRUE(close("moe_permute_backward (+=) " + what, down(ddx, size_t(N * C)), ref, kFwdTol));
    }
    VD ed = widen(e), wd = widen(w);
    auto combine = [&] {
      VD y(size_t(N * C), 0.0);
      for (int64_t t = 0; t < N; ++t)
        for (int64_t j = 0; j < k; ++j)
          if (slots[t * k + j] >= 0)
            for (int64_t c = 0; c < C; ++c)
              y[t * C + c] += wd[t * k + j] * ed[slots[t * k + j] * C + c];
      return y;
    };
    DeviceBuffer de_in = up(e), dw_in = up(w), y = poisoned(size_t(N * C));
    ops_->moe_unpermute(*q_, F(y), F(de_in), F(dw_in), I(ds), N, k, C);
    EXPECT_TRUE(close("moe_unpermute " + what, down(y, size_t(N * C)), combine(), kFwdTol));
    DeviceBuffer ddy = up(dy), dE = poisoned(size_t(std::max<int64_t>(R, 1) * C)),
                 dW = poisoned(size_t(N * k));
    ops_->moe_unpermute_backward(*q_, F(dE), F(dW), F(ddy), F(de_in), F(dw_in), I(ds), N, k, C);
    auto loss = [&] {
      const VD o = combine();
      double L = 0;
      for (size_t i = 0; i < o.size(); ++i) L += dy[i] * o[i];
      return L;
    };
    const VD num_de = numeric_grad(ed, loss);  // e has one spare row where R = 0
    EXPECT_TRUE(close("moe_unpermute_backward de vs finite differences " + what,
                      down(dE, size_t(R * C)), VD(num_de.begin(), num_de.begin() + R * C),
                      kBwdTol));
    EXPECT_TRUE(close("moe_unpermute_backward dw vs finite differences " + what,
                      down(dW, size_t(N * k)), numeric_grad(wd, loss), kBwdTol));
  }
}

// ---- vocabulary-parallel embedding --------------------------------------------------------------

TEST_P(Conformance, VocabParallelEmbeddingGatherScatterAndPositions) {
  const int64_t V = randint(4, 30), C = randint(1, 70), T = randint(1, 5), N = T * randint(1, 3);
  const int64_t v0 = randint(0, V - 2), Vs = randint(1, V - v0);  // this rank's slice [v0, v0+Vs)
  VI tokens(static_cast<size_t>(N));
  for (int32_t& t : tokens) t = int32_t(randint(0, V - 1));
  tokens[0] = int32_t(v0);  // at least one hit
  const VF table = rand(static_cast<size_t>(Vs * C)), pos = rand(static_cast<size_t>(T * C)), dout = rand(static_cast<size_t>(N * C));
  DeviceBuffer dt = up(table), dtok = up(tokens), dpos = up(pos), out = poisoned(static_cast<size_t>(N * C));
  ops_->embedding_gather(*q_, F(out), I(dtok), F(dt), v0, Vs, N, C);
  ops_->position_add(*q_, F(out), F(dpos), N, T, C);
  VD tabd = widen(table), posd = widen(pos);
  auto fwd = [&] {
    VD o(static_cast<size_t>(N * C), 0.0);
    for (int64_t t = 0; t < N; ++t) {
      const int64_t v = tokens[t] - v0;
      for (int64_t c = 0; c < C; ++c)
        o[t * C + c] = (v >= 0 && v < Vs ? tabd[v * C + c] : 0.0) + posd[(t % T) * C + c];
    }
    return o;
  };
  const std::string name = "embedding V" + std::to_string(V) + " slice [" + std::to_string(v0) + ", " +
                           std::to_string(v0 + Vs) + ") C" + std::to_string(C) + ", " + seed();
  EXPECT_TRUE(close(name + " gather + positions", down(out, static_cast<size_t>(N * C)), fwd(), kFwdTol));
  auto loss = [&] { const VD o = fwd(); double L = 0; for (size_t i = 0; i < o.size(); ++i) L += dout[i] * o[i]; return L; };
  const VD ntab = numeric_grad(tabd, loss), npos = numeric_grad(posd, loss);
  // scatter-add into the whole block, and into a shard [s0, s1) of it (as the Z-sharded gradient)
  const VF init = rand(table.size()), pinit = rand(pos.size());
  DeviceBuffer dd = up(dout), gt = up(init), gp = up(pinit);
  ops_->embedding_scatter_add(*q_, F(gt), 0, Vs * C, F(dd), I(dtok), v0, Vs, N, C);
  ops_->position_grad(*q_, F(gp), F(dd), N, T, C);
  VD ref = ntab, pref = npos;
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += init[i];
  for (size_t i = 0; i < pref.size(); ++i) pref[i] += pinit[i];
  EXPECT_TRUE(close(name + " scatter-add vs finite differences", down(gt, table.size()), ref, kBwdTol));
  EXPECT_TRUE(close(name + " position grad vs finite differences", down(gp, pos.size()), pref, kBwdTol));
  const int64_t s0 = randint(0, Vs * C - 1), s1 = randint(s0 + 1, Vs * C);
  const VF sinit = rand(static_cast<size_t>(s1 - s0));
  DeviceBuffer gs = up(sinit);
  ops_->embedding_scatter_add(*q_, F(gs), s0, s1, F(dd), I(dtok), v0, Vs, N, C);
  VD sref(static_cast<size_t>(s1 - s0));
  for (int64_t e = s0; e < s1; ++e) sref[e - s0] = ntab[e] + sinit[e - s0];
  EXPECT_TRUE(close(name + " shard [" + std::to_string(s0) + ", " + std::to_string(s1) + ")",
                    down(gs, sref.size()), sref, kBwdTol));
}

// ---- vocabulary-parallel cross-entropy ----------------------------------------------------------

TEST_P(Conformance, VocabParallelCrossEntropyPieces) {
  const int64_t N = randint(1, 7), V = randint(3, 300), cut = randint(1, V - 1);
  const int64_t v0s[2] = {0, cut}, Vss[2] = {cut, V - cut};
  const float grad_scale = 0.37f;
  const VF logits = rand(static_cast<size_t>(N * V), -8, 8);
  VI targets(static_cast<size_t>(N));
  for (int32_t& t : targets) t = int32_t(randint(0, V - 1));
  if (N > 1) targets[1] = -1;  // masked
  DeviceBuffer tg = up(targets), L[2], mx[2], st[2];
  for (int s = 0; s < 2; ++s) {
    VF part;
    for (int64_t t = 0; t < N; ++t) part.insert(part.end(), logits.begin() + t * V + v0s[s], logits.begin() + t * V + v0s[s] + Vss[s]);
    L[s] = up(part);
    mx[s] = poisoned(static_cast<size_t>(N));
    ops_->ce_row_max(*q_, F(mx[s]), F(L[s]), N, Vss[s]);
  }
  VF gmax(static_cast<size_t>(N));
  {
    const VF a = down(mx[0], static_cast<size_t>(N)), b = down(mx[1], static_cast<size_t>(N));
    for (int64_t t = 0; t < N; ++t) {
      double m = -1e300;
      for (int64_t j = 0; j < V; ++j) m = std::max(m, double(logits[t * V + j]));
      EXPECT_EQ(std::max(a[t], b[t]), float(m)) << "ce_row_max row " << t << ", " << seed();
      gmax[t] = std::max(a[t], b[t]);  // the all-reduce max
    }
  }
  DeviceBuffer dmax = up(gmax);
  VD stsum(static_cast<size_t>(2 * N), 0.0);
  for (int s = 0; s < 2; ++s) {
    st[s] = poisoned_d(static_cast<size_t>(2 * N));
    ops_->ce_sum_exp_target(*q_, D(st[s]), F(L[s]), F(dmax), I(tg), v0s[s], Vss[s], N);
    const VD p = down<double>(st[s], static_cast<size_t>(2 * N));
    for (int64_t i = 0; i < 2 * N; ++i) stsum[i] += p[i];
  }
  DeviceBuffer dst = up(stsum), losses = poisoned(static_cast<size_t>(N)), total = poisoned_d(1);
  ops_->ce_loss(*q_, F(losses), D(total), D(dst), F(dmax), I(tg), N);
  VD ld = widen(logits);
  auto ref_losses = [&] {
    VD out(static_cast<size_t>(N), 0.0);
    for (int64_t t = 0; t < N; ++t) {
      if (targets[t] < 0) continue;
      double m = -1e300, z = 0;
      for (int64_t j = 0; j < V; ++j) m = std::max(m, ld[t * V + j]);
      for (int64_t j = 0; j < V; ++j) z += std::exp(ld[t * V + j] - m);
      out[t] = m + std::log(z) - ld[t * V + targets[t]];
    }
    return out;
  };
  const VD rl = ref_losses();
  const std::string name = "cross-entropy V" + std::to_string(V) + " split at " + std::to_string(cut) + ", " + seed();
  EXPECT_TRUE(close(name + " losses", down(losses, static_cast<size_t>(N)), rl, kFwdTol));
  double rtotal = 0;
  for (double x : rl) rtotal += x;
  EXPECT_NEAR(down<double>(total, 1)[0], rtotal, kFwdTol * std::max(1.0, rtotal)) << name;
  // gradient of grad_scale * Σ losses
  auto loss = [&] { double s = 0; for (double x : ref_losses()) s += x; return grad_scale * s; };
  const VD num = numeric_grad(ld, loss);
  VF grad(static_cast<size_t>(N * V));
  for (int s = 0; s < 2; ++s) {
    ops_->ce_grad(*q_, F(L[s]), F(dmax), D(dst), I(tg), v0s[s], Vss[s], N, grad_scale);
    const VF g = down(L[s], static_cast<size_t>(N * Vss[s]));
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < Vss[s]; ++j) grad[t * V + v0s[s] + j] = g[t * Vss[s] + j];
  }
  EXPECT_TRUE(close(name + " dlogits vs finite differences", grad, num, kBwdTol));
  if (ops_->cross_entropy_fused) {
    DeviceBuffer Lf = up(logits), lf = poisoned(static_cast<size_t>(N)), tf = poisoned_d(1);
    ops_->cross_entropy_fused(*q_, F(Lf), F(lf), D(tf), I(tg), N, V, grad_scale);
    EXPECT_TRUE(close(name + " fused losses", down(lf, static_cast<size_t>(N)), rl, kFwdTol));
    EXPECT_TRUE(close(name + " fused dlogits vs finite differences", down(Lf, logits.size()), num, kBwdTol));
    EXPECT_NEAR(down<double>(tf, 1)[0], rtotal, kFwdTol * std::max(1.0, rtotal)) << name;
  }
}

// ce_row_max_sum_exp_target (Capabilities::ce_row_stats_fused): bit for bit ce_row_max then
// ce_sum_exp_target, on a slice (the target inside, outside and masked) of a width that is no
// multiple of a vector width, and on one row wider than the fixed 16-lane sum's blocks.
TEST_P(Conformance, CeRowStatsFusedIsRowMaxThenSumExp) {
  if (!be_->capabilities().ce_row_stats_fused)
    GTEST_SKIP() << "[optional] " << be_->name() << " has no ce_row_max_sum_exp_target (Capabilities::ce_row_stats_fused)";
  ASSERT_TRUE(ops_->ce_row_max_sum_exp_target) << "capability declared, entry missing";
  for (int round = 0; round < 2; ++round) {
    const int64_t N = round ? 1 : randint(1, 9), V = round ? 50257 : randint(2, 300),
                  v0 = round ? 0 : randint(0, V - 1), Vs = round ? V : randint(1, V - v0);
    const VF logits = rand(static_cast<size_t>(N * Vs), -12, 12);
    VI targets(static_cast<size_t>(N));
    for (int32_t& t : targets) t = int32_t(randint(0, V - 1));
    if (N > 2) targets[2] = -1;
    DeviceBuffer L = up(logits), tg = up(targets), m1 = poisoned(static_cast<size_t>(N)),
                 m2 = poisoned(static_cast<size_t>(N)), s1 = poisoned_d(static_cast<size_t>(2 * N)),
                 s2 = poisoned_d(static_cast<size_t>(2 * N));
    ops_->ce_row_max(*q_, F(m1), F(L), N, Vs);
    ops_->ce_sum_exp_target(*q_, D(s1), F(L), F(m1), I(tg), v0, Vs, N);
    ops_->ce_row_max_sum_exp_target(*q_, F(m2), D(s2), F(L), I(tg), v0, Vs, N);
    const std::string name = "ce_row_max_sum_exp_target N" + std::to_string(N) + " slice [" +
                             std::to_string(v0) + ", " + std::to_string(v0 + Vs) + "), " + seed();
    EXPECT_EQ(down(m2, static_cast<size_t>(N)), down(m1, static_cast<size_t>(N))) << name;
    const VD a = down<double>(s1, static_cast<size_t>(2 * N)), b = down<double>(s2, static_cast<size_t>(2 * N));
    for (int64_t i = 0; i < 2 * N; ++i) ASSERT_EQ(b[i], a[i]) << name << ": stats[" << i << "]";
    // and Σ exp against double
    const VF mx = down(m1, static_cast<size_t>(N));
    for (int64_t t = 0; t < N; ++t) {
      double z = 0;
      for (int64_t j = 0; j < Vs; ++j) z += std::exp(double(logits[t * Vs + j]) - mx[t]);
      EXPECT_NEAR(b[2 * t], z, 1e-5 * z) << name << ": row " << t;
    }
  }
}

// ce_grad_bf16 (Capabilities::bf16_loss_grad): each element of both copies is bit for bit the
// rounded fp32 ce_grad output (masked rows 0, the target column included), on a vocabulary slice
// whose width is not a multiple of any vector width or tile, with more rows than one tile; and
// within bf16's rounding of the double finite-difference gradient.
TEST_P(Conformance, CeGradBf16IsTheRoundedFp32Gradient) {
  if (!be_->capabilities().bf16_loss_grad)
    GTEST_SKIP() << "[optional] " << be_->name() << " has no ce_grad_bf16 (Capabilities::bf16_loss_grad)";
  ASSERT_TRUE(ops_->ce_grad_bf16) << "capability declared, entry missing";
  const int64_t N = randint(1, 70), V = randint(2, 300), v0 = randint(0, V - 1), Vs = randint(1, V - v0);
  const float grad_scale = 0.61f;
  const VF logits = rand(static_cast<size_t>(N * Vs), -10, 10);
  VI targets(static_cast<size_t>(N));
  for (int32_t& t : targets) t = int32_t(randint(0, V - 1));  // inside and outside the slice
  for (int64_t t = 0; t < N; t += 3) targets[t] = -1;           // masked (loss mask, Goldfish)
  if (N > 1) targets[1] = int32_t(v0 + Vs - 1);                  // the slice's last column
  VF mx(static_cast<size_t>(N));
  VD st(static_cast<size_t>(2 * N));
  for (int64_t t = 0; t < N; ++t) {
    mx[t] = *std::max_element(logits.begin() + t * Vs, logits.begin() + (t + 1) * Vs) + 0.25f;
    double z = 0;
    for (int64_t j = 0; j < Vs; ++j) z += std::exp(double(logits[t * Vs + j]) - mx[t]);
    st[2 * t] = z * 1.5;  // as if other slices held a third of the mass
    st[2 * t + 1] = 0;
  }
  const size_t n = logits.size();
  const uint16_t kPoison16 = 0x7fc1;
  DeviceBuffer L32 = up(logits), L16 = up(logits), dm = up(mx), ds = up(st), tg = up(targets),
               o = up(std::vector<uint16_t>(n, kPoison16)), ot = up(std::vector<uint16_t>(n, kPoison16)),
               o_only = up(std::vector<uint16_t>(n, kPoison16)), ot_only = up(std::vector<uint16_t>(n, kPoison16));
  ops_->ce_grad(*q_, F(L32), F(dm), D(ds), I(tg), v0, Vs, N, grad_scale);
  ops_->ce_grad_bf16(*q_, o.as<uint16_t>(), ot.as<uint16_t>(), F(L16), F(dm), D(ds), I(tg), v0, Vs, N, grad_scale);
  ops_->ce_grad_bf16(*q_, o_only.as<uint16_t>(), nullptr, F(L16), F(dm), D(ds), I(tg), v0, Vs, N, grad_scale);
  ops_->ce_grad_bf16(*q_, nullptr, ot_only.as<uint16_t>(), F(L16), F(dm), D(ds), I(tg), v0, Vs, N, grad_scale);
  const VF g32 = down(L32, n);
  const std::vector<uint16_t> g16 = down<uint16_t>(o, n), g16t = down<uint16_t>(ot, n),
                              g16o = down<uint16_t>(o_only, n), g16to = down<uint16_t>(ot_only, n);
  EXPECT_EQ(down(L16, n), logits) << "ce_grad_bf16 must only read the logits, " << seed();
  const std::string name = "ce_grad_bf16 N" + std::to_string(N) + " slice [" + std::to_string(v0) + ", " +
                           std::to_string(v0 + Vs) + "), " + seed();
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < Vs; ++j) {
      const size_t i = size_t(t * Vs + j), it = size_t(j * N + t);
      const uint32_t u = uint32_t(g16[i]) << 16;
      float got;
      std::memcpy(&got, &u, 4);
      ASSERT_FALSE(std::isnan(got)) << name << ": row " << t << " column " << j << " unwritten or NaN";
      ASSERT_EQ(got, ref_bf16(g32[i])) << name << ": row " << t << " column " << j << " (target " << targets[t] << ")";
      ASSERT_EQ(g16t[it], g16[i]) << name << ": transposed copy, row " << t << " column " << j;
      ASSERT_EQ(g16o[i], g16[i]) << name << ": stored copy alone, row " << t << " column " << j;
      ASSERT_EQ(g16to[it], g16[i]) << name << ": transposed copy alone, row " << t << " column " << j;
      // against the double value of the same formula
      const int32_t tgt = targets[t];
      double want = 0;
      if (tgt >= 0) {
        want = grad_scale * std::exp(double(logits[i]) - mx[t]) / st[2 * t];
        if (tgt - v0 == j) want -= grad_scale;
      }
      ASSERT_NEAR(got, want, 1e-2 * std::fabs(want) + 1e-7) << name << ": row " << t << " column " << j;
    }
}

TEST_P(Conformance, RowArgmaxLowestIndexOnTies) {
  const int64_t N = randint(1, 6), Vs = randint(2, 100), ld = Vs + randint(0, 5);
  VF L = rand(static_cast<size_t>(N * ld));
  const int64_t tie = randint(0, Vs - 2);
  L[tie] = L[tie + 1] = 5.0f;  // row 0: two equal maxima
  DeviceBuffer dl = up(L), idx = up(VI(static_cast<size_t>(N), -7)), val = poisoned(static_cast<size_t>(N));
  ops_->row_argmax(*q_, I(idx), F(val), F(dl), N, Vs, ld);
  const VI gi = down<int32_t>(idx, static_cast<size_t>(N));
  const VF gv = down(val, static_cast<size_t>(N));
  for (int64_t r = 0; r < N; ++r) {
    int64_t best = 0;
    for (int64_t j = 1; j < Vs; ++j) if (L[r * ld + j] > L[r * ld + best]) best = j;
    EXPECT_EQ(gi[r], best) << "row " << r << ", " << seed();
    EXPECT_EQ(gv[r], L[r * ld + best]) << "row " << r << ", " << seed();
  }
}

// NaN is the largest value: a row holding NaN gives its first NaN (index and NaN), wherever it
// sits, so greedy decoding sees a broken row; rows of -inf give column 0. (CUDA once skipped
// NaN; the CPU's std::max_element kept a NaN only in column 0.)
TEST_P(Conformance, RowArgmaxNaNIsTheLargest) {
  const int64_t Vs = randint(40, 300), ld = Vs + randint(0, 3), N = 6;
  VF L = rand(static_cast<size_t>(N * ld));
  const int64_t a = randint(1, Vs / 2), b = randint(Vs / 2 + 1, Vs - 1);
  L[0 * ld + 0] = kNaN;                               // row 0: NaN in column 0
  L[1 * ld + a] = kNaN;                               // row 1: NaN in the middle, larger after it
  L[1 * ld + b] = 100.0f;
  L[2 * ld + a] = 7.0f, L[2 * ld + b] = kNaN;          // row 2: NaN after the maximum
  L[3 * ld + b] = kNaN, L[3 * ld + a] = kNaN;          // row 3: two NaNs, the first wins
  for (int64_t j = 0; j < Vs; ++j) L[4 * ld + j] = -std::numeric_limits<float>::infinity();
  const int64_t want_idx[] = {0, a, b, a, 0, -1};      // row 5: no NaN, the plain maximum
  DeviceBuffer dl = up(L), idx = up(VI(static_cast<size_t>(N), -7)), val = poisoned(static_cast<size_t>(N));
  ops_->row_argmax(*q_, I(idx), F(val), F(dl), N, Vs, ld);
  const VI gi = down<int32_t>(idx, static_cast<size_t>(N));
  const VF gv = down(val, static_cast<size_t>(N));
  for (int64_t r = 0; r < N; ++r) {
    int64_t want = want_idx[r];
    if (want < 0) {
      want = 0;
      for (int64_t j = 1; j < Vs; ++j) if (L[r * ld + j] > L[r * ld + want]) want = j;
    }
    EXPECT_EQ(gi[r], want) << "row " << r << " (Vs " << Vs << "), " << seed();
    const float w = L[r * ld + want];
    EXPECT_TRUE(std::isnan(w) ? std::isnan(gv[r]) : gv[r] == w) << "row " << r << ": " << gv[r] << ", " << seed();
  }
}

// The fused cross-entropy refuses a target outside the vocabulary with an Error naming the first
// one, before it writes anything (CUDA once returned a wrong loss).
TEST_P(Conformance, CrossEntropyFusedRefusesATargetOutsideTheVocabulary) {
  if (!ops_->cross_entropy_fused)
    GTEST_SKIP() << "[optional] " << be_->name() << " has no cross_entropy_fused (Capabilities::fused_cross_entropy)";
  const int64_t N = randint(8, 40), V = randint(10, 200);
  const VF logits = rand(static_cast<size_t>(N * V));
  VI tg(static_cast<size_t>(N));
  for (auto& t : tg) t = int32_t(randint(-1, V - 1));
  const int64_t first = randint(1, N - 3);
  tg[size_t(first)] = int32_t(V + 3);
  tg[size_t(first + 2)] = int32_t(V);
  DeviceBuffer L = up(logits), losses = poisoned(static_cast<size_t>(N)), total = poisoned_d(1), dt = up(tg);
  try {
    ops_->cross_entropy_fused(*q_, F(L), F(losses), D(total), I(dt), N, V, 1.0f);
    q_->synchronize();
    ADD_FAILURE() << "target " << V + 3 << " of a vocabulary of " << V << " was accepted, " << seed();
  } catch (const Error& e) {
    const std::string want = "target token id " + std::to_string(V + 3) + " at position " +
                             std::to_string(first) + " is outside the model's vocabulary [0, " +
                             std::to_string(V) + ")";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what() << "\nexpected: " << want;
  }
  EXPECT_EQ(down(L, logits.size()), logits) << "logits written before the refusal, " << seed();
}

// ---- casts ------------------------------------------------------------------------------------

TEST_P(Conformance, CastsRoundToNearestEven) {
  VF x = rand(5000, -100, 100);
  const float specials[] = {0.0f, -0.0f, 1.0f, 1.00390625f /* tie, even down */,
                            1.01171875f /* tie, even up */, 3.4e38f, -3.4e38f, kNaN,
                            std::numeric_limits<float>::infinity(), 1e-40f};
  for (size_t i = 0; i < std::size(specials); ++i) x[i] = specials[i];
  const int64_t n = int64_t(x.size());
  DeviceBuffer dx = up(x), h = up(std::vector<uint16_t>(x.size(), 0x7fc1)), back = poisoned(x.size()), r = up(x);
  ops_->cast_f32_to_bf16(*q_, h.as<uint16_t>(), F(dx), n);
  ops_->cast_bf16_to_f32(*q_, F(back), h.as<uint16_t>(), n);
  ops_->round_to_bf16(*q_, F(r), n);
  const VF gb = down(back, x.size()), gr = down(r, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = ref_bf16(x[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(gb[i]) && std::isnan(gr[i])) << "NaN must stay NaN";
      continue;
    }
    ASSERT_EQ(gb[i], want) << "cast of " << x[i] << " (element " << i << "), " << seed();
    ASSERT_EQ(gr[i], want) << "round_to_bf16 of " << x[i] << " (element " << i << "), " << seed();
  }
}

// ---- bf16 producers (Capabilities::bf16_producers) ----------------------------------------------

// The bf16 stash's fused MLP activation ops (Capabilities::bf16_stash_fused; issue 28): the
// forward writes its bf16 output (bit for bit the bf16 producer's) and its input's bf16 copy (bit
// for bit the input rounded) in one pass, every element written over a poisoned buffer; the
// backward reads x from that copy and gives the bits of the fp32 backward on the copy widened,
// and the finite difference of the double activation at the copy's values within the backward
// tolerance (on more than one element). Sizes across the CPU kernels' 16384-element chunks and
// odd row widths.
TEST_P(Conformance, Bf16StashFusedActivationsAreTheUnfusedSequence) {
  if (!be_->capabilities().bf16_stash_fused)
    GTEST_SKIP() << "[optional] " << be_->name() << " has no fused bf16 stash ops (Capabilities::bf16_stash_fused)";
  ASSERT_TRUE(ops_->gelu_forward_bf16_x && ops_->swiglu_forward_bf16_x && ops_->gelu_backward_x16 &&
              ops_->swiglu_backward_x16 && ops_->gelu_forward_bf16 && ops_->swiglu_forward_bf16)
      << "capability declared, entries missing";
  const uint16_t kPoison16 = 0x7fc1;  // a quiet NaN in bf16
  auto widen16 = [](const std::vector<uint16_t>& h) {
    VF d(h.size());
    for (size_t i = 0; i < h.size(); ++i) {
      const uint32_t u = uint32_t(h[i]) << 16;
      std::memcpy(&d[i], &u, 4);
    }
    return d;
  };
  auto expect_rounded = [&](const std::string& what, const std::vector<uint16_t>& got, const VF& x) {
    for (size_t i = 0; i < x.size(); ++i) {
      const uint32_t u = uint32_t(got[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      ASSERT_EQ(f, ref_bf16(x[i])) << what << ": element " << i << " is not the rounded input, " << seed();
    }
  };
  for (const int64_t n : {int64_t(1), randint(1000, 5000), int64_t(16384 + 7)}) {
    const VF x = rand(static_cast<size_t>(n), -5, 5), dout = rand(static_cast<size_t>(n));
    const std::string at = " (n " + std::to_string(n) + "), " + seed();
    DeviceBuffer dx = up(x), dd = up(dout), o16 = up(std::vector<uint16_t>(x.size(), kPoison16)),
                 x16 = up(std::vector<uint16_t>(x.size(), kPoison16)),
                 want16 = up(std::vector<uint16_t>(x.size(), kPoison16));
    ops_->gelu_forward_bf16_x(*q_, o16.as<uint16_t>(), x16.as<uint16_t>(), F(dx), n);
    ops_->gelu_forward_bf16(*q_, want16.as<uint16_t>(), F(dx), n);
    const std::vector<uint16_t> got_x16 = down<uint16_t>(x16, x.size());
    EXPECT_EQ(down<uint16_t>(o16, x.size()), down<uint16_t>(want16, x.size())) << "gelu_forward_bf16_x output" << at;
    expect_rounded("gelu_forward_bf16_x input copy" + at, got_x16, x);
    const VF xw = widen16(got_x16);
    DeviceBuffer dxw = up(xw), g = poisoned(x.size()), want = poisoned(x.size());
    ops_->gelu_backward_x16(*q_, F(g), F(dd), x16.as<uint16_t>(), n);
    ops_->gelu_backward(*q_, F(want), F(dd), F(dxw), n);
    const VF got = down(g, x.size());
    EXPECT_EQ(0, std::memcmp(got.data(), down(want, x.size()).data(), x.size() * 4))
        << "gelu_backward_x16 is not gelu_backward on the widened copy" << at;
    VD num(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double h = 1e-6, xi = xw[i];
      num[i] = dout[i] * (gelu(xi + h) - gelu(xi - h)) / (2 * h);
    }
    // (Normwise against the largest element: not on one element, where a value in GELU's flat
    // tail is its own scale; the bits above hold there too.)
    if (n > 1) EXPECT_TRUE(close("gelu_backward_x16 vs finite differences" + at, got, num, kBwdTol));
  }
  for (const auto& [N, Fw] : {std::pair<int64_t, int64_t>{1, 1}, {3, 37}, {randint(1, 9), randint(100, 700)}}) {
    const VF gu = rand(static_cast<size_t>(N * 2 * Fw), -4, 4), dout = rand(static_cast<size_t>(N * Fw));
    const std::string at = " (" + std::to_string(N) + " x " + std::to_string(Fw) + "), " + seed();
    DeviceBuffer dgu = up(gu), dd = up(dout),
                 o16 = up(std::vector<uint16_t>(size_t(N * Fw), kPoison16)),
                 gu16 = up(std::vector<uint16_t>(gu.size(), kPoison16)),
                 want16 = up(std::vector<uint16_t>(size_t(N * Fw), kPoison16));
    ops_->swiglu_forward_bf16_x(*q_, o16.as<uint16_t>(), gu16.as<uint16_t>(), F(dgu), N, Fw);
    ops_->swiglu_forward_bf16(*q_, want16.as<uint16_t>(), F(dgu), N, Fw);
    const std::vector<uint16_t> got_gu16 = down<uint16_t>(gu16, gu.size());
    EXPECT_EQ(down<uint16_t>(o16, size_t(N * Fw)), down<uint16_t>(want16, size_t(N * Fw)))
        << "swiglu_forward_bf16_x output" << at;
    expect_rounded("swiglu_forward_bf16_x input copy" + at, got_gu16, gu);
    const VF guw = widen16(got_gu16);
    DeviceBuffer dguw = up(guw), g = poisoned(gu.size()), want = poisoned(gu.size());
    ops_->swiglu_backward_x16(*q_, F(g), F(dd), gu16.as<uint16_t>(), N, Fw);
    ops_->swiglu_backward(*q_, F(want), F(dd), F(dguw), N, Fw);
    const VF got = down(g, gu.size());
    EXPECT_EQ(0, std::memcmp(got.data(), down(want, gu.size()).data(), gu.size() * 4))
        << "swiglu_backward_x16 is not swiglu_backward on the widened copy" << at;
    VD gud(guw.begin(), guw.end());
    auto loss = [&] {
      double L = 0;
      for (int64_t t = 0; t < N; ++t)
        for (int64_t j = 0; j < Fw; ++j)
          L += dout[t * Fw + j] * silu(gud[t * 2 * Fw + j]) * gud[t * 2 * Fw + Fw + j];
      return L;
    };
    if (N * Fw > 1)
      EXPECT_TRUE(close("swiglu_backward_x16 vs finite differences" + at, got, numeric_grad(gud, loss), kBwdTol));
  }
}

// The bf16 forms write round(fp32 op) bit for bit, which is within bf16's half-ulp (relative
// 2^-9 = 2e-3) of the double reference; every element written (outputs poisoned with a bf16
// NaN pattern first).
TEST_P(Conformance, Bf16ProducersAreTheRoundedFp32Outputs) {
  if (!be_->capabilities().bf16_producers)
    GTEST_SKIP() << "[optional] " << be_->name() << " has no bf16 producers (Capabilities::bf16_producers)";
  ASSERT_TRUE(ops_->norm_apply_bf16 && ops_->gelu_forward_bf16 && ops_->swiglu_forward_bf16 &&
              ops_->cast_transpose_f32_to_bf16) << "capability declared, entries missing";
  auto widen16 = [](const std::vector<uint16_t>& h) {
    VD d(h.size());
    for (size_t i = 0; i < h.size(); ++i) {
      const uint32_t u = uint32_t(h[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      d[i] = f;
    }
    return d;
  };
  // Each bf16 output against the rounded fp32 output (exact) and the double reference (bf16
  // tolerance: relative 1e-2 at most, never NaN).
  auto check = [&](const std::string& what, const std::vector<uint16_t>& got16, const VF& fp32,
                   const VD& ref) {
    const VD got = widen16(got16);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << what << ": element " << i << " unwritten or NaN, " << seed();
      ASSERT_EQ(float(got[i]), ref_bf16(fp32[i])) << what << ": element " << i << " is not the rounded fp32 output, " << seed();
    }
    VF gotf(got.begin(), got.end());
    EXPECT_TRUE(close(what + " vs double, " + seed(), gotf, ref, 1e-2));
  };
  const uint16_t kPoison16 = 0x7fc1;  // a quiet NaN in bf16
  for (int layer = 0; layer < 2; ++layer) {  // LayerNorm (mean, bias) and RMSNorm
    const int64_t N = randint(1, 9), C = randint(1, 300);
    const VF x = rand(static_cast<size_t>(N * C), -3, 3), w = rand(static_cast<size_t>(C)),
             b = rand(static_cast<size_t>(C));
    VF mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    for (int64_t t = 0; t < N; ++t) {
      double m = 0, v = 0;
      for (int64_t c = 0; c < C; ++c) m += x[t * C + c];
      m /= double(C);
      for (int64_t c = 0; c < C; ++c) v += (layer ? (x[t * C + c] - m) * (x[t * C + c] - m) : double(x[t * C + c]) * x[t * C + c]);
      mean[t] = float(m);
      rstd[t] = float(1 / std::sqrt(v / double(C) + 1e-5));
    }
    DeviceBuffer dx = up(x), dw = up(w), db = up(b), dm = up(mean), dr = up(rstd),
                 o32 = poisoned(x.size()), o16 = up(std::vector<uint16_t>(x.size(), kPoison16));
    const float* m = layer ? F(dm) : nullptr;
    const float* bb = layer ? F(db) : nullptr;
    ops_->norm_apply(*q_, F(o32), F(dx), m, F(dr), F(dw), bb, N, C);
    ops_->norm_apply_bf16(*q_, o16.as<uint16_t>(), F(dx), m, F(dr), F(dw), bb, N, C);
    VD ref(x.size());
    for (int64_t t = 0; t < N; ++t)
      for (int64_t c = 0; c < C; ++c)
        ref[t * C + c] = (double(x[t * C + c]) - (layer ? double(mean[t]) : 0.0)) * double(rstd[t]) * w[c] +
                         (layer ? double(b[c]) : 0.0);
    check(layer ? "norm_apply_bf16 (LayerNorm)" : "norm_apply_bf16 (RMSNorm)",
          down<uint16_t>(o16, x.size()), down(o32, x.size()), ref);
  }
  {
    const int64_t n = randint(1, 5000);
    const VF x = rand(static_cast<size_t>(n), -5, 5);
    DeviceBuffer dx = up(x), o32 = poisoned(x.size()), o16 = up(std::vector<uint16_t>(x.size(), kPoison16));
    ops_->gelu_forward(*q_, F(o32), F(dx), n);
    ops_->gelu_forward_bf16(*q_, o16.as<uint16_t>(), F(dx), n);
    VD ref(x.size());
    for (int64_t i = 0; i < n; ++i) ref[i] = gelu(x[i]);
    // GELU crosses zero near x = 0 and -0.75 (where the relative error of any rounding grows):
    // the reference check is on the rounded fp32 (exact) and close() (absolute floor) for the rest.
    check("gelu_forward_bf16", down<uint16_t>(o16, x.size()), down(o32, x.size()), ref);
  }
  {
    const int64_t N = randint(1, 6), Fw = randint(1, 300);
    const VF gu = rand(static_cast<size_t>(N * 2 * Fw), -4, 4);
    DeviceBuffer dgu = up(gu), o32 = poisoned(static_cast<size_t>(N * Fw)),
                 o16 = up(std::vector<uint16_t>(size_t(N * Fw), kPoison16));
    ops_->swiglu_forward(*q_, F(o32), F(dgu), N, Fw);
    ops_->swiglu_forward_bf16(*q_, o16.as<uint16_t>(), F(dgu), N, Fw);
    VD ref(static_cast<size_t>(N * Fw));
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < Fw; ++j) ref[t * Fw + j] = silu(gu[t * 2 * Fw + j]) * double(gu[t * 2 * Fw + Fw + j]);
    check("swiglu_forward_bf16", down<uint16_t>(o16, ref.size()), down(o32, ref.size()), ref);
  }
  // The cast-transpose: both outputs, each alone, shapes across the 64-wide tiles with tails.
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 130}, {129, 65},
                                   {randint(1, 200), randint(1, 200)}}) {
    VF x = rand(static_cast<size_t>(rows * cols), -100, 100);
    x[0] = kNaN;
    DeviceBuffer dx = up(x);
    for (int which = 0; which < 3; ++which) {  // 0: both, 1: plain only, 2: transposed only
      DeviceBuffer o = up(std::vector<uint16_t>(x.size(), kPoison16)),
                   t = up(std::vector<uint16_t>(x.size(), kPoison16));
      ops_->cast_transpose_f32_to_bf16(*q_, which == 2 ? nullptr : o.as<uint16_t>(),
                                       which == 1 ? nullptr : t.as<uint16_t>(), F(dx), rows, cols);
      const VD go = widen16(down<uint16_t>(o, x.size())), gt = widen16(down<uint16_t>(t, x.size()));
      const std::string what = "cast_transpose " + std::to_string(rows) + "x" + std::to_string(cols) +
                               " form " + std::to_string(which) + ", " + seed();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const float want = ref_bf16(x[r * cols + c]);
          const double po = go[r * cols + c], pt = gt[c * rows + r];
          if (which != 2) {
            if (std::isnan(want)) ASSERT_TRUE(std::isnan(po)) << what;
            else ASSERT_EQ(float(po), want) << what << " plain (" << r << ", " << c << ")";
          } else {
            ASSERT_TRUE(std::isnan(po)) << what << ": the null plain output was written";
          }
          if (which != 1) {
            if (std::isnan(want)) ASSERT_TRUE(std::isnan(pt)) << what;
            else ASSERT_EQ(float(pt), want) << what << " transposed (" << c << ", " << r << ")";
          } else {
            ASSERT_TRUE(std::isnan(pt)) << what << ": the null transposed output was written";
          }
        }
    }
  }
}

// The weight-gradient form the model runs with bf16 activations: dW += (dYᵀ stored)·X as an NN
// product on the cast-transposed gradient equals the TN product dYᵀ·X on the plain bf16 copy
// (the same products, summed in another order: fp32 rounding apart) and the double reference.
TEST_P(Conformance, WeightGradientNnOnTheTransposedCastMatchesTn) {
  if (!be_->capabilities().bf16_producers || !be_->capabilities().gemm_bf16_storage)
    GTEST_SKIP() << "[optional] " << be_->name() << " has no cast-transpose or no bf16-stored GEMM operands";
  for (int rep = 0; rep < 3; ++rep) {
    const int64_t N = randint(1, 300), n_out = randint(1, 200), k_in = randint(1, 150);
    const VF dy = rand(static_cast<size_t>(N * n_out)), x = rand(static_cast<size_t>(N * k_in));
    VF x16 = x;
    for (float& v : x16) v = ref_bf16(v);
    const VF dw0 = rand(static_cast<size_t>(n_out * k_in));
    DeviceBuffer ddy = up(dy), dx = up(x16), p = up(std::vector<uint16_t>(dy.size(), 0x7fc1)),
                 t = up(std::vector<uint16_t>(dy.size(), 0x7fc1)), w_tn = up(dw0), w_nn = up(dw0);
    ops_->cast_transpose_f32_to_bf16(*q_, p.as<uint16_t>(), t.as<uint16_t>(), F(ddy), N, n_out);
    GemmArgs g;
    g.M = n_out; g.N = k_in; g.K = N; g.B = dx.data(); g.ldb = k_in; g.beta = 1.0f; g.ldc = k_in;
    g.precision = Precision::BF16; g.a_type = DType::BF16;
    g.trans_a = true; g.A = p.data(); g.lda = n_out; g.C = F(w_tn);
    ops_->gemm(*q_, g);
    g.trans_a = false; g.A = t.data(); g.lda = N; g.C = F(w_nn);
    ops_->gemm(*q_, g);
    VF dy16 = dy;
    for (float& v : dy16) v = ref_bf16(v);
    const VD ref = ref_gemm(true, false, n_out, k_in, N, 1, widen(dy16), n_out, widen(x16), k_in, 1,
                            widen(dw0), k_in);
    const std::string what = "dW " + std::to_string(n_out) + "x" + std::to_string(k_in) + "x" +
                             std::to_string(N) + ", " + seed();
    const VF tn = down(w_tn, dw0.size()), nn = down(w_nn, dw0.size());
    EXPECT_TRUE(close("TN " + what, tn, ref, kFwdTol));
    EXPECT_TRUE(close("NN on the transposed cast " + what, nn, ref, kFwdTol));
    EXPECT_TRUE(close("NN against TN " + what, nn, widen(tn), kFwdTol));
  }
}

// ---- optimizer ----------------------------------------------------------------------------------

TEST_P(Conformance, AdamWOverAnInterval) {
  const int64_t total = randint(10, 5000), lo = randint(0, total / 2), hi = randint(lo + 1, total);
  const VF p = rand(static_cast<size_t>(total)), g = rand(static_cast<size_t>(total)), m = rand(static_cast<size_t>(total), -0.1f, 0.1f),
           v = rand(static_cast<size_t>(total), 0.0f, 0.01f);
  AdamWArgs a;
  a.lr = 3e-3f; a.beta1 = 0.9f; a.beta2 = 0.95f; a.eps = 1e-8f; a.weight_decay = 0.1f;
  a.grad_scale = 0.5f; a.step = randint(1, 50);
  DeviceBuffer dp = up(p), dg = up(g), dm = up(m), dv = up(v);
  a.p = F(dp) + lo; a.g = F(dg) + lo; a.m = F(dm) + lo; a.v = F(dv) + lo; a.n = hi - lo;
  ops_->adamw(*q_, a);
  VD rp = widen(p), rm = widen(m), rv = widen(v);
  const double bc1 = 1 - std::pow(double(a.beta1), double(a.step)), bc2 = 1 - std::pow(double(a.beta2), double(a.step));
  for (int64_t i = lo; i < hi; ++i) {
    const double gi = double(g[i]) * a.grad_scale;
    rm[i] = a.beta1 * double(m[i]) + (1 - double(a.beta1)) * gi;
    rv[i] = a.beta2 * double(v[i]) + (1 - double(a.beta2)) * gi * gi;
    rp[i] = p[i] - double(a.lr) * ((rm[i] / bc1) / (std::sqrt(rv[i] / bc2) + a.eps) + a.weight_decay * double(p[i]));
  }
  const std::string name = "adamw on [" + std::to_string(lo) + ", " + std::to_string(hi) + ") of " +
                           std::to_string(total) + " step " + std::to_string(a.step) + ", " + seed();
  // The update is lr-sized: compare the change, not the weights, so the tolerance means something.
  VF dpg = down(dp, p.size());
  VF got_delta(p.size());
  VD ref_delta(p.size());
  for (size_t i = 0; i < p.size(); ++i) got_delta[i] = dpg[i] - p[i], ref_delta[i] = rp[i] - p[i];
  EXPECT_TRUE(close(name + " parameter change", got_delta, ref_delta, 1e-4));
  EXPECT_TRUE(close(name + " m", down(dm, m.size()), rm, kFwdTol));
  EXPECT_TRUE(close(name + " v", down(dv, v.size()), rv, kFwdTol));
  for (int64_t i = 0; i < total; ++i)
    if (i < lo || i >= hi) {
      ASSERT_EQ(dpg[i], p[i]) << "adamw wrote outside its interval at " << i;
    }
}

// The bias corrections as the CPU computes them (backend/adamw_bias.hpp: the power in double,
// the rest in float; 19.999995f at step 1 for beta2 0.95, not 20.0f). With m = v = p = 0,
// g = 1, lr = 1, eps = 0 and no decay every other step of the update is exact or one rounding
// that any IEEE backend makes alike, so the new p is bit for bit -(0.1f bc1) / sqrt(0.05f bc2).
TEST_P(Conformance, AdamWBiasCorrectionsAsTheCpu) {
  for (int64_t step : {int64_t(1), int64_t(2), int64_t(7), int64_t(100), int64_t(1000)})
    for (float beta2 : {0.95f, 0.999f}) {
      const int64_t n = 4;
      DeviceBuffer dp = up(VF(n, 0.0f)), dg = up(VF(n, 1.0f)), dm = up(VF(n, 0.0f)), dv = up(VF(n, 0.0f));
      AdamWArgs a;
      a.p = F(dp); a.g = F(dg); a.m = F(dm); a.v = F(dv); a.n = n;
      a.lr = 1.0f; a.beta1 = 0.9f; a.beta2 = beta2; a.eps = 0.0f; a.weight_decay = 0.0f;
      a.grad_scale = 1.0f; a.step = step;
      ops_->adamw(*q_, a);
      const float bc1 = adamw_bias_correction(a.beta1, step), bc2 = adamw_bias_correction(beta2, step);
      const float mi = (1.0f - a.beta1) * 1.0f, vi = (1.0f - beta2) * 1.0f;
      const float want = -((mi * bc1) / std::sqrt(vi * bc2));
      const VF got = down(dp, size_t(n));
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[size_t(i)], want) << "step " << step << " beta2 " << beta2 << ": the bias "
                                        << "corrections differ from the CPU's (" << bc1 << ", " << bc2 << ")";
    }
}

// The fused bf16 weight copy (AdamWArgs::p16): the fp32 update is unchanged bit for bit and p16
// holds the updated parameters rounded to nearest even.
TEST_P(Conformance, AdamWWritesTheBf16Copy) {
  if (!be_->capabilities().adamw_bf16_copy)
    GTEST_SKIP() << "[optional] " << be_->name() << " has no fused bf16 copy in adamw (Capabilities::adamw_bf16_copy)";
  const int64_t n = randint(10, 5000);
  const VF p = rand(static_cast<size_t>(n)), g = rand(static_cast<size_t>(n)),
           m = rand(static_cast<size_t>(n), -0.1f, 0.1f), v = rand(static_cast<size_t>(n), 0.0f, 0.01f);
  AdamWArgs a;
  a.lr = 3e-3f; a.weight_decay = 0.1f; a.grad_scale = 0.5f; a.step = randint(1, 50); a.n = n;
  DeviceBuffer p1 = up(p), g1 = up(g), m1 = up(m), v1 = up(v);
  DeviceBuffer p2 = up(p), m2 = up(m), v2 = up(v), h = up(std::vector<uint16_t>(size_t(n), 0x7fc1));
  a.p = F(p1); a.g = F(g1); a.m = F(m1); a.v = F(v1);
  ops_->adamw(*q_, a);
  a.p = F(p2); a.m = F(m2); a.v = F(v2); a.p16 = h.as<uint16_t>();
  ops_->adamw(*q_, a);
  const VF w1 = down(p1, size_t(n)), w2 = down(p2, size_t(n));
  DeviceBuffer back = poisoned(size_t(n));
  ops_->cast_bf16_to_f32(*q_, F(back), h.as<uint16_t>(), n);
  const VF b = down(back, size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(w1[i], w2[i]) << "the bf16 copy changed the fp32 update at " << i << ", " << seed();
    ASSERT_EQ(b[i], ref_bf16(w2[i])) << "bf16 copy of " << w2[i] << " at " << i << ", " << seed();
  }
}

// ---- memory, queue, registry ----------------------------------------------------------------

TEST_P(Conformance, MemoryQueueAndEvents) {
  DeviceBuffer a = be_->alloc(1000), s = be_->alloc(1000, MemoryKind::HostStaging);
  EXPECT_EQ(a.bytes(), 1000u);
  EXPECT_EQ(a.owner(), be_.get());
  EXPECT_EQ(s.kind(), MemoryKind::HostStaging);
  VF h = rand(250), back(250);
  q_->copy_to_device(a.data(), h.data(), 1000);
  DeviceBuffer b = be_->alloc(1000);
  q_->copy_on_device(b.data(), a.data(), 1000);
  Event e = q_->record();
  q_->copy_to_host(back.data(), b.data(), 1000);
  e.synchronize();
  q_->synchronize();
  EXPECT_TRUE(e.query());
  EXPECT_EQ(std::memcmp(h.data(), back.data(), 1000), 0);
  q_->fill_zero(b.data(), 1000);
  EXPECT_EQ(down(b, 250), VF(250, 0.0f));
  DeviceBuffer moved = std::move(b);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(moved.bytes(), 1000u);
  std::unique_ptr<Queue> other = be_->new_queue();
  other->wait(q_->record());
  other->synchronize();
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const BackendInfo& b : backends()) names.push_back(b.name);
  return names;
}

// gtest names take letters, digits and '_' only ("cpu-strict" -> "cpu_strict").
INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

// cpu-strict (backend/cpu/strict_backend.hpp) stands in for a GPU's memory: what it promises is
// what makes the model's device tests mean something.
TEST(StrictBackend, DeviceMemoryIsNotHostMemory) {
  std::unique_ptr<Backend> be = create("cpu-strict");
  EXPECT_FALSE(be->capabilities().host_visible);
  DeviceBuffer d = be->alloc_array<float>(100);
  DeviceBuffer s = be->alloc_array<float>(100, MemoryKind::HostStaging);
  std::vector<float> h(100, 1.5f);
  EXPECT_FALSE(be->host_readable(d.data()));
  EXPECT_FALSE(be->host_readable(d.as<float>() + 99));
  EXPECT_TRUE(be->host_readable(s.data()));
  EXPECT_TRUE(be->host_readable(h.data()));
  // A host load through a device pointer faults, as on a GPU.
  float* dev = d.as<float>();
  EXPECT_DEATH({ volatile float x = dev[3]; (void)x; }, "");
  EXPECT_DEATH({ dev[3] = 1.0f; }, "");
  // Host pointers given to an op, or as the device side of a copy, are refused by name.
  Queue& q = be->queue();
  auto msg = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(msg([&] { be->ops().add(q, h.data(), dev, 100); }).find("add argument x"),
            std::string::npos);
  EXPECT_NE(msg([&] { be->ops().add(q, dev, s.as<float>(), 100); }).find("add argument y"),
            std::string::npos);
  EXPECT_NE(msg([&] { q.copy_to_device(h.data(), h.data(), 400); }).find("copy_to_device"),
            std::string::npos);
  EXPECT_NE(msg([&] { q.copy_to_host(h.data(), h.data(), 400); }).find("copy_to_host"),
            std::string::npos);
  EXPECT_NE(msg([&] { q.copy_to_device(dev, dev, 400); }).find("expected host memory"),
            std::string::npos);
  // The same op on device memory works and round-trips exactly.
  q.copy_to_device(dev, h.data(), 400);
  DeviceBuffer d2 = be->alloc_array<float>(100);
  q.copy_on_device(d2.data(), dev, 400);
  be->ops().add(q, dev, d2.as<float>(), 100);
  std::vector<float> back(100);
  q.copy_to_host(back.data(), dev, 400);
  q.synchronize();
  EXPECT_EQ(back, std::vector<float>(100, 3.0f));
  // Freed memory is no longer device memory.
  void* gone = d2.data();
  d2 = DeviceBuffer();
  EXPECT_NE(msg([&] { q.fill_zero(gone, 4); }).find("not device memory"), std::string::npos);
}

TEST(BackendRegistry, CpuIsAlwaysThereAndUnknownNamesAreRefused) {
  EXPECT_EQ(cpu_backend().name(), "cpu");
  EXPECT_TRUE(cpu_backend().capabilities().host_visible);
  EXPECT_NO_THROW(check_op_table(cpu_backend().ops(), "cpu"));
  EXPECT_THROW(create("tpu"), Error);
  OpTable empty;
  EXPECT_THROW(check_op_table(empty, "empty"), Error);
}

}  // namespace
}  // namespace tetrad::backend
