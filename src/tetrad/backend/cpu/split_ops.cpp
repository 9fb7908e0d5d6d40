#include "tetrad/backend/cpu/split_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tetrad/backend/cpu/fast_math.hpp"
#include "tetrad/backend/cpu/precision.hpp"

namespace tetrad::backend::cpu {

// ---------------------------------------------------------------------------------------------
// Bias and residual

void bias_add(float* out, const float* b, int64_t N, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < n; ++j) out[t * n + j] += b[j];
}

void residual_add(float* out, const float* resid, const float* y, const float* b, int64_t N,
                  int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c)
      out[t * C + c] = resid[t * C + c] + y[t * C + c] + (b ? b[c] : 0.0f);
}

// Σ over tokens, parallel over column blocks (fixed order).
void bias_grad(float* db, const float* dout, int64_t N, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t j0 = 0; j0 < n; j0 += 256) {
    const int64_t j1 = std::min(n, j0 + 256);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = j0; j < j1; ++j) db[j] += dout[t * n + j];
  }
}

// ---------------------------------------------------------------------------------------------
// Norms with split statistics

void norm_row_stats(RowStat stat, double* out, int64_t stride, const float* x, const float* sub,
                    int64_t N, int64_t C) {
  if (stat == RowStat::Squares) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      const float* r = x + t * C;
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += double(r[c]) * r[c];
      out[t * stride] = s;
    }
    return;
  }
  const bool centred = stat == RowStat::CenteredSquares;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = x + t * C;
    double s = 0;
    if (centred) {
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

void norm_finish_stats(StatFinish f, float* out, const double* st, int64_t N, int64_t C,
                       float eps) {
  if (f == StatFinish::Mean)
    for (int64_t t = 0; t < N; ++t) out[t] = float(st[t] / double(C));
  else
    for (int64_t t = 0; t < N; ++t) out[t] = float(1.0 / std::sqrt(st[t] / double(C) + eps));
}

namespace {
inline float store_as(float, float v) { return v; }
inline uint16_t store_as(uint16_t, float v) { return kernels::float_to_bf16(v); }
}  // namespace

// The same arithmetic for both outputs, so the bf16 form is the fp32 result rounded, bit for bit.
template <typename O>
void norm_apply_impl(O* out, const float* x, const float* mean, const float* rstd, const float* wv,
                     const float* bv, int64_t N, int64_t Cx) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = x + t * Cx;
    O* o = out + t * Cx;
    const float m = mean ? mean[t] : 0.0f, s = rstd[t];
    if (bv) {
#pragma omp simd
      for (int64_t c = 0; c < Cx; ++c) o[c] = store_as(O(), (r[c] - m) * s * wv[c] + bv[c]);
    } else if (mean) {
#pragma omp simd
      for (int64_t c = 0; c < Cx; ++c) o[c] = store_as(O(), (r[c] - m) * s * wv[c]);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < Cx; ++c) o[c] = store_as(O(), r[c] * s * wv[c]);
    }
  }
}

void norm_apply(float* out, const float* x, const float* mean, const float* rstd, const float* wv,
                const float* bv, int64_t N, int64_t Cx) {
  norm_apply_impl(out, x, mean, rstd, wv, bv, N, Cx);
}

void norm_apply_bf16(uint16_t* out, const float* x, const float* mean, const float* rstd,
                     const float* wv, const float* bv, int64_t N, int64_t Cx) {
  norm_apply_impl(out, x, mean, rstd, wv, bv, N, Cx);
}

void cast_transpose_to_bf16(uint16_t* out, uint16_t* out_t, const float* x, int64_t rows,
                            int64_t cols) {
  // 64 x 64 tiles: a tile's 16 KiB of input and 8 KiB of transposed output stay in L1.
  constexpr int64_t kT = 64;
  const int64_t tr = (rows + kT - 1) / kT, tc = (cols + kT - 1) / kT;
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t tile = 0; tile < tr * tc; ++tile) {
    const int64_t r0 = (tile / tc) * kT, c0 = (tile % tc) * kT;
    const int64_t r1 = std::min(rows, r0 + kT), c1 = std::min(cols, c0 + kT);
    uint16_t buf[kT * kT];
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * cols;
      uint16_t* br = buf + (r - r0) * kT;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) br[c - c0] = kernels::float_to_bf16(xr[c]);
      if (out) std::memcpy(out + r * cols + c0, br, size_t(c1 - c0) * sizeof(uint16_t));
    }
    if (out_t)
      for (int64_t c = c0; c < c1; ++c) {
        uint16_t* o = out_t + c * rows;
        for (int64_t r = r0; r < r1; ++r) o[r] = buf[(r - r0) * kT + (c - c0)];
      }
  }
}

void norm_backward_partials(double* st, const float* dout, const float* x, const float* mean,
                            const float* rstd, const float* wv, int64_t N, int64_t Cx) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = x + t * Cx;
    const float* d = dout + t * Cx;
    const float m = mean ? mean[t] : 0.0f, s = rstd[t];
    double a1 = 0, a2 = 0;
