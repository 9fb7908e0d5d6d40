// CUDA kernels (kernels.hpp): elementwise, norms, rotary, embedding, cross-entropy, AdamW, sums
// of squares. Attention is in attention.cu.
//
// Portability: only the CUDA runtime's launch syntax, __shfl_xor_sync and __syncthreads are used
// (HIP has the same with 64-wide wavefronts: kWarp below and the shuffle masks are the places a
// port touches). Sizes are int64_t; grids stay under 2^31 blocks by grid-stride loops.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tetrad/backend/cuda/kernels.hpp"

namespace tetrad::gpu {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;

inline int grid_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  if (b > 65535LL * 16) b = 65535LL * 16;  // grid-stride loops cover the rest
  return int(b < 1 ? 1 : b);
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T part[32];
  const int lane = threadIdx.x % kWarp, wid = threadIdx.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // part may still be read by a previous call
  if (lane == 0) part[wid] = v;
  __syncthreads();
  const int nw = blockDim.x / kWarp;
  T r = lane < nw ? part[lane] : T(0);
  return warp_sum(r);
}

// The CPU's constants (backend/cpu/ops.cpp): sqrt(2/pi) and 0.044715.
constexpr float kGeluS = 0.7978845608028654f;
constexpr float kGeluA = 0.044715f;

__global__ void k_gelu_fwd(float* out, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    out[i] = 0.5f * v * (1.0f + tanhf(kGeluS * (v + kGeluA * v * v * v)));
  }
}
__global__ void k_gelu_bwd(float* dx, const float* dout, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float th = tanhf(kGeluS * (v + kGeluA * v * v * v));
    const float local =
        0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * kGeluS * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = local * dout[i];
  }
}
__global__ void k_swiglu_fwd(float* out, const float* gu, int64_t ntok, int64_t F) {
  const int64_t n = ntok * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / F, f = i - t * F;
    const float g = gu[t * 2 * F + f], u = gu[t * 2 * F + F + f];
    const float sg = 1.0f / (1.0f + expf(-g));
    out[i] = g * sg * u;
  }
}
__global__ void k_swiglu_bwd(float* dgu, const float* dout, const float* gu, int64_t ntok,
                             int64_t F) {
  const int64_t n = ntok * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / F, f = i - t * F;
    const float g = gu[t * 2 * F + f], u = gu[t * 2 * F + F + f];
    const float sg = 1.0f / (1.0f + expf(-g));
    const float d = dout[i];
    dgu[t * 2 * F + f] = d * u * sg * (1.0f + g * (1.0f - sg));
    dgu[t * 2 * F + F + f] = d * g * sg;
  }
}
__global__ void k_add(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}
__global__ void k_add_bias(float* out, const float* bias, int64_t ntok, int64_t OC, int64_t ld) {
  const int64_t n = ntok * OC;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / OC, c = i - t * OC;
    out[t * ld + c] += bias[c];
  }
}

// ---- deterministic column sums: stage 1 sums row chunks per column into scratch[chunk, col],
// stage 2 adds the chunks in order into the destination. ----
constexpr int kColRows = 256;  // rows per chunk
inline int64_t col_chunks(int64_t ntok) { return (ntok + kColRows - 1) / kColRows; }

// value(t, c) for the sums below.
struct ColDout {
  const float* d;
  int64_t ld;
  __device__ float operator()(int64_t t, int64_t c) const { return d[t * ld + c]; }
};
struct ColDoutN {  // dout * normalised x
  const float* d;
  const float* x;
  const float* mean;
  const float* rstd;
  int64_t ld;
  __device__ float operator()(int64_t t, int64_t c) const {
    const float m = mean ? mean[t] : 0.0f;
    return d[t * ld + c] * ((x[t * ld + c] - m) * rstd[t]);
  }
};
// blockDim (32, 8): 32 columns, 8 row lanes; grid (ceil(cols/32), chunks).
template <typename F>
__global__ void k_colsum_stage1(float* scratch, F f, int64_t ntok, int64_t cols) {
  __shared__ float part[8][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t t0 = blockIdx.y * int64_t(kColRows);
  const int64_t t1 = t0 + kColRows < ntok ? t0 + kColRows : ntok;
  float acc = 0.0f;
  if (c < cols)
    for (int64_t t = t0 + threadIdx.y; t < t1; t += 8) acc += f(t, c);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float s = 0.0f;
    for (int r = 0; r < 8; ++r) s += part[r][threadIdx.x];
    scratch[blockIdx.y * cols + c] = s;
  }
}
__global__ void k_colsum_stage2(float* dst, const float* scratch, int64_t chunks, int64_t cols) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += scratch[k * cols + c];
  dst[c] += s;
}
template <typename F>
void column_sum_into(float* dst, F f, int64_t ntok, int64_t cols, float* scratch, gpuStream_t s) {
  if (ntok <= 0 || cols <= 0) return;
  const int64_t chunks = col_chunks(ntok);
  dim3 grid(unsigned((cols + 31) / 32), unsigned(chunks));
  k_colsum_stage1<<<grid, dim3(32, 8), 0, s>>>(scratch, f, ntok, cols);
  gpu_check_launch("colsum_stage1");
  k_colsum_stage2<<<unsigned((cols + 255) / 256), 256, 0, s>>>(dst, scratch, chunks, cols);
  gpu_check_launch("colsum_stage2");
}

