// CUDA kernels beside their launchers (kernels.hpp): cross-entropy over (vocabulary-parallel)
// logits: per-row max and sum of exponentials, the losses and their sum in a fixed order, the
// gradient, and the row argmax.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tetrad/backend/cuda/kernel_common.cuh"
#include "tetrad/backend/cuda/kernels.hpp"

namespace tetrad::gpu {
namespace {

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
// The row argmax's order: NaN above every number (the first NaN of a row wins, as on the CPU:
// a broken row is seen, never skipped), then larger values, then lower indices. A total order,
// so any reduction tree gives the same (index, value).
__device__ __forceinline__ bool argmax_better(float v, int64_t i, float best, int64_t bi) {
  const bool vn = isnan(v), bn = isnan(best);
  if (vn || bn) return vn && (!bn || i < bi);
  return v > best || (v == best && i < bi);
}
__global__ void k_row_argmax(int32_t* idx, float* val, const float* L, int64_t Vs, int64_t ld) {
  const int64_t t = blockIdx.x;
  const float* r = L + t * ld;
  float best = -INFINITY;
  int64_t bi = Vs;  // past the end: nothing seen yet (any element, -inf included, beats it)
  for (int64_t j = threadIdx.x; j < Vs; j += blockDim.x)
    if (argmax_better(r[j], j, best, bi)) {
      best = r[j];
      bi = j;
    }
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float b2 = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t i2 = __shfl_xor_sync(0xffffffffu, bi, o);
    if (argmax_better(b2, i2, best, bi)) {
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
      if (argmax_better(pb[w], pi[w], best, bi)) {
        best = pb[w];
        bi = pi[w];
      }
    idx[t] = int32_t(bi == Vs ? 0 : bi);
    val[t] = best;
  }
}
// *first = the lowest t with targets[t] >= V, or N when there is none (one block, fixed order).
__global__ void k_first_target_at_or_above(int64_t* first, const int32_t* targets, int64_t N,
                                           int64_t V) {
  int64_t mine = N;
  for (int64_t t = threadIdx.x; t < N && mine == N; t += blockDim.x)
    if (targets[t] >= V) mine = t;
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const int64_t other = __shfl_xor_sync(0xffffffffu, mine, o);
    mine = other < mine ? other : mine;
  }
  __shared__ int64_t part[32];
  if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x / kWarp); ++w) mine = part[w] < mine ? part[w] : mine;
    *first = mine;
  }
}

}  // namespace

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
void first_target_at_or_above(int64_t* first, const int32_t* targets, int64_t N, int64_t V,
                              gpuStream_t s) {
  k_first_target_at_or_above<<<1, 1024, 0, s>>>(first, targets, N, V);
  TETRAD_LAUNCH_CHECK("first_target_at_or_above");
}
void row_argmax(int32_t* idx, float* val, const float* logits, int64_t N, int64_t Vs, int64_t ld,
                gpuStream_t s) {
  if (N <= 0) return;
  k_row_argmax<<<unsigned(N), 256, 0, s>>>(idx, val, logits, Vs, ld);
  TETRAD_LAUNCH_CHECK("row_argmax");
}

}  // namespace tetrad::gpu
