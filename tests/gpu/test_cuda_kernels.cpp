// The CUDA backend's kernels and cuBLASLt wrapper against double-precision references on the
// host (backend/cpu's double kernels, or a naive loop here), on fresh random inputs with outputs
// poisoned (NaN) first. Tolerances as docs/precision.md: fp32 arithmetic relative error under
// 1e-5 (2e-5 where a reduction over thousands of terms is involved), bf16 operands 1e-2, NaN
// never passes. Without a device every test is SKIPPED with the runtime's reason (CTest counts
// it as not run, never as passed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "tetrad/backend/cpu/attention.hpp"
#include "tetrad/backend/cpu/ops.hpp"
#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/backend/cuda/attention_tiles.hpp"
#include "tetrad/backend/cuda/gemm.hpp"
#include "tetrad/backend/cuda/gpu_api.hpp"
#include "tetrad/backend/cuda/kernels.hpp"

namespace {

namespace g = tetrad::gpu;
using VF = std::vector<float>;
using VD = std::vector<double>;

// The stream every kernel of a test runs on (CudaKernels::SetUp). Dev's copies and fills go on
// it too, so they are ordered with the kernels: cudaMemcpy / cudaMemset would run on the legacy
// default stream, which a non-blocking stream (gpuStreamCreate) does not wait for, and an input
// could be overwritten under a running kernel or a NaN fill land after it.
g::gpuStream_t g_test_stream = nullptr;

// A device array of T, RAII; every transfer on g_test_stream, in order with the test's kernels.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t n_) : n(n_) { GPU_CHECK(g::gpuMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(T))); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { up(h); }
  ~Dev() { g::gpuFree(p); }
  Dev(const Dev&) = delete;
  void up(const std::vector<T>& h) {  // after the work queued so far; h is read before returning
    GPU_CHECK(g::gpuMemcpyAsync(p, h.data(), h.size() * sizeof(T), g_test_stream));
    GPU_CHECK(g::gpuStreamSynchronize(g_test_stream));
  }
  std::vector<T> down() const {  // after the work queued so far
    std::vector<T> h(n);
    GPU_CHECK(g::gpuMemcpyAsync(h.data(), p, n * sizeof(T), g_test_stream));
    GPU_CHECK(g::gpuStreamSynchronize(g_test_stream));
    return h;
  }
  void poison() {  // NaN for floats, 0xff bytes otherwise; before the work queued after it
    GPU_CHECK(g::gpuMemsetAsync(p, 0xff, std::max<size_t>(1, n) * sizeof(T), g_test_stream));
  }
};

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (g::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device here: " << why;
    GPU_CHECK(g::gpuSetDevice(0));
    GPU_CHECK(g::gpuStreamCreate(&s_));
    g_test_stream = s_;
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  void TearDown() override {
    if (s_) g::gpuStreamDestroy(s_);
    g_test_stream = nullptr;
  }
  VF rand(size_t n, float lo = -1, float hi = 1) {
    std::uniform_real_distribution<float> d(lo, hi);
    VF v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  // ‖got - ref‖ / ‖ref‖ over all elements; NaN anywhere gives +inf.
  static double rel(const VF& got, const VD& ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      if (!std::isfinite(got[i])) return INFINITY;
      num += (got[i] - ref[i]) * (got[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    return std::sqrt(num / std::max(den, 1e-300));
  }
  static VD dbl(const VF& v) { return VD(v.begin(), v.end()); }
  std::string seed() const { return "seed " + std::to_string(seed_); }
  g::gpuStream_t s_ = nullptr;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

// ---- the card ----------------------------------------------------------------------------------

// scripts/gpu-check.sh runs this first and refuses the card by name when it fails: the device's
// blocks must hold every attention kernel's tiles at every head dim the kernels take (up to 128),
// on both paths (sm_86 / sm_89 cards allow 99 KB; the bf16 dK/dV kernel at head_dim 128 needs
// 160.5 KB).
TEST(CudaDevice, SharedMemoryHoldsEveryAttentionKernel) {
  std::string why;
  if (g::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device here: " << why;
  const g::DeviceInfo d = g::device_info(0);
  const std::string name = d.name + " (compute capability " + std::to_string(d.cc_major) + "." +
                           std::to_string(d.cc_minor) + ")";
  std::printf("card %s: %zu bytes of shared memory per block (opt-in)\n", name.c_str(),
              d.smem_per_block_optin);
  for (bool bf16 : {false, true}) {
    const std::string refusal = tetrad::gpu::attn::smem_refusal(d.smem_per_block_optin, 128, bf16, name);
    EXPECT_EQ(refusal, "") << "REFUSED: " << refusal;
  }
}

// ---- GEMM --------------------------------------------------------------------------------------

TEST_F(CudaKernels, GemmEveryLayoutFp32Bf16AndBias) {
  g::Gemm gemm;
  const int64_t M = 67, N = 45, K = 129;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int mode = 0; mode < 4; ++mode) {  // 0 fp32, 1 bf16 math on fp32 (refused), 2 bf16 storage, 3 fp32+bias
        const int64_t lda = (ta ? M : K) + 5, ldb = (tb ? K : N) + 3, ldc = N + 7;
        VF A = rand(size_t((ta ? K : M) * lda)), B = rand(size_t((tb ? N : K) * ldb)),
           C0 = rand(size_t(M * ldc)), bias = rand(static_cast<size_t>(N));
        const float alpha = 0.75f, beta = mode == 3 ? 1.0f : 0.5f;
        const bool bf = mode == 1 || mode == 2;
        // Reference in double, on bf16-rounded operands when the math is bf16.
        auto opnd = [&](float x) { return bf ? double(tetrad::kernels::round_to_bf16(x)) : double(x); };
        VD ref(size_t(M * ldc));
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double acc = 0;
            for (int64_t k = 0; k < K; ++k)
              acc += opnd(ta ? A[k * lda + i] : A[i * lda + k]) * opnd(tb ? B[j * ldb + k] : B[k * ldb + j]);
            ref[i * ldc + j] = alpha * acc + beta * C0[i * ldc + j] + (mode == 3 ? bias[j] : 0.0);
          }
        Dev<float> dA(A), dB(B), dC(C0), dbias(bias);
        std::vector<uint16_t> A16(A.size()), B16(B.size());
        for (size_t i = 0; i < A.size(); ++i) A16[i] = tetrad::kernels::float_to_bf16(A[i]);
        for (size_t i = 0; i < B.size(); ++i) B16[i] = tetrad::kernels::float_to_bf16(B[i]);
        Dev<uint16_t> dA16(A16), dB16(B16);
        g::GemmCall c;
        c.trans_a = ta;
        c.trans_b = tb;
        c.M = M; c.N = N; c.K = K;
        c.alpha = alpha; c.beta = beta;
        c.A = mode == 2 ? static_cast<const void*>(dA16.p) : dA.p;
        c.B = mode == 2 ? static_cast<const void*>(dB16.p) : dB.p;
        c.a_type = c.b_type = mode == 2 ? g::GemmType::BF16 : g::GemmType::F32;
        c.lda = lda; c.ldb = ldb; c.ldc = ldc;
        c.C = dC.p;
        c.math = bf ? g::GemmMath::BF16 : g::GemmMath::FP32;
        c.bias = mode == 3 ? dbias.p : nullptr;
        if (mode == 1) {
          // cuBLASLt's FAST_16BF may round other than to nearest even (or use TF32): the wrapper
          // refuses it; the backend casts the operands first (Conformance.Gemm*/cuda checks).
          EXPECT_THROW(gemm.run(c, s_), tetrad::Error);
          continue;
        }
        gemm.run(c, s_);
        VF got = dC.down();
        VF gv;
        VD rv;
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            if (j < N) {
              gv.push_back(got[i * ldc + j]);
              rv.push_back(ref[i * ldc + j]);
            } else {
              EXPECT_EQ(got[i * ldc + j], C0[i * ldc + j]) << "padding column written";
            }
          }
        // bf16 math on bf16-rounded operands is exact products + fp32 sums: fp32-level error.
        EXPECT_LT(rel(gv, rv), 1e-5) << "ta=" << ta << " tb=" << tb << " mode=" << mode << " " << seed();
      }
}

// The bias epilogue with the bias at 256-byte and at 4-byte aligned addresses (a bias inside a
// packed parameter buffer), in both orders on one Gemm (its plan cache) and for fp32 and
// bf16-stored operands: cuBLASLt's heuristic reads the bias pointer's alignment, so the plan must
// be made with the pointer set (it once was set after the heuristic: a plan for an aligned bias,
// made with a null pointer, met an unaligned one).
TEST_F(CudaKernels, GemmBiasEpilogueAtEveryAlignment) {
  const int64_t M = 64, N = 96, K = 128;
  VF A = rand(size_t(M * K)), B = rand(size_t(K * N)), bias = rand(size_t(N + 8));
  for (float& x : A) x = tetrad::kernels::round_to_bf16(x);
  for (float& x : B) x = tetrad::kernels::round_to_bf16(x);
  std::vector<uint16_t> A16(A.size()), B16(B.size());
  for (size_t i = 0; i < A.size(); ++i) A16[i] = tetrad::kernels::float_to_bf16(A[i]);
  for (size_t i = 0; i < B.size(); ++i) B16[i] = tetrad::kernels::float_to_bf16(B[i]);
  Dev<float> dA(A), dB(B), dbias(bias), dC(size_t(M * N));
  Dev<uint16_t> dA16(A16), dB16(B16);
  for (int order = 0; order < 2; ++order) {
    g::Gemm gemm;  // a fresh plan cache per order
    for (int pass = 0; pass < 4; ++pass) {
      const int64_t shift = ((pass / 2) ^ order) ? 1 : 0;  // 0: aligned bias, 1: 4 bytes off
      const bool bf16 = pass % 2;
      VD ref(size_t(M * N));
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double acc = 0;
          for (int64_t k = 0; k < K; ++k) acc += double(A[i * K + k]) * B[k * N + j];
          ref[size_t(i * N + j)] = acc + bias[size_t(j + shift)];
        }
      dC.poison();
      g::GemmCall c;
      c.M = M; c.N = N; c.K = K;
      c.A = bf16 ? static_cast<const void*>(dA16.p) : dA.p;
      c.B = bf16 ? static_cast<const void*>(dB16.p) : dB.p;
      c.a_type = c.b_type = bf16 ? g::GemmType::BF16 : g::GemmType::F32;
      c.math = bf16 ? g::GemmMath::BF16 : g::GemmMath::FP32;
      c.lda = K; c.ldb = N; c.ldc = N;
      c.C = dC.p;
      c.bias = dbias.p + shift;
      gemm.run(c, s_);
      EXPECT_LT(rel(dC.down(), ref), 1e-5) << "bias " << (shift ? "4-byte" : "256-byte")
                                           << " aligned, " << (bf16 ? "bf16" : "fp32")
                                           << ", order " << order << ", " << seed();
    }
  }
}

// K = 0 through the wrapper: C = beta C + bias, no library call (cuBLASLt rejects k = 0).
TEST_F(CudaKernels, GemmWithKZeroScalesCAndAddsTheBias) {
  const int64_t M = 5, N = 7, ldc = 9;
  VF C0 = rand(size_t(M * ldc)), bias = rand(size_t(N));
  Dev<float> dA(VF(4, 1.0f)), dB(VF(4, 1.0f)), dbias(bias);
  g::Gemm gemm;
  for (float beta : {0.0f, 1.0f}) {
    VF start = C0;
    if (beta == 0) std::fill(start.begin(), start.end(), NAN);
    Dev<float> dC(start);
    g::GemmCall c;
    c.M = M; c.N = N; c.K = 0; c.A = dA.p; c.lda = 1; c.B = dB.p; c.ldb = N; c.C = dC.p;
    c.ldc = ldc; c.beta = beta; c.bias = dbias.p;
    gemm.run(c, s_);
    const VF got = dC.down();
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        ASSERT_EQ(got[size_t(i * ldc + j)], (beta == 0 ? 0.0f : C0[size_t(i * ldc + j)]) + bias[size_t(j)])
            << "beta " << beta << " at " << i << "," << j;
  }
}

// The harness itself: a copy into an input must wait for the kernels queued before it on the
// test stream. Thirty milliseconds of GEMMs, then x is copied into y on the stream, then the
// host uploads new values into x: y must hold the old ones. (With cudaMemcpy on the legacy
// default stream, the upload ran at once, under the queued work, and y got the new values.)
TEST_F(CudaKernels, HarnessTransfersAreOrderedWithTheTestStream) {
  const int64_t n = 2048, big = 4096;
  const VF old_x = rand(size_t(n)), new_x = rand(size_t(n));
  Dev<float> x(old_x), y(VF(size_t(n), 0.0f));
  Dev<float> a(rand(size_t(big * big))), c(size_t(big * big));
  g::Gemm gemm;
  g::GemmCall call;
  call.M = call.N = call.K = big;
  call.A = call.B = a.p;
  call.lda = call.ldb = call.ldc = big;
  call.C = c.p;
  for (int r = 0; r < 12; ++r) gemm.run(call, s_);  // fp32: ~2.7 ms each on an H200
  g::add_inplace(y.p, x.p, n, s_);
  x.up(new_x);
  const VF got = y.down();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[size_t(i)], old_x[size_t(i)]) << "element " << i;
}