__device__ __forceinline__ uint16_t f2bf(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

__global__ void k_cast_f2b(uint16_t* out, int64_t ldo, const float* in, int64_t ldi, int64_t rows,
                           int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    out[r * ldo + c] = f2bf(in[r * ldi + c]);
  }
}
__global__ void k_cast_b2f(float* out, int64_t ldo, const uint16_t* in, int64_t ldi, int64_t rows,
                           int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    out[r * ldo + c] = bf2f(in[r * ldi + c]);
  }
}

// ---- norms: one block per row ----
__global__ void k_norm_row_sums(double* stat, int64_t stride, const float* x, const float* mean,
                                bool square, int64_t Cx) {
  const int64_t t = blockIdx.x;
  const float* r = x + t * Cx;
  double acc = 0;
  if (mean) {
    const double m = mean[t];
    for (int64_t c = threadIdx.x; c < Cx; c += blockDim.x) {
      const double d = double(r[c]) - m;
      acc += d * d;
    }
  } else if (square) {
    for (int64_t c = threadIdx.x; c < Cx; c += blockDim.x) acc += double(r[c]) * r[c];
  } else {
    for (int64_t c = threadIdx.x; c < Cx; c += blockDim.x) acc += r[c];
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) stat[t * stride] = acc;
}
__global__ void k_norm_finish_mean(float* mean, const double* stat, int64_t ntok, int64_t C) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t < ntok) mean[t] = float(stat[t] / double(C));
}
__global__ void k_norm_finish_rstd(float* rstd, const double* stat, int64_t ntok, int64_t C,
                                   float eps) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t < ntok) rstd[t] = float(1.0 / sqrt(stat[t] / double(C) + double(eps)));
}
__global__ void k_norm_apply(float* out, const float* x, const float* mean, const float* rstd,
                             const float* w, const float* b, int64_t Cx) {
  const int64_t t = blockIdx.x;
  const float m = mean ? mean[t] : 0.0f, s = rstd[t];
  const float* r = x + t * Cx;
  float* o = out + t * Cx;
  for (int64_t c = threadIdx.x; c < Cx; c += blockDim.x)
    o[c] = b ? (r[c] - m) * s * w[c] + b[c] : (r[c] - m) * s * w[c];
}
// Whole-row LayerNorm/RMSNorm forward: the statistics as the split path computes them (double
// sums, centred variance), in one block, then the apply; x's row is re-read from L1/L2.
__global__ void k_norm_fwd_row(float* out, float* mean_out, float* rstd_out, const float* x,
                               const float* w, const float* b, int64_t C, float eps, bool layer) {
  const int64_t t = blockIdx.x;
  const float* r = x + t * C;
  float m = 0.0f;
  double acc = 0;
  if (layer) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) acc += r[c];
    acc = block_sum(acc);
    m = float(acc / double(C));
    acc = 0;
    const double md = m;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const double d = double(r[c]) - md;
      acc += d * d;
    }
  } else {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) acc += double(r[c]) * r[c];
  }
  acc = block_sum(acc);
  const float s = float(1.0 / sqrt(acc / double(C) + double(eps)));
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[t] = m;
    rstd_out[t] = s;
  }
  float* o = out + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    o[c] = b ? (r[c] - m) * s * w[c] + b[c] : (r[c] - m) * s * w[c];
}
__global__ void k_norm_bwd_partials(double* st, const float* dout, const float* x,
                                    const float* mean, const float* rstd, const float* w,
                                    int64_t Cx) {
  const int64_t t = blockIdx.x;
  const float m = mean ? mean[t] : 0.0f, s = rstd[t];
  const float* r = x + t * Cx;
  const float* d = dout + t * Cx;
  double a1 = 0, a2 = 0;
  for (int64_t c = threadIdx.x; c < Cx; c += blockDim.x) {
    const float dn = d[c] * w[c];
    a1 += dn;
    a2 += dn * ((r[c] - m) * s);
  }
  a1 = block_sum(a1);
  a2 = block_sum(a2);
  if (threadIdx.x == 0) {
    st[2 * t] = a1;
    st[2 * t + 1] = a2;
  }
}
__global__ void k_norm_bwd_apply(float* dx, const float* dout, const float* x, const float* mean,
                                 const float* rstd, const float* w, const double* st, int64_t Cx,
                                 int64_t C) {
  const int64_t t = blockIdx.x;
  const float m = mean ? mean[t] : 0.0f, s = rstd[t];
  const float mean_dn = mean ? float(st[2 * t] / double(C)) : 0.0f;
  const float mean_dnn = float(st[2 * t + 1] / double(C));
  const float* r = x + t * Cx;
  const float* d = dout + t * Cx;
  float* o = dx + t * Cx;
  for (int64_t c = threadIdx.x; c < Cx; c += blockDim.x) {
    const float n = (r[c] - m) * s;
    o[c] += (d[c] * w[c] - mean_dn - n * mean_dnn) * s;
  }
}
// Whole-row backward: partials and apply in one block.
__global__ void k_norm_bwd_row(float* dx, const float* dout, const float* x, const float* mean,
                               const float* rstd, const float* w, int64_t C) {
  const int64_t t = blockIdx.x;
  const float m = mean ? mean[t] : 0.0f, s = rstd[t];
  const float* r = x + t * C;
  const float* d = dout + t * C;
  double a1 = 0, a2 = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float dn = d[c] * w[c];
    a1 += dn;
    a2 += dn * ((r[c] - m) * s);
  }
  a1 = block_sum(a1);
  a2 = block_sum(a2);
  const float mean_dn = mean ? float(a1 / double(C)) : 0.0f;
  const float mean_dnn = float(a2 / double(C));
  float* o = dx + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float n = (r[c] - m) * s;
    o[c] += (d[c] * w[c] - mean_dn - n * mean_dnn) * s;
  }
}

