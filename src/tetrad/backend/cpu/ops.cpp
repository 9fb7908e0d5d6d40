#include "tetrad/backend/cpu/ops.hpp"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "tetrad/core/error.hpp"
#include "tetrad/backend/adamw_bias.hpp"
#include "tetrad/backend/cpu/fast_math.hpp"
#include "tetrad/backend/cpu/precision.hpp"

namespace tetrad::kernels {

namespace {
// Stores v as the output type: plain for T, rounded to bf16 for uint16_t.
template <typename O, typename T>
inline O to_out(T v) {
  if constexpr (std::is_same_v<O, uint16_t>) return float_to_bf16(float(v));
  else return O(v);
}
// Reads a stored input as T: plain for T, widened (exactly) from bf16 for uint16_t.
template <typename T, typename X>
inline T from_in(X v) {
  if constexpr (std::is_same_v<X, uint16_t>) return T(bf16_to_float(v));
  else return v;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// GEMM

template <>
void gemm<float>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                                beta, C, ldc);
  TETRAD_CHECK(st == dnnl_success, "dnnl_sgemm failed with status ", int(st), " for M=", M,
               " N=", N, " K=", K);
}

template <>
void gemm<double>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                  const double* A, int64_t lda, const double* B, int64_t ldb, double beta,
                  double* C, int64_t ldc) {
  // Reference path for the double-precision gradient checks: clarity over speed.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[k * lda + i] : A[i * lda + k];
        const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
      }
      C[i * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * C[i * ldc + j]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Linear

template <typename T>
void linear_forward(T* out, const T* in, const T* W, const T* bias, int64_t ntok, int64_t IC,
                    int64_t OC, bool accumulate) {
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < ntok; ++t) {
      T* o = out + t * OC;
      if (accumulate) {
#pragma omp simd
        for (int64_t j = 0; j < OC; ++j) o[j] += bias[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < OC; ++j) o[j] = bias[j];
      }
    }
  }
  const T beta = (bias || accumulate) ? T(1) : T(0);
  gemm<T>(false, true, ntok, OC, IC, T(1), in, IC, W, IC, beta, out, OC);
}

template <typename T>
void linear_backward(T* din, T* dW, T* dbias, const T* dout, const T* in, const T* W,
                     int64_t ntok, int64_t IC, int64_t OC) {
  if (din) gemm<T>(false, false, ntok, IC, OC, T(1), dout, OC, W, IC, T(0), din, IC);
  if (dW) gemm<T>(true, false, OC, IC, ntok, T(1), dout, OC, in, IC, T(1), dW, IC);
  if (dbias) {
    // Parallel over output channels, sequential over tokens: no races, order fixed.
    constexpr int64_t kBlock = 256;
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < OC; j0 += kBlock) {
      const int64_t j1 = std::min(OC, j0 + kBlock);
      for (int64_t t = 0; t < ntok; ++t) {
        const T* d = dout + t * OC;
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) dbias[j] += d[j];
      }
    }
  }
}

void linear_forward_bf16(float* out, const uint16_t* in, const uint16_t* W, const float* bias,
                         int64_t ntok, int64_t IC, int64_t OC, bool accumulate) {
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < ntok; ++t) {
      float* o = out + t * OC;
      if (accumulate) {
#pragma omp simd
        for (int64_t j = 0; j < OC; ++j) o[j] += bias[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < OC; ++j) o[j] = bias[j];
      }
    }
  }
  const float beta = (bias || accumulate) ? 1.0f : 0.0f;
  gemm_bf16(false, true, ntok, OC, IC, 1.0f, Bf16Operand::bf16_stored(in, IC),
            Bf16Operand::bf16_stored(W, IC), beta, out, OC);
}

