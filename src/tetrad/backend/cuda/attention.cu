// Flash attention, forward and backward, on the GPU (kernels.hpp, attention_forward/backward).
//
// Own kernels, not cuDNN's fused attention: (1) the backward must be deterministic (the overlap
// and recompute tests compare runs bit for bit, and cuDNN's SDPA backward accumulates dQ with
// atomics unless its slower deterministic mode is asked for); (2) the op table's layout (strided
// rows inside a fused qkv buffer, GQA, an arbitrary query offset into the key block) maps onto
// these kernels directly, where cuDNN's graph needs its own tensor descriptors and a separate
// build per shape; (3) a HIP port is mechanical: the only tensor-core code is the WMMA API, which
// rocWMMA mirrors; (4) no cuDNN (hundreds of MB) to ship to a cluster node. docs/gpu.md says what
// this costs against cuDNN's and FlashAttention-3's Hopper kernels (they use wgmma/TMA).
//
// Structure (FlashAttention-2's loop order): a block of 128 threads owns a tile of BQ queries of
// one head and streams BK-key tiles through shared memory with an online softmax; the score tile
// S, the probabilities P and the output accumulator O live in shared memory (never a [T, T]
// matrix in device memory). The tile products go through one helper, tile_mma, with two bodies:
// fp32 FMA (AttnPath::kF32, exact) and WMMA bf16 tensor cores with fp32 accumulation
// (AttnPath::kBf16). Backward: one kernel per query tile computes dQ over key tiles; another per
// (key tile, kv head) computes dK and dV over the GQA group's query heads and the query tiles
// that see it; each recomputes P from the forward's log-sum-exp. No atomics anywhere.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tetrad/backend/cuda/attention_tiles.hpp"
#include "tetrad/backend/cuda/kernels.hpp"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "the CUDA backend's attention needs sm_80 or newer (bf16 WMMA); set CMAKE_CUDA_ARCHITECTURES"
#endif