// Block size for one-row-per-block kernels: enough threads for the row, a multiple of 32.
inline int row_threads(int64_t C) {
  if (C >= 1024) return 256;
  if (C >= 256) return 128;
  return 64;
}

// ---- rotary ----
__global__ void k_rope(float* x, int64_t ntok, int64_t T, int64_t pos0, int64_t n_rot_heads,
                       int64_t hd, int64_t stride, const float* cs, const float* sn, float sign) {
  const int64_t half = hd / 2;
  const int64_t n = ntok * n_rot_heads * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % half;
    const int64_t th = i / half;
    const int64_t h = th % n_rot_heads, t = th / n_rot_heads;
    const int64_t pos = pos0 + t % T;
    float* x1 = x + t * stride + h * hd;
    const float a = x1[j], b = x1[j + half];
    const float c = cs[pos * half + j], sv = sign * sn[pos * half + j];
    x1[j] = a * c - b * sv;
    x1[j + half] = b * c + a * sv;
  }
}

// ---- embedding ----
__global__ void k_embed_fwd(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                            int64_t ntok, int64_t T, int64_t C, int64_t v0, int64_t Vl, int64_t V,
                            int* bad) {
  const int64_t n = ntok * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i - t * C;
    const int64_t tok = tokens[t];
    if (bad && (tok < 0 || tok >= V) && c == 0) *bad = 1;
    const int64_t local = tok - v0;
    float e = (local >= 0 && local < Vl) ? wte[local * C + c] : 0.0f;
    if (wpe) e += wpe[(t % T) * C + c];
    out[i] = e;
  }
}
// Vocabulary rows are dealt out to kBuckets buckets by (local row % kBuckets); thread (c, b)
// owns column c of every row of bucket b and walks the tokens in order.
constexpr int kEmbedBuckets = 64;
// Only elements e = local * C + c of the flattened (Vl, C) block with s0 <= e < s1 are written,
// to dshard[e - s0] (a Z shard of the table's gradient; dense: s0 = 0, s1 = Vl * C).
__global__ void k_embed_bwd_wte(float* dshard, int64_t s0, int64_t s1, const float* dout,
                                const int32_t* tokens, int64_t ntok, int64_t C, int64_t v0,
                                int64_t Vl) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t bucket = blockIdx.y;
  if (c >= C) return;
  for (int64_t t = 0; t < ntok; ++t) {
    const int64_t local = int64_t(tokens[t]) - v0;
    if (local < 0 || local >= Vl || local % kEmbedBuckets != bucket) continue;
    const int64_t e = local * C + c;
    if (e < s0 || e >= s1) continue;
    dshard[e - s0] += dout[t * C + c];
  }
}
// dwpe[p] += Σ over sequences of dout[b * T + p]: thread per (p, c), fixed order over b.
__global__ void k_embed_bwd_wpe(float* dwpe, const float* dout, int64_t ntok, int64_t T,
                                int64_t C) {
  const int64_t n = T * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i / C, c = i - p * C;
    float acc = 0.0f;
    for (int64_t t = p; t < ntok; t += T) acc += dout[t * C + c];
    dwpe[i] += acc;
  }
}

// ---- cross-entropy ----
// One block per row: online (max, Σ exp) over the row in one read.
__global__ void k_xent_partials(float* rmax, float* rsum, float* tgt, const float* logits,
                                int64_t ld, const int32_t* targets, int64_t v0, int64_t Vl) {
  const int64_t t = blockIdx.x;
  const float* r = logits + t * ld;
  float m = -INFINITY, s = 0.0f;
  for (int64_t c = threadIdx.x; c < Vl; c += blockDim.x) {
    const float v = r[c];
    if (v > m) {
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  // Combine (m, s) pairs over the block.
  __shared__ float sm[32], ss[32];
  const int lane = threadIdx.x % kWarp, wid = threadIdx.x / kWarp;
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    const float mm = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.0f : s * expf(m - mm)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mm));
    m = mm;
  }
  if (lane == 0) {
    sm[wid] = m;
    ss[wid] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = -INFINITY, S = 0.0f;
    const int nw = blockDim.x / kWarp;
    for (int w = 0; w < nw; ++w) {
      const float mm = fmaxf(M, sm[w]);
      S = (M == -INFINITY ? 0.0f : S * expf(M - mm)) +
          (sm[w] == -INFINITY ? 0.0f : ss[w] * expf(sm[w] - mm));
      M = mm;
    }
    rmax[t] = M;
    rsum[t] = S;
    const int64_t target = targets[t];
    const int64_t local = target - v0;
    tgt[t] = (target >= 0 && local >= 0 && local < Vl) ? r[local] : 0.0f;
  }
}
__global__ void k_xent_rescale(float* rsum, const float* rmax, const float* gmax, int64_t ntok) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t < ntok) rsum[t] = rmax[t] == -INFINITY ? 0.0f : rsum[t] * expf(rmax[t] - gmax[t]);
}
__global__ void k_xent_losses(float* losses, const float* gmax, const float* gsum,
                              const float* gtgt, const int32_t* targets, int64_t ntok, int64_t V,
                              int* bad) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= ntok) return;
  const int64_t target = targets[t];
  if (bad && target >= V) *bad = 1;
  losses[t] = target >= 0 ? logf(gsum[t]) + gmax[t] - gtgt[t] : 0.0f;
}
// One block sums all losses in a fixed order (ntok is at most a few hundred thousand).
__global__ void k_sum_losses(double* out, const float* losses, int64_t ntok) {
  double acc = 0;
  for (int64_t t = threadIdx.x; t < ntok; t += blockDim.x) acc += losses[t];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}