// ---- attention ---------------------------------------------------------------------------------

struct AttnCase { int B, Tq, Tk, H, KVH, hd; int64_t q_offset; };

// Naive double causal attention with the op table's q_offset: forward O and lse, backward dQ,
// dK, dV, all dense [b][t][h][d] with row strides H*hd (q, out) and KVH*hd (k, v).
void naive_attention(const AttnCase& c, const VD& q, const VD& k, const VD& v, const VD& dout,
                     VD& o, VD& lse, VD& dq, VD& dk, VD& dv) {
  const int hd = c.hd, grp = c.H / c.KVH;
  const int64_t qs = int64_t(c.H) * hd, ks = int64_t(c.KVH) * hd;
  const double scale = 1.0 / std::sqrt(double(hd));
  o.assign(size_t(c.B) * c.Tq * qs, 0);
  lse.assign(size_t(c.B) * c.H * c.Tq, 0);
  dq.assign(o.size(), 0);
  dk.assign(size_t(c.B) * c.Tk * ks, 0);
  dv.assign(dk.size(), 0);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h) {
      const int kh = h / grp;
      for (int i = 0; i < c.Tq; ++i) {
        const int64_t last = std::min<int64_t>(c.Tk - 1, c.q_offset + i);
        const double* qi = &q[(size_t(b) * c.Tq + i) * qs + h * hd];
        VD s(size_t(last + 1));
        double mx = -INFINITY;
        for (int64_t j = 0; j <= last; ++j) {
          const double* kj = &k[(size_t(b) * c.Tk + j) * ks + kh * hd];
          double acc = 0;
          for (int d = 0; d < hd; ++d) acc += qi[d] * kj[d];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& x : s) sum += std::exp(x - mx);
        lse[(size_t(b) * c.H + h) * c.Tq + i] = mx + std::log(sum);
        double* oi = &o[(size_t(b) * c.Tq + i) * qs + h * hd];
        VD p(s.size());
        for (size_t j = 0; j < s.size(); ++j) p[j] = std::exp(s[j] - mx) / sum;
        for (size_t j = 0; j < s.size(); ++j)
          for (int d = 0; d < hd; ++d) oi[d] += p[j] * v[(size_t(b) * c.Tk + j) * ks + kh * hd + d];
        const double* doi = &dout[(size_t(b) * c.Tq + i) * qs + h * hd];
        double D = 0;
        for (int d = 0; d < hd; ++d) D += doi[d] * oi[d];
        for (size_t j = 0; j < s.size(); ++j) {
          const double* vj = &v[(size_t(b) * c.Tk + j) * ks + kh * hd];
          double dp = 0;
          for (int d = 0; d < hd; ++d) dp += doi[d] * vj[d];
          const double ds = p[j] * (dp - D) * scale;
          for (int d = 0; d < hd; ++d) {
            dq[(size_t(b) * c.Tq + i) * qs + h * hd + d] += ds * k[(size_t(b) * c.Tk + j) * ks + kh * hd + d];
            dk[(size_t(b) * c.Tk + j) * ks + kh * hd + d] += ds * qi[d];
            dv[(size_t(b) * c.Tk + j) * ks + kh * hd + d] += p[j] * doi[d];
          }
        }
      }
    }
}