namespace tetrad::gpu {
namespace {

constexpr int kAttnThreads = attn::kThreads;  // 4 warps
constexpr int kWarps = kAttnThreads / 32;

template <typename T> struct Elem;
template <> struct Elem<float> {
  static __device__ __forceinline__ float from(float x) { return x; }
  static constexpr int kPad = attn::kF32Pad;
};
template <> struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
  static constexpr int kPad = attn::kBf16Pad;
};
// The kernels' layouts (attention_tiles.hpp) for element type T.
template <typename T, int BQ, int BK, int HDP>
using FwdSmem = attn::FwdLayout<int(sizeof(T)), Elem<T>::kPad, BQ, BK, HDP>;
template <typename T, int BQ, int BK, int HDP>
using DqSmem = attn::DqLayout<int(sizeof(T)), Elem<T>::kPad, BQ, BK, HDP>;
template <typename T, int BQ, int BK, int HDP>
using DkvSmem = attn::DkvLayout<int(sizeof(T)), Elem<T>::kPad, BQ, BK, HDP>;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

// C[M,N] (fp32, ldc) (+)= A[M,K] · B[K,N]. A(m,k) = ACOL ? a[k*lda + m] : a[m*lda + k];
// B(k,n) = BCOL ? b[n*ldb + k] : b[k*ldb + n]. All operands in shared memory; called by all
// threads of the block; no barrier inside (the caller syncs before and after).
template <bool ACOL, bool BCOL, int M, int N, int K>
__device__ __forceinline__ void tile_mma(float* C, int ldc, const float* a, int lda,
                                         const float* b, int ldb, bool accumulate) {
  constexpr int kOut = M * N;
  for (int e = threadIdx.x; e < kOut; e += kAttnThreads) {
    const int m = e / N, n = e % N;
    float acc = accumulate ? C[m * ldc + n] : 0.0f;
#pragma unroll 8
    for (int k = 0; k < K; ++k) {
      const float av = ACOL ? a[k * lda + m] : a[m * lda + k];
      const float bv = BCOL ? b[n * ldb + k] : b[k * ldb + n];
      acc = fmaf(av, bv, acc);
    }
    C[m * ldc + n] = acc;
  }
}
template <bool ACOL, bool BCOL, int M, int N, int K>
__device__ __forceinline__ void tile_mma(float* C, int ldc, const __nv_bfloat16* a, int lda,
                                         const __nv_bfloat16* b, int ldb, bool accumulate) {
  using namespace nvcuda;
  using ALayout = typename std::conditional<ACOL, wmma::col_major, wmma::row_major>::type;
  using BLayout = typename std::conditional<BCOL, wmma::col_major, wmma::row_major>::type;
  constexpr int kFm = M / 16, kFn = N / 16;
  const int warp = threadIdx.x / 32;
  for (int f = warp; f < kFm * kFn; f += kWarps) {
    const int m0 = (f / kFn) * 16, n0 = (f % kFn) * 16;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    if (accumulate)
      wmma::load_matrix_sync(acc, C + m0 * ldc + n0, ldc, wmma::mem_row_major);
    else
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, ALayout> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, BLayout> fb;
      wmma::load_matrix_sync(fa, ACOL ? a + k0 * lda + m0 : a + m0 * lda + k0, lda);
      wmma::load_matrix_sync(fb, BCOL ? b + n0 * ldb + k0 : b + k0 * ldb + n0, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(C + m0 * ldc + n0, acc, ldc, wmma::mem_row_major);
  }
}

__device__ __forceinline__ float warp_max_f(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum_f(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Loads rows [r0, r0 + R) of one head (hd real columns, HDP padded) into a T tile; rows past
// `rows` and columns past hd are zero.
template <typename T, int R, int HDP>
__device__ __forceinline__ void load_tile(T* dst, int ld, const float* src, int64_t row_stride,
                                          int r0, int rows, int hd) {
  for (int e = threadIdx.x; e < R * HDP; e += kAttnThreads) {
    const int r = e / HDP, d = e % HDP;
    float v = 0.0f;
    if (r0 + r < rows && d < hd) v = src[int64_t(r0 + r) * row_stride + d];
    dst[r * ld + d] = Elem<T>::from(v);
  }
}

struct Params {
  const float *q, *k, *v, *o, *dout, *lse_in;
  float *out, *lse, *dq, *dk, *dv;
  int B, Tq, Tk, n_head, n_kv_head, hd;
  int64_t q_offset;
  int64_t q_stride, kv_stride, out_stride, q_bstride, kv_bstride, out_bstride;
  float scale;
  // Document mask (AttnDims::doc_start): null, or the first visible key of query i of sequence
  // b is doc_start[b * doc_bstride + i] - doc_shift.
  const int32_t* doc_start;
  int64_t doc_bstride, doc_shift;
};

// ---- what the forward and both backward kernels share ----
// Where head h of sequence b starts in a strided q / k / v / out buffer.
__device__ __forceinline__ const float* head_rows(const float* base, int b, int64_t bstride, int h,
                                                  int hd) {
  return base + b * bstride + int64_t(h) * hd;
}
// One past the last key the query tile [q0, q0 + BQ) can see.
template <int BQ>
__device__ __forceinline__ int64_t keys_seen_by(const Params& P, int q0) {
  const int64_t last_q = q0 + BQ - 1 < P.Tq - 1 ? q0 + BQ - 1 : P.Tq - 1;
  const int64_t kend = P.q_offset + last_q + 1;
  return kend < P.Tk ? kend : P.Tk;
}
// The document mask's first key query q of sequence b sees (0 without a mask).
__device__ __forceinline__ int64_t doc_first(const Params& P, int b, int64_t q) {
  return P.doc_start ? int64_t(P.doc_start[b * P.doc_bstride + q]) - P.doc_shift : 0;
}
// Whether query row i of the tile at q0 sees key kj (causal, after the query offset, inside the
// query's document).
__device__ __forceinline__ bool sees(const Params& P, int b, int q0, int i, int64_t kj) {
  return q0 + i < P.Tq && kj < P.Tk && kj <= P.q_offset + q0 + i &&
         (!P.doc_start || kj >= doc_first(P, b, q0 + i));
}
// The first key any query of the tile [q0, q0 + BQ) sees under the document mask (0 without
// one). Every thread computes the same value from global memory (the tile's BQ entries, one
// cached run), so branches on it are uniform.
template <int BQ>
__device__ __forceinline__ int64_t doc_first_of_tile(const Params& P, int b, int q0) {
  if (!P.doc_start) return 0;
  int64_t lo = INT64_MAX;
  for (int i = 0; i < BQ && q0 + i < P.Tq; ++i) {
    const int64_t f = doc_first(P, b, q0 + i);
    lo = f < lo ? f : lo;
  }
  return lo < 0 ? 0 : lo;
}

// D[i] = Σ_d dout[i, d] * out[i, d] for the rows of a query tile (one warp per row).
template <int BQ>
__device__ __forceinline__ void row_dots(float* D, const float* dob, const float* ob,
                                         int64_t stride, int q0, int Tq, int hd) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < BQ; i += kWarps) {
    float acc = 0.0f;
    if (q0 + i < Tq)
      for (int d = lane; d < hd; d += 32)
        acc += dob[int64_t(q0 + i) * stride + d] * ob[int64_t(q0 + i) * stride + d];
    acc = warp_sum_f(acc);
    if (lane == 0) D[i] = acc;
  }
}
// The backward's per-row statistics of the query tile at q0 of head h: the forward's lse
// (INFINITY past Tq, so P recomputes to 0 there) and D = rowsum(dO * O).
template <int BQ>
__device__ __forceinline__ void load_row_stats(float* lse, float* D, const Params& P, int b, int h,
                                               int q0) {
  for (int i = threadIdx.x; i < BQ; i += kAttnThreads)
    lse[i] = q0 + i < P.Tq ? P.lse_in[(int64_t(b) * P.n_head + h) * P.Tq + q0 + i] : INFINITY;
  row_dots<BQ>(D, head_rows(P.dout, b, P.out_bstride, h, P.hd),
               head_rows(P.o, b, P.out_bstride, h, P.hd), P.out_stride, q0, P.Tq, P.hd);
}
// P of row i, column j of the key tile at k0, recomputed from the raw score and the forward's lse.
__device__ __forceinline__ float recomputed_p(const Params& P, float score, float lse, int b,
                                              int q0, int i, int64_t kj) {
  return sees(P, b, q0, i, kj) ? expf(score * P.scale - lse) : 0.0f;
}
// dst rows [r0, r0 + R) (those below `rows`, hd real columns) = acc * scale.
template <int R, int HDP>
__device__ __forceinline__ void store_rows(float* dst, int64_t stride, const float* acc, int ld,
                                           int r0, int rows, int hd, float scale) {
  for (int e = threadIdx.x; e < R * HDP; e += kAttnThreads) {
    const int r = e / HDP, d = e % HDP;
    if (r0 + r < rows && d < hd) dst[int64_t(r0 + r) * stride + d] = acc[r * ld + d] * scale;
  }
}
__device__ __forceinline__ void zero(float* x, int n) {
  for (int e = threadIdx.x; e < n; e += kAttnThreads) x[e] = 0.0f;
}

// The query tile a forward or dQ block owns (blockIdx: query tile, head, sequence), its kv head
// and where that kv head's keys and values start.
struct QueryTile {
  int q0, h, b, kvh;
  const float *kb, *vb;
};
template <int BQ>
__device__ __forceinline__ QueryTile query_tile(const Params& P) {
  QueryTile t;
  t.q0 = blockIdx.x * BQ;
  t.h = blockIdx.y;
  t.b = blockIdx.z;
  t.kvh = t.h / (P.n_head / P.n_kv_head);
  t.kb = head_rows(P.k, t.b, P.kv_bstride, t.kvh, P.hd);
  t.vb = head_rows(P.v, t.b, P.kv_bstride, t.kvh, P.hd);
  return t;
}
// Key tile k0's K and V rows into shared memory, between barriers (the previous tile's products
// are done with them before, every thread sees them after).
template <typename T, int BK, int HDP>
__device__ __forceinline__ void load_kv_tile(T* Ks, T* Vs, int ldt, const QueryTile& t,
                                             const Params& P, int k0) {
  __syncthreads();
  load_tile<T, BK, HDP>(Ks, ldt, t.kb, P.kv_stride, k0, P.Tk, P.hd);
  load_tile<T, BK, HDP>(Vs, ldt, t.vb, P.kv_stride, k0, P.Tk, P.hd);
  __syncthreads();
}

// ---- forward ----
template <typename T, int BQ, int BK, int HDP>
__global__ void __launch_bounds__(kAttnThreads) k_attn_fwd(Params P) {
  using L = FwdSmem<T, BQ, BK, HDP>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem + L::q);
  T* Ks = reinterpret_cast<T*>(smem + L::k);
  T* Vs = reinterpret_cast<T*>(smem + L::v);
  float* S = reinterpret_cast<float*>(smem + L::s);
  T* Ps = reinterpret_cast<T*>(smem + L::p);
  float* O = reinterpret_cast<float*>(smem + L::o);
  float* mrow = reinterpret_cast<float*>(smem + L::st);
  float* lrow = mrow + BQ;

  const QueryTile qt = query_tile<BQ>(P);
  const int q0 = qt.q0, h = qt.h, b = qt.b;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_tile<T, BQ, HDP>(Qs, L::ldt, head_rows(P.q, b, P.q_bstride, h, P.hd), P.q_stride, q0, P.Tq,
                        P.hd);
  zero(O, BQ * L::ldo);
  for (int i = threadIdx.x; i < BQ; i += kAttnThreads) {
    mrow[i] = -INFINITY;
    lrow[i] = 0.0f;
  }
  const int64_t kend = keys_seen_by<BQ>(P, q0);
  // Key tiles wholly before the tile's documents are skipped (starting at a multiple of BK, so
  // the tiles are the unmasked kernel's).
  const int64_t kfirst = doc_first_of_tile<BQ>(P, b, q0) / BK * BK;
  for (int k0 = int(kfirst < kend ? kfirst : kend); k0 < kend; k0 += BK) {
    load_kv_tile<T, BK, HDP>(Ks, Vs, L::ldt, qt, P, k0);  // after the last tile's products
    tile_mma<false, true, BQ, BK, HDP>(S, L::lds, Qs, L::ldt, Ks, L::ldt, false);
    __syncthreads();
    for (int i = warp; i < BQ; i += kWarps) {
      float mx = -INFINITY;
      for (int j = lane; j < BK; j += 32) {
        const float sv = sees(P, b, q0, i, k0 + j) ? S[i * L::lds + j] * P.scale : -INFINITY;
        S[i * L::lds + j] = sv;
        mx = fmaxf(mx, sv);
      }
      mx = warp_max_f(mx);
      const float mold = mrow[i];
      const float mnew = fmaxf(mold, mx);
      const float alpha = mnew == -INFINITY ? 1.0f : expf(mold - mnew);
      float sum = 0.0f;
      for (int j = lane; j < BK; j += 32) {
        const float sv = S[i * L::lds + j];
        const float p = sv == -INFINITY ? 0.0f : expf(sv - mnew);
        const T pt = Elem<T>::from(p);
        Ps[i * L::ldp + j] = pt;
        sum += to_f(pt);  // the normaliser counts what P·V multiplies with
      }
      sum = warp_sum_f(sum);
      for (int d = lane; d < HDP; d += 32) O[i * L::ldo + d] *= alpha;
      __syncwarp();
      if (lane == 0) {
        lrow[i] = lrow[i] * alpha + sum;
        mrow[i] = mnew;
      }
    }
    __syncthreads();
    tile_mma<false, false, BQ, HDP, BK>(O, L::ldo, Ps, L::ldp, Vs, L::ldt, true);
  }
  __syncthreads();
  float* ob = P.out + b * P.out_bstride + int64_t(h) * P.hd;
  for (int e = threadIdx.x; e < BQ * HDP; e += kAttnThreads) {
    const int i = e / HDP, d = e % HDP;
    if (q0 + i < P.Tq && d < P.hd) {
      const float l = lrow[i];
      ob[int64_t(q0 + i) * P.out_stride + d] = l > 0.0f ? O[i * L::ldo + d] / l : 0.0f;
    }
  }
  if (P.lse)
    for (int i = threadIdx.x; i < BQ; i += kAttnThreads)
      if (q0 + i < P.Tq)
        P.lse[(int64_t(b) * P.n_head + h) * P.Tq + q0 + i] = mrow[i] + logf(lrow[i]);
}

// ---- backward: dQ (per query tile, over the key tiles it sees) ----
template <typename T, int BQ, int BK, int HDP>
__global__ void __launch_bounds__(kAttnThreads) k_attn_bwd_dq(Params P) {
  using L = DqSmem<T, BQ, BK, HDP>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem + L::q);
  T* dOs = reinterpret_cast<T*>(smem + L::dout);
  T* Ks = reinterpret_cast<T*>(smem + L::k);
  T* Vs = reinterpret_cast<T*>(smem + L::v);
  float* S = reinterpret_cast<float*>(smem + L::s);
  float* dP = reinterpret_cast<float*>(smem + L::dp);
  T* dS = reinterpret_cast<T*>(smem + L::ds);
  float* dQ = reinterpret_cast<float*>(smem + L::dq);
  float* lse = reinterpret_cast<float*>(smem + L::st);
  float* D = lse + BQ;