__global__ void k_xent_bwd(float* x, int64_t ld, const float* gmax, const float* gsum,
                           const int32_t* targets, int64_t v0, int64_t Vl, float grad_scale) {
  const int64_t t = blockIdx.x;
  float* r = x + t * ld;
  const int64_t target = targets[t];
  if (target < 0) {
    for (int64_t c = threadIdx.x; c < Vl; c += blockDim.x) r[c] = 0.0f;
    return;
  }
  const float M = gmax[t], inv = 1.0f / gsum[t];
  const int64_t local = target - v0;
  for (int64_t c = threadIdx.x; c < Vl; c += blockDim.x) {
    const float p = expf(r[c] - M) * inv;
    r[c] = grad_scale * (p - (c == local ? 1.0f : 0.0f));
  }
}

// ---- multi-tensor AdamW and sums of squares ----
// Which span holds element i: the last k with offsets[k] <= i (binary search, offsets[0] = 0).
__device__ __forceinline__ int span_of(const int64_t* offsets, int count, int64_t i) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= i) lo = mid; else hi = mid - 1;
  }
  return lo;
}
__global__ void k_adamw(const TensorSpan* spans, const int64_t* offsets, int count, int64_t total,
                        float lr, float beta1, float beta2, float eps, float grad_scale, float bc1,
                        float bc2) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int k = span_of(offsets, count, i);
    const TensorSpan& sp = spans[k];
    const int64_t j = i - offsets[k];
    const float gi = sp.g[j] * grad_scale;
    const float mi = beta1 * sp.m[j] + (1.0f - beta1) * gi;
    const float vi = beta2 * sp.v[j] + (1.0f - beta2) * gi * gi;
    sp.m[j] = mi;
    sp.v[j] = vi;
    const float p = sp.p[j] - lr * ((mi * bc1) / (sqrtf(vi * bc2) + eps) + sp.weight_decay * sp.p[j]);
    sp.p[j] = p;
    if (sp.p_bf16) sp.p_bf16[j] = f2bf(p);
  }
}
constexpr int64_t kSsqChunk = 8192;  // elements per block of the first stage
__global__ void k_ssq_stage1(double* scratch, const float* const* ptrs, const int64_t* offsets,
                             int count, int64_t total) {
  const int64_t i0 = blockIdx.x * kSsqChunk;
  const int64_t i1 = i0 + kSsqChunk < total ? i0 + kSsqChunk : total;
  double acc = 0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const int k = span_of(offsets, count, i);
    const float v = ptrs[k][i - offsets[k]];
    acc += double(v) * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) scratch[blockIdx.x] = acc;
}
__global__ void k_ssq_stage2(double* out, const double* scratch, int64_t nblocks) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < nblocks; i += blockDim.x) acc += scratch[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}


