#include "tetrad/backend/cpu/head_norm.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tetrad/core/error.hpp"

namespace tetrad::backend::cpu {

namespace {
void check(const HeadNormArgs& a, const char* op, bool backward) {
  if (a.N < 0 || a.n_heads < 0 || a.head_dim <= 0 || a.stride < a.n_heads * a.head_dim)
    fail(op, ": N = ", a.N, ", n_heads = ", a.n_heads, ", head_dim = ", a.head_dim, ", stride = ",
         a.stride, " (expected head_dim > 0 and stride >= n_heads * head_dim)");
  if (backward && (!a.saved || !a.dw))
    fail(op, ": needs the forward's saved input and a weight gradient (saved, dw not null)");
}
}  // namespace

void head_norm_forward(const HeadNormArgs& a) {
  check(a, "head_norm_forward", false);
  const int64_t hd = a.head_dim, H = a.n_heads;
#pragma omp parallel for schedule(static) if (a.N * H * hd > 16384)
  for (int64_t r = 0; r < a.N; ++r)
    for (int64_t h = 0; h < H; ++h) {
      float* x = a.x + r * a.stride + h * hd;
      if (a.saved) {
        float* s = a.saved + (r * H + h) * hd;
        for (int64_t d = 0; d < hd; ++d) s[d] = x[d];
      }
      double ss = 0;
      for (int64_t d = 0; d < hd; ++d) ss += double(x[d]) * x[d];
      const float rs = float(1.0 / std::sqrt(ss / double(hd) + double(a.eps)));
      a.rstd[r * H + h] = rs;
#pragma omp simd
      for (int64_t d = 0; d < hd; ++d) x[d] = x[d] * rs * a.w[d];
    }
}

void head_norm_backward(const HeadNormArgs& a) {
  check(a, "head_norm_backward", true);
  const int64_t hd = a.head_dim, H = a.n_heads;
  // The weight's gradient first (it reads dy before dx replaces it): partial sums over fixed
  // chunks of rows (in double, whatever the thread count), then the chunks in order.
  constexpr int64_t kRows = 64;
  const int64_t chunks = (a.N + kRows - 1) / kRows;
  std::vector<double> part(size_t(chunks * hd), 0.0);
#pragma omp parallel for schedule(static) if (a.N * H * hd > 16384)
  for (int64_t c = 0; c < chunks; ++c) {
    double* p = part.data() + c * hd;
    for (int64_t r = c * kRows; r < std::min(a.N, (c + 1) * kRows); ++r)
      for (int64_t h = 0; h < H; ++h) {
        const float* g = a.x + r * a.stride + h * hd;
        const float* s = a.saved + (r * H + h) * hd;
        const double rs = a.rstd[r * H + h];
        for (int64_t d = 0; d < hd; ++d) p[d] += double(g[d]) * (s[d] * rs);
      }
  }
  for (int64_t d = 0; d < hd; ++d) {
    double acc = 0;
    for (int64_t c = 0; c < chunks; ++c) acc += part[size_t(c * hd + d)];
    a.dw[d] += float(acc);
  }
#pragma omp parallel for schedule(static) if (a.N * H * hd > 16384)
  for (int64_t r = 0; r < a.N; ++r)
    for (int64_t h = 0; h < H; ++h) {
      float* g = a.x + r * a.stride + h * hd;
      const float* s = a.saved + (r * H + h) * hd;
      const float rs = a.rstd[r * H + h];
      double dot = 0;  // Σ dy w x̂
      for (int64_t d = 0; d < hd; ++d) dot += double(g[d]) * a.w[d] * (s[d] * rs);
      const float m = float(dot / double(hd));
#pragma omp simd
      for (int64_t d = 0; d < hd; ++d) g[d] = (g[d] * a.w[d] - s[d] * rs * m) * rs;
    }
}

}  // namespace tetrad::backend::cpu
