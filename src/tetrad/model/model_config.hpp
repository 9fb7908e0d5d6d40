// The architecture of a model: which family and its sizes. A pure value type; the named
// standard configurations (tiny, small, gpt2-124m, ...) live in model_config.cpp.
#pragma once
#include <cstdint>
#include <string>

#include "tetrad/model/family.hpp"

namespace tetrad {
namespace kernels {
struct RopeFrequencies;
}

struct ModelConfig {
  Family family = Family::GPT2;
  int n_layer = 2;
  int n_embd = 64;       // hidden size C
  int n_head = 4;
  int n_kv_head = 4;     // == n_head unless grouped-query attention (Llama only)
  int ffn = 256;         // MLP inner size (GPT-2: 4C; Llama: SwiGLU inner size)
  int vocab_size = 512;
  int max_seq = 64;      // learned positions (GPT-2) / longest sequence (Llama)
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;  // Llama only
  // Llama only: "default" or "llama3" (Llama 3.1's frequency scaling with the four fields below,
  // as Hugging Face's rope_type "llama3"; backend/cpu/ops.hpp has the formula).
  std::string rope_type = "default";
  double rope_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int rope_original_max_position = 8192;
  bool tie_embeddings = true;   // GPT-2 always ties; Llama does not by default
  float init_std = 0.02f;
  // The width of one attention head; 0 (the default): n_embd / n_head. Read it through
  // head_dim(). A family whose heads are n_embd / n_head wide (FamilyDesc::independent_head_dim
  // false: every family registered so far) refuses any other value (validate()).
  int explicit_head_dim = 0;

  // Mixture of experts (a family with FamilyDesc::moe; parallel/moe_block.hpp has the block):
  // every block's MLP is n_experts SwiGLU experts of inner width ffn, a fp32 router choosing
  // experts_per_token of them per token (softmax over the experts, then the top k).
  int n_experts = 0;
  int experts_per_token = 0;
  // Renormalise the chosen experts' k softmax weights to sum 1 (Mixtral always; Qwen3-MoE as
  // its config's norm_topk_prob says).
  bool norm_topk_prob = true;
  // Load balancing: "aux_loss" (Switch / Mixtral: router_aux_loss_coef * E * Σ_e f_e P_e per
  // layer, averaged over layers), "expert_bias" (DeepSeek-V3's aux-loss-free balancing: a
  // per-expert bias added to the router's probabilities for the top-k selection only, updated
  // after each optimizer step by expert_bias_rate * sign(mean load - load_e)), "both" or "none".
  std::string moe_balance = "aux_loss";
  float expert_bias_rate = 0.001f;  // DeepSeek-V3's bias update speed (gamma)
  // The shared expert (Qwen2-MoE's form; 0: none): a SwiGLU MLP of this inner width that every
  // token goes through, its output scaled by sigmoid(x · w_gate) and added to the routed output.
  int shared_expert_ffn = 0;
  float router_aux_loss_coef = 0.001f;  // Mixtral's default
  float router_z_loss_coef = 0.0f;      // ST-MoE's z-loss: coef * mean_t logsumexp(logits_t)²
  // 0: dropless (every token reaches its k experts however uneven the load); > 0: each expert
  // takes at most ceil(capacity_factor * tokens * k / E) tokens of a micro-batch, in token
  // order, and the choices beyond are dropped (counted in the block's load statistics).
  float moe_capacity_factor = 0.0f;

  bool moe() const { return desc().moe; }
  bool moe_renormalize() const { return norm_topk_prob; }
  bool moe_aux_loss() const { return moe_balance == "aux_loss" || moe_balance == "both"; }
  bool moe_expert_bias() const { return moe_balance == "expert_bias" || moe_balance == "both"; }
  int head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : n_embd / n_head; }
  int q_dim() const { return n_head * head_dim(); }       // every query head: n_head * head_dim
  int kv_dim() const { return n_kv_head * head_dim(); }   // the keys' (or values') heads
  const FamilyDesc& desc() const { return family_desc(family); }
  bool rope_llama3() const { return desc().positions == Positions::Rope && rope_type == "llama3"; }
  // Rows of the MLP's input GEMM: ffn, or 2 ffn where gate and up are fused (SwiGLU).
  int mlp_in_dim() const { return desc().mlp_in_factor() * ffn; }
  int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  // Throws Error when sizes are inconsistent (heads not dividing C, kv heads not dividing heads,
  // a head width the family does not have...).
  void validate() const;
};

// The rotary frequencies of a Llama config (theta and, for rope_type "llama3", its scaling).
kernels::RopeFrequencies rope_frequencies(const ModelConfig& c);

// Named standard configurations (benchmarks.md): "tiny", "small", "gpt2-124m", plus
// "llama-tiny", "llama-small". Throws Error listing the known names.
ModelConfig named_model(const std::string& name);

}  // namespace tetrad