// ---- the op table's extra pieces (cuda_backend.cpp) ----
__global__ void k_residual_add(float* out, const float* r, const float* y, const float* b,
                               int64_t N, int64_t C) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = b ? r[i] + y[i] + b[i % C] : r[i] + y[i];
}
__global__ void k_position_add(float* out, const float* pos, int64_t N, int64_t T, int64_t C) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i - t * C;
    out[i] += pos[(t % T) * C + c];
  }
}
__global__ void k_round_bf16(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = bf2f(f2bf(x[i]));
}
__global__ void k_row_max(float* mx, const float* L, int64_t ld, int64_t Vs) {
  const int64_t t = blockIdx.x;
  const float* r = L + t * ld;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < Vs; j += blockDim.x) m = fmaxf(m, r[j]);
  for (int o = kWarp / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ float part[32];
  if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = -INFINITY;
    for (int w = 0; w < int(blockDim.x / kWarp); ++w) M = fmaxf(M, part[w]);
    mx[t] = M;
  }
}
__global__ void k_sum_exp_target(double* st, const float* L, const float* mx,
                                 const int32_t* targets, int64_t v0, int64_t Vs) {
  const int64_t t = blockIdx.x;
  const float* r = L + t * Vs;
  const float m = mx[t];
  double acc = 0;
  for (int64_t j = threadIdx.x; j < Vs; j += blockDim.x) acc += expf(r[j] - m);
  acc = block_sum(acc);
  if (threadIdx.x == 0) {
    st[2 * t] = acc;
    const int64_t v = int64_t(targets[t]) - v0;
    st[2 * t + 1] = (targets[t] >= 0 && v >= 0 && v < Vs) ? double(r[v]) : 0.0;
  }
}
__global__ void k_ce_loss(float* losses, const double* st, const float* mx,
                          const int32_t* targets, int64_t N) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t < N)
    losses[t] = targets[t] >= 0 ? float(log(st[2 * t]) + double(mx[t]) - st[2 * t + 1]) : 0.0f;
}
// The losses summed in row order by one thread: the op table asks for the CPU's order, and N is
// at most a few hundred thousand (well under a millisecond).
__global__ void k_sum_rows_in_order(double* total, const float* losses, int64_t N) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s = 0;
  for (int64_t t = 0; t < N; ++t) s += losses[t];
  *total = s;
}
__global__ void k_ce_grad(float* L, const float* mx, const double* st, const int32_t* targets,
                          int64_t v0, int64_t Vs, float grad_scale) {
  const int64_t t = blockIdx.x;
  float* r = L + t * Vs;
  if (targets[t] < 0) {
    for (int64_t j = threadIdx.x; j < Vs; j += blockDim.x) r[j] = 0.0f;
    return;
  }
  const float scale = grad_scale / float(st[2 * t]), m = mx[t];
  const int64_t v = int64_t(targets[t]) - v0;
  for (int64_t j = threadIdx.x; j < Vs; j += blockDim.x) {
    float g = expf(r[j] - m) * scale;
    if (j == v) g -= grad_scale;
    r[j] = g;
  }
}
__global__ void k_row_argmax(int32_t* idx, float* val, const float* L, int64_t Vs, int64_t ld) {
  const int64_t t = blockIdx.x;
  const float* r = L + t * ld;
  float best = -INFINITY;
  int64_t bi = Vs;  // past the end: no finite maximum seen yet
  for (int64_t j = threadIdx.x; j < Vs; j += blockDim.x)
    if (r[j] > best || (r[j] == best && j < bi)) {
      best = r[j];
      bi = j;
    }
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float b2 = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t i2 = __shfl_xor_sync(0xffffffffu, bi, o);
    if (b2 > best || (b2 == best && i2 < bi)) {
      best = b2;
      bi = i2;
    }
  }
  __shared__ float pb[32];
  __shared__ int64_t pi[32];
  if (threadIdx.x % kWarp == 0) {
    pb[threadIdx.x / kWarp] = best;
    pi[threadIdx.x / kWarp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x / kWarp); ++w)
      if (pb[w] > best || (pb[w] == best && pi[w] < bi)) {
        best = pb[w];
        bi = pi[w];
      }
    idx[t] = int32_t(bi == Vs ? 0 : bi);
    val[t] = best;
  }
}
__global__ void k_adamw_one(TensorSpan sp, float lr, float beta1, float beta2, float eps,
                            float grad_scale, float bc1, float bc2) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < sp.n;
       j += int64_t(gridDim.x) * blockDim.x) {
    const float gi = sp.g[j] * grad_scale;
    const float mi = beta1 * sp.m[j] + (1.0f - beta1) * gi;
    const float vi = beta2 * sp.v[j] + (1.0f - beta2) * gi * gi;
    sp.m[j] = mi;
    sp.v[j] = vi;
    const float p = sp.p[j] - lr * ((mi * bc1) / (sqrtf(vi * bc2) + eps) + sp.weight_decay * sp.p[j]);
    sp.p[j] = p;
    if (sp.p_bf16) sp.p_bf16[j] = f2bf(p);
  }
}
__global__ void k_ssq_one(double* scratch, const float* x, int64_t n) {
  const int64_t i0 = blockIdx.x * kSsqChunk;
  const int64_t i1 = i0 + kSsqChunk < n ? i0 + kSsqChunk : n;
  double acc = 0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) acc += double(x[i]) * x[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) scratch[blockIdx.x] = acc;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Host entry points

#define TETRAD_LAUNCH_CHECK(name) gpu_check_launch(name)

void gelu_forward(float* out, const float* x, int64_t n, gpuStream_t s) {
  if (n <= 0) return;
  k_gelu_fwd<<<grid_for(n), kThreads, 0, s>>>(out, x, n);
  TETRAD_LAUNCH_CHECK("gelu_forward");
}
void gelu_backward(float* dx, const float* dout, const float* x, int64_t n, gpuStream_t s) {
  if (n <= 0) return;
  k_gelu_bwd<<<grid_for(n), kThreads, 0, s>>>(dx, dout, x, n);
  TETRAD_LAUNCH_CHECK("gelu_backward");
}
void swiglu_forward(float* out, const float* gu, int64_t ntok, int64_t F, gpuStream_t s) {
  if (ntok * F <= 0) return;
  k_swiglu_fwd<<<grid_for(ntok * F), kThreads, 0, s>>>(out, gu, ntok, F);
  TETRAD_LAUNCH_CHECK("swiglu_forward");
}
void swiglu_backward(float* dgu, const float* dout, const float* gu, int64_t ntok, int64_t F,
                     gpuStream_t s) {
  if (ntok * F <= 0) return;
  k_swiglu_bwd<<<grid_for(ntok * F), kThreads, 0, s>>>(dgu, dout, gu, ntok, F);
  TETRAD_LAUNCH_CHECK("swiglu_backward");
}
void add_inplace(float* x, const float* y, int64_t n, gpuStream_t s) {
  if (n <= 0) return;
  k_add<<<grid_for(n), kThreads, 0, s>>>(x, y, n);
  TETRAD_LAUNCH_CHECK("add_inplace");
}
void add_bias(float* out, const float* bias, int64_t ntok, int64_t OC, int64_t ld, gpuStream_t s) {
  if (ntok * OC <= 0) return;
  k_add_bias<<<grid_for(ntok * OC), kThreads, 0, s>>>(out, bias, ntok, OC, ld);
  TETRAD_LAUNCH_CHECK("add_bias");
}
int64_t column_sum_scratch(int64_t ntok, int64_t cols) { return col_chunks(ntok) * cols; }
void bias_backward(float* dbias, const float* dout, int64_t ntok, int64_t OC, int64_t ld,
                   float* scratch, gpuStream_t s) {
  column_sum_into(dbias, ColDout{dout, ld}, ntok, OC, scratch, s);
}
void cast_f32_to_bf16(uint16_t* out, int64_t ldo, const float* in, int64_t ldi, int64_t rows,
                      int64_t cols, gpuStream_t s) {
  if (rows * cols <= 0) return;
  k_cast_f2b<<<grid_for(rows * cols), kThreads, 0, s>>>(out, ldo, in, ldi, rows, cols);
  TETRAD_LAUNCH_CHECK("cast_f32_to_bf16");
}
void cast_bf16_to_f32(float* out, int64_t ldo, const uint16_t* in, int64_t ldi, int64_t rows,
                      int64_t cols, gpuStream_t s) {
  if (rows * cols <= 0) return;
  k_cast_b2f<<<grid_for(rows * cols), kThreads, 0, s>>>(out, ldo, in, ldi, rows, cols);
  TETRAD_LAUNCH_CHECK("cast_bf16_to_f32");
}

