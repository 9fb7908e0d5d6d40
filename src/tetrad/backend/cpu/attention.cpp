// Causal flash attention on the CPU: see attention.hpp for the contract.
//
// One source, three code paths. The kernels below are written once with GCC vector extensions
// (Vec<T, W>) in always_inline functions; each path is an entry function with its own
// __attribute__((target)) that holds the OpenMP loop and inlines everything under it, so the same
// code becomes SSE2 (portable), AVX2+FMA or AVX-512 instructions. The entry is picked at run time.
//
// Forward, per task (sequence b, head h, block of Bq queries), vectorised over queries:
//   QT[d][i] = q[i][d] * log2(e)/sqrt(hd)              packed once per task
//   for each key block (only those some query of the block can see):
//     ST[j][i] = sum_d k[j][d] QT[d][i]                  score tile, keys x queries
//     online softmax in base 2 down each column i (running max m_i, running sum l_i)
//     OT[d][i] = OT[d][i] * alpha_i + sum_j v[j][d] PT[j][i]
//   out[i][d] = OT[d][i] / l_i,  lse_i = (m_i + log2 l_i) * ln 2
// k and v are read by broadcast from a contiguous copy made once per call (see KvSource).
//
// Backward, per task (sequence b, kv head g, chunk of its key blocks): the task owns those dk/dv
// rows, so no two threads write the same row.
//   pack K (rows, padded to the vector width), K^T and V^T of the chunk's key blocks
//   for each query head h of the group: pack Q, dO (rows), D_i = dO_i . O_i, L_i = lse_i*log2(e)
//     for each key block j0 of the chunk: for each query block i0 from the diagonal down:
//       S = Q K^T (vectorised over keys), P = 2^(S*c - L_i) masked, dP = dO V^T,
//       dS = P (dP - D_i) / sqrt(hd)
//       dV[j0..] += P^T dO;  dK[j0..] += dS^T Q;  dQ[i0..] += dS K       (vectorised over d)
//     dQ of head h -> dq (one chunk) or to the chunk's dq share (summed in chunk order after)
//   write dK, dV rows
// All seven products are one register-tiled micro-kernel C[m][n] += sum_k A(m,k) B[k][n] with A
// read by broadcast through (row, column) strides and B, C vectorised along n.
//
// Measured with DISABLED_Benchmark.Gpt2Small in tests/test_attention.cpp (B=1 T=1024 12 heads
// hd=64, float, 2 threads) on a shared 2-core Zen 3 (AVX2, no AVX-512) whose register-only FMA
// loop gave 163-177 GFLOP/s, in its quiet moments: forward 17.6-20 ms, 80-91 GFLOP/s (47-52% of
// that peak); backward 40.6-48 ms, 84-99 GFLOP/s (51-57%). The GEMM tiles reach about 85% of
// peak alone and 65-70% in place; the rest of the forward is softmax, packing and transposes.
#include "tetrad/backend/cpu/attention.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"

