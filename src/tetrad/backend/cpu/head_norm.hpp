// CPU kernels of the per-head RMSNorm (Qwen3's q_norm / k_norm; backend/ops.hpp, HeadNormArgs,
// documents the op). OpenMP over rows (forward, backward) and over the weight's columns (its
// gradient, every column summed in row order): deterministic for any thread count.
#pragma once

#include "tetrad/backend/ops.hpp"

namespace tetrad::backend::cpu {

void head_norm_forward(const HeadNormArgs& a);
void head_norm_backward(const HeadNormArgs& a);

}  // namespace tetrad::backend::cpu