void norm_row_sums(double* stat, int64_t stride, const float* x, const float* mean, bool square,
                   int64_t ntok, int64_t Cx, gpuStream_t s) {
  if (ntok <= 0) return;
  k_norm_row_sums<<<unsigned(ntok), row_threads(Cx), 0, s>>>(stat, stride, x, mean, square, Cx);
  TETRAD_LAUNCH_CHECK("norm_row_sums");
}
void norm_finish_mean(float* mean, const double* stat, int64_t ntok, int64_t C, gpuStream_t s) {
  if (ntok <= 0) return;
  k_norm_finish_mean<<<grid_for(ntok), kThreads, 0, s>>>(mean, stat, ntok, C);
  TETRAD_LAUNCH_CHECK("norm_finish_mean");
}
void norm_finish_rstd(float* rstd, const double* stat, int64_t ntok, int64_t C, float eps,
                      gpuStream_t s) {
  if (ntok <= 0) return;
  k_norm_finish_rstd<<<grid_for(ntok), kThreads, 0, s>>>(rstd, stat, ntok, C, eps);
  TETRAD_LAUNCH_CHECK("norm_finish_rstd");
}
void norm_apply(float* out, const float* x, const float* mean, const float* rstd, const float* w,
                const float* b, int64_t ntok, int64_t Cx, gpuStream_t s) {
  if (ntok <= 0) return;
  k_norm_apply<<<unsigned(ntok), row_threads(Cx), 0, s>>>(out, x, mean, rstd, w, b, Cx);
  TETRAD_LAUNCH_CHECK("norm_apply");
}
void norm_backward_partials(double* st, const float* dout, const float* x, const float* mean,
                            const float* rstd, const float* w, int64_t ntok, int64_t Cx,
                            gpuStream_t s) {
  if (ntok <= 0) return;
  k_norm_bwd_partials<<<unsigned(ntok), row_threads(Cx), 0, s>>>(st, dout, x, mean, rstd, w, Cx);
  TETRAD_LAUNCH_CHECK("norm_backward_partials");
}
void norm_backward_apply(float* dx, const float* dout, const float* x, const float* mean,
                         const float* rstd, const float* w, const double* st, int64_t ntok,
                         int64_t Cx, int64_t C, gpuStream_t s) {
  if (ntok <= 0) return;
  k_norm_bwd_apply<<<unsigned(ntok), row_threads(Cx), 0, s>>>(dx, dout, x, mean, rstd, w, st, Cx,
                                                              C);
  TETRAD_LAUNCH_CHECK("norm_backward_apply");
}
void norm_weight_grad(float* dw, float* db, const float* dout, const float* x, const float* mean,
                      const float* rstd, int64_t ntok, int64_t Cx, float* scratch, gpuStream_t s) {
  column_sum_into(dw, ColDoutN{dout, x, mean, rstd, Cx}, ntok, Cx, scratch, s);
  if (db) column_sum_into(db, ColDout{dout, Cx}, ntok, Cx, scratch + column_sum_scratch(ntok, Cx), s);
}
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t ntok, int64_t C, float eps, gpuStream_t s) {
  if (ntok <= 0) return;
  k_norm_fwd_row<<<unsigned(ntok), row_threads(C), 0, s>>>(out, mean, rstd, x, w, b, C, eps, true);
  TETRAD_LAUNCH_CHECK("layernorm_forward");
}
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t ntok,
                     int64_t C, float eps, gpuStream_t s) {
  if (ntok <= 0) return;
  k_norm_fwd_row<<<unsigned(ntok), row_threads(C), 0, s>>>(out, nullptr, rstd, x, w, nullptr, C,
                                                           eps, false);
  TETRAD_LAUNCH_CHECK("rmsnorm_forward");
}
void norm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                   const float* w, const float* mean, const float* rstd, int64_t ntok, int64_t C,
                   float* scratch, gpuStream_t s) {
  if (ntok <= 0) return;
  k_norm_bwd_row<<<unsigned(ntok), row_threads(C), 0, s>>>(dx, dout, x, mean, rstd, w, C);
  TETRAD_LAUNCH_CHECK("norm_backward");
  norm_weight_grad(dw, db, dout, x, mean, rstd, ntok, C, scratch, s);
}