TEST_F(CudaKernels, FlashAttentionForwardBackwardBothPathsAgainstNaiveDouble) {
  const AttnCase cases[] = {
      {2, 100, 100, 4, 2, 64, 0},    // training shape, tiles not dividing T, GQA
      {1, 37, 100, 2, 1, 48, 63},    // queries are the last Tq keys (q_offset = Tk - Tq), padded hd
      {1, 20, 50, 2, 2, 128, 50},    // query block after the whole key block (no mask inside)
      {2, 130, 130, 3, 3, 32, 0},
  };
  for (const AttnCase& c : cases)
    for (g::AttnPath path : {g::AttnPath::kF32, g::AttnPath::kBf16}) {
      const int64_t qs = int64_t(c.H) * c.hd, ks = int64_t(c.KVH) * c.hd;
      VF q = rand(size_t(c.B) * c.Tq * qs), k = rand(size_t(c.B) * c.Tk * ks),
         v = rand(size_t(c.B) * c.Tk * ks), dout = rand(size_t(c.B) * c.Tq * qs);
      VD o, lse, dq, dk, dv;
      naive_attention(c, dbl(q), dbl(k), dbl(v), dbl(dout), o, lse, dq, dk, dv);
      Dev<float> dQ(q), dK(k), dV(v), dO(dout), out(o.size()), dl(lse.size()), gq(q.size()),
          gk(k.size()), gv(v.size());
      out.poison(); dl.poison(); gq.poison(); gk.poison(); gv.poison();
      g::AttnDims d{c.B, c.Tq, c.Tk, c.H, c.KVH, c.hd, c.q_offset, qs, ks, qs,
                    c.Tq * qs, c.Tk * ks, c.Tq * qs};
      g::attention_forward(out.p, dl.p, dQ.p, dK.p, dV.p, d, path, s_);
      g::attention_backward(gq.p, gk.p, gv.p, dO.p, dQ.p, dK.p, dV.p, out.p, dl.p, d, path, s_);
      const double tol = path == g::AttnPath::kF32 ? 1e-5 : 1e-2;
      const std::string what = "B=" + std::to_string(c.B) + " Tq=" + std::to_string(c.Tq) +
                               " Tk=" + std::to_string(c.Tk) + " hd=" + std::to_string(c.hd) +
                               (path == g::AttnPath::kF32 ? " fp32 " : " bf16 ") + seed();
      EXPECT_LT(rel(out.down(), o), tol) << "out " << what;
      EXPECT_LT(rel(dl.down(), lse), tol) << "lse " << what;
      EXPECT_LT(rel(gq.down(), dq), tol) << "dq " << what;
      EXPECT_LT(rel(gk.down(), dk), tol) << "dk " << what;
      EXPECT_LT(rel(gv.down(), dv), tol) << "dv " << what;
      // Deterministic: the backward again gives the same bits.
      VF q1 = gq.down(), k1 = gk.down();
      g::attention_backward(gq.p, gk.p, gv.p, dO.p, dQ.p, dK.p, dV.p, out.p, dl.p, d, path, s_);
      EXPECT_EQ(0, std::memcmp(q1.data(), gq.down().data(), q1.size() * 4)) << what;
      EXPECT_EQ(0, std::memcmp(k1.data(), gk.down().data(), k1.size() * 4)) << what;
    }
}