void linear_backward_bf16(float* din, float* dW, float* dbias, const uint16_t* dout,
                          const float* dout_f32, const uint16_t* in, const uint16_t* W,
                          int64_t ntok, int64_t IC, int64_t OC) {
  if (din)
    gemm_bf16(false, false, ntok, IC, OC, 1.0f, Bf16Operand::bf16_stored(dout, OC),
              Bf16Operand::bf16_stored(W, IC), 0.0f, din, IC);
  if (dW)
    gemm_bf16(true, false, OC, IC, ntok, 1.0f, Bf16Operand::bf16_stored(dout, OC),
              Bf16Operand::bf16_stored(in, IC), 1.0f, dW, IC);
  if (dbias) {
    constexpr int64_t kBlock = 256;
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < OC; j0 += kBlock) {
      const int64_t j1 = std::min(OC, j0 + kBlock);
      for (int64_t t = 0; t < ntok; ++t) {
        if (dout_f32) {
          const float* d = dout_f32 + t * OC;
#pragma omp simd
          for (int64_t j = j0; j < j1; ++j) dbias[j] += d[j];
        } else {
          const uint16_t* d = dout + t * OC;
#pragma omp simd
          for (int64_t j = j0; j < j1; ++j) dbias[j] += bf16_to_float(d[j]);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Embedding

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t ntok,
                       int64_t T_seq, int64_t C, int64_t V) {
  for (int64_t t = 0; t < ntok; ++t)
    if (tokens[t] < 0 || tokens[t] >= V)
      fail("token id ", tokens[t], " at position ", t, " is outside the model's vocabulary [0, ",
           V, ")");
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < ntok; ++t) {
    T* o = out + t * C;
    const T* e = wte + int64_t(tokens[t]) * C;
    if (wpe) {
      const T* p = wpe + (t % T_seq) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = e[c];
    }
  }
}

template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t ntok,
                        int64_t T_seq, int64_t C) {
  // Parallel over channel blocks so that repeated tokens never race; tokens in order.
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    const int64_t c1 = std::min(C, c0 + kBlock);
    for (int64_t t = 0; t < ntok; ++t) {
      const T* d = dout + t * C;
      T* e = dwte + int64_t(tokens[t]) * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) e[c] += d[c];
      if (dwpe) {
        T* p = dwpe + (t % T_seq) * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Norms

namespace {
template <typename T, typename O>
void layernorm_forward_impl(O* out, T* mean, T* rstd, const T* x, const T* w, const T* b,
                            int64_t ntok, int64_t C, T eps) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < ntok; ++t) {
    const T* xr = x + t * C;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += xr[c];
    const T m = s / T(C);
    T v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    const T r = T(1) / std::sqrt(v / T(C) + eps);
    O* o = out + t * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = to_out<O>((xr[c] - m) * r * w[c] + b[c]);
    mean[t] = m;
    rstd[t] = r;
  }
}
}  // namespace

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b,
                       int64_t ntok, int64_t C, T eps) {
  layernorm_forward_impl(out, mean, rstd, x, w, b, ntok, C, eps);
}
void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x,
                            const float* w, const float* b, int64_t ntok, int64_t C, float eps) {
  layernorm_forward_impl(out, mean, rstd, x, w, b, ntok, C, eps);
}

template <typename T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w,
                        const T* mean, const T* rstd, int64_t ntok, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < ntok; ++t) {
    const T* xr = x + t * C;
    const T* d = dout + t * C;
    const T m = mean[t], r = rstd[t];
    T dn_mean = 0, dn_n_mean = 0;
#pragma omp simd reduction(+ : dn_mean, dn_n_mean)
    for (int64_t c = 0; c < C; ++c) {
      const T n = (xr[c] - m) * r;
      const T dn = d[c] * w[c];
      dn_mean += dn;
      dn_n_mean += dn * n;
    }
    dn_mean /= T(C);
    dn_n_mean /= T(C);
    T* dxr = dx + t * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const T n = (xr[c] - m) * r;
      dxr[c] += (d[c] * w[c] - dn_mean - n * dn_n_mean) * r;
    }
  }
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    const int64_t c1 = std::min(C, c0 + kBlock);
    for (int64_t t = 0; t < ntok; ++t) {
      const T* xr = x + t * C;
      const T* d = dout + t * C;
      const T m = mean[t], r = rstd[t];
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) {
        dw[c] += d[c] * (xr[c] - m) * r;
        db[c] += d[c];
      }
    }
  }
}

namespace {
template <typename T, typename O>
void rmsnorm_forward_impl(O* out, T* rstd, const T* x, const T* w, int64_t ntok, int64_t C,
                          T eps) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < ntok; ++t) {
    const T* xr = x + t * C;
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const T r = T(1) / std::sqrt(ss / T(C) + eps);
    O* o = out + t * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = to_out<O>(xr[c] * r * w[c]);
    rstd[t] = r;
  }
}
}  // namespace

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int64_t ntok, int64_t C, T eps) {
  rmsnorm_forward_impl(out, rstd, x, w, ntok, C, eps);
}
void rmsnorm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* w,
                          int64_t ntok, int64_t C, float eps) {
  rmsnorm_forward_impl(out, rstd, x, w, ntok, C, eps);
}