  const QueryTile qt = query_tile<BQ>(P);
  const int q0 = qt.q0, h = qt.h, b = qt.b;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_tile<T, BQ, HDP>(Qs, L::ldt, head_rows(P.q, b, P.q_bstride, h, P.hd), P.q_stride, q0, P.Tq,
                        P.hd);
  load_tile<T, BQ, HDP>(dOs, L::ldt, head_rows(P.dout, b, P.out_bstride, h, P.hd), P.out_stride,
                        q0, P.Tq, P.hd);
  zero(dQ, BQ * L::ldo);
  load_row_stats<BQ>(lse, D, P, b, h, q0);

  const int64_t kend = keys_seen_by<BQ>(P, q0);
  const int64_t kfirst = doc_first_of_tile<BQ>(P, b, q0) / BK * BK;  // as the forward's
  for (int k0 = int(kfirst < kend ? kfirst : kend); k0 < kend; k0 += BK) {
    load_kv_tile<T, BK, HDP>(Ks, Vs, L::ldt, qt, P, k0);
    tile_mma<false, true, BQ, BK, HDP>(S, L::lds, Qs, L::ldt, Ks, L::ldt, false);
    tile_mma<false, true, BQ, BK, HDP>(dP, L::lds, dOs, L::ldt, Vs, L::ldt, false);
    __syncthreads();
    for (int i = warp; i < BQ; i += kWarps)
      for (int j = lane; j < BK; j += 32) {
        const float p = recomputed_p(P, S[i * L::lds + j], lse[i], b, q0, i, k0 + j);
        dS[i * L::ldp + j] = Elem<T>::from(p * (dP[i * L::lds + j] - D[i]));
      }
    __syncthreads();
    tile_mma<false, false, BQ, HDP, BK>(dQ, L::ldo, dS, L::ldp, Ks, L::ldt, true);
  }
  __syncthreads();
  store_rows<BQ, HDP>(P.dq + b * P.q_bstride + int64_t(h) * P.hd, P.q_stride, dQ, L::ldo, q0,
                      P.Tq, P.hd, P.scale);
}