// The vector helpers pass vectors by value; they are always inlined, so the ABI note is moot.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tetrad::kernels {
namespace {

#define TETRAD_INLINE inline __attribute__((always_inline))

template <class T, int W>
struct VecOf {
  typedef T type __attribute__((vector_size(W * sizeof(T))));
};
template <class T>
struct IntOf;
template <>
struct IntOf<float> {
  using type = int32_t;
  static constexpr int kMantissa = 23, kBias = 127;
};
template <>
struct IntOf<double> {
  using type = int64_t;
  static constexpr int kMantissa = 52, kBias = 1023;
};

template <class T, int W>
TETRAD_INLINE typename VecOf<T, W>::type load(const T* p) {
  typename VecOf<T, W>::type v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T, int W>
TETRAD_INLINE void store(T* p, typename VecOf<T, W>::type v) {
  std::memcpy(p, &v, sizeof v);
}
template <class T, int W>
TETRAD_INLINE typename VecOf<T, W>::type splat(T x) {
  typename VecOf<T, W>::type v = {};
  return v + x;
}

// 2^x, elementwise: 2^x = 2^n 2^r with n = round(x), |r| <= 1/2. Inputs <= -bias give exactly 0
// (so -inf masks to 0). Float: degree-6 fit of 2^r on [-1/2, 1/2] (Chebyshev nodes), relative
// error 2e-8 before rounding; double: Taylor series of e^(r ln 2) to degree 13 (< 5e-18).
template <class T, int W>
TETRAD_INLINE typename VecOf<T, W>::type exp2v(typename VecOf<T, W>::type x) {
  using V = typename VecOf<T, W>::type;
  using I = typename IntOf<T>::type;
  typedef I IV __attribute__((vector_size(W * sizeof(T))));
  constexpr T lo = -T(IntOf<T>::kBias), hi = T(IntOf<T>::kBias);
  x = x < lo ? lo : x;  // maxps/minps patterns, written so that NaN passes through
  x = x > hi ? hi : x;
  // k = x + 1.5 * 2^mantissa rounds x to an integer n that lands in k's low mantissa bits.
  constexpr T magic = T(1.5) * T(I(1) << IntOf<T>::kMantissa);
  const V k = x + magic;
  const V r = x - (k - magic);
  V p;
  if constexpr (sizeof(T) == 4) {
    p = r * T(1.546973217e-04) + T(1.340043265e-03);
    p = p * r + T(9.618025273e-03);
    p = p * r + T(5.550327152e-02);
    p = p * r + T(2.402265072e-01);
    p = p * r + T(6.931471825e-01);
    p = p * r + T(1);
  } else {
    const V t = r * T(0.6931471805599453094);
    p = t * T(1.0 / 6227020800.0) + T(1.0 / 479001600.0);
    p = p * t + T(1.0 / 39916800.0);
    p = p * t + T(1.0 / 3628800.0);
    p = p * t + T(1.0 / 362880.0);
    p = p * t + T(1.0 / 40320.0);
    p = p * t + T(1.0 / 5040.0);
    p = p * t + T(1.0 / 720.0);
    p = p * t + T(1.0 / 120.0);
    p = p * t + T(1.0 / 24.0);
    p = p * t + T(1.0 / 6.0);
    p = p * t + T(0.5);
    p = p * t + T(1);
    p = p * t + T(1);
  }
  I magic_bits;
  std::memcpy(&magic_bits, &magic, sizeof magic);
  const IV e = ((IV)k + (I(IntOf<T>::kBias) - magic_bits)) << IntOf<T>::kMantissa;
  return p * (V)e;
}

// Register tile: C[r][c*W..] (+)= sum_k A(r, k) * B[k][c*W..] for r < R, c < C.
// A(r, k) = a[r * a_ms + k * a_ks] (broadcast), B rows ldb apart, C rows ldc apart.
template <class T, int W, int R, int C>
TETRAD_INLINE void micro(T* __restrict c, int64_t ldc, const T* __restrict a, int64_t a_ms,
                         int64_t a_ks, const T* __restrict b, int64_t ldb, int K, bool accumulate) {
  using V = typename VecOf<T, W>::type;
  V acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < C; ++j) acc[r][j] = accumulate ? load<T, W>(c + r * ldc + j * W) : V{};
  for (int k = 0; k < K; ++k) {
    V bv[C];
#pragma GCC unroll 16
    for (int j = 0; j < C; ++j) bv[j] = load<T, W>(b + k * ldb + j * W);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const T ar = a[r * a_ms + k * a_ks];
#pragma GCC unroll 16
      for (int j = 0; j < C; ++j) acc[r][j] += ar * bv[j];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < C; ++j) store<T, W>(c + r * ldc + j * W, acc[r][j]);
}

// One register tile of n < N rows (n known only at run time).
template <class T, int W, int N, int C>
TETRAD_INLINE void micro_n(int n, T* c, int64_t ldc, const T* a, int64_t a_ms, int64_t a_ks,
                           const T* b, int64_t ldb, int K, bool accumulate) {
  if constexpr (N > 1) {
    if (n == N - 1) return micro<T, W, N - 1, C>(c, ldc, a, a_ms, a_ks, b, ldb, K, accumulate);
    micro_n<T, W, N - 1, C>(n, c, ldc, a, a_ms, a_ks, b, ldb, K, accumulate);
  }
}

// Rows [0, M) in tiles of R rows. A remainder below R/2 is merged with the last full tile and the
// two split in halves (64 = 20*3 + 2 + 2 rather than 21*3 + 1), since thin tiles run far slower.
template <class T, int W, int R, int C>
TETRAD_INLINE void micro_rows(int M, T* c, int64_t ldc, const T* a, int64_t a_ms, int64_t a_ks,
                              const T* b, int64_t ldb, int K, bool accumulate) {
  int full = M / R, rest = M % R;
  if (rest > 0 && 2 * rest < R && full > 0) --full, rest += R;
  int m = 0;
  for (; m < full * R; m += R)
    micro<T, W, R, C>(c + m * ldc, ldc, a + m * a_ms, a_ms, a_ks, b, ldb, K, accumulate);
  if (rest >= R) {
    const int half = rest / 2;
    micro_n<T, W, R, C>(rest - half, c + m * ldc, ldc, a + m * a_ms, a_ms, a_ks, b, ldb, K,
                        accumulate);
    m += rest - half;
    rest = half;
  }
  if (rest > 0)
    micro_n<T, W, R, C>(rest, c + m * ldc, ldc, a + m * a_ms, a_ms, a_ks, b, ldb, K, accumulate);
}

// C[M][NV*W] (+)= A[M][K] B[K][NV*W], A by broadcast through strides (see micro); column tiles
// of C vectors, then C/2, C/4, ...
template <class T, int W, int R, int C>
TETRAD_INLINE void gemm_tiles(int M, int NV, int K, T* c, int64_t ldc, const T* a, int64_t a_ms,
                              int64_t a_ks, const T* b, int64_t ldb, bool accumulate) {
  int nv = 0;
  for (; nv + C <= NV; nv += C)
    micro_rows<T, W, R, C>(M, c + nv * W, ldc, a, a_ms, a_ks, b + nv * W, ldb, K, accumulate);
  if constexpr (C > 1)
    if (nv < NV)
      gemm_tiles<T, W, R, C / 2>(M, NV - nv, K, c + nv * W, ldc, a, a_ms, a_ks, b + nv * W, ldb,
                                 accumulate);
}

// Tile shapes per vector width: R x C accumulators must leave room for C loads and a broadcast
// (16 registers below AVX-512, 32 with it), and both FMA pipes need at least 8 independent
// chains. On the 2-core AVX2 machine 3x4 beat 4x2 and 6x2 in the forward (17.6 vs 22.5 and
// 19.0 ms, gpt2-124m shapes) and tied in the backward; 6x4 for AVX-512 is untuned.
template <class T, int W>
struct Tiles {
  static constexpr int R = W * int(sizeof(T)) == 64 ? 6 : 3;
  static constexpr int C = 4;
  static constexpr int kBq = 64 > 4 * W ? 64 : 4 * W;  // forward query block (multiple of W)
  static constexpr int kBk = 64 > 4 * W ? 64 : 4 * W;  // key block (forward and backward)
  static constexpr int kBqBwd = 64;                    // backward query block
};

// One out-of-line GEMM per (T, W), compiled for its path's target (specialised below), so the
// unrolled tiles are generated once per path rather than at every call site.
template <class T, int W>
void gemm(int M, int NV, int K, T* c, int64_t ldc, const T* a, int64_t a_ms, int64_t a_ks,
          const T* b, int64_t ldb, bool accumulate);

#define TETRAD_ATTENTION_GEMM(T, W, TARGET)                                                     \
  template <>                                                                                  \
  TARGET __attribute__((noinline)) void gemm<T, W>(int M, int NV, int K, T* c, int64_t ldc,   \
                                                   const T* a, int64_t a_ms, int64_t a_ks,     \
                                                   const T* b, int64_t ldb, bool accumulate) { \
    gemm_tiles<T, W, Tiles<T, W>::R, Tiles<T, W>::C>(M, NV, K, c, ldc, a, a_ms, a_ks, b, ldb,  \
                                                     accumulate);                              \
  }
#define TETRAD_AVX2 __attribute__((target("avx2,fma")))
#define TETRAD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
TETRAD_ATTENTION_GEMM(float, 4, )
TETRAD_ATTENTION_GEMM(double, 2, )
TETRAD_ATTENTION_GEMM(float, 8, TETRAD_AVX2)
TETRAD_ATTENTION_GEMM(double, 4, TETRAD_AVX2)
TETRAD_ATTENTION_GEMM(float, 16, TETRAD_AVX512)
TETRAD_ATTENTION_GEMM(double, 8, TETRAD_AVX512)

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Work memory, one arena per thread and role, kept between calls (it grows, never shrinks):
// allocating and faulting in fresh pages on every call cost several percent of a gpt2-sized
// backward. Contents are whatever the previous call left; users initialise what they read.
class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() { std::free(base_); }
  // Starts a new carve of `bytes` in total (the sum of take()'s rounded sizes).
  void reserve(size_t bytes) {
    if (bytes > cap_) {
      std::free(base_);
      cap_ = (bytes + 4095) / 4096 * 4096;
      base_ = static_cast<char*>(std::aligned_alloc(64, cap_));
      TETRAD_CHECK(base_ != nullptr, "attention work memory of ", cap_, " bytes not available");
    }
    used_ = 0;
  }
  template <class T>
  T* take(int64_t n) {
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += bytes_for<T>(n);
    TETRAD_CHECK(used_ <= cap_, "attention arena overrun");
    return p;
  }
  template <class T>
  static size_t bytes_for(int64_t n) {
    return (size_t(n) * sizeof(T) + 63) / 64 * 64;
  }

