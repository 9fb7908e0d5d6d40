#include "tetrad/model/model_config.hpp"

#include "tetrad/backend/cpu/ops.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/model/params.hpp"

namespace tetrad {

std::string family_name(Family f) { return f == Family::GPT2 ? "gpt2" : "llama"; }

Family parse_family(const std::string& s) {
  if (s == "gpt2") return Family::GPT2;
  if (s == "llama") return Family::Llama;
  fail("model.family: unknown family '", s, "'; expected \"gpt2\" or \"llama\"");
}

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
  if (n_embd % n_head != 0)
    fail("model.n_head (", n_head, ") must divide model.n_embd (", n_embd, ")");
  if (n_head % n_kv_head != 0)
    fail("model.n_kv_head (", n_kv_head, ") must divide model.n_head (", n_head, ")");
  if (family == Family::GPT2 && n_kv_head != n_head)
    fail("model.n_kv_head: GPT-2 has no grouped-query attention; set it equal to n_head (",
         n_head, ") or use family = \"llama\"");
  if (family == Family::GPT2 && !tie_embeddings)
    fail("model.tie_embeddings: GPT-2 always ties the output head to the token embedding");
  if (family == Family::Llama && head_dim() % 2 != 0)
    fail("model: rotary positions need an even head dimension, got ", head_dim());
  if (!(norm_eps > 0)) fail("model.norm_eps must be positive");
  if (family == Family::Llama) {
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
  } else {
    fail("unknown model '", name,
         "'; expected one of: tiny, small, gpt2-124m, llama-tiny, llama-small, llama-1b");
  }
  return c;
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

}  // namespace tetrad