// ---- backward: dK, dV (per key tile and kv head, over the group's query heads and tiles) ----
template <typename T, int BQ, int BK, int HDP>
__global__ void __launch_bounds__(kAttnThreads) k_attn_bwd_dkv(Params P) {
  using L = DkvSmem<T, BQ, BK, HDP>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Ks = reinterpret_cast<T*>(smem + L::k);
  T* Vs = reinterpret_cast<T*>(smem + L::v);
  T* Qs = reinterpret_cast<T*>(smem + L::q);
  T* dOs = reinterpret_cast<T*>(smem + L::dout);
  float* S = reinterpret_cast<float*>(smem + L::s);   // scores, then dP
  T* Ps = reinterpret_cast<T*>(smem + L::p);          // P, then dS
  float* dK = reinterpret_cast<float*>(smem + L::dk);
  float* dV = reinterpret_cast<float*>(smem + L::dv);
  float* lse = reinterpret_cast<float*>(smem + L::st);
  float* D = lse + BQ;

  const int k0 = blockIdx.x * BK, kvh = blockIdx.y, b = blockIdx.z;
  const int group = P.n_head / P.n_kv_head;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_tile<T, BK, HDP>(Ks, L::ldt, head_rows(P.k, b, P.kv_bstride, kvh, P.hd), P.kv_stride, k0,
                        P.Tk, P.hd);
  load_tile<T, BK, HDP>(Vs, L::ldt, head_rows(P.v, b, P.kv_bstride, kvh, P.hd), P.kv_stride, k0,
                        P.Tk, P.hd);
  zero(dK, BK * L::ldo);
  zero(dV, BK * L::ldo);
  // First query that sees key k0: position q_offset + i >= k0.
  int64_t qfirst = int64_t(k0) - P.q_offset;
  if (qfirst < 0) qfirst = 0;
  const int qt0 = int(qfirst / BQ) * BQ;
  for (int hh = 0; hh < group; ++hh) {
    const int h = kvh * group + hh;
    for (int q0 = qt0; q0 < P.Tq; q0 += BQ) {
      // Document mask: a query tile whose documents all start after this key tile sees none of
      // it (the same value in every thread: the branch is uniform, barriers stay paired).
      if (P.doc_start && doc_first_of_tile<BQ>(P, b, q0) >= int64_t(k0) + BK) continue;
      __syncthreads();
      load_tile<T, BQ, HDP>(Qs, L::ldt, head_rows(P.q, b, P.q_bstride, h, P.hd), P.q_stride, q0,
                            P.Tq, P.hd);
      load_tile<T, BQ, HDP>(dOs, L::ldt, head_rows(P.dout, b, P.out_bstride, h, P.hd),
                            P.out_stride, q0, P.Tq, P.hd);
      load_row_stats<BQ>(lse, D, P, b, h, q0);
      __syncthreads();
      tile_mma<false, true, BQ, BK, HDP>(S, L::lds, Qs, L::ldt, Ks, L::ldt, false);
      __syncthreads();
      for (int i = warp; i < BQ; i += kWarps)
        for (int j = lane; j < BK; j += 32)
          Ps[i * L::ldp + j] =
              Elem<T>::from(recomputed_p(P, S[i * L::lds + j], lse[i], b, q0, i, k0 + j));
      __syncthreads();
      // dV += Pᵀ dO; dP = dO Vᵀ (into S, which is free now).
      tile_mma<true, false, BK, HDP, BQ>(dV, L::ldo, Ps, L::ldp, dOs, L::ldt, true);
      tile_mma<false, true, BQ, BK, HDP>(S, L::lds, dOs, L::ldt, Vs, L::ldt, false);
      __syncthreads();
      for (int e = threadIdx.x; e < BQ * BK; e += kAttnThreads) {
        const int i = e / BK, j = e % BK;
        const float p = to_f(Ps[i * L::ldp + j]);
        Ps[i * L::ldp + j] = Elem<T>::from(p * (S[i * L::lds + j] - D[i]));
      }
      __syncthreads();
      tile_mma<true, false, BK, HDP, BQ>(dK, L::ldo, Ps, L::ldp, Qs, L::ldt, true);
    }
  }
  __syncthreads();
  const int64_t kvoff = b * P.kv_bstride + int64_t(kvh) * P.hd;
  store_rows<BK, HDP>(P.dk + kvoff, P.kv_stride, dK, L::ldo, k0, P.Tk, P.hd, P.scale);
  store_rows<BK, HDP>(P.dv + kvoff, P.kv_stride, dV, L::ldo, k0, P.Tk, P.hd, 1.0f);
}

