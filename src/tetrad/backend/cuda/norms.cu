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
__global__ void k_norm_row_sums(double* stat, int64_t stride, const float* x, const float* mean,
                                bool square, int64_t Cx) {
  const int64_t t = blockIdx.x;
  const float* r = x + t * Cx;
  double acc = 0;
  if (mean) {
    const double m = mean[t];
    for (int64_t c = threadIdx.x; c < Cx; c += blockDim.x) {
      const double d = double(r[c]) - m;
      acc += d * d;
    }
  } else if (square) {
    for (int64_t c = threadIdx.x; c < Cx; c += blockDim.x) acc += double(r[c]) * r[c];
  } else {
    for (int64_t c = threadIdx.x; c < Cx; c += blockDim.x) acc += r[c];
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) stat[t * stride] = acc;
}
__global__ void k_norm_finish_mean(float* mean, const double* stat, int64_t ntok, int64_t C) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t < ntok) mean[t] = float(stat[t] / double(C));
}
__global__ void k_norm_finish_rstd(float* rstd, const double* stat, int64_t ntok, int64_t C,
                                   float eps) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t < ntok) rstd[t] = float(1.0 / sqrt(stat[t] / double(C) + double(eps)));
}
__global__ void k_norm_apply(float* out, const float* x, const float* mean, const float* rstd,
                             const float* w, const float* b, int64_t Cx) {
  const int64_t t = blockIdx.x;
  const float m = mean ? mean[t] : 0.0f, s = rstd[t];
  const float* r = x + t * Cx;
  float* o = out + t * Cx;
  for (int64_t c = threadIdx.x; c < Cx; c += blockDim.x)
    o[c] = b ? (r[c] - m) * s * w[c] + b[c] : (r[c] - m) * s * w[c];
}
// Whole-row LayerNorm/RMSNorm forward: the statistics as the split path computes them (double
// sums, centred variance), in one block, then the apply; x's row is re-read from L1/L2.
__global__ void k_norm_fwd_row(float* out, float* mean_out, float* rstd_out, const float* x,
                               const float* w, const float* b, int64_t C, float eps, bool layer) {
  const int64_t t = blockIdx.x;
  const float* r = x + t * C;
  float m = 0.0f;
  double acc = 0;
  if (layer) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) acc += r[c];
    acc = block_sum(acc);
    m = float(acc / double(C));
    acc = 0;
    const double md = m;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const double d = double(r[c]) - md;
      acc += d * d;
    }
  } else {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) acc += double(r[c]) * r[c];
  }
  acc = block_sum(acc);
  const float s = float(1.0 / sqrt(acc / double(C) + double(eps)));
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[t] = m;
    rstd_out[t] = s;
  }
  float* o = out + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    o[c] = b ? (r[c] - m) * s * w[c] + b[c] : (r[c] - m) * s * w[c];
}
__global__ void k_norm_bwd_partials(double* st, const float* dout, const float* x,
                                    const float* mean, const float* rstd, const float* w,
                                    int64_t Cx) {
  const int64_t t = blockIdx.x;
  const float m = mean ? mean[t] : 0.0f, s = rstd[t];
  const float* r = x + t * Cx;
  const float* d = dout + t * Cx;
  double a1 = 0, a2 = 0;
  for (int64_t c = threadIdx.x; c < Cx; c += blockDim.x) {
    const float dn = d[c] * w[c];
    a1 += dn;
    a2 += dn * ((r[c] - m) * s);
  }
  a1 = block_sum(a1);
  a2 = block_sum(a2);
  if (threadIdx.x == 0) {
    st[2 * t] = a1;
    st[2 * t + 1] = a2;
  }
}
__global__ void k_norm_bwd_apply(float* dx, const float* dout, const float* x, const float* mean,
                                 const float* rstd, const float* w, const double* st, int64_t Cx,
                                 int64_t C) {
  const int64_t t = blockIdx.x;
  const float m = mean ? mean[t] : 0.0f, s = rstd[t];
  const float mean_dn = mean ? float(st[2 * t] / double(C)) : 0.0f;
  const float mean_dnn = float(st[2 * t + 1] / double(C));
  const float* r = x + t * Cx;
  const float* d = dout + t * Cx;
  float* o = dx + t * Cx;
  for (int64_t c = threadIdx.x; c < Cx; c += blockDim.x) {
    const float n = (r[c] - m) * s;
    o[c] += (d[c] * w[c] - mean_dn - n * mean_dnn) * s;
  }
}
// Whole-row backward: partials and apply in one block.
__global__ void k_norm_bwd_row(float* dx, const float* dout, const float* x, const float* mean,
                               const float* rstd, const float* w, int64_t C) {
  const int64_t t = blockIdx.x;
  const float m = mean ? mean[t] : 0.0f, s = rstd[t];
  const float* r = x + t * C;
  const float* d = dout + t * C;
  double a1 = 0, a2 = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float dn = d[c] * w[c];
    a1 += dn;
    a2 += dn * ((r[c] - m) * s);
  }
  a1 = block_sum(a1);
  a2 = block_sum(a2);
  const float mean_dn = mean ? float(a1 / double(C)) : 0.0f;
  const float mean_dnn = float(a2 / double(C));
  float* o = dx + t * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float n = (r[c] - m) * s;
    o[c] += (d[c] * w[c] - mean_dn - n * mean_dnn) * s;
  }
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
