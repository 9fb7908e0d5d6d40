#include "tetrad/model/model_config.hpp"

#include <cmath>

#include "tetrad/backend/rope_tables.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad {

namespace {
// The mixture-of-experts settings: refused on a dense family, and every value tetrad does not
// implement refused by name.
void validate_moe(const ModelConfig& c) {
  const FamilyDesc& d = c.desc();
  if (!d.moe) {
    if (c.n_experts != 0 || c.experts_per_token != 0 || c.shared_expert_ffn != 0)
      fail("model.n_experts / model.experts_per_token / model.shared_expert_ffn: ", d.display,
           " is a dense model (no mixture of experts); use a family with experts (\"mixtral\")");
    return;
  }
  if (c.n_experts < 1) fail("model.n_experts must be positive for ", d.display, ", got ", c.n_experts);
  if (c.experts_per_token < 1)
    fail("model.experts_per_token (top-k) must be positive, got ", c.experts_per_token);
  if (c.experts_per_token > c.n_experts)
    fail("model.experts_per_token (top-k) = ", c.experts_per_token, " is larger than model.n_experts = ",
         c.n_experts, ": a token cannot be routed to more experts than there are");
  if (c.moe_balance != "aux_loss" && c.moe_balance != "expert_bias" && c.moe_balance != "both" &&
      c.moe_balance != "none")
    fail("model.moe_balance = \"", c.moe_balance, "\": expected \"aux_loss\", \"expert_bias\" "
         "(DeepSeek-V3's aux-loss-free bias), \"both\" or \"none\"");
  if (!(c.expert_bias_rate >= 0) || !std::isfinite(c.expert_bias_rate))
    fail("model.expert_bias_rate must be a finite number >= 0, got ", c.expert_bias_rate);
  if (c.shared_expert_ffn < 0)
    fail("model.shared_expert_ffn must be >= 0 (0: no shared expert), got ", c.shared_expert_ffn);
  if (!(c.router_aux_loss_coef >= 0))
    fail("model.router_aux_loss_coef must be >= 0, got ", c.router_aux_loss_coef);
  if (!(c.router_z_loss_coef >= 0))
    fail("model.router_z_loss_coef must be >= 0, got ", c.router_z_loss_coef);
  if (!(c.moe_capacity_factor >= 0))
    fail("model.moe_capacity_factor must be >= 0 (0: dropless), got ", c.moe_capacity_factor);
}

// The families whose heads may be wider or narrower than n_embd / n_head, for messages.
std::string head_dim_families() {
  std::string s;
  for (const FamilyDesc& f : families())
    if (f.independent_head_dim) s += std::string(s.empty() ? "\"" : ", \"") + f.name + "\"";
  return s;
}
}  // namespace

void ModelConfig::validate() const {
  auto positive = [](const char* field, long v) {
    if (v <= 0) fail("model.", field, " must be positive, got ", v);
  };
  positive("n_layer", n_layer);
  positive("n_embd", n_embd);
  positive("n_head", n_head);
  positive("n_kv_head", n_kv_head);
  positive("ffn", ffn);
  positive("vocab_size", vocab_size);
  positive("max_seq", max_seq);
  const FamilyDesc& d = desc();
  if (explicit_head_dim < 0)
    fail("model.head_dim must be positive (or 0: n_embd / n_head), got ", explicit_head_dim);
  if (!d.independent_head_dim || explicit_head_dim == 0) {
    if (n_embd % n_head != 0)
      fail("model.n_head (", n_head, ") must divide model.n_embd (", n_embd, ")");
    if (explicit_head_dim > 0 && explicit_head_dim != n_embd / n_head)
      fail("model.head_dim = ", explicit_head_dim, ": ", d.display,
           " heads are n_embd / n_head = ", n_embd / n_head,
           " wide; a head width of its own needs a family that has one (", head_dim_families(),
           ")");
  }
  if (n_head % n_kv_head != 0)
    fail("model.n_kv_head (", n_kv_head, ") must divide model.n_head (", n_head, ")");
  if (!d.grouped_query_attention && n_kv_head != n_head)
    fail("model.n_kv_head: ", d.display, " has no grouped-query attention; set it equal to n_head (",
         n_head, ") or use a family with it (\"llama\", \"qwen2\")");
  if (d.tied == TiedEmbeddings::Always && !tie_embeddings)
    fail("model.tie_embeddings: ", d.display, " always ties the output head to the token embedding");
  if (d.positions == Positions::Rope && head_dim() % 2 != 0)
    fail("model: rotary positions need an even head dimension, got ", head_dim());
  if (!(norm_eps > 0)) fail("model.norm_eps must be positive");
  if (d.positions == Positions::Rope) {
    if (!(rope_theta > 0)) fail("model.rope_theta must be positive, got ", rope_theta);
    if (rope_type != "default" && rope_type != "llama3")
      fail("model.rope_type = \"", rope_type, "\": expected \"default\" or \"llama3\"");
    if (rope_type == "llama3") {
      if (!(rope_factor >= 1)) fail("model.rope_factor must be >= 1 (llama3 rope), got ", rope_factor);
      if (!(rope_low_freq_factor > 0) || !(rope_high_freq_factor > rope_low_freq_factor))
        fail("model.rope_high_freq_factor (", rope_high_freq_factor,
             ") must exceed model.rope_low_freq_factor (", rope_low_freq_factor, ") > 0");
      if (rope_original_max_position <= 0)
        fail("model.rope_original_max_position must be positive, got ", rope_original_max_position);
    }
  }
  if (!(init_std > 0)) fail("model.init_std must be positive");
  validate_moe(*this);
}

