// CUDA kernels beside their launchers (kernels.hpp): the elementwise family. GELU and SwiGLU
// (forward/backward), residual, bias and position adds, the bias gradient (a column sum), fp32 <->
// bf16 casts and rounding to bf16.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tetrad/backend/cuda/kernel_common.cuh"
#include "tetrad/backend/cuda/kernels.hpp"
#include "tetrad/backend/cuda/column_sums.cuh"

namespace tetrad::gpu {
namespace {

// The CPU's constants (backend/cpu/ops.cpp): sqrt(2/pi) and 0.044715.
constexpr float kGeluS = 0.7978845608028654f;
constexpr float kGeluA = 0.044715f;

// tanh(sqrt(2/pi) (v + 0.044715 v^3)), the inner term forward and backward share.
__device__ __forceinline__ float gelu_tanh(float v) {
  return tanhf(kGeluS * (v + kGeluA * v * v * v));
}
__global__ void k_gelu_fwd(float* out, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    out[i] = 0.5f * v * (1.0f + gelu_tanh(v));
  }
}
__global__ void k_gelu_bwd(float* dx, const float* dout, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float th = gelu_tanh(v);
    const float local =
        0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * kGeluS * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = local * dout[i];
  }
}
// Element i of SwiGLU's output: its gate g and up u (row t of gu [ntok, 2F]) and sigmoid(g).
struct SwigluAt {
  int64_t gate, up;  // indices into gu
  float g, u, sg;
  __device__ __forceinline__ SwigluAt(const float* gu, int64_t i, int64_t F) {
    const int64_t t = i / F, f = i - t * F;
    gate = t * 2 * F + f;
    up = gate + F;
    g = gu[gate];
    u = gu[up];
    sg = 1.0f / (1.0f + expf(-g));
  }
};
__global__ void k_swiglu_fwd(float* out, const float* gu, int64_t ntok, int64_t F) {
  const int64_t n = ntok * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const SwigluAt e(gu, i, F);
    out[i] = e.g * e.sg * e.u;
  }
}
__global__ void k_swiglu_bwd(float* dgu, const float* dout, const float* gu, int64_t ntok,
                             int64_t F) {
  const int64_t n = ntok * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const SwigluAt e(gu, i, F);
    const float d = dout[i];
    dgu[e.gate] = d * e.u * e.sg * (1.0f + e.g * (1.0f - e.sg));
    dgu[e.up] = d * e.g * e.sg;
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
// out[r * ldo + c] = conv(in[r * ldi + c]) over rows x cols: both casts.
struct ToBf16 {
  __device__ uint16_t operator()(float x) const { return f2bf(x); }
};
struct FromBf16 {
  __device__ float operator()(uint16_t x) const { return bf2f(x); }
};
template <typename Out, typename In, typename Conv>
__global__ void k_cast(Out* out, int64_t ldo, const In* in, int64_t ldi, int64_t rows,
                       int64_t cols, Conv conv) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    out[r * ldo + c] = conv(in[r * ldi + c]);
  }
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
__global__ void k_gemm_empty(float* C, int64_t ldc, int64_t M, int64_t N, float beta,
                             const float* bias) {
  const int64_t n = M * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / N, c = i - r * N;
    float& out = C[r * ldc + c];
    const float kept = beta == 0.0f ? 0.0f : beta * out;
    out = bias ? kept + bias[c] : kept;
  }
}
__global__ void k_round_bf16(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = bf2f(f2bf(x[i]));
}

}  // namespace

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
  k_cast<<<grid_for(rows * cols), kThreads, 0, s>>>(out, ldo, in, ldi, rows, cols, ToBf16{});
  TETRAD_LAUNCH_CHECK("cast_f32_to_bf16");
}
void cast_bf16_to_f32(float* out, int64_t ldo, const uint16_t* in, int64_t ldi, int64_t rows,
                      int64_t cols, gpuStream_t s) {
  if (rows * cols <= 0) return;
  k_cast<<<grid_for(rows * cols), kThreads, 0, s>>>(out, ldo, in, ldi, rows, cols, FromBf16{});
  TETRAD_LAUNCH_CHECK("cast_bf16_to_f32");
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
void gemm_empty_product(float* C, int64_t ldc, int64_t M, int64_t N, float beta,
                        const float* bias, gpuStream_t s) {
  if (M * N <= 0) return;
  k_gemm_empty<<<grid_for(M * N), kThreads, 0, s>>>(C, ldc, M, N, beta, bias);
  TETRAD_LAUNCH_CHECK("gemm_empty_product");
}
void round_to_bf16(float* x, int64_t n, gpuStream_t s) {
  if (n <= 0) return;
  k_round_bf16<<<grid_for(n), kThreads, 0, s>>>(x, n);
  TETRAD_LAUNCH_CHECK("round_to_bf16");
}

}  // namespace tetrad::gpu