#pragma omp simd reduction(+ : a1, a2)
    for (int64_t c = 0; c < Cx; ++c) {
      const float dn = d[c] * wv[c];
      a1 += dn;
      a2 += dn * ((r[c] - m) * s);
    }
    st[2 * t] = a1;
    st[2 * t + 1] = a2;
  }
}

void norm_backward_apply(float* dx, const float* dout, const float* x, const float* mean,
                         const float* rstd, const float* wv, const double* st, int64_t N,
                         int64_t Cx, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = x + t * Cx;
    const float* d = dout + t * Cx;
    const float m = mean ? mean[t] : 0.0f, s = rstd[t];
    const float mean_dn = mean ? float(st[2 * t] / double(C)) : 0.0f;
    const float mean_dnn = float(st[2 * t + 1] / double(C));
    float* o = dx + t * Cx;
#pragma omp simd
    for (int64_t c = 0; c < Cx; ++c) {
      const float n = (r[c] - m) * s;
      o[c] += (d[c] * wv[c] - mean_dn - n * mean_dnn) * s;
    }
  }
}

void norm_param_grads(float* dw, float* db, const float* dout, const float* x, const float* mean,
                      const float* rstd, int64_t N, int64_t Cx) {
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < Cx; c0 += kBlock) {
    const int64_t c1 = std::min(Cx, c0 + kBlock);
    for (int64_t t = 0; t < N; ++t) {
      const float* r = x + t * Cx;
      const float* d = dout + t * Cx;
      const float m = mean ? mean[t] : 0.0f, s = rstd[t];
      for (int64_t c = c0; c < c1; ++c) {
        dw[c] += d[c] * (r[c] - m) * s;
        if (db) db[c] += d[c];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel embedding

void embedding_gather(float* out, const int32_t* tokens, const float* E, int64_t v0, int64_t Vs,
                      int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    float* o = out + t * C;
    const int64_t v = tokens[t] - v0;
    if (v >= 0 && v < Vs) std::memcpy(o, E + v * C, C * sizeof(float));
    else std::fill(o, o + C, 0.0f);
  }
}

void position_add(float* out, const float* P, int64_t N, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c) out[t * C + c] += P[(t % T) * C + c];
}

void embedding_scatter_add(float* gp, int64_t s0, int64_t s1, const float* R,
                           const int32_t* ids, int64_t v0, int64_t Vs, int64_t rows, int64_t C) {
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    const int64_t c1 = std::min(C, c0 + kBlock);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t v = ids[r] - v0;
      if (v < 0 || v >= Vs) continue;
      const int64_t e = v * C;  // the row's first element in the block
      const int64_t lo = std::max(c0, s0 - e), hi = std::min(c1, s1 - e);
      for (int64_t c = lo; c < hi; ++c) gp[e + c - s0] += R[r * C + c];
    }
  }
}

void position_grad(float* dP, const float* dout, int64_t N, int64_t T, int64_t C) {
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    const int64_t c1 = std::min(C, c0 + kBlock);
    for (int64_t t = 0; t < N; ++t) {
      const float* dr = dout + t * C;
      for (int64_t c = c0; c < c1; ++c) dP[(t % T) * C + c] += dr[c];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel cross-entropy

void ce_row_max(float* mx, const float* L, int64_t N, int64_t Vs) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    mx[t] = kernels::row_max(L + t * Vs, Vs);
  }
}

// Σ exp in sum_exp_shifted's fixed lane order (the vectorised exp is this op's whole cost; the
// scalar loop it replaces took about half the bf16 step's loss phase on gpt2-124m).
void ce_sum_exp_target(double* st, const float* L, const float* mx, const int32_t* targets,
                       int64_t v0, int64_t Vs, int64_t N) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = L + t * Vs;
    st[2 * t] = kernels::sum_exp_shifted(r, Vs, mx[t]);
    const int64_t v = targets[t] - v0;
    st[2 * t + 1] = (targets[t] >= 0 && v >= 0 && v < Vs) ? r[v] : 0.0;
  }
}

void ce_row_max_sum_exp_target(float* mx, double* st, const float* L, const int32_t* targets,
                               int64_t v0, int64_t Vs, int64_t N) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = L + t * Vs;
    const float m = kernels::row_max(r, Vs);
    mx[t] = m;
    st[2 * t] = kernels::sum_exp_shifted(r, Vs, m);  // the row again, from cache
    const int64_t v = targets[t] - v0;
    st[2 * t + 1] = (targets[t] >= 0 && v >= 0 && v < Vs) ? r[v] : 0.0;
  }
}

void ce_loss(float* losses, double* total, const double* st, const float* mx,
             const int32_t* targets, int64_t N) {
  double sum = 0;
  for (int64_t t = 0; t < N; ++t) {
    const bool kept = targets[t] >= 0;
    losses[t] = kept ? float(std::log(st[2 * t]) + mx[t] - st[2 * t + 1]) : 0.0f;
    sum += losses[t];
  }
  *total = sum;
}