 private:
  char* base_ = nullptr;
  size_t cap_ = 0, used_ = 0;
};
thread_local Arena tls_task_arena;    // per-thread buffers of a task loop
thread_local Arena tls_shared_arena;  // buffers a calling thread shares with its team

constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Rows of q/k/v/out are far apart (a fused qkv row): strided reads of them fetch this many rows
// ahead, which the hardware prefetchers do not.
constexpr int kPrefetchRows = 8;
template <class T>
TETRAD_INLINE void prefetch_row(const T* p, int n) {
  for (int e = 0; e < n; e += 64 / int(sizeof(T))) __builtin_prefetch(p + e);
}

// Below this many queries per sequence the forward reads k/v in place (see KvSource).
constexpr int kPackMinQueries = 16;

// ---------------------------------------------------------------------------------------------
// Forward

template <class T, int W>
struct ForwardScratch {
  static constexpr int Bq = Tiles<T, W>::kBq, Bk = Tiles<T, W>::kBk;
  T *qt, *ot, *st, *m, *l, *lo;  // [hd][Bq], [hd][Bq], [Bk][Bq], [Bq], [Bq], [Bq]
  explicit ForwardScratch(int hd) {
    Arena& a = tls_task_arena;
    a.reserve(2 * Arena::bytes_for<T>(int64_t(hd) * Bq) + Arena::bytes_for<T>(int64_t(Bk) * Bq) +
              3 * Arena::bytes_for<T>(Bq));
    qt = a.take<T>(int64_t(hd) * Bq), ot = a.take<T>(int64_t(hd) * Bq);
    st = a.take<T>(int64_t(Bk) * Bq), m = a.take<T>(Bq), l = a.take<T>(Bq), lo = a.take<T>(Bq);
  }
};

// Where a task reads k and v: either in place, or from contiguous copies [B, n_kv_head, Tk, hd]
// made once per call. Rows of k/v in a fused qkv buffer are a large power-of-two-ish stride apart
// and a key block would map onto few L1 sets; the copy costs O(Tk hd) against O(Tq Tk hd) work,
// so it is skipped when there are few queries (decode).
template <class T>
struct KvSource {
  const T* k;
  const T* v;
  int64_t row, batch, head;  // strides in elements
  bool packed;
};

template <class T>
KvSource<T> kv_in_place(const T* k, const T* v, const AttentionDims& d) {
  return {k, v, d.kv_stride, d.kv_batch_stride, d.head_dim, false};
}

// Copies row `task` = (b * n_kv_head + g) * Tk + j of k and v into kbuf/vbuf [B, n_kv, Tk, hd].
template <class T>
void pack_kv_rows(T* kbuf, T* vbuf, const T* k, const T* v, const AttentionDims& d, int64_t task) {
  const int hd = d.head_dim;
  const int64_t per_seq = int64_t(d.n_kv_head) * d.Tk;
  const int b = int(task / per_seq), g = int(task / d.Tk % d.n_kv_head), j = int(task % d.Tk);
  const int64_t src = b * d.kv_batch_stride + int64_t(j) * d.kv_stride + int64_t(g) * hd;
  const int64_t dst = (int64_t(b) * d.n_kv_head + g) * d.Tk * hd + int64_t(j) * hd;
  if (j + kPrefetchRows < d.Tk)
    prefetch_row(k + src + kPrefetchRows * d.kv_stride, hd),
        prefetch_row(v + src + kPrefetchRows * d.kv_stride, hd);
  std::memcpy(kbuf + dst, k + src, sizeof(T) * hd);
  std::memcpy(vbuf + dst, v + src, sizeof(T) * hd);
}

// The document mask's first visible key of query i of sequence b, in the key block's frame (any
// int: below 0 when the document began before the block, past the query when it sees nothing).
TETRAD_INLINE int64_t doc_first_key(const AttentionDims& d, int b, int i) {
  return int64_t(d.doc_start[b * d.doc_batch_stride + i]) - d.doc_shift;
}