// ---- merge of two partial results (attention_merge): one warp per (sequence, head, query) ----
// The row's weights in double (as the CPU's kernel), applied in fp32. Each warp owns its row:
// every lane reads the row's two lse values before lane 0 overwrites lse (the __syncwarp).
__global__ void k_attn_merge(float* out, float* lse, const float* out_b, const float* lse_b,
                             int64_t rows, int Tq, int nh, int hd, int64_t stride,
                             int64_t bstride) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; row < rows;
       row += warps) {  // row = (b * nh + h) * Tq + i: lse's own index
    const int64_t i = row % Tq, bh = row / Tq, b = bh / nh;
    const int h = int(bh % nh);
    const float la = lse[row], lb = lse_b[row];
    if (lb == -INFINITY) continue;  // nothing seen in the second block: row unchanged
    float* o = out + b * bstride + i * stride + int64_t(h) * hd;
    const float* ob = out_b + b * bstride + i * stride + int64_t(h) * hd;
    float fa = 0.0f, fb = 1.0f, l = lb;  // nothing seen before: the second block's result
    if (la != -INFINITY) {
      const double m = fmax(double(la), double(lb));
      const double wa = exp(double(la) - m), wb = exp(double(lb) - m), sum = wa + wb;
      fa = float(wa / sum), fb = float(wb / sum), l = float(m + log(sum));
    }
    for (int d = lane; d < hd; d += 32) o[d] = la == -INFINITY ? ob[d] : fa * o[d] + fb * ob[d];
    __syncwarp();
    if (lane == 0) lse[row] = l;
  }
}