void rope_forward(float* x, int64_t ntok, int64_t T, int64_t pos0, int64_t n_rot_heads,
                  int64_t hd, int64_t stride, const float* cos_table, const float* sin_table,
                  gpuStream_t s) {
  const int64_t n = ntok * n_rot_heads * (hd / 2);
  if (n <= 0) return;
  k_rope<<<grid_for(n), kThreads, 0, s>>>(x, ntok, T, pos0, n_rot_heads, hd, stride, cos_table,
                                           sin_table, 1.0f);
  TETRAD_LAUNCH_CHECK("rope_forward");
}
void rope_backward(float* dx, int64_t ntok, int64_t T, int64_t pos0, int64_t n_rot_heads,
                   int64_t hd, int64_t stride, const float* cos_table, const float* sin_table,
                   gpuStream_t s) {
  const int64_t n = ntok * n_rot_heads * (hd / 2);
  if (n <= 0) return;
  k_rope<<<grid_for(n), kThreads, 0, s>>>(dx, ntok, T, pos0, n_rot_heads, hd, stride, cos_table,
                                           sin_table, -1.0f);
  TETRAD_LAUNCH_CHECK("rope_backward");
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t ntok, int64_t T, int64_t C, int64_t v0, int64_t Vl, int64_t V,
                       int* bad, gpuStream_t s) {
  if (ntok * C <= 0) return;
  k_embed_fwd<<<grid_for(ntok * C), kThreads, 0, s>>>(out, tokens, wte, wpe, ntok, T, C, v0, Vl,
                                                       V, bad);
  TETRAD_LAUNCH_CHECK("embedding_forward");
}
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t ntok, int64_t T, int64_t C, int64_t v0, int64_t Vl,
                        gpuStream_t s) {
  if (ntok * C <= 0) return;
  if (dwte) {
    dim3 grid(unsigned((C + 127) / 128), kEmbedBuckets);
    k_embed_bwd_wte<<<grid, 128, 0, s>>>(dwte, 0, Vl * C, dout, tokens, ntok, C, v0, Vl);
    TETRAD_LAUNCH_CHECK("embedding_backward(wte)");
  }
  if (dwpe) {
    k_embed_bwd_wpe<<<grid_for(T * C), kThreads, 0, s>>>(dwpe, dout, ntok, T, C);
    TETRAD_LAUNCH_CHECK("embedding_backward(wpe)");
  }
}

void xent_partials(float* rmax, float* rsum, float* tgt, const float* logits, int64_t ld,
                   const int32_t* targets, int64_t ntok, int64_t v0, int64_t Vl, gpuStream_t s) {
  if (ntok <= 0) return;
  k_xent_partials<<<unsigned(ntok), 512, 0, s>>>(rmax, rsum, tgt, logits, ld, targets, v0, Vl);
  TETRAD_LAUNCH_CHECK("xent_partials");
}
void xent_rescale(float* rsum, const float* rmax, const float* gmax, int64_t ntok, gpuStream_t s) {
  if (ntok <= 0) return;
  k_xent_rescale<<<grid_for(ntok), kThreads, 0, s>>>(rsum, rmax, gmax, ntok);
  TETRAD_LAUNCH_CHECK("xent_rescale");
}
void xent_losses(float* losses, double* loss_sum, const float* gmax, const float* gsum,
                 const float* gtgt, const int32_t* targets, int64_t ntok, int64_t V, int* bad,
                 gpuStream_t s) {
  if (ntok <= 0) return;
  k_xent_losses<<<grid_for(ntok), kThreads, 0, s>>>(losses, gmax, gsum, gtgt, targets, ntok, V, bad);
  TETRAD_LAUNCH_CHECK("xent_losses");
  if (loss_sum) {
    k_sum_losses<<<1, 1024, 0, s>>>(loss_sum, losses, ntok);
    TETRAD_LAUNCH_CHECK("xent_losses(sum)");
  }
}
void xent_backward(float* logits_to_dlogits, int64_t ld, const float* gmax, const float* gsum,
                   const int32_t* targets, int64_t ntok, int64_t v0, int64_t Vl, float grad_scale,
                   gpuStream_t s) {
  if (ntok <= 0) return;
  k_xent_bwd<<<unsigned(ntok), 512, 0, s>>>(logits_to_dlogits, ld, gmax, gsum, targets, v0, Vl,
                                            grad_scale);
  TETRAD_LAUNCH_CHECK("xent_backward");
}

void adamw_multi(const TensorSpan* spans_dev, const int64_t* offsets_dev, int count,
                 int64_t total, float lr, float beta1, float beta2, float eps, float grad_scale,
                 int64_t step, gpuStream_t s) {
  if (total <= 0) return;
  // As the CPU: the bias corrections in double, rounded to float once.
  const float bc1 = float(1.0 / (1.0 - std::pow(double(beta1), double(step))));
  const float bc2 = float(1.0 / (1.0 - std::pow(double(beta2), double(step))));
  k_adamw<<<grid_for(total), kThreads, 0, s>>>(spans_dev, offsets_dev, count, total, lr, beta1,
                                               beta2, eps, grad_scale, bc1, bc2);
  TETRAD_LAUNCH_CHECK("adamw_multi");
}
int64_t sum_squares_scratch(int64_t total) { return (total + kSsqChunk - 1) / kSsqChunk; }
void sum_squares_multi(double* out, const float* const* ptrs_dev, const int64_t* offsets_dev,
                       int count, int64_t total, double* scratch, gpuStream_t s) {
  if (total <= 0) {
    GPU_CHECK(gpuMemsetAsync(out, 0, sizeof(double), s));
    return;
  }
  const int64_t nb = sum_squares_scratch(total);
  k_ssq_stage1<<<unsigned(nb), kThreads, 0, s>>>(scratch, ptrs_dev, offsets_dev, count, total);
  TETRAD_LAUNCH_CHECK("sum_squares(stage1)");
  k_ssq_stage2<<<1, 1024, 0, s>>>(out, scratch, nb);
  TETRAD_LAUNCH_CHECK("sum_squares(stage2)");
}


