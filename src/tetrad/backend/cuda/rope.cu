// CUDA kernels beside their launchers (kernels.hpp): rotary position embedding, forward and
// backward (the same rotation with the sine negated).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tetrad/backend/cuda/kernel_common.cuh"
#include "tetrad/backend/cuda/kernels.hpp"

namespace tetrad::gpu {
namespace {

// ---- rotary ----
__global__ void k_rope(float* x, int64_t ntok, int64_t T, int64_t pos0, int64_t n_rot_heads,
                       int64_t hd, int64_t stride, const float* cs, const float* sn, float sign,
                       const int32_t* doc_start) {
  const int64_t half = hd / 2;
  const int64_t n = ntok * n_rot_heads * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % half;
    const int64_t th = i / half;
    const int64_t h = th % n_rot_heads, t = th / n_rot_heads;
    const int64_t pos = pos0 + t % T - (doc_start ? doc_start[t] : 0);
    float* x1 = x + t * stride + h * hd;
    const float a = x1[j], b = x1[j + half];
    const float c = cs[pos * half + j], sv = sign * sn[pos * half + j];
    x1[j] = a * c - b * sv;
    x1[j + half] = b * c + a * sv;
  }
}

// Forward (sign +1) and the adjoint (-1, the rotation by -angle) in one launcher.
void rope(float* x, int64_t ntok, int64_t T, int64_t pos0, int64_t n_rot_heads, int64_t hd,
          int64_t stride, const float* cos_table, const float* sin_table, float sign,
          const int32_t* doc_start, const char* name, gpuStream_t s) {
  const int64_t n = ntok * n_rot_heads * (hd / 2);
  if (n <= 0) return;
  k_rope<<<grid_for(n), kThreads, 0, s>>>(x, ntok, T, pos0, n_rot_heads, hd, stride, cos_table,
                                           sin_table, sign, doc_start);
  TETRAD_LAUNCH_CHECK(name);
}

}  // namespace

void rope_forward(float* x, int64_t ntok, int64_t T, int64_t pos0, int64_t n_rot_heads,
                  int64_t hd, int64_t stride, const float* cos_table, const float* sin_table,
                  const int32_t* doc_start, gpuStream_t s) {
  rope(x, ntok, T, pos0, n_rot_heads, hd, stride, cos_table, sin_table, 1.0f, doc_start,
       "rope_forward", s);
}
void rope_backward(float* dx, int64_t ntok, int64_t T, int64_t pos0, int64_t n_rot_heads,
                   int64_t hd, int64_t stride, const float* cos_table, const float* sin_table,
                   const int32_t* doc_start, gpuStream_t s) {
  rope(dx, ntok, T, pos0, n_rot_heads, hd, stride, cos_table, sin_table, -1.0f, doc_start,
       "rope_backward", s);
}

}  // namespace tetrad::gpu