// Asks for the kernel's shared memory, after checking that this device can give it: a card
// whose blocks cannot hold the tiles (sm_86 / sm_89 allow 99 KB) gets an Error naming it and
// what it would need, not cudaFuncSetAttribute's "invalid argument".
template <typename Kernel>
void launch(Kernel k, dim3 grid, size_t smem, const Params& p, bool bf16, gpuStream_t s,
            const char* name) {
  int dev = 0, optin = 0;
  GPU_CHECK(cudaGetDevice(&dev));
  GPU_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (smem > size_t(optin)) {
    const DeviceInfo info = device_info(dev);
    fail(attn::smem_refusal(size_t(optin), p.hd, bf16,
                            detail::concat(info.name, " (compute capability ", info.cc_major, ".",
                                           info.cc_minor, ", device ", dev, ")")),
         " [", name, "]");
  }
  GPU_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  k<<<grid, kAttnThreads, smem, s>>>(p);
  gpu_check_launch(name);
}

template <typename T, int BQ, int BK, int HDP>
void run_fwd(const Params& p, gpuStream_t s) {
  constexpr bool bf16 = sizeof(T) == 2;
  dim3 grid(unsigned((p.Tq + BQ - 1) / BQ), unsigned(p.n_head), unsigned(p.B));
  launch(k_attn_fwd<T, BQ, BK, HDP>, grid, FwdSmem<T, BQ, BK, HDP>::bytes, p, bf16, s,
         "attention_forward");
}
template <typename T, int BQ, int BK, int HDP>
void run_bwd(const Params& p, gpuStream_t s) {
  constexpr bool bf16 = sizeof(T) == 2;
  dim3 gq(unsigned((p.Tq + BQ - 1) / BQ), unsigned(p.n_head), unsigned(p.B));
  launch(k_attn_bwd_dq<T, BQ, BK, HDP>, gq, DqSmem<T, BQ, BK, HDP>::bytes, p, bf16, s,
         "attention_backward(dq)");
  dim3 gk(unsigned((p.Tk + BK - 1) / BK), unsigned(p.n_kv_head), unsigned(p.B));
  launch(k_attn_bwd_dkv<T, BQ, BK, HDP>, gk, DkvSmem<T, BQ, BK, HDP>::bytes, p, bf16, s,
         "attention_backward(dkv)");
}

