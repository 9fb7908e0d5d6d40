// CUDA kernels beside their launchers (kernels.hpp): LayerNorm and RMSNorm, forward and backward,
// whole-row and split over X (partial row sums, finish, apply), and the weight gradients.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tetrad/backend/cuda/kernel_common.cuh"
#include "tetrad/backend/cuda/kernels.hpp"
#include "tetrad/backend/cuda/column_sums.cuh"

namespace tetrad::gpu {
namespace {

// ---- norms: one block per row ----
// What the split kernels and the whole-row (Gx = 1) kernels share, so that both compute the same
// thing in the same order: the row sums in double, the apply, the backward's two sums and its
// apply. Every thread of the block calls them (block_sum inside).
enum class RowSum { Plain, Squares, Centred };
__device__ __forceinline__ double row_sum(const float* r, int64_t C, RowSum kind, double m) {
  double acc = 0;
  if (kind == RowSum::Centred) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const double d = double(r[c]) - m;
      acc += d * d;
    }
  } else if (kind == RowSum::Squares) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) acc += double(r[c]) * r[c];
  } else {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) acc += r[c];
  }
  return block_sum(acc);
}
// o = (r - m) * s * w (+ b)
__device__ __forceinline__ void apply_row(float* o, const float* r, int64_t C, float m, float s,
                                          const float* w, const float* b) {
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    o[c] = b ? (r[c] - m) * s * w[c] + b[c] : (r[c] - m) * s * w[c];
}
// a1 = Σ dout*w, a2 = Σ dout*w*n over the row (n = (x - m) * s), block sums in double.
__device__ __forceinline__ void backward_sums(double& a1, double& a2, const float* d,
                                              const float* r, const float* w, float m, float s,
                                              int64_t C) {
  a1 = 0;
  a2 = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float dn = d[c] * w[c];
    a1 += dn;
    a2 += dn * ((r[c] - m) * s);
  }
  a1 = block_sum(a1);
  a2 = block_sum(a2);
}
// o += (dout*w - mean_dn - n*mean_dnn) * s
__device__ __forceinline__ void backward_apply_row(float* o, const float* d, const float* r,
                                                   const float* w, float m, float s,
                                                   float mean_dn, float mean_dnn, int64_t C) {
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float n = (r[c] - m) * s;
    o[c] += (d[c] * w[c] - mean_dn - n * mean_dnn) * s;
  }
}

__global__ void k_norm_row_sums(double* stat, int64_t stride, const float* x, const float* mean,
                                bool square, int64_t Cx) {
  const int64_t t = blockIdx.x;
  const RowSum kind = mean ? RowSum::Centred : square ? RowSum::Squares : RowSum::Plain;
  const double acc = row_sum(x + t * Cx, Cx, kind, mean ? double(mean[t]) : 0.0);
  if (threadIdx.x == 0) stat[t * stride] = acc;
}
__global__ void k_norm_finish_mean(float* mean, const double* stat, int64_t ntok, int64_t C) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t < ntok) mean[t] = float(stat[t] / double(C));
}
__device__ __forceinline__ float rstd_of(double sum_sq, int64_t C, float eps) {
  return float(1.0 / sqrt(sum_sq / double(C) + double(eps)));
}
__global__ void k_norm_finish_rstd(float* rstd, const double* stat, int64_t ntok, int64_t C,
                                   float eps) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t < ntok) rstd[t] = rstd_of(stat[t], C, eps);
}
__global__ void k_norm_apply(float* out, const float* x, const float* mean, const float* rstd,
                             const float* w, const float* b, int64_t Cx) {
  const int64_t t = blockIdx.x;
  apply_row(out + t * Cx, x + t * Cx, Cx, mean ? mean[t] : 0.0f, rstd[t], w, b);
}
// Whole-row LayerNorm/RMSNorm forward: the statistics as the split path computes them (double
// sums, centred variance), in one block, then the apply; x's row is re-read from L1/L2.
__global__ void k_norm_fwd_row(float* out, float* mean_out, float* rstd_out, const float* x,
                               const float* w, const float* b, int64_t C, float eps, bool layer) {
  const int64_t t = blockIdx.x;
  const float* r = x + t * C;
  float m = 0.0f;
  double sq;
  if (layer) {
    m = float(row_sum(r, C, RowSum::Plain, 0.0) / double(C));
    sq = row_sum(r, C, RowSum::Centred, double(m));
  } else {
    sq = row_sum(r, C, RowSum::Squares, 0.0);
  }
  const float s = rstd_of(sq, C, eps);
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[t] = m;
    rstd_out[t] = s;
  }
  apply_row(out + t * C, r, C, m, s, w, b);
}
__global__ void k_norm_bwd_partials(double* st, const float* dout, const float* x,
                                    const float* mean, const float* rstd, const float* w,
                                    int64_t Cx) {
  const int64_t t = blockIdx.x;
  double a1, a2;
  backward_sums(a1, a2, dout + t * Cx, x + t * Cx, w, mean ? mean[t] : 0.0f, rstd[t], Cx);
  if (threadIdx.x == 0) {
    st[2 * t] = a1;
    st[2 * t + 1] = a2;
  }
}
__global__ void k_norm_bwd_apply(float* dx, const float* dout, const float* x, const float* mean,
                                 const float* rstd, const float* w, const double* st, int64_t Cx,
                                 int64_t C) {
  const int64_t t = blockIdx.x;
  const float mean_dn = mean ? float(st[2 * t] / double(C)) : 0.0f;
  const float mean_dnn = float(st[2 * t + 1] / double(C));
  backward_apply_row(dx + t * Cx, dout + t * Cx, x + t * Cx, w, mean ? mean[t] : 0.0f, rstd[t],
                     mean_dn, mean_dnn, Cx);
}
// Whole-row backward: partials and apply in one block.
__global__ void k_norm_bwd_row(float* dx, const float* dout, const float* x, const float* mean,
                               const float* rstd, const float* w, int64_t C) {
  const int64_t t = blockIdx.x;
  const float m = mean ? mean[t] : 0.0f, s = rstd[t];
  double a1, a2;
  backward_sums(a1, a2, dout + t * C, x + t * C, w, m, s, C);
  const float mean_dn = mean ? float(a1 / double(C)) : 0.0f;
  const float mean_dnn = float(a2 / double(C));
  backward_apply_row(dx + t * C, dout + t * C, x + t * C, w, m, s, mean_dn, mean_dnn, C);
}

// Block size for one-row-per-block kernels: enough threads for the row, a multiple of 32.
inline int row_threads(int64_t C) {
  if (C >= 1024) return 256;
  if (C >= 256) return 128;
  return 64;
}

}  // namespace

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

}  // namespace tetrad::gpu
