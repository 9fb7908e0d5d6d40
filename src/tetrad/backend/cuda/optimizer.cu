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
// One element of AdamW (backend/ops.hpp), the multi-tensor and the one-tensor kernels alike.
__device__ __forceinline__ void adamw_element(const TensorSpan& sp, int64_t j, float lr,
                                              float beta1, float beta2, float eps,
                                              float grad_scale, float bc1, float bc2) {
  const float gi = sp.g[j] * grad_scale;
  const float mi = beta1 * sp.m[j] + (1.0f - beta1) * gi;
  const float vi = beta2 * sp.v[j] + (1.0f - beta2) * gi * gi;
  sp.m[j] = mi;
  sp.v[j] = vi;
  const float p = sp.p[j] - lr * ((mi * bc1) / (sqrtf(vi * bc2) + eps) + sp.weight_decay * sp.p[j]);
  sp.p[j] = p;
  if (sp.p_bf16) sp.p_bf16[j] = f2bf(p);
}
__global__ void k_adamw(const TensorSpan* spans, const int64_t* offsets, int count, int64_t total,
                        float lr, float beta1, float beta2, float eps, float grad_scale, float bc1,
                        float bc2) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int k = span_of(offsets, count, i);
    adamw_element(spans[k], i - offsets[k], lr, beta1, beta2, eps, grad_scale, bc1, bc2);
  }
}
__global__ void k_adamw_one(TensorSpan sp, float lr, float beta1, float beta2, float eps,
                            float grad_scale, float bc1, float bc2) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < sp.n;
       j += int64_t(gridDim.x) * blockDim.x)
    adamw_element(sp, j, lr, beta1, beta2, eps, grad_scale, bc1, bc2);
}

// Sums of squares, stage 1: block b sums x² over elements [b * kSsqChunk, +kSsqChunk) of the
// concatenation into scratch[b] (fixed order); stage 2 sums the blocks' partials.
constexpr int64_t kSsqChunk = 8192;
struct SpansAt {  // element i of the concatenated tensors
  const float* const* ptrs;
  const int64_t* offsets;
  int count;
  __device__ float operator()(int64_t i) const {
    const int k = span_of(offsets, count, i);
    return ptrs[k][i - offsets[k]];
  }
};
struct OneAt {
  const float* x;
  __device__ float operator()(int64_t i) const { return x[i]; }
};
template <typename At>
__global__ void k_ssq_stage1(double* scratch, At at, int64_t total) {
  const int64_t i0 = blockIdx.x * kSsqChunk;
  const int64_t i1 = i0 + kSsqChunk < total ? i0 + kSsqChunk : total;
  double acc = 0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const float v = at(i);
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
template <typename At>
void sum_squares_of(double* out, At at, int64_t total, double* scratch, gpuStream_t s) {
  if (total <= 0) {
    GPU_CHECK(gpuMemsetAsync(out, 0, sizeof(double), s));
    return;
  }
  const int64_t nb = (total + kSsqChunk - 1) / kSsqChunk;
  k_ssq_stage1<<<unsigned(nb), kThreads, 0, s>>>(scratch, at, total);
  TETRAD_LAUNCH_CHECK("sum_squares(stage1)");
  k_ssq_stage2<<<1, 1024, 0, s>>>(out, scratch, nb);
  TETRAD_LAUNCH_CHECK("sum_squares(stage2)");
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
  sum_squares_of(out, SpansAt{ptrs_dev, offsets_dev, count}, total, scratch, s);
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
  sum_squares_of(out, OneAt{x}, n, scratch, s);
}

}  // namespace tetrad::gpu