// ---- norms, activations, rotary, embedding -----------------------------------------------------

TEST_F(CudaKernels, NormsMatchTheCpuDoubleKernels) {
  const int64_t N = 77, C = 300;
  VF x = rand(size_t(N * C)), w = rand(static_cast<size_t>(C)), b = rand(static_cast<size_t>(C)), dout = rand(size_t(N * C));
  VD xo(size_t(N * C)), mean(N), rstd(N), dx(size_t(N * C), 0), dw(C, 0), db(C, 0);
  VD xd = dbl(x), wd = dbl(w), bd = dbl(b), dd = dbl(dout);
  tetrad::kernels::layernorm_forward<double>(xo.data(), mean.data(), rstd.data(), xd.data(), wd.data(), bd.data(), N, C, 1e-5);
  tetrad::kernels::layernorm_backward<double>(dx.data(), dw.data(), db.data(), dd.data(), xd.data(), wd.data(), mean.data(), rstd.data(), N, C);
  Dev<float> dX(x), dW(w), dB(b), dD(dout), out(xo.size()), m(N), r(N), gx(VF(x.size(), 0)),
      gw(VF(C, 0)), gb(VF(C, 0)), scratch(size_t(2 * g::column_sum_scratch(N, C)));
  out.poison(); m.poison(); r.poison();
  g::layernorm_forward(out.p, m.p, r.p, dX.p, dW.p, dB.p, N, C, 1e-5f, s_);
  g::norm_backward(gx.p, gw.p, gb.p, dD.p, dX.p, dW.p, m.p, r.p, N, C, scratch.p, s_);
  EXPECT_LT(rel(out.down(), xo), 1e-5) << seed();
  EXPECT_LT(rel(gx.down(), dx), 1e-5) << seed();
  EXPECT_LT(rel(gw.down(), dw), 2e-5) << seed();
  EXPECT_LT(rel(gb.down(), db), 2e-5) << seed();
  // Split statistics over two column halves, summed on the host as the X all-reduce would.
  Dev<double> st(static_cast<size_t>(N)), st2(static_cast<size_t>(N));
  g::norm_row_sums(st.p, 1, dX.p, nullptr, false, N, C, s_);
  VD full = st.down();
  for (int64_t t = 0; t < N; ++t) {
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += x[t * C + c];
    EXPECT_NEAR(full[t], s, 1e-9 * C);
  }
}

