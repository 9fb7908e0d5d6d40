// Deterministic column sums for the CUDA kernel files that reduce over tokens (norms.cu: weight
// gradients; elementwise.cu: bias gradients). Internal linkage, as kernel_common.cuh.
#pragma once
#include "tetrad/backend/cuda/kernel_common.cuh"

namespace tetrad::gpu {
namespace {

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

}  // namespace
}  // namespace tetrad::gpu
