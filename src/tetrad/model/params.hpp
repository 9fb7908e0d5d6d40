// The parameter table: every parameter tensor of a model, in one contiguous buffer.
//
// All parameters live in one allocation (and the gradients, Adam moments, ... in buffers of the
// same size and layout), so the optimizer is one flat loop and sharding/bucketing are (offset,
// size) slices. Names are the Hugging Face names of the family (GPT2LMHeadModel /
// LlamaForCausalLM), so checkpoints map one to one.
//
// Layout convention: every linear weight is stored as [out, in] (y = x · Wᵀ), for both families.
// GPT-2's Hugging Face Conv1D stores [in, out]; the checkpoint code transposes on export/import
// (ParamSpec::hf_transposed says so).
// The tensors, their order, names and shapes are the family's (model/family.hpp); every tensor
// carries its role. Tensors that are used together are adjacent so one GEMM covers them
// (kFusedGroups; build_param_table fails if they are not):
//   Llama q_proj, k_proj, v_proj  -> one [(nh + 2*nkv)*hd, C] matrix
//   Llama gate_proj, up_proj      -> one [2F, C] matrix (gate rows first)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tetrad/model/model_config.hpp"

namespace tetrad {

// What the optimizer and the FLOP counts see of a role (weight decay groups, matmul weights).
// Buffer: state saved with the weights that the optimizer leaves alone (no gradient, no decay;
// the MoE expert bias, updated by its own rule after each step).
enum class ParamKind { Embedding, Linear, Bias, Norm, Buffer };
ParamKind role_kind(TensorRole role);

struct ParamSpec {
  std::string name;            // Hugging Face name, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  // internal shape ([out, in] for linear weights)
  int64_t offset = 0;          // element offset in the flat buffer
  int64_t numel = 0;
  TensorRole role = TensorRole::Head;
  ParamKind kind = ParamKind::Linear;  // role_kind(role)
  bool hf_transposed = false;  // HF stores the transpose of our shape (GPT-2 Conv1D weights)
  int layer = -1;              // block index, -1 for embeddings / final norm / head
};

struct ParamTable {
  std::vector<ParamSpec> specs;
  int64_t total = 0;
  const ParamSpec& find(const std::string& name) const;  // throws Error if absent
  const ParamSpec* try_find(const std::string& name) const;
};

// Builds the table for a model config from its family's entries (deterministic order = memory
// order). Throws Error if a fused group (kFusedGroups) is not adjacent in some layer.
ParamTable build_param_table(const ModelConfig& c);
// The check build_param_table runs: in every layer, the roles of each fused group follow one
// another in the table, in the group's order. Throws Error naming the layer and tensors.
void check_fused_groups(const ParamTable& t);

// Total parameter count (build_param_table(c).total).
int64_t count_parameters(const ModelConfig& c);
// Model FLOPs per token for forward+backward: 6*N_params_matmul + 12*L*C*T (attention,
// causal counted in full as in the PaLM / Megatron convention).
double flops_per_token(const ModelConfig& c, int seq_len);
// FLOPs per token that recomputation adds ("none" | "selective" | "full", train.recompute):
// selective reruns attention's score and value products (4 L C T), full each block's forward
// (2 per block weight + 4 L C T). flops_per_token + this = hardware FLOPs (HFU).
double recompute_flops_per_token(const ModelConfig& c, int seq_len, const std::string& recompute);

// The family's initial values of one tensor (index = its position in the ParamTable), written to
// p[spec.numel], by its role: weights N(0, init_std), the residual projections (AttnOut, MlpOut)
// scaled by 1/sqrt(2L) where the family says so (GPT-2); biases 0, norms 1. Each tensor draws from its own random stream seeded by
// (seed, index), so any rank can produce any tensor and init does not depend on allocation
// order. float for the model, double for the test oracle's gradient checks.
template <typename T>
void init_parameter(const ModelConfig& cfg, const ParamSpec& spec, size_t index, uint64_t seed,
                    T* p);

}  // namespace tetrad
