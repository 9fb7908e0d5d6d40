#include "tetrad/backend/cpu/moe_ops.hpp"

#include <cstring>

namespace tetrad::kernels {

namespace {
// Threads only where there is enough work to pay for them (rows are short in tests).
bool worth_threads(int64_t N, int64_t k, int64_t C) { return N * k * C > 32768; }
}  // namespace

void moe_permute(float* out, const float* x, const int32_t* slots, int64_t N, int64_t k,
                 int64_t C) {
#pragma omp parallel for schedule(static) if (worth_threads(N, k, C))
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = slots[t * k + j];
      if (r >= 0) std::memcpy(out + r * C, x + t * C, size_t(C) * sizeof(float));
    }
}

void moe_permute_backward(float* dx, const float* dout, const int32_t* slots, int64_t N,
                          int64_t k, int64_t C) {
#pragma omp parallel for schedule(static) if (worth_threads(N, k, C))
  for (int64_t t = 0; t < N; ++t) {
    float* d = dx + t * C;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = slots[t * k + j];
      if (r < 0) continue;
      const float* s = dout + r * C;
      for (int64_t c = 0; c < C; ++c) d[c] += s[c];
    }
  }
}

void moe_unpermute(float* y, const float* e, const float* w, const int32_t* slots, int64_t N,
                   int64_t k, int64_t C) {
#pragma omp parallel for schedule(static) if (worth_threads(N, k, C))
  for (int64_t t = 0; t < N; ++t) {
    float* o = y + t * C;
    for (int64_t c = 0; c < C; ++c) o[c] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = slots[t * k + j];
      if (r < 0) continue;
      const float wj = w[t * k + j];
      const float* s = e + r * C;
      for (int64_t c = 0; c < C; ++c) o[c] += wj * s[c];
    }
  }
}

void moe_unpermute_backward(float* de, float* dw, const float* dy, const float* e, const float* w,
                            const int32_t* slots, int64_t N, int64_t k, int64_t C) {
#pragma omp parallel for schedule(static) if (worth_threads(N, k, C))
  for (int64_t t = 0; t < N; ++t) {
    const float* g = dy + t * C;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = slots[t * k + j];
      if (r < 0) {
        dw[t * k + j] = 0.0f;
        continue;
      }
      const float wj = w[t * k + j];
      const float* s = e + r * C;
      float* d = de + r * C;
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) {
        d[c] = wj * g[c];
        acc += double(g[c]) * double(s[c]);
      }
      dw[t * k + j] = float(acc);
    }
  }
}

}  // namespace tetrad::kernels
