// What every CUDA kernel file of the op families shares (elementwise.cu, norms.cu, rope.cu,
// embedding.cu, cross_entropy.cu, optimizer.cu; attention is attention.cu): launch geometry,
// warp and block sums, bf16 conversions, the launch check. Included by .cu files only; everything
// here has internal linkage (an unnamed namespace), so each file has its own copy.
//
// Portability: only the CUDA runtime's launch syntax, __shfl_xor_sync and __syncthreads are used
// (HIP has the same with 64-wide wavefronts: kWarp below and the shuffle masks are the places a
// port touches). Sizes are int64_t; grids stay under 2^31 blocks by grid-stride loops.
#pragma once
#include <cuda_runtime.h>

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

__device__ __forceinline__ uint16_t f2bf(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

}  // namespace
}  // namespace tetrad::gpu

#define TETRAD_LAUNCH_CHECK(name) gpu_check_launch(name)
