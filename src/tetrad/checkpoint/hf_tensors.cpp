// A parameter's tensors in a Hugging Face folder (hf_tensors.hpp).
#include "tetrad/checkpoint/hf_tensors.hpp"

#include "tetrad/core/error.hpp"

namespace tetrad {

namespace {

HfPiece whole(const std::string& name, const ParamSpec& s, std::vector<int64_t> shape) {
  return {name, std::move(shape), 0, s.numel, false};
}

}  // namespace

std::vector<HfLayout> hf_layouts(const ModelConfig& c, const ParamSpec& s) {
  std::vector<int64_t> shape = s.shape;
  if (s.hf_transposed) {
    TETRAD_CHECK(shape.size() == 2, s.name);
    shape = {shape[1], shape[0]};
  }
  const HfLayout table_name{{s.name, shape, 0, s.numel, s.hf_transposed}};
  const HfExpertNames* x = c.desc().hf_experts;
  const bool expert_role = s.role == TensorRole::Router || s.role == TensorRole::ExpertGateUp ||
                           s.role == TensorRole::ExpertDown;
  if (!expert_role) return {table_name};
  TETRAD_CHECK(x != nullptr && s.layer >= 0, s.name, ": ", c.desc().display,
               " has no Hugging Face names for its experts");
  const std::string layer = std::string(c.desc().layer_prefix) + std::to_string(s.layer) + ".";
  const int64_t E = c.n_experts, F = c.ffn, C = c.n_embd;
  // The router keeps its name per expert or fused (Mixtral's block_sparse_moe.gate is mlp.gate
  // once transformers 5 fuses the experts).
  if (s.role == TensorRole::Router) {
    std::vector<HfLayout> v{table_name};
    if (layer + x->fused_router != s.name)
      v.push_back({whole(layer + x->fused_router, s, shape)});
    return v;
  }
  HfLayout per_expert;
  const std::string experts = layer + x->experts;
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = experts + std::to_string(e) + ".";
    if (s.role == TensorRole::ExpertGateUp) {
      per_expert.push_back({p + x->gate, {F, C}, e * 2 * F * C, F * C});
      per_expert.push_back({p + x->up, {F, C}, e * 2 * F * C + F * C, F * C});
    } else {
      per_expert.push_back({p + x->down, {C, F}, e * C * F, C * F});
    }
  }
  // transformers 5's fused tensor is tetrad's stacked one with the experts as a dimension of
  // its own: the same floats in the same order.
  const bool gate_up = s.role == TensorRole::ExpertGateUp;
  const std::string fused = layer + (gate_up ? x->fused_gate_up : x->fused_down);
  std::vector<HfLayout> v{per_expert,
                          {whole(fused, s, gate_up ? std::vector<int64_t>{E, 2 * F, C}
                                                   : std::vector<int64_t>{E, C, F})}};
  if (fused != s.name) v.push_back(table_name);
  return v;
}

}  // namespace tetrad