kernels::RopeFrequencies rope_frequencies(const ModelConfig& c) {
  kernels::RopeFrequencies f;
  f.theta = c.rope_theta;
  if (c.rope_llama3()) {
    f.factor = c.rope_factor;
    f.low_freq_factor = c.rope_low_freq_factor;
    f.high_freq_factor = c.rope_high_freq_factor;
    f.original_max_position = c.rope_original_max_position;
  }
  return f;
}

ModelConfig named_model(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") {
    c = ModelConfig{};  // the defaults are the tiny test model
  } else if (name == "small") {
    c.n_layer = 6; c.n_embd = 512; c.n_head = 8; c.n_kv_head = 8; c.ffn = 2048;
    c.vocab_size = 8192; c.max_seq = 512;
  } else if (name == "gpt2-124m") {
    c.n_layer = 12; c.n_embd = 768; c.n_head = 12; c.n_kv_head = 12; c.ffn = 3072;
    c.vocab_size = 50304; c.max_seq = 1024;
  } else if (name == "llama-tiny") {
    c.family = Family::Llama; c.n_kv_head = 2; c.ffn = 192; c.tie_embeddings = false;
    c.norm_eps = 1e-6f;
  } else if (name == "llama-small") {
    c.family = Family::Llama; c.n_layer = 6; c.n_embd = 512; c.n_head = 8; c.n_kv_head = 4;
    c.ffn = 1408; c.vocab_size = 8192; c.max_seq = 512; c.tie_embeddings = false;
    c.norm_eps = 1e-6f;
  } else if (name == "llama-1b") {
    // ~1.03B parameters (TinyLlama-like widths, 20 layers): the GPU benchmark's Llama at
    // sequence 2048 (docs/gpu.md).
    c.family = Family::Llama; c.n_layer = 20; c.n_embd = 2048; c.n_head = 32; c.n_kv_head = 8;
    c.ffn = 5632; c.vocab_size = 32000; c.max_seq = 2048; c.tie_embeddings = false;
    c.norm_eps = 1e-5f;
  } else if (name == "qwen2-tiny") {
    // Qwen2.5's small models' form: q/k/v biases, tied embeddings, rope theta 1e6.
    c.family = Family::Qwen2; c.n_kv_head = 2; c.ffn = 192; c.tie_embeddings = true;
    c.norm_eps = 1e-6f; c.rope_theta = 1000000.0f;
  } else if (name == "qwen3-tiny") {
    // Qwen3's small models' form: q/k norms, heads wider than n_embd / n_head (24 of 64 / 4),
    // tied embeddings, rope theta 1e6.
    c.family = Family::Qwen3; c.n_kv_head = 2; c.ffn = 192; c.tie_embeddings = true;
    c.explicit_head_dim = 24; c.norm_eps = 1e-6f; c.rope_theta = 1000000.0f;
  } else if (name == "mixtral-tiny") {
    // Mixtral's form at test size: 4 experts of width 96, top 2, grouped-query attention.
    c.family = Family::Mixtral; c.n_kv_head = 2; c.ffn = 96; c.tie_embeddings = false;
    c.n_experts = 4; c.experts_per_token = 2; c.rope_theta = 1000000.0f;
  } else if (name == "qwen2-moe-tiny") {
    // Qwen2-MoE's form: q/k/v biases, 4 experts of width 48, top 2 without renormalising, a
    // shared expert of width 96 with its gate.
    c.family = Family::Qwen2Moe; c.n_kv_head = 2; c.ffn = 48; c.tie_embeddings = false;
    c.n_experts = 4; c.experts_per_token = 2; c.norm_topk_prob = false;
    c.shared_expert_ffn = 96; c.norm_eps = 1e-6f; c.rope_theta = 1000000.0f;
  } else if (name == "qwen3-moe-tiny") {
    // Qwen3-MoE's form: q/k norms, heads wider than n_embd / n_head (24 of 64 / 4), 8 experts of
    // width 48, top 2 without renormalising.
    c.family = Family::Qwen3Moe; c.n_kv_head = 2; c.ffn = 48; c.tie_embeddings = false;
    c.explicit_head_dim = 24; c.n_experts = 8; c.experts_per_token = 2;
    c.norm_topk_prob = false; c.norm_eps = 1e-6f; c.rope_theta = 1000000.0f;
  } else if (name == "mixtral-small" || name == "mixtral-small-dense") {
    // Issue 32's benchmark Mixtral (bench/moe.sh): 8 experts of width 1408, top 2, 4 layers of
    // 512 with 8 heads and 2 key/value heads, vocabulary 8192, sequence 512; "-dense" is the
    // Mistral-shaped dense model of the same active parameters (one SwiGLU MLP of width 2 x 1408).
    c.family = Family::Mixtral; c.n_layer = 4; c.n_embd = 512; c.n_head = 8; c.n_kv_head = 2;
    c.ffn = 1408; c.vocab_size = 8192; c.max_seq = 512; c.tie_embeddings = false;
    c.n_experts = 8; c.experts_per_token = 2; c.rope_theta = 1000000.0f;
    if (name == "mixtral-small-dense") {
      c.family = Family::Llama;
      c.ffn = 2 * 1408;
      c.n_experts = 0;
      c.experts_per_token = 0;
    }
  } else {
    fail("unknown model '", name, "'; expected one of: tiny, small, gpt2-124m, llama-tiny, "
         "llama-small, llama-1b, qwen2-tiny, qwen3-tiny, mixtral-tiny, mixtral-small, "
         "mixtral-small-dense, qwen2-moe-tiny, qwen3-moe-tiny");
  }
  return c;
}

}  // namespace tetrad
