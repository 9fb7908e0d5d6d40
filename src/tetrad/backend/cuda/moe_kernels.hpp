// CUDA kernels of the mixture-of-experts permutation (the op table's moe_* entries; the contract
// is backend/ops.hpp's), enqueued on the given stream. Deterministic: every output element is
// written by one thread in a fixed order; dw's row sums are a fixed-shape block reduction.
#pragma once
#include <cstdint>

#include "tetrad/backend/cuda/gpu_api.hpp"

namespace tetrad::gpu {

void moe_permute(float* out, const float* x, const int32_t* slots, int64_t N, int64_t k,
                 int64_t C, gpuStream_t s);
void moe_permute_backward(float* dx, const float* dout, const int32_t* slots, int64_t N,
                          int64_t k, int64_t C, gpuStream_t s);
void moe_unpermute(float* y, const float* e, const float* w, const int32_t* slots, int64_t N,
                   int64_t k, int64_t C, gpuStream_t s);
void moe_unpermute_backward(float* de, float* dw, const float* dy, const float* e, const float* w,
                            const int32_t* slots, int64_t N, int64_t k, int64_t C, gpuStream_t s);

}  // namespace tetrad::gpu