// Head dims are padded to the next of 16, 32, 64, 128 (zeros in shared memory).
template <bool Bwd>
void dispatch(const Params& p, AttnPath path, gpuStream_t s) {
  auto go = [&](auto tag_hdp) {
    constexpr int HDP = decltype(tag_hdp)::value;
    constexpr int B16 = attn::kBf16Tile, F32 = attn::kF32Tile;
    if (path == AttnPath::kBf16) {
      if constexpr (Bwd) run_bwd<__nv_bfloat16, B16, B16, HDP>(p, s);
      else run_fwd<__nv_bfloat16, B16, B16, HDP>(p, s);
    } else {
      if constexpr (Bwd) run_bwd<float, F32, F32, HDP>(p, s);
      else run_fwd<float, F32, F32, HDP>(p, s);
    }
  };
  switch (attn::padded_head_dim(p.hd)) {
    case 16: go(std::integral_constant<int, 16>{}); break;
    case 32: go(std::integral_constant<int, 32>{}); break;
    case 64: go(std::integral_constant<int, 64>{}); break;
    case 128: go(std::integral_constant<int, 128>{}); break;
    default: fail("CUDA attention: head_dim ", p.hd, " is not supported (at most 128)");
  }
}

Params make_params(const AttnDims& d) {
  if (d.B <= 0 || d.Tq <= 0 || d.Tk <= 0 || d.n_head <= 0 || d.n_kv_head <= 0 ||
      d.head_dim <= 0 || d.n_head % d.n_kv_head != 0)
    fail("CUDA attention: bad dims B=", d.B, " Tq=", d.Tq, " Tk=", d.Tk, " n_head=", d.n_head,
         " n_kv_head=", d.n_kv_head, " head_dim=", d.head_dim,
         " (all > 0, n_head a multiple of n_kv_head)");
  Params p{};
  p.B = d.B;
  p.Tq = d.Tq;
  p.Tk = d.Tk;
  p.n_head = d.n_head;
  p.n_kv_head = d.n_kv_head;
  p.hd = d.head_dim;
  p.q_offset = d.q_offset;  // relative to key 0, any sign (AttnDims)
  p.q_stride = d.q_stride;
  p.kv_stride = d.kv_stride;
  p.out_stride = d.out_stride;
  p.q_bstride = d.q_batch_stride;
  p.kv_bstride = d.kv_batch_stride;
  p.out_bstride = d.out_batch_stride;
  p.scale = float(1.0 / std::sqrt(double(d.head_dim)));
  p.doc_start = d.doc_start;
  p.doc_bstride = d.doc_batch_stride;
  p.doc_shift = d.doc_shift;
  return p;
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttnDims& d, AttnPath path, gpuStream_t s) {
  Params p = make_params(d);
  p.out = out;
  p.lse = lse;
  p.q = q;
  p.k = k;
  p.v = v;
  dispatch<false>(p, path, s);
}

