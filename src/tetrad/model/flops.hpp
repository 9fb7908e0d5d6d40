// How the attention core's FLOPs are counted, and the model FLOPs per token in either count: the
// one convention `tetrad plan`, `tetrad train` and `tetrad bench` print MFU in (issue 32).
#pragma once
#include <string>

#include "tetrad/model/model_config.hpp"

namespace tetrad {

// How the attention core's FLOPs (Q K^T and P V) are counted.
//   Causal: half of the S x S score matrix, the work a causal kernel does (FlashAttention's own
//     benchmark count, "/ (2 if causal else 1)"): the planner's MFU and HFU, and the trainer's
//     and `tetrad bench`'s, so none can exceed 100% however long the sequence (tetrad's models
//     are all causal).
//   Full: every score counted, as PaLM appendix B and Narayanan et al. (SC21) do; the count the
//     published rows report (Megatron-LM, AxoNN), so predictions compared with them use it, and
//     model/params.hpp's flops_per_token (the layer split's cost).
enum class AttentionFlops { Causal, Full };
const char* attention_flops_name(AttentionFlops a);  // "causal attention counted as half" | ...

// Model FLOPs per token, forward + backward: 6*N_matmul + c*12*L*A*T, c = 1/2 (Causal) or 1
// (Full: flops_per_token(c, seq_len)); N_matmul the weights a token multiplies with (a mixture of
// experts: its k experts and the router, params.cpp's active_numel: MFU on active FLOPs).
double flops_per_token(const ModelConfig& c, int seq_len, AttentionFlops a);
// What recomputation adds ("none" | "selective" | "full"), the attention core's part counted the
// same way: recompute_flops_per_token(c, seq_len, recompute) for Full.
double recompute_flops_per_token(const ModelConfig& c, int seq_len, const std::string& recompute,
                                 AttentionFlops a);

}  // namespace tetrad