TEST_F(CudaKernels, GeluSwigluRopeEmbeddingAgainstCpu) {
  const int64_t N = 64, F = 96, n = N * F;
  VF x = rand(size_t(n), -4, 4), dout = rand(static_cast<size_t>(n)), gu = rand(size_t(2 * n), -4, 4);
  VD ref(static_cast<size_t>(n)), refd(static_cast<size_t>(n)), sw(static_cast<size_t>(n)), swd(static_cast<size_t>(2 * n));
  VD xd = dbl(x), dd = dbl(dout), gud = dbl(gu);
  tetrad::kernels::gelu_forward<double>(ref.data(), xd.data(), n);
  tetrad::kernels::gelu_backward<double>(refd.data(), dd.data(), xd.data(), n);
  tetrad::kernels::swiglu_forward<double>(sw.data(), gud.data(), N, F);
  tetrad::kernels::swiglu_backward<double>(swd.data(), dd.data(), gud.data(), N, F);
  Dev<float> dX(x), dD(dout), dGU(gu), o(static_cast<size_t>(n)), od(static_cast<size_t>(n)), so(static_cast<size_t>(n)), sod(static_cast<size_t>(2 * n));
  o.poison(); od.poison(); so.poison(); sod.poison();
  g::gelu_forward(o.p, dX.p, n, s_);
  g::gelu_backward(od.p, dD.p, dX.p, n, s_);
  g::swiglu_forward(so.p, dGU.p, N, F, s_);
  g::swiglu_backward(sod.p, dD.p, dGU.p, N, F, s_);
  EXPECT_LT(rel(o.down(), ref), 1e-5);
  EXPECT_LT(rel(od.down(), refd), 1e-5);
  EXPECT_LT(rel(so.down(), sw), 1e-5);
  EXPECT_LT(rel(sod.down(), swd), 1e-5);

  // Rotary on 3 of 4 heads of rows with stride 4*hd + 8, positions from 5.
  const int64_t T = 16, hd = 32, heads = 4, stride = heads * hd + 8, maxp = 64;
  VF r = rand(size_t(N * stride));
  VF cs(size_t(maxp * hd / 2)), sn(cs.size());
  tetrad::kernels::rope_tables<float>(cs.data(), sn.data(), maxp, hd, 10000.0);
  VD rd = dbl(r);
  VD csd = dbl(cs), snd = dbl(sn);
  tetrad::kernels::rope_forward<double>(rd.data(), N, T, 5, 3, hd, stride, csd.data(), snd.data());
  Dev<float> dR(r), dC(cs), dS(sn);
  g::rope_forward(dR.p, N, T, 5, 3, hd, stride, dC.p, dS.p, nullptr, s_);
  EXPECT_LT(rel(dR.down(), rd), 1e-6);
  g::rope_backward(dR.p, N, T, 5, 3, hd, stride, dC.p, dS.p, nullptr, s_);
  EXPECT_LT(rel(dR.down(), dbl(r)), 1e-6) << "the adjoint of a rotation is its inverse";

  // Vocabulary-parallel embedding: this rank holds rows [10, 40) of 50.
  const int64_t V = 50, v0 = 10, Vl = 30, C = 24;
  std::vector<int32_t> tok(static_cast<size_t>(N));
  for (auto& t : tok) t = int32_t(std::uniform_int_distribution<int>(0, int(V) - 1)(rng_));
  VF wte = rand(size_t(Vl * C)), dE = rand(size_t(N * C));
  Dev<int32_t> dT(tok);
  Dev<int> bad(std::vector<int>{0});
  Dev<float> dW(wte), e(size_t(N * C)), dwte(VF(wte.size(), 0)), dDE(dE);
  e.poison();
  g::embedding_forward(e.p, dT.p, dW.p, nullptr, N, T, C, v0, Vl, V, bad.p, s_);
  g::embedding_backward(dwte.p, nullptr, dDE.p, dT.p, N, T, C, v0, Vl, s_);
  VF eg = e.down(), dg = dwte.down();
  VD eref(size_t(N * C), 0), dref(wte.size(), 0);
  for (int64_t t = 0; t < N; ++t)
    if (tok[t] >= v0 && tok[t] < v0 + Vl)
      for (int64_t c = 0; c < C; ++c) {
        eref[t * C + c] = wte[(tok[t] - v0) * C + c];
        dref[(tok[t] - v0) * C + c] += dE[t * C + c];
      }
  EXPECT_LT(rel(eg, eref), 1e-7);
  EXPECT_LT(rel(dg, dref), 1e-6);
  EXPECT_EQ(bad.down()[0], 0);
  tok[3] = int32_t(V);  // out of range: flagged
  dT.up(tok);
  g::embedding_forward(e.p, dT.p, dW.p, nullptr, N, T, C, v0, Vl, V, bad.p, s_);
  EXPECT_EQ(bad.down()[0], 1);
}

// ---- cross-entropy, optimizer, sums of squares --------------------------------------------------

