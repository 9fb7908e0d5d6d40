// CUDA kernels beside their launchers (kernels.hpp): the per-head RMSNorm (Qwen3's q_norm /
// k_norm, backend/ops.hpp's HeadNormArgs), forward and backward. One warp per (row, head) for the
// statistics and the apply; the weight's gradient one block per column, its rows in a fixed
// order (deterministic).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tetrad/backend/cuda/kernel_common.cuh"
#include "tetrad/backend/cuda/kernels.hpp"

namespace tetrad::gpu {
namespace {

constexpr int kWarpsPerBlock = 4;

__global__ void k_head_norm_fwd(float* x, float* rstd, float* saved, const float* w,
                                int64_t ntok, int64_t n_heads, int64_t hd, int64_t stride,
                                float eps) {
  const int64_t pair = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (pair >= ntok * n_heads) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t r = pair / n_heads, h = pair % n_heads;
  float* v = x + r * stride + h * hd;
  double ss = 0;
  for (int64_t d = lane; d < hd; d += kWarp) ss += double(v[d]) * v[d];
  ss = warp_sum(ss);
  const float rs = float(1.0 / sqrt(ss / double(hd) + double(eps)));
  if (lane == 0) rstd[pair] = rs;
  for (int64_t d = lane; d < hd; d += kWarp) {
    if (saved) saved[pair * hd + d] = v[d];
    v[d] = v[d] * rs * w[d];
  }
}

// dw[d] += Σ over (row, head) of dy x̂: one block per column d.
__global__ void k_head_norm_dw(float* dw, const float* dy, const float* saved, const float* rstd,
                               int64_t ntok, int64_t n_heads, int64_t hd, int64_t stride) {
  const int64_t d = blockIdx.x;
  double acc = 0;
  for (int64_t pair = threadIdx.x; pair < ntok * n_heads; pair += blockDim.x) {
    const int64_t r = pair / n_heads, h = pair % n_heads;
    acc += double(dy[r * stride + h * hd + d]) * (saved[pair * hd + d] * rstd[pair]);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) dw[d] += float(acc);
}

__global__ void k_head_norm_bwd(float* x, const float* saved, const float* rstd, const float* w,
                                int64_t ntok, int64_t n_heads, int64_t hd, int64_t stride) {
  const int64_t pair = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (pair >= ntok * n_heads) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t r = pair / n_heads, h = pair % n_heads;
  float* g = x + r * stride + h * hd;
  const float* s = saved + pair * hd;
  const float rs = rstd[pair];
  double dot = 0;
  for (int64_t d = lane; d < hd; d += kWarp) dot += double(g[d]) * w[d] * (s[d] * rs);
  dot = warp_sum(dot);
  const float m = float(dot / double(hd));
  for (int64_t d = lane; d < hd; d += kWarp) g[d] = (g[d] * w[d] - s[d] * rs * m) * rs;
}

unsigned pair_blocks(int64_t ntok, int64_t n_heads) {
  return unsigned((ntok * n_heads + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void head_norm_forward(float* x, float* rstd, float* saved, const float* w, int64_t ntok,
                       int64_t n_heads, int64_t hd, int64_t stride, float eps, gpuStream_t s) {
  if (ntok * n_heads <= 0) return;
  k_head_norm_fwd<<<pair_blocks(ntok, n_heads), kWarpsPerBlock * kWarp, 0, s>>>(
      x, rstd, saved, w, ntok, n_heads, hd, stride, eps);
  TETRAD_LAUNCH_CHECK("head_norm_forward");
}

void head_norm_backward(float* x, float* dw, const float* saved, const float* rstd,
                        const float* w, int64_t ntok, int64_t n_heads, int64_t hd, int64_t stride,
                        gpuStream_t s) {
  if (ntok * n_heads <= 0) return;
  // The weight's gradient reads dy before the apply overwrites it (same stream: in order).
  k_head_norm_dw<<<unsigned(hd), kThreads, 0, s>>>(dw, x, saved, rstd, ntok, n_heads, hd, stride);
  TETRAD_LAUNCH_CHECK("head_norm_backward (weight gradient)");
  k_head_norm_bwd<<<pair_blocks(ntok, n_heads), kWarpsPerBlock * kWarp, 0, s>>>(
      x, saved, rstd, w, ntok, n_heads, hd, stride);
  TETRAD_LAUNCH_CHECK("head_norm_backward");
}

}  // namespace tetrad::gpu