template <class T, int W>
TETRAD_INLINE void forward_task(T* out, T* lse, const T* q, const KvSource<T>& kv,
                                const AttentionDims& d, int off, int b, int h, int i0,
                                ForwardScratch<T, W>& s) {
  using V = typename VecOf<T, W>::type;
  constexpr int Bq = Tiles<T, W>::kBq, Bk = Tiles<T, W>::kBk;
  const int hd = d.head_dim;
  const int nq = std::min(Bq, d.Tq - i0);
  const int NV = (nq + W - 1) / W;  // query vectors in use (a short last block, or decode)
  const int kvh = h / (d.n_head / d.n_kv_head);
  const T* qb = q + b * d.q_batch_stride + int64_t(i0) * d.q_stride + int64_t(h) * hd;
  const T* kb = kv.k + b * kv.batch + kvh * kv.head;
  const T* vb = kv.v + b * kv.batch + kvh * kv.head;
  const int64_t ks = kv.row;
  T* qt = s.qt;
  T* ot = s.ot;
  T* st = s.st;
  T* mrow = s.m;
  T* lrow = s.l;

  const T c2 = T(1.4426950408889634074) / std::sqrt(T(hd));  // log2(e) / sqrt(hd)
  // q and out rows are far apart (rows of a fused qkv buffer) and touched once: request them all
  // first (out for writing; it is written at the end of the task).
  T* ob = out + b * d.out_batch_stride + int64_t(i0) * d.out_stride + int64_t(h) * hd;
  for (int i = 0; i < nq; ++i)
    for (int e = 0; e < hd; e += 64 / int(sizeof(T))) {
      __builtin_prefetch(qb + i * d.q_stride + e);
      __builtin_prefetch(ob + i * d.out_stride + e, 1);
    }
  std::memset(ot, 0, sizeof(T) * hd * Bq);
  for (int i = 0; i < NV * W; ++i)
    for (int e = 0; e < hd; ++e)
      qt[e * Bq + i] = i < nq ? qb[int64_t(i) * d.q_stride + e] * c2 : T(0);
  for (int c = 0; c < NV; ++c) {
    store<T, W>(mrow + c * W, splat<T, W>(-std::numeric_limits<T>::infinity()));
    store<T, W>(lrow + c * W, V{});
  }
  V iota;
  for (int w = 0; w < W; ++w) iota[w] = T(w);

  const int first_pos = off + i0;              // position of the block's first query (any sign)
  const int n_keys = std::min(d.Tk, off + i0 + nq);  // keys seen by the block's last query
  // Document mask: each lane's first visible key (padding lanes see none), the block's smallest
  // (keys before it are skipped) and largest (key blocks before it need the mask).
  const bool docs = d.doc_start != nullptr;
  int64_t lo_min = docs ? d.Tk : 0, lo_max = 0;
  for (int i = 0; docs && i < NV * W; ++i) {
    const int64_t f = i < nq ? std::clamp<int64_t>(doc_first_key(d, b, i0 + i), 0, d.Tk) : d.Tk;
    s.lo[i] = T(f);
    if (i < nq) lo_min = std::min(lo_min, f), lo_max = std::max(lo_max, f);
  }
  for (int j0 = int(std::min<int64_t>(lo_min, n_keys)); j0 < n_keys; j0 += Bk) {
    const int nk = std::min(Bk, n_keys - j0);
    if (kv.packed && j0 + Bk < n_keys) {  // next key block into L2 while this one is computed
      const int64_t bytes = int64_t(std::min(Bk, n_keys - j0 - Bk)) * hd * sizeof(T);
      const char* kn = reinterpret_cast<const char*>(kb + (j0 + Bk) * ks);
      const char* vn = reinterpret_cast<const char*>(vb + (j0 + Bk) * ks);
      for (int64_t o = 0; o < bytes; o += 64) {
        __builtin_prefetch(kn + o, 0, 2);
        __builtin_prefetch(vn + o, 0, 2);
      }
    }
    gemm<T, W>(nk, NV, hd, st, Bq, kb + j0 * ks, ks, 1, qt, Bq, false);
    const bool diagonal = j0 + nk - 1 > first_pos;
    const bool doc_edge = docs && j0 < lo_max;  // some lane's document starts after key j0
    for (int c = 0; c < NV; ++c) {
      const V pos = iota + T(first_pos + c * W);
      V mx = load<T, W>(mrow + c * W);
      if (diagonal || doc_edge) {  // keys after the query or before its document: -inf
        const V ninf = splat<T, W>(-std::numeric_limits<T>::infinity());
        const V lo = doc_edge ? load<T, W>(s.lo + c * W) : V{};
        for (int j = 0; j < nk; ++j) {
          V x = load<T, W>(st + j * Bq + c * W);
          const V key = splat<T, W>(T(j0 + j));
          x = key > pos ? ninf : x;
          x = key < lo ? ninf : x;
          store<T, W>(st + j * Bq + c * W, x);
          mx = mx > x ? mx : x;
        }
      } else {
        for (int j = 0; j < nk; ++j) {
          const V x = load<T, W>(st + j * Bq + c * W);
          mx = mx > x ? mx : x;
        }
      }
      // A lane that has seen no key yet keeps mx = -inf (masked blocks only: a query before the
      // key block, off < 0, or before its document); it subtracts 0 instead, so its p and alpha
      // are 0, not NaN. Every other lane: msub = mx.
      V msub = mx;
      if (diagonal || doc_edge)
        msub = mx == splat<T, W>(-std::numeric_limits<T>::infinity()) ? V{} : mx;
      V sum = {};
      for (int j = 0; j < nk; ++j) {
        const V p = exp2v<T, W>(load<T, W>(st + j * Bq + c * W) - msub);
        store<T, W>(st + j * Bq + c * W, p);
        sum += p;
      }
      // Rescale the running sum and output only where some lane's maximum grew (rare after the
      // first blocks); alpha = 1 elsewhere, so skipping is exact.
      const V mold = load<T, W>(mrow + c * W);
      bool grew = false;
      for (int w = 0; w < W; ++w) grew |= mx[w] > mold[w];
      V l = load<T, W>(lrow + c * W);
      if (grew) {
        const V alpha = exp2v<T, W>(mold - msub);
        l *= alpha;
        store<T, W>(mrow + c * W, mx);
        if (j0 > 0)
          for (int e = 0; e < hd; ++e)
            store<T, W>(ot + e * Bq + c * W, load<T, W>(ot + e * Bq + c * W) * alpha);
      }
      store<T, W>(lrow + c * W, l + sum);
    }
    gemm<T, W>(hd, NV, nk, ot, Bq, vb + j0 * ks, 1, ks, st, Bq, true);
  }

  // Normalise, transpose into rows in L1 (qt is free now), then write whole rows: scalar stores
  // straight into the (cold) output rows stalled on their cache misses.
  for (int c = 0; c < NV; ++c) {
    const V l = load<T, W>(lrow + c * W);
    const V inv = l > T(0) ? T(1) / l : V{};  // a row that saw no key: out = 0, lse = -inf
    for (int e = 0; e < hd; ++e)
      store<T, W>(ot + e * Bq + c * W, load<T, W>(ot + e * Bq + c * W) * inv);
  }
  T* rows = qt;
  for (int i = 0; i < nq; ++i)
    for (int e = 0; e < hd; ++e) rows[i * hd + e] = ot[e * Bq + i];
  for (int i = 0; i < nq; ++i)
    std::memcpy(ob + int64_t(i) * d.out_stride, rows + i * hd, sizeof(T) * hd);
  if (lse) {
    T* lb = lse + (int64_t(b) * d.n_head + h) * d.Tq + i0;
    for (int i = 0; i < nq; ++i)
      lb[i] = (mrow[i] + std::log2(lrow[i])) * T(0.6931471805599453094);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward

template <class T, int W>
struct BackwardScratch {
  static constexpr int Bq = Tiles<T, W>::kBqBwd, Bk = Tiles<T, W>::kBk;
  int hdp, tkp;
  T *kp, *dk, *dv;  // [Tk][hdp]: K rows, dK and dV accumulators
  T *kt, *vt;       // [tkp/Bk][hd][Bk]: K^T, V^T per key block
  T *qp, *dop, *dq; // [Tq][hdp]: Q, dO rows of one head, dQ accumulator
  T *dd, *ll, *lo;  // [Tq]: D_i = dO_i . O_i, lse_i * log2(e), first visible key (documents)
  T *s, *dp;        // [Bq][Bk]: P, then dP and dS
  explicit BackwardScratch(const AttentionDims& d)
      : hdp(round_up(d.head_dim, W)), tkp(round_up(d.Tk, Bk)) {
    const int64_t rows_k = int64_t(d.Tk) * hdp, rows_q = int64_t(d.Tq) * hdp;
    const int64_t kt_n = int64_t(d.head_dim) * tkp, tile = int64_t(Bq) * Bk;
    Arena& a = tls_task_arena;
    a.reserve(3 * Arena::bytes_for<T>(rows_k) + 2 * Arena::bytes_for<T>(kt_n) +
              3 * Arena::bytes_for<T>(rows_q) + 3 * Arena::bytes_for<T>(d.Tq) +
              2 * Arena::bytes_for<T>(tile));
    kp = a.take<T>(rows_k), dk = a.take<T>(rows_k), dv = a.take<T>(rows_k);
    kt = a.take<T>(kt_n), vt = a.take<T>(kt_n);
    qp = a.take<T>(rows_q), dop = a.take<T>(rows_q), dq = a.take<T>(rows_q);
    dd = a.take<T>(d.Tq), ll = a.take<T>(d.Tq), lo = a.take<T>(d.Tq);
    s = a.take<T>(tile), dp = a.take<T>(tile);
  }
};

// Number of key-block chunks per (sequence, kv head) in the backward: enough tasks for a team
// (kMinBackwardTasks), from the shapes alone so results do not depend on the thread count.
constexpr int kMinBackwardTasks = 8;
inline int backward_chunks(const AttentionDims& d, int Bk) {
  const int units = std::max(1, (d.chunk_B > 0 ? d.chunk_B : d.B) * d.n_kv_head);
  const int key_blocks = (d.Tk + Bk - 1) / Bk;
  return std::max(1, std::min(key_blocks, (kMinBackwardTasks + units - 1) / units));
}

// Task (b, g, chunk): key blocks jb = chunk, chunk + n_chunks, ... of kv head g (interleaved, so
// chunks of a causal problem get similar work). It owns those dk/dv rows. With one chunk it also
// owns dq of the group's heads and writes it; otherwise it writes its share of dq to
// dq_part[chunk][b][h][Tq][hd], summed in chunk order afterwards.
template <class T, int W>
TETRAD_INLINE void backward_task(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                                 const T* v, const T* out, const T* lse, const AttentionDims& d,
                                 int off, int b, int g, int chunk, int n_chunks, T* dq_part,
                                 BackwardScratch<T, W>& s) {
  using V = typename VecOf<T, W>::type;
  constexpr int Bq = Tiles<T, W>::kBqBwd, Bk = Tiles<T, W>::kBk, NVK = Bk / W;
  const int hd = d.head_dim, hdp = s.hdp, NVD = hdp / W;
  const int Tq = d.Tq, Tk = d.Tk;
  const int group = d.n_head / d.n_kv_head;
  const T scale = T(1) / std::sqrt(T(hd));
  const T c2 = scale * T(1.4426950408889634074);
  const T log2e = T(1.4426950408889634074);

  // Pack this kv head's K as rows (padded to hdp) and K^T, V^T per key block ([Tk/Bk][hd][Bk],
  // so a block's rows are Bk apart rather than Tk: a Tk stride of a power of two would put a
  // whole block on a few L1 sets). Padding columns (hd..hdp) of row buffers are never read into
  // kept results: they only feed padding columns of the products.
  const int64_t kv_base = b * d.kv_batch_stride + int64_t(g) * hd;
  const int j_first = chunk * Bk, j_step = n_chunks * Bk;
  for (int j0 = j_first; j0 < Tk; j0 += j_step) {
    T* ktb = s.kt + int64_t(j0) * hd;
    T* vtb = s.vt + int64_t(j0) * hd;
    const int nk = std::min(Bk, Tk - j0);
    for (int jj = 0; jj < nk; ++jj) {
      const T* kr = k + kv_base + int64_t(j0 + jj) * d.kv_stride;
      const T* vr = v + kv_base + int64_t(j0 + jj) * d.kv_stride;
      if (jj + kPrefetchRows < nk) prefetch_row(kr + kPrefetchRows * d.kv_stride, hd),
                                   prefetch_row(vr + kPrefetchRows * d.kv_stride, hd);
      std::memcpy(s.kp + int64_t(j0 + jj) * hdp, kr, sizeof(T) * hd);
      for (int e = 0; e < hd; ++e) {
        ktb[e * Bk + jj] = kr[e];
        vtb[e * Bk + jj] = vr[e];
      }
    }
    // Keys past Tk: no product reads their P or dS (the products stop at nk), but the tiles are
    // computed whole, so their K^T and V^T columns must be finite.
    for (int e = 0; e < hd; ++e)
      for (int jj = nk; jj < Bk; ++jj) ktb[e * Bk + jj] = vtb[e * Bk + jj] = T(0);
    std::memset(s.dk + int64_t(j0) * hdp, 0, sizeof(T) * nk * hdp);
    std::memset(s.dv + int64_t(j0) * hdp, 0, sizeof(T) * nk * hdp);
  }
  V iota;
  for (int w = 0; w < W; ++w) iota[w] = T(w);
  // Document mask: each query's first visible key (clamped to [0, Tk]), the same for every head.
  const bool docs = d.doc_start != nullptr;
  if (docs)
    for (int i = 0; i < Tq; ++i)
      s.lo[i] = T(std::clamp<int64_t>(doc_first_key(d, b, i), 0, Tk));

  for (int h = g * group; h < (g + 1) * group; ++h) {
    const int64_t q_base = b * d.q_batch_stride + int64_t(h) * hd;
    const int64_t o_base = b * d.out_batch_stride + int64_t(h) * hd;
    const T* lse_row = lse + (int64_t(b) * d.n_head + h) * Tq;
    for (int i = 0; i < Tq; ++i) {
      const T* qr = q + q_base + int64_t(i) * d.q_stride;
      const T* gr = dout + o_base + int64_t(i) * d.out_stride;
      const T* orow = out + o_base + int64_t(i) * d.out_stride;
      if (i + kPrefetchRows < Tq) prefetch_row(qr + kPrefetchRows * d.q_stride, hd),
                                  prefetch_row(gr + kPrefetchRows * d.out_stride, hd),
                                  prefetch_row(orow + kPrefetchRows * d.out_stride, hd);
      T dot = 0;
      for (int e = 0; e < hd; ++e) {
        s.qp[int64_t(i) * hdp + e] = qr[e];
        s.dop[int64_t(i) * hdp + e] = gr[e];
        dot += gr[e] * orow[e];
      }
      s.dd[i] = dot;
      s.ll[i] = lse_row[i] * log2e;
    }
    std::memset(s.dq, 0, sizeof(T) * Tq * hdp);

    for (int j0 = j_first; j0 < Tk; j0 += j_step) {
      const int nk = std::min(Bk, Tk - j0);
      // Queries at positions >= j0 see this key block.
      for (int i0 = std::max(0, j0 - off); i0 < Tq; i0 += Bq) {
        const int nq = std::min(Bq, Tq - i0);
        // Document mask: skip a query block whose documents all start after this key block.
        T lo_min = T(Tk), lo_max = T(0);
        for (int i = 0; docs && i < nq; ++i)
          lo_min = std::min(lo_min, s.lo[i0 + i]), lo_max = std::max(lo_max, s.lo[i0 + i]);
        if (docs && lo_min > T(j0 + nk - 1)) continue;
        const bool doc_edge = docs && lo_max > T(j0);
        T* sp = s.s;
        T* dpp = s.dp;
        const T* qi = s.qp + int64_t(i0) * hdp;
        const T* doi = s.dop + int64_t(i0) * hdp;
        gemm<T, W>(nq, NVK, hd, sp, Bk, qi, hdp, 1, s.kt + int64_t(j0) * hd, Bk, false);
        gemm<T, W>(nq, NVK, hd, dpp, Bk, doi, hdp, 1, s.vt + int64_t(j0) * hd, Bk, false);
        // Some key of the block lies after the first query's position (includes padded keys).
        const bool diagonal = j0 + Bk - 1 > off + i0;
        for (int i = 0; i < nq; ++i) {
          const T li = s.ll[i0 + i], di = s.dd[i0 + i];
          const T pos = T(off + i0 + i);
          const T lo = docs ? s.lo[i0 + i] : T(0);
          for (int c = 0; c < NVK; ++c) {
            V p = exp2v<T, W>(load<T, W>(sp + i * Bk + c * W) * c2 - li);
            if (diagonal) p = iota + T(j0 + c * W) > pos ? V{} : p;
            if (doc_edge) p = iota + T(j0 + c * W) < lo ? V{} : p;
            store<T, W>(sp + i * Bk + c * W, p);
            store<T, W>(dpp + i * Bk + c * W,
                        p * (load<T, W>(dpp + i * Bk + c * W) - di) * scale);
          }
        }
        gemm<T, W>(nk, NVD, nq, s.dv + int64_t(j0) * hdp, hdp, sp, 1, Bk, doi, hdp,
                         true);
        gemm<T, W>(nk, NVD, nq, s.dk + int64_t(j0) * hdp, hdp, dpp, 1, Bk, qi, hdp,
                         true);
        gemm<T, W>(nq, NVD, nk, s.dq + int64_t(i0) * hdp, hdp, dpp, Bk, 1,
                         s.kp + int64_t(j0) * hdp, hdp, true);
      }
    }
    if (n_chunks == 1) {
      for (int i = 0; i < Tq; ++i)
        std::memcpy(dq + q_base + int64_t(i) * d.q_stride, s.dq + int64_t(i) * hdp,
                    sizeof(T) * hd);
    } else {
      T* part = dq_part + ((int64_t(chunk) * d.B + b) * d.n_head + h) * Tq * hd;
      for (int i = 0; i < Tq; ++i)
        std::memcpy(part + int64_t(i) * hd, s.dq + int64_t(i) * hdp, sizeof(T) * hd);
    }
  }
  for (int j0 = j_first; j0 < Tk; j0 += j_step)
    for (int j = j0; j < std::min(Tk, j0 + Bk); ++j) {
      std::memcpy(dk + kv_base + int64_t(j) * d.kv_stride, s.dk + int64_t(j) * hdp,
                  sizeof(T) * hd);
      std::memcpy(dv + kv_base + int64_t(j) * d.kv_stride, s.dv + int64_t(j) * hdp,
                  sizeof(T) * hd);
    }
}

// dq row (b, i) of every head = sum over chunks of dq_part, in chunk order.
template <class T>
void reduce_dq_row(T* dq, const T* dq_part, const AttentionDims& d, int n_chunks, int64_t row) {
  const int b = int(row / d.Tq), i = int(row % d.Tq), hd = d.head_dim;
  for (int h = 0; h < d.n_head; ++h) {
    T* dst = dq + b * d.q_batch_stride + int64_t(i) * d.q_stride + int64_t(h) * hd;
    const int64_t stride = int64_t(d.B) * d.n_head * d.Tq * hd;
    const T* src = dq_part + ((int64_t(b) * d.n_head + h) * d.Tq + i) * hd;
    for (int e = 0; e < hd; ++e) dst[e] = src[e];
    for (int c = 1; c < n_chunks; ++c)
      for (int e = 0; e < hd; ++e) dst[e] += src[c * stride + e];
  }
}

// ---------------------------------------------------------------------------------------------
// Entry points, one per code path. The OpenMP loop must sit in the target-attributed function
// itself (its outlined body inherits the attribute; a lambda would not).

#define TETRAD_ATTENTION_ENTRIES(NAME, TARGET, VECTOR_BYTES)                                      \
  template <class T>                                                                              \
  TARGET __attribute__((flatten)) void forward_##NAME(T* out, T* lse, const T* q, const T* k,     \
                                                      const T* v, const AttentionDims& d,         \
                                                      int off) {                                  \
    constexpr int W = VECTOR_BYTES / int(sizeof(T));                                              \
    constexpr int Bq = Tiles<T, W>::kBq;                                                          \
    const int nqb = (d.Tq + Bq - 1) / Bq;                                                         \
    const int64_t ntask = int64_t(d.B) * d.n_head * nqb;                                          \
    KvSource<T> kv = kv_in_place(k, v, d);                                                        \
    const int64_t kv_rows = int64_t(d.B) * d.n_kv_head * d.Tk;                                    \
    T *kbuf = nullptr, *vbuf = nullptr;                                                           \
    if (d.Tq >= kPackMinQueries) {                                                                \
      tls_shared_arena.reserve(2 * Arena::bytes_for<T>(kv_rows * d.head_dim));                    \
      kbuf = tls_shared_arena.take<T>(kv_rows * d.head_dim);                                      \
      vbuf = tls_shared_arena.take<T>(kv_rows * d.head_dim);                                      \
      kv = {kbuf, vbuf, d.head_dim, int64_t(d.n_kv_head) * d.Tk * d.head_dim,                     \
            int64_t(d.Tk) * d.head_dim, true};                                                    \
    }                                                                                             \
    _Pragma("omp parallel") {                                                                     \
      if (kv.packed) {                                                                            \
        _Pragma("omp for schedule(static)") for (int64_t t = 0; t < kv_rows; ++t)                 \
            pack_kv_rows(kbuf, vbuf, k, v, d, t);                                                 \
      }                                                                                           \
      ForwardScratch<T, W> s(d.head_dim);                                                         \
      /* Head by head, so a head's k/v stay in cache across its tasks; within a head the largest  \
         query blocks (most keys) first. Each task writes only its own rows. */                   \
      _Pragma("omp for schedule(dynamic, 1)") for (int64_t t = 0; t < ntask; ++t) {               \
        const int qb = nqb - 1 - int(t % nqb);                                                    \
        const int bh = int(t / nqb);                                                              \
        forward_task<T, W>(out, lse, q, kv, d, off, bh / d.n_head, bh % d.n_head, qb * Bq, s);  \
      }                                                                                           \
    }                                                                                             \
  }                                                                                               \
  template <class T>                                                                              \
  TARGET __attribute__((flatten)) void backward_##NAME(                                           \
      T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,       \
      const T* lse, const AttentionDims& d, int off) {                                            \
    constexpr int W = VECTOR_BYTES / int(sizeof(T));                                              \
    const int n_chunks = backward_chunks(d, Tiles<T, W>::kBk);                                    \
    const int ntask = d.B * d.n_kv_head * n_chunks;                                               \
    std::unique_ptr<T[], FreeDeleter> dq_part;                                                    \
    if (n_chunks > 1) {                                                                           \
      const size_t bytes = sizeof(T) * n_chunks * size_t(d.B) * d.n_head * d.Tq * d.head_dim;     \
      dq_part.reset(static_cast<T*>(std::aligned_alloc(64, (bytes + 127) / 64 * 64)));            \
      TETRAD_CHECK(dq_part != nullptr, "attention: ", bytes, " bytes for dq partials");          \
    }                                                                                             \
    _Pragma("omp parallel") {                                                                     \
      BackwardScratch<T, W> s(d);                                                                 \
      _Pragma("omp for schedule(dynamic, 1)") for (int t = 0; t < ntask; ++t) {                   \
        const int unit = t / n_chunks;                                                            \
        backward_task<T, W>(dq, dk, dv, dout, q, k, v, out, lse, d, off, unit / d.n_kv_head,      \
                            unit % d.n_kv_head, t % n_chunks, n_chunks, dq_part.get(), s);        \
      }                                                                                           \
      if (n_chunks > 1) {                                                                         \
        _Pragma("omp for schedule(static)") for (int64_t r = 0; r < int64_t(d.B) * d.Tq; ++r)     \
            reduce_dq_row(dq, dq_part.get(), d, n_chunks, r);                                     \
      }                                                                                           \
    }                                                                                             \
  }