TEST_F(CudaKernels, FusedAndVocabParallelCrossEntropy) {
  const int64_t N = 33, V = 1000;
  VF L = rand(size_t(N * V), -8, 8);
  std::vector<int32_t> tg(static_cast<size_t>(N));
  for (auto& t : tg) t = int32_t(std::uniform_int_distribution<int>(0, int(V) - 1)(rng_));
  tg[4] = -1;  // masked
  VD loss_ref(N, 0), grad_ref(size_t(N * V), 0);
  const double gs = 0.25;
  for (int64_t t = 0; t < N; ++t) {
    if (tg[t] < 0) continue;
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(L[t * V + j]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(L[t * V + j] - mx);
    loss_ref[t] = std::log(s) + mx - L[t * V + tg[t]];
    for (int64_t j = 0; j < V; ++j) grad_ref[t * V + j] = gs * (std::exp(L[t * V + j] - mx) / s - (j == tg[t]));
  }
  // Two vocabulary slices [0, 400) and [400, 1000), combined on the host (the Y all-reduces).
  Dev<float> dL(L);
  Dev<int32_t> dT(tg);
  const int64_t split = 400;
  Dev<float> m0(N), s0(N), t0(N), m1(N), s1(N), t1(N);
  g::xent_partials(m0.p, s0.p, t0.p, dL.p, V, dT.p, N, 0, split, s_);
  g::xent_partials(m1.p, s1.p, t1.p, dL.p + split, V, dT.p, N, split, V - split, s_);
  VF hm0 = m0.down(), hm1 = m1.down();
  VF gmax(N);
  for (int64_t t = 0; t < N; ++t) gmax[t] = std::max(hm0[t], hm1[t]);
  Dev<float> dG(gmax);
  g::xent_rescale(s0.p, m0.p, dG.p, N, s_);
  g::xent_rescale(s1.p, m1.p, dG.p, N, s_);
  VF hs0 = s0.down(), hs1 = s1.down(), ht0 = t0.down(), ht1 = t1.down();
  VF gsum(N), gtgt(N);
  for (int64_t t = 0; t < N; ++t) {
    gsum[t] = hs0[t] + hs1[t];
    gtgt[t] = ht0[t] + ht1[t];
  }
  Dev<float> dS(gsum), dTg(gtgt), losses(N);
  Dev<double> total(1);
  losses.poison();
  g::xent_losses(losses.p, total.p, dG.p, dS.p, dTg.p, dT.p, N, V, nullptr, s_);
  EXPECT_LT(rel(losses.down(), loss_ref), 1e-5) << seed();
  double tot = 0;
  for (double x : loss_ref) tot += x;
  EXPECT_NEAR(total.down()[0], tot, 1e-5 * std::abs(tot));
  g::xent_backward(dL.p, V, dG.p, dS.p, dT.p, N, 0, split, float(gs), s_);
  g::xent_backward(dL.p + split, V, dG.p, dS.p, dT.p, N, split, V - split, float(gs), s_);
  EXPECT_LT(rel(dL.down(), grad_ref), 1e-5) << seed();
}

TEST_F(CudaKernels, MultiTensorAdamWWritesTheBf16CopyAndSumOfSquares) {
  const std::vector<int64_t> sizes = {1000, 1, 4097, 300};
  std::vector<VF> p, gr, m, v;
  std::vector<std::unique_ptr<Dev<float>>> dp, dg, dm, dv;
  std::vector<std::unique_ptr<Dev<uint16_t>>> d16;
  std::vector<g::TensorSpan> spans;
  std::vector<int64_t> offs = {0};
  for (int64_t n : sizes) {
    p.push_back(rand(static_cast<size_t>(n)));
    gr.push_back(rand(static_cast<size_t>(n)));
    m.push_back(rand(size_t(n), -0.1f, 0.1f));
    v.push_back(rand(size_t(n), 0.0f, 0.01f));
    dp.push_back(std::make_unique<Dev<float>>(p.back()));
    dg.push_back(std::make_unique<Dev<float>>(gr.back()));
    dm.push_back(std::make_unique<Dev<float>>(m.back()));
    dv.push_back(std::make_unique<Dev<float>>(v.back()));
    d16.push_back(std::make_unique<Dev<uint16_t>>(static_cast<size_t>(n)));
    spans.push_back({dp.back()->p, dg.back()->p, dm.back()->p, dv.back()->p, d16.back()->p, n,
                     spans.size() % 2 ? 0.0f : 0.1f});
    offs.push_back(offs.back() + n);
  }
  Dev<g::TensorSpan> dspans(spans);
  Dev<int64_t> doffs(offs);
  const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, gsc = 0.5f;
  g::adamw_multi(dspans.p, doffs.p, int(sizes.size()), offs.back(), lr, b1, b2, eps, gsc, 7, s_);
  for (size_t k = 0; k < sizes.size(); ++k) {
    VF pc = p[k], mc = m[k], vc = v[k];
    tetrad::kernels::adamw_update<float>(pc.data(), gr[k].data(), mc.data(), vc.data(), sizes[k], lr, b1,
                                   b2, eps, spans[k].weight_decay, gsc, 7);
    VF got = dp[k]->down();
    EXPECT_LT(rel(got, dbl(pc)), 1e-6) << "tensor " << k;
    std::vector<uint16_t> b16 = d16[k]->down();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(b16[i], tetrad::kernels::float_to_bf16(got[i])) << "bf16 copy, tensor " << k;
  }
  // Σ x² over all tensors.
  std::vector<const float*> ptrs;
  double ref = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    ptrs.push_back(dg[k]->p);
    for (float x : gr[k]) ref += double(x) * x;
  }
  Dev<const float*> dptrs(ptrs);
  Dev<double> out(1), scratch(size_t(g::sum_squares_scratch(offs.back())));
  g::sum_squares_multi(out.p, dptrs.p, doffs.p, int(sizes.size()), offs.back(), scratch.p, s_);
  EXPECT_NEAR(out.down()[0], ref, 1e-12 * ref);
}

// ---- ceilings (printed for scripts/gpu-check.sh; asserts only that they were measured) --------

class CudaCeilings : public CudaKernels {};

