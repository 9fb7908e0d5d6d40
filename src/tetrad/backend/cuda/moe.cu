// CUDA kernels of the mixture-of-experts permutation (moe_kernels.hpp): tokens to their experts'
// rows and back. One thread per output element (grid-stride), walking the token's k choices in
// order, so results repeat bit for bit; the combine weights' gradient is one block per choice.
#include <cuda_runtime.h>

#include <cstdint>

#include "tetrad/backend/cuda/kernel_common.cuh"
#include "tetrad/backend/cuda/moe_kernels.hpp"

namespace tetrad::gpu {
namespace {

__global__ void k_moe_permute(float* out, const float* x, const int32_t* slots, int64_t N,
                              int64_t k, int64_t C) {
  const int64_t n = N * k * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tj = i / C, c = i - tj * C;
    const int64_t r = slots[tj];
    if (r >= 0) out[r * C + c] = x[(tj / k) * C + c];
  }
}

__global__ void k_moe_permute_bwd(float* dx, const float* dout, const int32_t* slots, int64_t N,
                                  int64_t k, int64_t C) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i - t * C;
    float acc = dx[i];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = slots[t * k + j];
      if (r >= 0) acc += dout[r * C + c];
    }
    dx[i] = acc;
  }
}

__global__ void k_moe_unpermute(float* y, const float* e, const float* w, const int32_t* slots,
                                int64_t N, int64_t k, int64_t C) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i - t * C;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = slots[t * k + j];
      if (r >= 0) acc += w[t * k + j] * e[r * C + c];
    }
    y[i] = acc;
  }
}

// de rows: one thread per element of every kept choice.
__global__ void k_moe_unpermute_bwd_de(float* de, const float* dy, const float* w,
                                       const int32_t* slots, int64_t N, int64_t k, int64_t C) {
  const int64_t n = N * k * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tj = i / C, c = i - tj * C;
    const int64_t r = slots[tj];
    if (r >= 0) de[r * C + c] = w[tj] * dy[(tj / k) * C + c];
  }
}

// dw: one block per choice (t, j), a strided partial per thread then the block's fixed-shape sum.
__global__ void k_moe_unpermute_bwd_dw(float* dw, const float* dy, const float* e,
                                       const int32_t* slots, int64_t k, int64_t C) {
  const int64_t tj = blockIdx.x;
  const int64_t r = slots[tj];
  double acc = 0;
  if (r >= 0)
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      acc += double(dy[(tj / k) * C + c]) * double(e[r * C + c]);
  acc = block_sum(acc);
  if (threadIdx.x == 0) dw[tj] = r >= 0 ? float(acc) : 0.0f;
}

}  // namespace

void moe_permute(float* out, const float* x, const int32_t* slots, int64_t N, int64_t k,
                 int64_t C, gpuStream_t s) {
  if (N * k * C <= 0) return;
  k_moe_permute<<<grid_for(N * k * C), kThreads, 0, s>>>(out, x, slots, N, k, C);
  TETRAD_LAUNCH_CHECK("moe_permute");
}
void moe_permute_backward(float* dx, const float* dout, const int32_t* slots, int64_t N,
                          int64_t k, int64_t C, gpuStream_t s) {
  if (N * C <= 0) return;
  k_moe_permute_bwd<<<grid_for(N * C), kThreads, 0, s>>>(dx, dout, slots, N, k, C);
  TETRAD_LAUNCH_CHECK("moe_permute_backward");
}
void moe_unpermute(float* y, const float* e, const float* w, const int32_t* slots, int64_t N,
                   int64_t k, int64_t C, gpuStream_t s) {
  if (N * C <= 0) return;
  k_moe_unpermute<<<grid_for(N * C), kThreads, 0, s>>>(y, e, w, slots, N, k, C);
  TETRAD_LAUNCH_CHECK("moe_unpermute");
}
void moe_unpermute_backward(float* de, float* dw, const float* dy, const float* e, const float* w,
                            const int32_t* slots, int64_t N, int64_t k, int64_t C,
                            gpuStream_t s) {
  if (N * k <= 0) return;
  if (C > 0) {
    k_moe_unpermute_bwd_de<<<grid_for(N * k * C), kThreads, 0, s>>>(de, dy, w, slots, N, k, C);
    TETRAD_LAUNCH_CHECK("moe_unpermute_backward (de)");
  }
  // One block per choice; grid.x allows 2^31 - 1 blocks.
  k_moe_unpermute_bwd_dw<<<unsigned(N * k), kThreads, 0, s>>>(dw, dy, e, slots, k, C);
  TETRAD_LAUNCH_CHECK("moe_unpermute_backward (dw)");
}

}  // namespace tetrad::gpu
