#include "tetrad/model/params.hpp"

#include <string>

#include "tetrad/core/error.hpp"

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

}  // namespace tetrad