void residual_add(float* out, const float* resid, const float* y, const float* b, int64_t N,
                  int64_t C, gpuStream_t s) {
  if (N * C <= 0) return;
  k_residual_add<<<grid_for(N * C), kThreads, 0, s>>>(out, resid, y, b, N, C);
  TETRAD_LAUNCH_CHECK("residual_add");
}
void position_add(float* out, const float* pos, int64_t N, int64_t T, int64_t C, gpuStream_t s) {
  if (N * C <= 0) return;
  k_position_add<<<grid_for(N * C), kThreads, 0, s>>>(out, pos, N, T, C);
  TETRAD_LAUNCH_CHECK("position_add");
}
void position_grad(float* dpos, const float* dout, int64_t N, int64_t T, int64_t C, gpuStream_t s) {
  if (N * C <= 0) return;
  k_embed_bwd_wpe<<<grid_for(T * C), kThreads, 0, s>>>(dpos, dout, N, T, C);
  TETRAD_LAUNCH_CHECK("position_grad");
}
void embedding_scatter_add(float* dshard, int64_t s0, int64_t s1, const float* dout,
                           const int32_t* tokens, int64_t v0, int64_t Vs, int64_t N, int64_t C,
                           gpuStream_t s) {
  if (N * C <= 0 || s1 <= s0) return;
  dim3 grid(unsigned((C + 127) / 128), kEmbedBuckets);
  k_embed_bwd_wte<<<grid, 128, 0, s>>>(dshard, s0, s1, dout, tokens, N, C, v0, Vs);
  TETRAD_LAUNCH_CHECK("embedding_scatter_add");
}
void round_to_bf16(float* x, int64_t n, gpuStream_t s) {
  if (n <= 0) return;
  k_round_bf16<<<grid_for(n), kThreads, 0, s>>>(x, n);
  TETRAD_LAUNCH_CHECK("round_to_bf16");
}
void ce_row_max(float* mx, const float* logits, int64_t ld, int64_t N, int64_t Vs, gpuStream_t s) {
  if (N <= 0) return;
  k_row_max<<<unsigned(N), 512, 0, s>>>(mx, logits, ld, Vs);
  TETRAD_LAUNCH_CHECK("ce_row_max");
}
void ce_sum_exp_target(double* st, const float* logits, const float* mx, const int32_t* targets,
                       int64_t v0, int64_t Vs, int64_t N, gpuStream_t s) {
  if (N <= 0) return;
  k_sum_exp_target<<<unsigned(N), 512, 0, s>>>(st, logits, mx, targets, v0, Vs);
  TETRAD_LAUNCH_CHECK("ce_sum_exp_target");
}
void ce_loss(float* losses, double* total, const double* st, const float* mx,
             const int32_t* targets, int64_t N, gpuStream_t s) {
  if (N <= 0) {
    if (total) GPU_CHECK(gpuMemsetAsync(total, 0, sizeof(double), s));
    return;
  }
  k_ce_loss<<<grid_for(N), kThreads, 0, s>>>(losses, st, mx, targets, N);
  TETRAD_LAUNCH_CHECK("ce_loss");
  if (total) {
    k_sum_rows_in_order<<<1, 32, 0, s>>>(total, losses, N);
    TETRAD_LAUNCH_CHECK("ce_loss(total)");
  }
}
void ce_loss_total_in_order(double* total, const float* losses, int64_t N, gpuStream_t s) {
  if (N <= 0) {
    GPU_CHECK(gpuMemsetAsync(total, 0, sizeof(double), s));
    return;
  }
  k_sum_rows_in_order<<<1, 32, 0, s>>>(total, losses, N);
  TETRAD_LAUNCH_CHECK("ce_loss_total_in_order");
}
void ce_grad(float* logits, const float* mx, const double* st, const int32_t* targets, int64_t v0,
             int64_t Vs, int64_t N, float grad_scale, gpuStream_t s) {
  if (N <= 0) return;
  k_ce_grad<<<unsigned(N), 512, 0, s>>>(logits, mx, st, targets, v0, Vs, grad_scale);
  TETRAD_LAUNCH_CHECK("ce_grad");
}
void row_argmax(int32_t* idx, float* val, const float* logits, int64_t N, int64_t Vs, int64_t ld,
                gpuStream_t s) {
  if (N <= 0) return;
  k_row_argmax<<<unsigned(N), 256, 0, s>>>(idx, val, logits, Vs, ld);
  TETRAD_LAUNCH_CHECK("row_argmax");
}
void adamw(const TensorSpan& sp, float lr, float beta1, float beta2, float eps, float grad_scale,
           int64_t step, gpuStream_t s) {
  if (sp.n <= 0) return;
  const float bc1 = float(1.0 / (1.0 - std::pow(double(beta1), double(step))));
  const float bc2 = float(1.0 / (1.0 - std::pow(double(beta2), double(step))));
  k_adamw_one<<<grid_for(sp.n), kThreads, 0, s>>>(sp, lr, beta1, beta2, eps, grad_scale, bc1, bc2);
  TETRAD_LAUNCH_CHECK("adamw");
}
void sum_squares(double* out, const float* x, int64_t n, double* scratch, gpuStream_t s) {
  if (n <= 0) {
    GPU_CHECK(gpuMemsetAsync(out, 0, sizeof(double), s));
    return;
  }
  const int64_t nb = sum_squares_scratch(n);
  k_ssq_one<<<unsigned(nb), kThreads, 0, s>>>(scratch, x, n);
  TETRAD_LAUNCH_CHECK("sum_squares(stage1)");
  k_ssq_stage2<<<1, 1024, 0, s>>>(out, scratch, nb);
  TETRAD_LAUNCH_CHECK("sum_squares(stage2)");
}

}  // namespace tetrad::gpu