TEST_F(CudaCeilings, GemmAndCopy) {
  const int64_t n = 8192;
  Dev<float> a(rand(size_t(n * n))), b(rand(size_t(n * n))), c(size_t(n * n));
  Dev<uint16_t> a16(size_t(n * n)), b16(size_t(n * n));
  g::cast_f32_to_bf16(a16.p, n, a.p, n, n, n, s_);
  g::cast_f32_to_bf16(b16.p, n, b.p, n, n, n, s_);
  g::Gemm gemm;
  cudaEvent_t e0, e1;
  GPU_CHECK(cudaEventCreate(&e0));
  GPU_CHECK(cudaEventCreate(&e1));
  auto median_ms = [&](auto&& fn, int reps) {
    fn();
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
      GPU_CHECK(cudaEventRecord(e0, s_));
      fn();
      GPU_CHECK(cudaEventRecord(e1, s_));
      GPU_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      GPU_CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
  };
  auto run = [&](g::GemmType t, g::GemmMath m) {
    g::GemmCall call;
    call.M = call.N = call.K = n;
    call.lda = call.ldb = call.ldc = n;
    call.A = t == g::GemmType::BF16 ? static_cast<const void*>(a16.p) : a.p;
    call.B = t == g::GemmType::BF16 ? static_cast<const void*>(b16.p) : b.p;
    call.a_type = call.b_type = t;
    call.math = m;
    call.C = c.p;
    gemm.run(call, s_);
  };
  const double flop = 2.0 * double(n) * n * n;
  const double bf16 = flop / median_ms([&] { run(g::GemmType::BF16, g::GemmMath::BF16); }, 10) / 1e9;
  const double tf32 = flop / median_ms([&] { run(g::GemmType::F32, g::GemmMath::TF32); }, 5) / 1e9;
  const double fp32 = flop / median_ms([&] { run(g::GemmType::F32, g::GemmMath::FP32); }, 3) / 1e9;
  const size_t bytes = size_t(n * n) * 4;
  const double copy = 2.0 * double(bytes) /
                      median_ms([&] { GPU_CHECK(cudaMemcpyAsync(c.p, a.p, bytes, cudaMemcpyDeviceToDevice, s_)); }, 10) / 1e6;
  std::printf("ceiling gemm_bf16_tflops %.1f\nceiling gemm_tf32_tflops %.1f\n"
              "ceiling gemm_fp32_tflops %.1f\nceiling copy_gbs %.0f\n", bf16, tf32, fp32, copy);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  EXPECT_GT(bf16, 0);
  EXPECT_GT(copy, 0);
}

}  // namespace

