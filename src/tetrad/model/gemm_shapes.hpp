// The GEMM problems a model's training step runs, as shapes the backend's ceilings can time
// (backend/ceilings.hpp measures them; `tetrad bench` reports each against the square's).
#pragma once
#include <vector>

#include "tetrad/backend/ceilings.hpp"
#include "tetrad/model/model_config.hpp"

namespace tetrad {

// The GEMMs of one training step of a model over `tokens` tokens, in tetrad's layout (linear
// weights stored [out, in], y = x·Wᵀ): for each linear layer its forward (NT), input-gradient
// (NN) and weight-gradient (TN) products, and the same for the output head. Attention's own
// batched products (scores, values) are not included.
std::vector<GemmShape> model_gemm_shapes(const ModelConfig& c, int tokens);

}  // namespace tetrad
