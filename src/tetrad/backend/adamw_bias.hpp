// AdamW's bias corrections, 1 / (1 - beta^step), as every backend computes them (the op table's
// adamw, backend/ops.hpp): the power in double, rounded to T, then the rest in T. In float at
// step 1 with beta2 0.95 that is 19.999995f, where the same in double rounded once gives 20.0f:
// a backend that computed it otherwise would drift from the CPU from the first step.
#pragma once
#include <cmath>
#include <cstdint>

namespace tetrad::backend {

template <typename T>
inline T adamw_bias_correction(T beta, int64_t step) {
  return T(1) / (T(1) - T(std::pow(double(beta), double(step))));
}

}  // namespace tetrad::backend
