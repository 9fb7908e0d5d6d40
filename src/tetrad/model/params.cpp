#include "tetrad/model/params.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"

namespace tetrad {

const ParamSpec* ParamTable::try_find(const std::string& name) const {
  for (const auto& s : specs)
    if (s.name == name) return &s;
  return nullptr;
}

const ParamSpec& ParamTable::find(const std::string& name) const {
  const ParamSpec* s = try_find(name);
  if (!s) fail("no parameter named '", name, "' in this model");
  return *s;
}

ParamKind role_kind(TensorRole role) {
  using R = TensorRole;
  switch (role) {
    case R::TokenEmbedding:
    case R::PositionEmbedding:
      return ParamKind::Embedding;
    case R::AttnNorm:
    case R::MlpNorm:
    case R::FinalNorm:
    case R::QNorm:
    case R::KNorm:
      return ParamKind::Norm;
    case R::AttnNormBias:
    case R::QkvBias:
    case R::QBias:
    case R::KBias:
    case R::VBias:
    case R::AttnOutBias:
    case R::MlpNormBias:
    case R::MlpInBias:
    case R::MlpOutBias:
    case R::FinalNormBias:
      return ParamKind::Bias;
    case R::Qkv:
    case R::Q:
    case R::K:
    case R::V:
    case R::AttnOut:
    case R::MlpIn:
    case R::Gate:
    case R::Up:
    case R::MlpOut:
    case R::Head:
    case R::Router:
    case R::ExpertGateUp:
    case R::ExpertDown:
    case R::SharedGate:
    case R::SharedUp:
    case R::SharedDown:
    case R::SharedExpertGate:
      return ParamKind::Linear;
    case R::ExpertBias:
      return ParamKind::Buffer;
  }
  fail("tensor role ", int(role), " has no kind");
}

ParamTable build_param_table(const ModelConfig& c) {
  const FamilyDesc& f = c.desc();
  auto size = [&](Dim d) -> int64_t {
    switch (d) {
      case Dim::None: return 0;
      case Dim::Vocab: return c.vocab_size;
      case Dim::Hidden: return c.n_embd;
      case Dim::Positions: return c.max_seq;
      case Dim::Ffn: return c.ffn;
      case Dim::QHeads: return c.q_dim();
      case Dim::KvHeads: return c.kv_dim();
      case Dim::QkvHeads: return c.qkv_dim();
      case Dim::HeadDim: return c.head_dim();
      case Dim::Experts: return c.n_experts;
      case Dim::ExpertsGateUp: return int64_t(c.n_experts) * 2 * c.ffn;
      case Dim::ExpertsHidden: return int64_t(c.n_experts) * c.n_embd;
      case Dim::SharedFfn: return c.moe() ? c.shared_expert_ffn : 0;
      case Dim::SharedGateRows: return c.moe() && c.shared_expert_ffn > 0 ? 1 : 0;
      case Dim::BiasExperts: return c.moe() && c.moe_expert_bias() ? c.n_experts : 0;
    }
    fail("dimension ", int(d), " has no size");
  };
  ParamTable t;
  auto add = [&](const TensorEntry& e, std::string name, int layer) {
    if (e.role == TensorRole::Head && c.tie_embeddings) return;  // the token embedding serves
    if (size(e.rows) == 0 || (e.cols != Dim::None && size(e.cols) == 0)) return;  // not asked for
    ParamSpec s;
    s.name = std::move(name);
    s.shape = {size(e.rows)};
    if (e.cols != Dim::None) s.shape.push_back(size(e.cols));
    s.numel = 1;
    for (auto d : s.shape) s.numel *= d;
    s.offset = t.total;
    s.role = e.role;
    s.kind = role_kind(e.role);
    s.layer = layer;
    s.hf_transposed = e.hf_transposed;
    t.total += s.numel;
    t.specs.push_back(std::move(s));
  };
  for (const TensorEntry& e : f.top) add(e, e.name, -1);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = f.layer_prefix + std::to_string(l) + ".";
    for (const TensorEntry& e : f.layer) add(e, p + e.name, l);
  }
  for (const TensorEntry& e : f.bottom) add(e, e.name, -1);
  check_fused_groups(t);
  return t;
}

