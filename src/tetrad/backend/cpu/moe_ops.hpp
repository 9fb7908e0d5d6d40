// CPU kernels of the mixture-of-experts permutation (the op table's moe_* entries, backend/ops.hpp
// for the contract): tokens copied to their experts' rows and back, the weighted combine and its
// backward. Parallel over tokens with OpenMP; each output row is written by one thread in a fixed
// order, so results do not depend on the thread count.
#pragma once
#include <cstdint>

namespace tetrad::kernels {

void moe_permute(float* out, const float* x, const int32_t* slots, int64_t N, int64_t k,
                 int64_t C);
void moe_permute_backward(float* dx, const float* dout, const int32_t* slots, int64_t N,
                          int64_t k, int64_t C);
void moe_unpermute(float* y, const float* e, const float* w, const int32_t* slots, int64_t N,
                   int64_t k, int64_t C);
void moe_unpermute_backward(float* de, float* dw, const float* dy, const float* e, const float* w,
                            const int32_t* slots, int64_t N, int64_t k, int64_t C);

}  // namespace tetrad::kernels