template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                      int64_t ntok, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < ntok; ++t) {
    const T* xr = x + t * C;
    const T* d = dout + t * C;
    const T r = rstd[t];
    T dn_n_mean = 0;
#pragma omp simd reduction(+ : dn_n_mean)
    for (int64_t c = 0; c < C; ++c) dn_n_mean += d[c] * w[c] * xr[c] * r;
    dn_n_mean /= T(C);
    T* dxr = dx + t * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dxr[c] += (d[c] * w[c] - xr[c] * r * dn_n_mean) * r;
  }
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    const int64_t c1 = std::min(C, c0 + kBlock);
    for (int64_t t = 0; t < ntok; ++t) {
      const T* xr = x + t * C;
      const T* d = dout + t * C;
      const T r = rstd[t];
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dw[c] += d[c] * xr[c] * r;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Activations

namespace {
constexpr double kGeluS = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluA = 0.044715;
constexpr int64_t kElemChunk = 16384;  // elementwise work split into fixed chunks
}  // namespace

// x16 (not null): x rounded to bf16 too, chunk by chunk while the chunk is in cache.
template <typename T, typename O>
void gelu_forward_impl(O* out, const T* x, int64_t n, uint16_t* x16 = nullptr) {
  const T s = T(kGeluS), a = T(kGeluA);
#pragma omp parallel for schedule(static)
  for (int64_t i0 = 0; i0 < n; i0 += kElemChunk) {
    const int64_t i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const T v = x[i];
      out[i] = to_out<O>(T(0.5) * v * (T(1) + fast_tanh(s * (v + a * v * v * v))));
    }
    if constexpr (std::is_same_v<T, float>)
      if (x16) convert_to_bf16(x + i0, x16 + i0, i1 - i0, false);
  }
}
template <typename T>
void gelu_forward(T* out, const T* x, int64_t n) { gelu_forward_impl(out, x, n); }
void gelu_forward_bf16(uint16_t* out, const float* x, int64_t n) { gelu_forward_impl(out, x, n); }
void gelu_forward_bf16_x(uint16_t* out, uint16_t* x16, const float* x, int64_t n) {
  gelu_forward_impl(out, x, n, x16);
}

template <typename T, typename O, typename X = T>
void gelu_backward_impl(O* dx, const T* dout, const X* x, int64_t n) {
  const T s = T(kGeluS), a = T(kGeluA);
#pragma omp parallel for schedule(static)
  for (int64_t i0 = 0; i0 < n; i0 += kElemChunk) {
    const int64_t i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const T v = from_in<T>(x[i]);
      const T th = fast_tanh(s * (v + a * v * v * v));
      const T local = T(0.5) * (T(1) + th) +
                      T(0.5) * v * (T(1) - th * th) * s * (T(1) + T(3) * a * v * v);
      dx[i] = to_out<O>(local * dout[i]);
    }
  }
}
template <typename T>
void gelu_backward(T* dx, const T* dout, const T* x, int64_t n) { gelu_backward_impl(dx, dout, x, n); }
void gelu_backward_bf16(uint16_t* dx, const float* dout, const float* x, int64_t n) {
  gelu_backward_impl(dx, dout, x, n);
}
void gelu_backward_x16(float* dx, const float* dout, const uint16_t* x16, int64_t n) {
  gelu_backward_impl(dx, dout, x16, n);
}

// gu16 (not null): gate|up rounded to bf16 too, row by row while the row is in cache.
template <typename T, typename O>
void swiglu_forward_impl(O* out, const T* gu, int64_t ntok, int64_t F, uint16_t* gu16 = nullptr) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < ntok; ++t) {
    const T* g = gu + t * 2 * F;
    const T* u = g + F;
    O* o = out + t * F;
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) o[j] = to_out<O>(g[j] * fast_sigmoid(g[j]) * u[j]);
    if constexpr (std::is_same_v<T, float>)
      if (gu16) convert_to_bf16(g, gu16 + t * 2 * F, 2 * F, false);
  }
}
template <typename T>
void swiglu_forward(T* out, const T* gu, int64_t ntok, int64_t F) {
  swiglu_forward_impl(out, gu, ntok, F);
}
void swiglu_forward_bf16(uint16_t* out, const float* gu, int64_t ntok, int64_t F) {
  swiglu_forward_impl(out, gu, ntok, F);
}
void swiglu_forward_bf16_x(uint16_t* out, uint16_t* gu16, const float* gu, int64_t ntok,
                           int64_t F) {
  swiglu_forward_impl(out, gu, ntok, F, gu16);
}