void attention_merge(float* out, float* lse, const float* out_b, const float* lse_b,
                     const AttnDims& d, gpuStream_t s) {
  if (d.B < 0 || d.Tq < 0 || d.n_head <= 0 || d.head_dim <= 0 ||
      d.out_stride < int64_t(d.n_head) * d.head_dim)
    fail("CUDA attention_merge: bad dims B=", d.B, " Tq=", d.Tq, " n_head=", d.n_head,
         " head_dim=", d.head_dim, " out_stride=", d.out_stride);
  const int64_t rows = int64_t(d.B) * d.n_head * d.Tq;
  if (rows == 0) return;
  constexpr int kThreadsMerge = 256;  // 8 rows per block
  int64_t blocks = (rows * 32 + kThreadsMerge - 1) / kThreadsMerge;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;  // the warp-stride loop covers the rest
  k_attn_merge<<<unsigned(blocks), kThreadsMerge, 0, s>>>(out, lse, out_b, lse_b, rows, d.Tq,
                                                          d.n_head, d.head_dim, d.out_stride,
                                                          d.out_batch_stride);
  gpu_check_launch("attention_merge");
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttnDims& d, AttnPath path, gpuStream_t s) {
  if (!lse) fail("CUDA attention backward needs the forward's log-sum-exp (lse is null)");
  Params p = make_params(d);
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.dout = dout;
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = out;
  p.lse_in = lse;
  dispatch<true>(p, path, s);
}

}  // namespace tetrad::gpu