TETRAD_ATTENTION_ENTRIES(portable, , 16)
TETRAD_ATTENTION_ENTRIES(avx2, TETRAD_AVX2, 32)
TETRAD_ATTENTION_ENTRIES(avx512, TETRAD_AVX512, 64)

void check_dims(const AttentionDims& d, int64_t q_offset) {
  TETRAD_CHECK(d.B >= 0 && d.Tq >= 0 && d.Tk >= 0, "attention: need B, Tq, Tk >= 0, got B=", d.B,
               " Tq=", d.Tq, " Tk=", d.Tk);
  // Bad offsets are the caller's input (AttentionArgs' offsets): an Error, not an invariant.
  constexpr int64_t kMaxPos = std::numeric_limits<int>::max() / 2;
  if (q_offset + d.Tq > kMaxPos || q_offset - d.Tk < -kMaxPos)
    fail("attention: q_offset ", q_offset, " (Tq ", d.Tq, ", Tk ", d.Tk,
         ") is past the kernel's int positions (|q_offset| + Tq + Tk up to ", kMaxPos, ")");
  if (d.Tk == 0 && d.Tq > 0)
    fail("attention: ", d.Tq, " queries and no keys (Tk = 0): every query needs at least key 0");
  TETRAD_CHECK(d.n_head > 0 && d.n_kv_head > 0 && d.n_head % d.n_kv_head == 0,
               "attention: n_head=", d.n_head, " must be a multiple of n_kv_head=", d.n_kv_head);
  TETRAD_CHECK(d.head_dim > 0, "attention: head_dim=", d.head_dim);
  TETRAD_CHECK(d.q_stride >= int64_t(d.n_head) * d.head_dim &&
                   d.out_stride >= int64_t(d.n_head) * d.head_dim &&
                   d.kv_stride >= int64_t(d.n_kv_head) * d.head_dim,
               "attention: a row stride is shorter than its row (q ", d.q_stride, ", kv ",
               d.kv_stride, ", out ", d.out_stride, ")");
}

}  // namespace