template <typename T, typename O, typename X = T>
void swiglu_backward_impl(O* dgu, const T* dout, const X* gu, int64_t ntok, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < ntok; ++t) {
    const X* g = gu + t * 2 * F;
    const X* u = g + F;
    const T* d = dout + t * F;
    O* dg = dgu + t * 2 * F;
    O* du = dg + F;
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) {
      const T gj = from_in<T>(g[j]), uj = from_in<T>(u[j]);
      const T sg = fast_sigmoid(gj);
      const T silu = gj * sg;
      dg[j] = to_out<O>(d[j] * uj * sg * (T(1) + gj * (T(1) - sg)));
      du[j] = to_out<O>(d[j] * silu);
    }
  }
}
template <typename T>
void swiglu_backward(T* dgu, const T* dout, const T* gu, int64_t ntok, int64_t F) {
  swiglu_backward_impl(dgu, dout, gu, ntok, F);
}
void swiglu_backward_bf16(uint16_t* dgu, const float* dout, const float* gu, int64_t ntok,
                          int64_t F) {
  swiglu_backward_impl(dgu, dout, gu, ntok, F);
}
void swiglu_backward_x16(float* dgu, const float* dout, const uint16_t* gu16, int64_t ntok,
                         int64_t F) {
  swiglu_backward_impl(dgu, dout, gu16, ntok, F);
}

// ---------------------------------------------------------------------------------------------
// Rotary positions

std::vector<double> rope_inv_freq(int64_t hd, const RopeFrequencies& f) {
  TETRAD_CHECK(hd > 0 && hd % 2 == 0, "rotary positions need an even head dimension, got ", hd);
  TETRAD_CHECK(f.theta > 0, "rope theta must be positive, got ", f.theta);
  const int64_t half = hd / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // As Hugging Face: inv_freq = 1 / theta^(2i / hd), angle = pos * inv_freq.
    inv[size_t(i)] = 1.0 / std::pow(f.theta, double(2 * i) / double(hd));
  }
  if (f.factor > 0) {
    TETRAD_CHECK(f.high_freq_factor > f.low_freq_factor && f.low_freq_factor > 0 &&
                     f.original_max_position > 0,
                 "llama3 rope scaling needs high_freq_factor > low_freq_factor > 0 and "
                 "original_max_position_embeddings > 0");
    const double pi = 3.14159265358979323846;
    const double low_wavelen = f.original_max_position / f.low_freq_factor;
    const double high_wavelen = f.original_max_position / f.high_freq_factor;
    for (double& x : inv) {
      const double wavelen = 2 * pi / x;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        x /= f.factor;
        continue;
      }
      const double s = (f.original_max_position / wavelen - f.low_freq_factor) /
                       (f.high_freq_factor - f.low_freq_factor);
      x = (1 - s) * x / f.factor + s * x;
    }
  }
  return inv;
}

template <typename T>
void rope_tables(T* cos_table, T* sin_table, int64_t max_pos, int64_t hd, double theta) {
  RopeFrequencies f;
  f.theta = theta;
  rope_tables(cos_table, sin_table, max_pos, hd, f);
}

template <typename T>
void rope_tables(T* cos_table, T* sin_table, int64_t max_pos, int64_t hd,
                 const RopeFrequencies& f) {
  const int64_t half = hd / 2;
  const std::vector<double> inv = rope_inv_freq(hd, f);
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = inv[size_t(i)];
    for (int64_t p = 0; p < max_pos; ++p) {
      cos_table[p * half + i] = T(std::cos(double(p) * inv_freq));
      sin_table[p * half + i] = T(std::sin(double(p) * inv_freq));
    }
  }
}

