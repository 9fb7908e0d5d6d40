// Branch-free exp / tanh / sigmoid that the compiler vectorises inside `#pragma omp simd` loops.
// libm's expf/tanhf are scalar calls and were the largest non-GEMM cost (GELU over a
// [1024, 3072] activation, softmax over [1024, 50304] logits). Relative error ~2e-7 for exp;
// the double overloads call libm (double is only used by the gradient-check tests).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace tetrad::kernels {

#pragma omp declare simd
inline float fast_exp(float x) {
  // exp(x) = 2^n * exp(r), n = round(x / ln2), |r| <= ln2 / 2.
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // Cody-Waite split of ln2
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
inline double fast_exp(double x) { return std::exp(x); }

#pragma omp declare simd
inline float fast_tanh(float x) {
  // tanh(x) = 1 - 2 / (exp(2x) + 1); saturates cleanly for large |x|.
  return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f);
}
inline double fast_tanh(double x) { return std::tanh(x); }

#pragma omp declare simd
inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }
inline double fast_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Σ_j exp(x[j] - m) over n values, vectorised: column j is summed into lane j % 16 and the 16
// lanes are then added in a fixed tree. The order depends on nothing but n (not the vector
// width the compiler chose, the row's alignment or the thread count), so every rank, layout and
// run sums a row the same way. (A `simd reduction` may peel for alignment, which moves the lane
// boundaries with the row's address; a plain scalar loop does not vectorise the exp at all.)
inline float sum_exp_shifted(const float* x, int64_t n, float m) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) acc[l] += fast_exp(x[j + l] - m);
  }
  for (int l = 0; j + l < n; ++l) acc[l] += fast_exp(x[j + l] - m);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}
// max_j x[j] over n >= 1 values in 16 lanes (as sum_exp_shifted): `simd reduction(max)` over
// std::max stays a scalar maxss chain in GCC (4 cycles an element: measured as slow as the exps).
// The maximum of numbers does not depend on the order; NaNs are skipped (a NaN logit makes its
// row's Σ exp, hence its loss, NaN anyway).
inline float row_max(const float* x, int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = x[0];
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  }
  for (int l = 0; j + l < n; ++l) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  float m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}
inline double row_max(const double* x, int64_t n) {
  double m = x[0];
  for (int64_t j = 1; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}
inline double sum_exp_shifted(const double* x, int64_t n, double m) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(x[j] - m);
  return s;
}

}  // namespace tetrad::kernels
