// CUDA kernels beside their launchers (kernels.hpp): AdamW and sums of squares, multi-tensor (one
// launch over many spans) and per tensor, with two-stage fixed-order sums.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tetrad/backend/adamw_bias.hpp"
#include "tetrad/backend/cuda/kernel_common.cuh"
#include "tetrad/backend/cuda/kernels.hpp"

namespace tetrad::gpu {
namespace {

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

void adamw_multi(const TensorSpan* spans_dev, const int64_t* offsets_dev, int count,
                 int64_t total, float lr, float beta1, float beta2, float eps, float grad_scale,
                 int64_t step, gpuStream_t s) {
  if (total <= 0) return;
  const float bc1 = backend::adamw_bias_correction(beta1, step);  // as the CPU, bit for bit
  const float bc2 = backend::adamw_bias_correction(beta2, step);
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
void adamw(const TensorSpan& sp, float lr, float beta1, float beta2, float eps, float grad_scale,
           int64_t step, gpuStream_t s) {
  if (sp.n <= 0) return;
  const float bc1 = backend::adamw_bias_correction(beta1, step);  // as the CPU, bit for bit
  const float bc2 = backend::adamw_bias_correction(beta2, step);
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