// ---- op benchmarks on the models' own shapes (printed for scripts/gpu-check.sh) --------------
// Not a training benchmark: the time of each GEMM (forward, input gradient, weight gradient) and
// of attention forward/backward and the fused cross-entropy at the shapes of one micro-batch of
// gpt2-124m (B 16, T 1024) and llama-1b (B 8, T 2048), bf16 math on fp32-stored operands as the
// backend runs them, summed into the time the step's GEMMs and attention alone would take. It
// gives the GEMM ceiling on the model's shapes and the attention kernel's rate, to set against
// the training benchmark once the model runs on the backend.
namespace {
class CudaBench : public CudaKernels {};

struct Shape { const char* name; int64_t M, N, K; int count; };  // C[M,N] = A[M,K] W[N,K]^T

TEST_F(CudaBench, ModelShapes) {
  struct Model { const char* name; int64_t B, T, C, L, H, KV, F, V; bool swiglu; };
  const Model models[] = {{"gpt2-124m", 16, 1024, 768, 12, 12, 12, 3072, 50304, false},
                          {"llama-1b", 8, 2048, 2048, 20, 32, 8, 5632, 32000, true}};
  g::Gemm gemm;
  cudaEvent_t e0, e1;
  GPU_CHECK(cudaEventCreate(&e0));
  GPU_CHECK(cudaEventCreate(&e1));
  auto time_ms = [&](auto&& fn) {
    fn();
    std::vector<float> ms;
    for (int r = 0; r < 5; ++r) {
      GPU_CHECK(cudaEventRecord(e0, s_));
      fn();
      GPU_CHECK(cudaEventRecord(e1, s_));
      GPU_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      GPU_CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[2]);
  };
  for (const Model& m : models) {
    const int64_t N = m.B * m.T, hd = m.C / m.H, kvd = m.KV * hd;
    const Shape shapes[] = {{"qkv", N, m.C + 2 * kvd, m.C, int(m.L)},
                            {"attn_out", N, m.C, m.C, int(m.L)},
                            {"mlp_up", N, m.swiglu ? 2 * m.F : m.F, m.C, int(m.L)},
                            {"mlp_down", N, m.C, m.F, int(m.L)},
                            {"head", N, m.V, m.C, 1}};
    int64_t maxA = 0, maxW = 0, maxC = 0;
    for (const Shape& s : shapes) {
      maxA = std::max({maxA, s.M * s.K, s.M * s.N});
      maxW = std::max(maxW, s.N * s.K);
      maxC = std::max(maxC, s.M * s.N);
    }
    // bf16-stored operands, as the backend runs a bf16 product (its casts of fp32-stored
    // operands are elementwise passes, not counted here); fp32 outputs.
    const int64_t maxX = std::max(maxC, maxA);
    Dev<uint16_t> A(static_cast<size_t>(maxA)), W(static_cast<size_t>(maxW)), X(static_cast<size_t>(maxX));
    {
      Dev<float> f(rand(static_cast<size_t>(std::max({maxA, maxW, maxX}))));
      g::cast_f32_to_bf16(A.p, maxA, f.p, maxA, 1, maxA, s_);
      g::cast_f32_to_bf16(W.p, maxW, f.p, maxW, 1, maxW, s_);
      g::cast_f32_to_bf16(X.p, maxX, f.p, maxX, 1, maxX, s_);
      GPU_CHECK(g::gpuStreamSynchronize(s_));
    }
    Dev<float> Cb(static_cast<size_t>(maxX)), dW(static_cast<size_t>(maxW));
    double gemm_ms = 0, gemm_flop = 0;
    for (const Shape& s : shapes) {
      auto call = [&](bool ta, bool tb, int64_t M, int64_t Nn, int64_t K, const uint16_t* a,
                      int64_t lda, const uint16_t* b, int64_t ldb, float* c, int64_t ldc) {
        g::GemmCall gc;
        gc.trans_a = ta; gc.trans_b = tb; gc.M = M; gc.N = Nn; gc.K = K;
        gc.A = a; gc.lda = lda; gc.B = b; gc.ldb = ldb; gc.C = c; gc.ldc = ldc;
        gc.a_type = gc.b_type = g::GemmType::BF16;
        gc.math = g::GemmMath::BF16;
        gemm.run(gc, s_);
      };
      // forward: out[M,N] = in[M,K] W[N,K]^T; input grad: din[M,K] = dout[M,N] W[N,K];
      // weight grad: dW[N,K] += dout[M,N]^T in[M,K].
      const double f = time_ms([&] { call(false, true, s.M, s.N, s.K, A.p, s.K, W.p, s.K, Cb.p, s.N); });
      const double d = time_ms([&] { call(false, false, s.M, s.K, s.N, A.p, s.N, W.p, s.K, Cb.p, s.K); });
      const double w = time_ms([&] { call(true, false, s.N, s.K, s.M, A.p, s.N, X.p, s.K, dW.p, s.K); });
      const double flop = 2.0 * s.M * s.N * s.K;
      std::printf("bench %s gemm %-8s M=%ld N=%ld K=%ld  fwd %.3f ms (%.0f TFLOP/s)  dgrad %.3f (%.0f)  wgrad %.3f (%.0f)  x%d\n",
                  m.name, s.name, long(s.M), long(s.N), long(s.K), f, flop / f / 1e9, d, flop / d / 1e9,
                  w, flop / w / 1e9, s.count);
      gemm_ms += s.count * (f + d + w);
      gemm_flop += s.count * 3 * flop;
    }
    // Attention (bf16 and fp32 paths), one layer, causal.
    const int64_t qs = m.C + 2 * kvd;
    Dev<float> qkv(rand(size_t(N * qs))), o(size_t(N * m.C)), lse(size_t(m.B * m.H * m.T)),
        dqkv(size_t(N * qs)), dout(rand(size_t(N * m.C)));
    g::AttnDims ad{int(m.B), int(m.T), int(m.T), int(m.H), int(m.KV), int(hd), 0, qs, qs, m.C,
                   m.T * qs, m.T * qs, m.T * m.C};
    const double causal_flop = 4.0 * m.B * m.H * double(m.T) * m.T * hd / 2;  // QK^T + PV, causal
    double attn_ms = 0;
    for (g::AttnPath path : {g::AttnPath::kBf16, g::AttnPath::kF32}) {
      const double f = time_ms([&] {
        g::attention_forward(o.p, lse.p, qkv.p, qkv.p + m.C, qkv.p + m.C + kvd, ad, path, s_);
      });
      const double b = time_ms([&] {
        g::attention_backward(dqkv.p, dqkv.p + m.C, dqkv.p + m.C + kvd, dout.p, qkv.p, qkv.p + m.C,
                              qkv.p + m.C + kvd, o.p, lse.p, ad, path, s_);
      });
      std::printf("bench %s attention %s fwd %.3f ms (%.0f TFLOP/s causal)  bwd %.3f ms (%.0f at 2.5x)  x%ld\n",
                  m.name, path == g::AttnPath::kBf16 ? "bf16" : "fp32", f, causal_flop / f / 1e9, b,
                  2.5 * causal_flop / b / 1e9, long(m.L));
      if (path == g::AttnPath::kBf16) attn_ms = m.L * (f + b);
    }
    // Cross-entropy, fused, over the head's logits.
    Dev<float> logits(rand(size_t(N * m.V), -4, 4)), mx(size_t(3 * N)), losses(static_cast<size_t>(N));
    std::vector<int32_t> tg(static_cast<size_t>(N));
    for (auto& t : tg) t = int32_t(std::uniform_int_distribution<int>(0, int(m.V) - 1)(rng_));
    Dev<int32_t> dT(tg);
    const double ce = time_ms([&] {
      g::xent_partials(mx.p, mx.p + N, mx.p + 2 * N, logits.p, m.V, dT.p, N, 0, m.V, s_);
      g::xent_losses(losses.p, nullptr, mx.p, mx.p + N, mx.p + 2 * N, dT.p, N, m.V, nullptr, s_);
      g::xent_backward(logits.p, m.V, mx.p, mx.p + N, dT.p, N, 0, m.V, 1.0f, s_);
    });
    const double bytes = 3.0 * N * m.V * 4;  // read fwd, read + write bwd
    std::printf("bench %s cross_entropy fused %.3f ms (%.0f GB/s over 3 passes of the logits)\n",
                m.name, ce, bytes / ce / 1e6);
    const double model_flop = gemm_flop + 3.0 * 2 * m.L * 2.0 * m.B * m.H * double(m.T) * m.T * hd;  // 12LCT-style, full attention
    const double sum = gemm_ms + attn_ms + ce;
    std::printf("bench %s summary gemms %.1f ms (%.0f TFLOP/s), attention %.1f ms, xent %.1f ms, sum %.1f ms "
                "-> %.0f tokens/s, MFU %.1f%% of 989 if nothing else took time\n",
                m.name, gemm_ms, gemm_flop / gemm_ms / 1e9, attn_ms, ce, sum, N / (sum * 1e-3),
                100.0 * model_flop / (sum * 1e-3) / 989e12);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}
}  // namespace
