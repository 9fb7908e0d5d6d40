#include "tetrad/model/params.hpp"

#include <algorithm>
#include <cmath>
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

ParamTable build_param_table(const ModelConfig& c) {
  ParamTable t;
  auto add = [&](std::string name, std::vector<int64_t> shape, ParamKind kind, int layer,
                 bool hf_t = false) {
    ParamSpec s;
    s.name = std::move(name);
    s.shape = std::move(shape);
    s.numel = 1;
    for (auto d : s.shape) s.numel *= d;
    s.offset = t.total;
    s.kind = kind;
    s.layer = layer;
    s.hf_transposed = hf_t;
    t.total += s.numel;
    t.specs.push_back(std::move(s));
  };
  const int64_t C = c.n_embd, F = c.ffn, V = c.vocab_size, hd = c.head_dim();
  if (c.family == Family::GPT2) {
    add("transformer.wte.weight", {V, C}, ParamKind::Embedding, -1);
    add("transformer.wpe.weight", {c.max_seq, C}, ParamKind::Embedding, -1);
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      add(p + "ln_1.weight", {C}, ParamKind::Norm, l);
      add(p + "ln_1.bias", {C}, ParamKind::Bias, l);
      add(p + "attn.c_attn.weight", {3 * C, C}, ParamKind::Linear, l, true);
      add(p + "attn.c_attn.bias", {3 * C}, ParamKind::Bias, l);
      add(p + "attn.c_proj.weight", {C, C}, ParamKind::Linear, l, true);
      add(p + "attn.c_proj.bias", {C}, ParamKind::Bias, l);
      add(p + "ln_2.weight", {C}, ParamKind::Norm, l);
      add(p + "ln_2.bias", {C}, ParamKind::Bias, l);
      add(p + "mlp.c_fc.weight", {F, C}, ParamKind::Linear, l, true);
      add(p + "mlp.c_fc.bias", {F}, ParamKind::Bias, l);
      add(p + "mlp.c_proj.weight", {C, F}, ParamKind::Linear, l, true);
      add(p + "mlp.c_proj.bias", {C}, ParamKind::Bias, l);
    }
    add("transformer.ln_f.weight", {C}, ParamKind::Norm, -1);
    add("transformer.ln_f.bias", {C}, ParamKind::Bias, -1);
  } else {
    add("model.embed_tokens.weight", {V, C}, ParamKind::Embedding, -1);
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {C}, ParamKind::Norm, l);
      add(p + "self_attn.q_proj.weight", {c.n_head * hd, C}, ParamKind::Linear, l);
      add(p + "self_attn.k_proj.weight", {c.n_kv_head * hd, C}, ParamKind::Linear, l);
      add(p + "self_attn.v_proj.weight", {c.n_kv_head * hd, C}, ParamKind::Linear, l);
      add(p + "self_attn.o_proj.weight", {C, c.n_head * hd}, ParamKind::Linear, l);
      add(p + "post_attention_layernorm.weight", {C}, ParamKind::Norm, l);
      add(p + "mlp.gate_proj.weight", {F, C}, ParamKind::Linear, l);
      add(p + "mlp.up_proj.weight", {F, C}, ParamKind::Linear, l);
      add(p + "mlp.down_proj.weight", {C, F}, ParamKind::Linear, l);
    }
    add("model.norm.weight", {C}, ParamKind::Norm, -1);
    if (!c.tie_embeddings) add("lm_head.weight", {V, C}, ParamKind::Linear, -1);
  }
  return t;
}

int64_t count_parameters(const ModelConfig& c) { return build_param_table(c).total; }

double flops_per_token(const ModelConfig& c, int seq_len) {
  // 6 FLOPs per multiply-accumulate weight per token (2 forward, 4 backward) over the weights
  // used in matrix multiplies (all linear weights and the output head), plus attention scores
  // and values: 12 * L * C * T (PaLM appendix B; causal masking not discounted).
  double n_matmul = 0;
  for (const auto& p : build_param_table(c).specs)
    if (p.kind == ParamKind::Linear) n_matmul += double(p.numel);
  if (c.tie_embeddings) n_matmul += double(c.vocab_size) * c.n_embd;  // tied output head
  return 6.0 * n_matmul + 12.0 * c.n_layer * double(c.n_embd) * seq_len;
}

double recompute_flops_per_token(const ModelConfig& c, int seq_len, const std::string& recompute) {
  if (recompute == "none") return 0;
  // Attention's score and value products again in the backward pass: 4 * L * C * T.
  const double attention = 4.0 * c.n_layer * double(c.n_embd) * seq_len;
  if (recompute == "selective") return attention;
  if (recompute == "full") {
    // Each block's forward again: its linear weights once more (2 FLOPs per weight) + attention.
    double block = 0;
    for (const auto& p : build_param_table(c).specs)
      if (p.kind == ParamKind::Linear && p.layer >= 0) block += double(p.numel);
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
  if (s.kind == ParamKind::Bias) {
    std::fill(p, p + s.numel, T(0));
    return;
  }
  double std = cfg.init_std;
  // GPT-2 scales the projections that write into the residual stream (Radford et al. 2019).
  if (cfg.family == Family::GPT2 && s.kind == ParamKind::Linear &&
      (s.name.ends_with("attn.c_proj.weight") || s.name.ends_with("mlp.c_proj.weight")))
    std /= std::sqrt(2.0 * cfg.n_layer);
  uint64_t sm = seed ^ (0x5DEECE66Dull * (index + 1));
  Rng rng(splitmix64(sm));
  for (int64_t j = 0; j < s.numel; ++j) p[j] = T(rng.normal() * std);
}
template void init_parameter<float>(const ModelConfig&, const ParamSpec&, size_t, uint64_t, float*);
template void init_parameter<double>(const ModelConfig&, const ParamSpec&, size_t, uint64_t, double*);

}  // namespace tetrad