void ce_grad(float* L, const float* mx, const double* st, const int32_t* targets, int64_t v0,
             int64_t Vs, int64_t N, float grad_scale) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    float* r = L + t * Vs;
    if (targets[t] < 0) {
      std::fill(r, r + Vs, 0.0f);
      continue;
    }
    const float scale = grad_scale / float(st[2 * t]), m = mx[t];
#pragma omp simd
    for (int64_t j = 0; j < Vs; ++j) r[j] = kernels::fast_exp(r[j] - m) * scale;
    const int64_t v = targets[t] - v0;
    if (v >= 0 && v < Vs) r[v] -= grad_scale;
  }
}

// ce_grad's values rounded to bf16, row by row (the logits streamed once, the stored copy
// written as they are read); the transposed copy is then transposed from the stored one (or from
// a row's scratch when only the transposed copy is asked for) in 64 x 64 bf16 tiles: half the
// bytes of transposing fp32, and the exps stay in the streaming pass (in cast_transpose's
// tiles, whose 64 rows lie 4 * Vs bytes apart, the same pass measured 1.3x slower than ce_grad
// plus the cast). The element values are computed as ce_grad computes them (the same
// expressions, then the target's subtraction): bit for bit ce_grad followed by the cast.
namespace {
void ce_grad_bf16_row(uint16_t* o, const float* x, int32_t target, const float* mx,
                      const double* st, int64_t t, int64_t v0, int64_t Vs, float grad_scale) {
  if (target < 0) {
    std::fill(o, o + Vs, uint16_t(0));
    return;
  }
  const float scale = grad_scale / float(st[2 * t]), m = mx[t];
#pragma omp simd
  for (int64_t j = 0; j < Vs; ++j) o[j] = kernels::float_to_bf16(kernels::fast_exp(x[j] - m) * scale);
  const int64_t v = target - v0;
  if (v >= 0 && v < Vs) {
    float g = kernels::fast_exp(x[v] - m) * scale;
    g -= grad_scale;
    o[v] = kernels::float_to_bf16(g);
  }
}
}  // namespace

void ce_grad_bf16(uint16_t* out, uint16_t* out_t, const float* L, const float* mx,
                  const double* st, const int32_t* targets, int64_t v0, int64_t Vs, int64_t N,
                  float grad_scale) {
  if (out) {
#pragma omp parallel for schedule(static) if (N * Vs > 32768)
    for (int64_t t = 0; t < N; ++t)
      ce_grad_bf16_row(out + t * Vs, L + t * Vs, targets[t], mx, st, t, v0, Vs, grad_scale);
    if (out_t) transpose_bf16(out_t, out, N, Vs);
    return;
  }
  if (!out_t) return;
  // Transposed copy only: 64 rows at a time through a scratch of their bf16 values.
  constexpr int64_t kT = 64;
  const int64_t tr = (N + kT - 1) / kT;
#pragma omp parallel
  {
    std::vector<uint16_t> rows(size_t(kT * Vs));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < tr; ++b) {
      const int64_t r0 = b * kT, r1 = std::min(N, r0 + kT);
      for (int64_t t = r0; t < r1; ++t)
        ce_grad_bf16_row(rows.data() + (t - r0) * Vs, L + t * Vs, targets[t], mx, st, t, v0, Vs,
                         grad_scale);
      for (int64_t c = 0; c < Vs; ++c) {
        uint16_t* o = out_t + c * N;
        for (int64_t t = r0; t < r1; ++t) o[t] = rows[size_t((t - r0) * Vs + c)];
      }
    }
  }
}

// out_t (cols, rows) = xᵀ for bf16 x (rows, cols), in 64 x 64 tiles.
void transpose_bf16(uint16_t* out_t, const uint16_t* x, int64_t rows, int64_t cols) {
  constexpr int64_t kT = 64;
  const int64_t tr = (rows + kT - 1) / kT, tc = (cols + kT - 1) / kT;
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t tile = 0; tile < tr * tc; ++tile) {
    const int64_t r0 = (tile % tr) * kT, c0 = (tile / tr) * kT;  // down a column block first
    const int64_t r1 = std::min(rows, r0 + kT), c1 = std::min(cols, c0 + kT);
    for (int64_t c = c0; c < c1; ++c) {
      uint16_t* o = out_t + c * rows;
      for (int64_t r = r0; r < r1; ++r) o[r] = x[r * cols + c];
    }
  }
}

void row_argmax(int32_t* idx, float* val, const float* logits, int64_t N, int64_t Vs, int64_t ld) {
  for (int64_t b = 0; b < N; ++b) {
    const float* row = logits + b * ld;
    int64_t j = 0;  // the first maximum; NaN counts as the largest value (the first NaN wins)
    for (int64_t i = 1; i < Vs && !std::isnan(row[j]); ++i)
      if (std::isnan(row[i]) || row[i] > row[j]) j = i;
    idx[b] = int32_t(j);
    val[b] = row[j];
  }
}

}  // namespace tetrad::backend::cpu