void check_fused_groups(const ParamTable& t) {
  for (size_t i = 0; i < t.specs.size(); ++i)
    for (std::span<const TensorRole> group : kFusedGroups) {
      if (t.specs[i].role != group[0]) continue;
      for (size_t k = 1; k < group.size(); ++k) {
        const ParamSpec* next = i + k < t.specs.size() ? &t.specs[i + k] : nullptr;
        if (!next || next->role != group[k] || next->layer != t.specs[i].layer ||
            next->offset != t.specs[i + k - 1].offset + t.specs[i + k - 1].numel)
          fail("parameter table: '", t.specs[i + k - 1].name, "' (", role_name(group[k - 1]),
               ") must be followed by the layer's ", role_name(group[k]),
               " tensor: they are computed as one GEMM, so the family's table must list them "
               "adjacent and in this order; found ",
               next ? "'" + next->name + "' (" + role_name(next->role) + ")" : "the table's end");
      }
    }
}

int64_t count_parameters(const ModelConfig& c) { return build_param_table(c).total; }

// The weights one token multiplies with: all of a dense tensor, k of E experts' (a mixture of
// experts counts its active parameters, as MFU on active FLOPs does).
double active_numel(const ModelConfig& c, const ParamSpec& p) {
  if (p.role == TensorRole::ExpertGateUp || p.role == TensorRole::ExpertDown)
    return double(p.numel) * c.experts_per_token / c.n_experts;
  return double(p.numel);
}

double flops_per_token(const ModelConfig& c, int seq_len) {
  // 6 FLOPs per multiply-accumulate weight per token (2 forward, 4 backward) over the weights
  // used in matrix multiplies (all linear weights and the output head), plus attention scores
  // and values: 12 * L * A * T with A = n_head * head_dim (PaLM appendix B; causal masking not
  // discounted).
  double n_matmul = 0;
  for (const auto& p : build_param_table(c).specs)
    if (p.kind == ParamKind::Linear) n_matmul += active_numel(c, p);
  if (c.tie_embeddings) n_matmul += double(c.vocab_size) * c.n_embd;  // tied output head
  return 6.0 * n_matmul + 12.0 * c.n_layer * double(c.q_dim()) * seq_len;
}

double recompute_flops_per_token(const ModelConfig& c, int seq_len, const std::string& recompute) {
  if (recompute == "none") return 0;
  // Attention's score and value products again in the backward pass: 4 * L * C * T.
  const double attention = 4.0 * c.n_layer * double(c.q_dim()) * seq_len;
  if (recompute == "selective") return attention;
  if (recompute == "full") {
    // Each block's forward again: its linear weights once more (2 FLOPs per weight) + attention.
    double block = 0;
    for (const auto& p : build_param_table(c).specs)
      if (p.kind == ParamKind::Linear && p.layer >= 0) block += active_numel(c, p);
    return 2.0 * block + attention;
  }
  fail("train.recompute = \"", recompute, "\": expected \"none\", \"selective\" or \"full\"");
}

template <typename T>
void init_parameter(const ModelConfig& cfg, const ParamSpec& s, size_t index, uint64_t seed, T* p) {
  if (s.kind == ParamKind::Norm) {
    std::fill(p, p + s.numel, T(1));
    return;
  }
  if (s.kind == ParamKind::Bias || s.kind == ParamKind::Buffer) {
    std::fill(p, p + s.numel, T(0));
    return;
  }
  double std = cfg.init_std;
  // GPT-2 scales the projections that write into the residual stream (Radford et al. 2019).
  if (cfg.desc().scaled_residual_init &&
      (s.role == TensorRole::AttnOut || s.role == TensorRole::MlpOut))
    std /= std::sqrt(2.0 * cfg.n_layer);
  uint64_t sm = seed ^ (0x5DEECE66Dull * (index + 1));
  Rng rng(splitmix64(sm));
  for (int64_t j = 0; j < s.numel; ++j) p[j] = T(rng.normal() * std);
}
template void init_parameter<float>(const ModelConfig&, const ParamSpec&, size_t, uint64_t, float*);
template void init_parameter<double>(const ModelConfig&, const ParamSpec&, size_t, uint64_t, double*);

}  // namespace tetrad