namespace {
template <typename T>
void rope_apply(T* x, int64_t ntok, int64_t T_seq, int64_t pos0, int64_t n_rot_heads, int64_t hd,
                int64_t stride, const T* cos_table, const T* sin_table, T sign,
                const int32_t* doc_start) {
  const int64_t half = hd / 2;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < ntok; ++t) {
    const int64_t pos = pos0 + t % T_seq - (doc_start ? doc_start[t] : 0);
    const T* cs = cos_table + pos * half;
    const T* sn = sin_table + pos * half;
    T* row = x + t * stride;
    for (int64_t h = 0; h < n_rot_heads; ++h) {
      T* x1 = row + h * hd;
      T* x2 = x1 + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const T a = x1[i], b = x2[i], s = sign * sn[i];
        x1[i] = a * cs[i] - b * s;
        x2[i] = b * cs[i] + a * s;
      }
    }
  }
}
}  // namespace

template <typename T>
void rope_forward(T* x, int64_t ntok, int64_t T_seq, int64_t pos0, int64_t n_rot_heads,
                  int64_t hd, int64_t stride, const T* cos_table, const T* sin_table,
                  const int32_t* doc_start) {
  rope_apply(x, ntok, T_seq, pos0, n_rot_heads, hd, stride, cos_table, sin_table, T(1), doc_start);
}

template <typename T>
void rope_backward(T* dx, int64_t ntok, int64_t T_seq, int64_t pos0, int64_t n_rot_heads,
                   int64_t hd, int64_t stride, const T* cos_table, const T* sin_table,
                   const int32_t* doc_start) {
  // A rotation's adjoint is the rotation by the opposite angle.
  rope_apply(dx, ntok, T_seq, pos0, n_rot_heads, hd, stride, cos_table, sin_table, T(-1),
             doc_start);
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

namespace {
void check_targets(const int32_t* targets, int64_t ntok, int64_t V) {
  for (int64_t t = 0; t < ntok; ++t)
    if (targets[t] >= V)
      fail("target token id ", targets[t], " at position ", t,
           " is outside the model's vocabulary [0, ", V, ")");
}
// One row of the fused cross-entropy: its max and its target's logit, then e^(x - max) in place
// and their sum. Shared by the fp32-gradient and bf16-gradient forms so both compute the same.
template <typename T>
struct ExpRow {
  T max, target_logit, sum;
};
template <typename T>
inline ExpRow<T> exp_row_in_place(T* row, int64_t V, int32_t tgt) {
  const T mx = row_max(row, V);
  const T target_logit = row[tgt];
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < V; ++j) {
    const T e = fast_exp(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  return {mx, target_logit, sum};
}
}  // namespace

template <typename T>
double cross_entropy_fused(T* logits, T* losses, const int32_t* targets, int64_t ntok, int64_t V,
                           T grad_scale) {
  check_targets(targets, ntok, V);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < ntok; ++t) {
    T* row = logits + t * V;
    const int32_t tgt = targets[t];
    if (tgt < 0) {
      std::fill(row, row + V, T(0));
      losses[t] = 0;
      continue;
    }
    const ExpRow<T> r = exp_row_in_place(row, V, tgt);
    losses[t] = std::log(r.sum) + r.max - r.target_logit;
    const T scale = grad_scale / r.sum;
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) row[j] *= scale;
    row[tgt] -= grad_scale;
  }
  double total = 0;
  for (int64_t t = 0; t < ntok; ++t) total += double(losses[t]);
  return total;
}

template <typename T>
double cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t ntok,
                             int64_t V) {
  check_targets(targets, ntok, V);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < ntok; ++t) {
    const T* row = logits + t * V;
    const int32_t tgt = targets[t];
    if (tgt < 0) {
      losses[t] = 0;
      continue;
    }
    const T mx = row_max(row, V);
    const T sum = sum_exp_shifted(row, V, mx);
    losses[t] = std::log(sum) + mx - row[tgt];
  }
  double total = 0;
  for (int64_t t = 0; t < ntok; ++t) total += double(losses[t]);
  return total;
}

// ---------------------------------------------------------------------------------------------
// Elementwise and optimizer

template <typename T>
void add_inplace(T* x, const T* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i0 = 0; i0 < n; i0 += kElemChunk) {
    const int64_t i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) x[i] += y[i];
  }
}

