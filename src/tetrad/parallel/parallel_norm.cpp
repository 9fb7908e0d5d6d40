// ParallelTransformer: LayerNorm / RMSNorm over a hidden size split across X, exact. Each rank
// sums its Cx = C/Gx columns per row, the row statistics are all-reduced over X (mean then
// variance for LayerNorm, mean square for RMSNorm; backward: Σ dn and Σ dn·n), then every rank
// normalises its own columns. Weight and bias gradients accumulate per column, in token order.
#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>
#include <cmath>

namespace tetrad::parallel {

namespace {

void row_sums(const float* x, int64_t N, int64_t C, double* out, int stride, const float* sub) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = x + t * C;
    double s = 0;
    if (sub) {
      const double m = sub[t];
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += (r[c] - m) * (r[c] - m);
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += r[c];
    }
    out[t * stride] = s;
  }
}

}  // namespace

void ParallelTransformer::norm_fwd(float* out, float* mean, float* rstd, const float* x, int wi,
                                   int bi, int64_t N) {
  const int64_t C = cfg_.n_embd;
  const float eps = cfg_.norm_eps;
  double* st = stats_.data();
  ScopedPhase sp(prof_, Phase::Norm);
  if (gpt2_) {
    row_sums(x, N, Cx_, st, 1, nullptr);
    sum_over(g_.x, st, N, "norm mean");
    for (int64_t t = 0; t < N; ++t) mean[t] = float(st[t] / double(C));
    row_sums(x, N, Cx_, st, 1, mean);
    sum_over(g_.x, st, N, "norm var");
    for (int64_t t = 0; t < N; ++t) rstd[t] = float(1.0 / std::sqrt(st[t] / double(C) + eps));
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      const float* r = x + t * Cx_;
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < Cx_; ++c) s += double(r[c]) * r[c];
      st[t] = s;
    }
    sum_over(g_.x, st, N, "norm ms");
    for (int64_t t = 0; t < N; ++t) rstd[t] = float(1.0 / std::sqrt(st[t] / double(C) + eps));
  }
  const float* wv = w(wi);
  const float* bv = w(bi);
  const bool gpt2 = gpt2_;
  const int64_t Cx = Cx_;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = x + t * Cx;
    float* o = out + t * Cx;
    const float m = gpt2 ? mean[t] : 0.0f, s = rstd[t];
    if (bv) {
#pragma omp simd
      for (int64_t c = 0; c < Cx; ++c) o[c] = (r[c] - m) * s * wv[c] + bv[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < Cx; ++c) o[c] = r[c] * s * wv[c];
    }
  }
}

// dx += norm backward; dw, db accumulate. Row sums of dn and dn*n are all-reduced over X.
void ParallelTransformer::norm_bwd(float* dx, const float* dout, const float* x, const float* mean,
                                   const float* rstd, int wi, int bi, int64_t N) {
  const int64_t C = cfg_.n_embd;
  double* st = stats_.data();
  ScopedPhase sp(prof_, Phase::Norm);
  const float* wv = w(wi);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = x + t * Cx_;
    const float* d = dout + t * Cx_;
    const float m = gpt2_ ? mean[t] : 0.0f, s = rstd[t];
    double a1 = 0, a2 = 0;
#pragma omp simd reduction(+ : a1, a2)
    for (int64_t c = 0; c < Cx_; ++c) {
      const float dn = d[c] * wv[c];
      a1 += dn;
      a2 += dn * ((r[c] - m) * s);
    }
    st[2 * t] = a1;
    st[2 * t + 1] = a2;
  }
  sum_over(g_.x, st, 2 * N, "norm grad");
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = x + t * Cx_;
    const float* d = dout + t * Cx_;
    const float m = gpt2_ ? mean[t] : 0.0f, s = rstd[t];
    const float mean_dn = gpt2_ ? float(st[2 * t] / double(C)) : 0.0f;
    const float mean_dnn = float(st[2 * t + 1] / double(C));
    float* o = dx + t * Cx_;
#pragma omp simd
    for (int64_t c = 0; c < Cx_; ++c) {
      const float n = (r[c] - m) * s;
      o[c] += (d[c] * wv[c] - mean_dn - n * mean_dnn) * s;
    }
  }
  float* dw = gw(wi);
  float* db = gw(bi);
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < Cx_; c0 += kBlock) {
    const int64_t c1 = std::min(Cx_, c0 + kBlock);
    for (int64_t t = 0; t < N; ++t) {
      const float* r = x + t * Cx_;
      const float* d = dout + t * Cx_;
      const float m = gpt2_ ? mean[t] : 0.0f, s = rstd[t];
      for (int64_t c = c0; c < c1; ++c) {
        dw[c] += d[c] * (r[c] - m) * s;
        if (db) db[c] += d[c];
      }
    }
  }
}

}  // namespace tetrad::parallel