double attention_forward_flops(const AttentionDims& d) {
  return attention_forward_flops(d, int64_t(d.Tk) - d.Tq);
}

double attention_forward_flops(const AttentionDims& d, int64_t q_offset) {
  if (q_offset < 0) {  // the first -q_offset queries see no key; the rest start at key 0
    AttentionDims seen = d;
    seen.Tq = int(std::max<int64_t>(0, d.Tq + q_offset));
    return attention_forward_flops(seen, 0);
  }
  // Queries 0..n_tri-1 end inside the key block (a triangle after q_offset full columns); the
  // rest see all Tk keys.
  const double n_tri = double(std::clamp<int64_t>(int64_t(d.Tk) - q_offset, 0, d.Tq));
  const double pairs = n_tri * double(q_offset) + 0.5 * n_tri * n_tri + (d.Tq - n_tri) * d.Tk;
  return 4.0 * pairs * d.head_dim * d.n_head * d.B;
}

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionDims& d,
                       int64_t q_offset, AttentionPath path) {
  check_dims(d, q_offset);
  TETRAD_CHECK(attention_path_supported(path), "attention path ", attention_path_name(path),
               " not supported on this CPU");
  if (d.B == 0 || d.Tq == 0) return;
  const int off = int(q_offset);
  switch (path) {
    case AttentionPath::kPortable: forward_portable(out, lse, q, k, v, d, off); break;
    case AttentionPath::kAvx2: forward_avx2(out, lse, q, k, v, d, off); break;
    case AttentionPath::kAvx512: forward_avx512(out, lse, q, k, v, d, off); break;
  }
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const AttentionDims& d, int64_t q_offset,
                        AttentionPath path) {
  check_dims(d, q_offset);
  TETRAD_CHECK(attention_path_supported(path), "attention path ", attention_path_name(path),
               " not supported on this CPU");
  TETRAD_CHECK(lse != nullptr || d.Tq == 0, "attention_backward needs the forward's lse");
  if (d.B == 0) return;
  const int off = int(q_offset);
  switch (path) {
    case AttentionPath::kPortable: backward_portable(dq, dk, dv, dout, q, k, v, out, lse, d, off); break;
    case AttentionPath::kAvx2: backward_avx2(dq, dk, dv, dout, q, k, v, out, lse, d, off); break;
    case AttentionPath::kAvx512: backward_avx512(dq, dk, dv, dout, q, k, v, out, lse, d, off); break;
  }
}

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionDims& d,
                       AttentionPath path) {
  TETRAD_CHECK(d.Tk >= d.Tq, "attention: need Tk >= Tq without a q_offset, got Tq=", d.Tq,
               " Tk=", d.Tk);
  attention_forward(out, lse, q, k, v, d, int64_t(d.Tk) - d.Tq, path);
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const AttentionDims& d, AttentionPath path) {
  TETRAD_CHECK(d.Tk >= d.Tq, "attention: need Tk >= Tq without a q_offset, got Tq=", d.Tq,
               " Tk=", d.Tk);
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d, int64_t(d.Tk) - d.Tq, path);
}

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionDims& d,
                       int64_t q_offset) {
  attention_forward(out, lse, q, k, v, d, q_offset, attention_default_path());
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const AttentionDims& d, int64_t q_offset) {
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d, q_offset, attention_default_path());
}

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                       const AttentionDims& d) {
  attention_forward(out, lse, q, k, v, d, attention_default_path());
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const AttentionDims& d) {
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d, attention_default_path());
}

#define TETRAD_INSTANTIATE(T)                                                                   \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*,                      \
                                     const AttentionDims&);                                     \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, const AttentionDims&, \
                                     AttentionPath);                                            \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,       \
                                      const T*, const T*, const AttentionDims&);                \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,       \
                                      const T*, const T*, const AttentionDims&, AttentionPath);  \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, const AttentionDims&, \
                                     int64_t);                                                  \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, const AttentionDims&, \
                                     int64_t, AttentionPath);                                   \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,       \
                                      const T*, const T*, const AttentionDims&, int64_t);       \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,       \
                                      const T*, const T*, const AttentionDims&, int64_t,        \
                                      AttentionPath);
TETRAD_INSTANTIATE(float)
TETRAD_INSTANTIATE(double)

}  // namespace tetrad::kernels