template <typename T>
double sum_squares(const T* x, int64_t n) {
  // Fixed chunks summed in a fixed order: the same result for any thread count.
  const int64_t nchunks = (n + kElemChunk - 1) / kElemChunk;
  std::vector<double> partial(nchunks);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t i0 = c * kElemChunk, i1 = std::min(n, i0 + kElemChunk);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = i0; i < i1; ++i) s += double(x[i]) * double(x[i]);
    partial[c] = s;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, T lr, T beta1, T beta2, T eps,
                  T weight_decay, T grad_scale, int64_t step) {
  const T bc1 = backend::adamw_bias_correction(beta1, step);
  const T bc2 = backend::adamw_bias_correction(beta2, step);
#pragma omp parallel for schedule(static)
  for (int64_t i0 = 0; i0 < n; i0 += kElemChunk) {
    const int64_t i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const T gi = g[i] * grad_scale;
      const T mi = beta1 * m[i] + (T(1) - beta1) * gi;
      const T vi = beta2 * v[i] + (T(1) - beta2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] -= lr * ((mi * bc1) / (std::sqrt(vi * bc2) + eps) + weight_decay * p[i]);
    }
  }
}

double cross_entropy_fused_bf16(float* logits, uint16_t* dlogits, float* losses,
                                const int32_t* targets, int64_t ntok, int64_t V,
                                float grad_scale) {
  check_targets(targets, ntok, V);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < ntok; ++t) {
    float* row = logits + t * V;
    uint16_t* drow = dlogits + t * V;
    const int32_t tgt = targets[t];
    if (tgt < 0) {
      std::fill(drow, drow + V, uint16_t(0));
      losses[t] = 0;
      continue;
    }
    const ExpRow<float> r = exp_row_in_place(row, V, tgt);
    losses[t] = std::log(r.sum) + r.max - r.target_logit;
    const float scale = grad_scale / r.sum;
    const float at_target = row[tgt] * scale - grad_scale;
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) drow[j] = float_to_bf16(row[j] * scale);
    drow[tgt] = float_to_bf16(at_target);
  }
  double total = 0;
  for (int64_t t = 0; t < ntok; ++t) total += double(losses[t]);
  return total;
}

void adamw_update_bf16(float* p, uint16_t* p16, const float* g, float* m, float* v, int64_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int64_t step) {
  const float bc1 = backend::adamw_bias_correction(beta1, step);
  const float bc2 = backend::adamw_bias_correction(beta2, step);
#pragma omp parallel for schedule(static)
  for (int64_t i0 = 0; i0 < n; i0 += kElemChunk) {
    const int64_t i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const float gi = g[i] * grad_scale;
      const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
      const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const float pi = p[i] - lr * ((mi * bc1) / (std::sqrt(vi * bc2) + eps) + weight_decay * p[i]);
      p[i] = pi;
      p16[i] = float_to_bf16(pi);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Explicit instantiations

#define TETRAD_INSTANTIATE(T)                                                                    \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t,   \
                                  bool);                                                          \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t,   \
                                   int64_t);                                                      \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, int64_t, int64_t,   \
                                     int64_t, int64_t);                                           \
  template void embedding_backward<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t,        \
                                      int64_t);                                                   \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, \
                                     T);                                                          \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,        \
                                      const T*, int64_t, int64_t);                                \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, T);             \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t,     \
                                    int64_t);                                                     \
  template void gelu_forward<T>(T*, const T*, int64_t);                                          \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t);                               \
  template void swiglu_forward<T>(T*, const T*, int64_t, int64_t);                               \
  template void swiglu_backward<T>(T*, const T*, const T*, int64_t, int64_t);                    \
  template void rope_tables<T>(T*, T*, int64_t, int64_t, double);                                \
  template void rope_tables<T>(T*, T*, int64_t, int64_t, const RopeFrequencies&);                                \
  template void rope_forward<T>(T*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,        \
                                const T*, const T*, const int32_t*);                             \
  template void rope_backward<T>(T*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,       \
                                 const T*, const T*, const int32_t*);                            \
  template double cross_entropy_fused<T>(T*, T*, const int32_t*, int64_t, int64_t, T);           \
  template double cross_entropy_forward<T>(T*, const T*, const int32_t*, int64_t, int64_t);      \
  template void add_inplace<T>(T*, const T*, int64_t);                                           \
  template double sum_squares<T>(const T*, int64_t);                                             \
  template void adamw_update<T>(T*, const T*, T*, T*, int64_t, T, T, T, T, T, T, int64_t);

TETRAD_INSTANTIATE(float)
TETRAD_INSTANTIATE(double)

}  // namespace tetrad::kernels
