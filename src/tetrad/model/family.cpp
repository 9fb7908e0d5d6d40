// The registered model families (family.hpp). Adding one: an entry below (its tensors, names and
// properties), a value in Family, its config.json reader and writer (checkpoint/hf_config.cpp),
// and the block parts its new properties or roles need.
#include "tetrad/model/family.hpp"

#include <array>
#include <cstddef>

#include "tetrad/core/error.hpp"

namespace tetrad {
namespace {

using R = TensorRole;
using D = Dim;

// GPT2LMHeadModel. Linear weights stored [out, in]; Hugging Face's Conv1D stores [in, out].
constexpr TensorEntry kGpt2Top[] = {
    {R::TokenEmbedding, "transformer.wte.weight", D::Vocab, D::Hidden},
    {R::PositionEmbedding, "transformer.wpe.weight", D::Positions, D::Hidden},
};
constexpr TensorEntry kGpt2Layer[] = {
    {R::AttnNorm, "ln_1.weight", D::Hidden},
    {R::AttnNormBias, "ln_1.bias", D::Hidden},
    {R::Qkv, "attn.c_attn.weight", D::QkvHeads, D::Hidden, true},
    {R::QkvBias, "attn.c_attn.bias", D::QkvHeads},
    {R::AttnOut, "attn.c_proj.weight", D::Hidden, D::QHeads, true},
    {R::AttnOutBias, "attn.c_proj.bias", D::Hidden},
    {R::MlpNorm, "ln_2.weight", D::Hidden},
    {R::MlpNormBias, "ln_2.bias", D::Hidden},
    {R::MlpIn, "mlp.c_fc.weight", D::Ffn, D::Hidden, true},
    {R::MlpInBias, "mlp.c_fc.bias", D::Ffn},
    {R::MlpOut, "mlp.c_proj.weight", D::Hidden, D::Ffn, true},
    {R::MlpOutBias, "mlp.c_proj.bias", D::Hidden},
};
constexpr TensorEntry kGpt2Bottom[] = {
    {R::FinalNorm, "transformer.ln_f.weight", D::Hidden},
    {R::FinalNormBias, "transformer.ln_f.bias", D::Hidden},
};
constexpr const char* kGpt2Buffers[] = {".attn.bias", ".attn.masked_bias"};

// A layer's table from its attention part (which ends with the MLP's norm) and its MLP part.
template <size_t N, size_t M>
constexpr std::array<TensorEntry, N + M> join(const TensorEntry (&attn)[N], const TensorEntry (&mlp)[M]) {
  std::array<TensorEntry, N + M> out{};
  for (size_t i = 0; i < N; ++i) out[i] = attn[i];
  for (size_t i = 0; i < M; ++i) out[N + i] = mlp[i];
  return out;
}

// LlamaForCausalLM: q, k, v and gate, up adjacent (kFusedGroups), one GEMM each.
constexpr TensorEntry kLlamaTop[] = {
    {R::TokenEmbedding, "model.embed_tokens.weight", D::Vocab, D::Hidden},
};
constexpr TensorEntry kLlamaAttention[] = {
    {R::AttnNorm, "input_layernorm.weight", D::Hidden},
    {R::Q, "self_attn.q_proj.weight", D::QHeads, D::Hidden},
    {R::K, "self_attn.k_proj.weight", D::KvHeads, D::Hidden},
    {R::V, "self_attn.v_proj.weight", D::KvHeads, D::Hidden},
    {R::AttnOut, "self_attn.o_proj.weight", D::Hidden, D::QHeads},
    {R::MlpNorm, "post_attention_layernorm.weight", D::Hidden},
};
constexpr TensorEntry kLlamaMlp[] = {
    {R::Gate, "mlp.gate_proj.weight", D::Ffn, D::Hidden},
    {R::Up, "mlp.up_proj.weight", D::Ffn, D::Hidden},
    {R::MlpOut, "mlp.down_proj.weight", D::Hidden, D::Ffn},
};
constexpr auto kLlamaLayer = join(kLlamaAttention, kLlamaMlp);
constexpr TensorEntry kLlamaBottom[] = {
    {R::FinalNorm, "model.norm.weight", D::Hidden},
    {R::Head, "lm_head.weight", D::Vocab, D::Hidden},
};
constexpr const char* kLlamaBuffers[] = {".rotary_emb.inv_freq"};

// Qwen2ForCausalLM (Qwen2, Qwen2.5): Llama's block with biases on q, k and v (none on o_proj or
// the MLP). The three biases follow the three weights, adjacent (kFusedQkvBias): one bias of the
// q|k|v GEMM. Its ends are Llama's (tied or not).
constexpr TensorEntry kQwen2Attention[] = {
    {R::AttnNorm, "input_layernorm.weight", D::Hidden},
    {R::Q, "self_attn.q_proj.weight", D::QHeads, D::Hidden},
    {R::K, "self_attn.k_proj.weight", D::KvHeads, D::Hidden},
    {R::V, "self_attn.v_proj.weight", D::KvHeads, D::Hidden},
    {R::QBias, "self_attn.q_proj.bias", D::QHeads},
    {R::KBias, "self_attn.k_proj.bias", D::KvHeads},
    {R::VBias, "self_attn.v_proj.bias", D::KvHeads},
    {R::AttnOut, "self_attn.o_proj.weight", D::Hidden, D::QHeads},
    {R::MlpNorm, "post_attention_layernorm.weight", D::Hidden},
};
constexpr auto kQwen2Layer = join(kQwen2Attention, kLlamaMlp);

// Qwen3ForCausalLM: Llama's block with an RMSNorm on each query and key head (q_norm, k_norm:
// one [head_dim] weight each, shared by the heads), heads of their own width (config.json's
// head_dim, 128 in the published models), no biases.
constexpr TensorEntry kQwen3Attention[] = {
    {R::AttnNorm, "input_layernorm.weight", D::Hidden},
    {R::Q, "self_attn.q_proj.weight", D::QHeads, D::Hidden},
    {R::K, "self_attn.k_proj.weight", D::KvHeads, D::Hidden},
    {R::V, "self_attn.v_proj.weight", D::KvHeads, D::Hidden},
    {R::QNorm, "self_attn.q_norm.weight", D::HeadDim},
    {R::KNorm, "self_attn.k_norm.weight", D::HeadDim},
    {R::AttnOut, "self_attn.o_proj.weight", D::Hidden, D::QHeads},
    {R::MlpNorm, "post_attention_layernorm.weight", D::Hidden},
};
constexpr auto kQwen3Layer = join(kQwen3Attention, kLlamaMlp);

// MixtralForCausalLM: Llama's attention; the MLP a mixture of experts (block_sparse_moe): the
// router ("gate") and each expert's w1 (gate), w3 (up) and w2 (down), stored stacked here (one
// GEMM operand per expert group) and split into Hugging Face's per-expert tensors by the folder
// code (kMixtralExperts; checkpoint/hf_tensors.cpp). transformers 5 renames block_sparse_moe to
// mlp when it fuses the experts.
constexpr TensorEntry kMixtralMoe[] = {
    {R::Router, "block_sparse_moe.gate.weight", D::Experts, D::Hidden},
    {R::ExpertGateUp, "block_sparse_moe.experts.w1_w3", D::ExpertsGateUp, D::Hidden},
    {R::ExpertDown, "block_sparse_moe.experts.w2", D::ExpertsHidden, D::Ffn},
    // Optional (model.shared_expert_ffn, model.moe_balance): Qwen2-MoE's names under Mixtral's
    // prefix, DeepSeek-V3's for the bias; no Hugging Face Mixtral has them (export refuses).
    {R::SharedGate, "block_sparse_moe.shared_expert.gate_proj.weight", D::SharedFfn, D::Hidden},
    {R::SharedUp, "block_sparse_moe.shared_expert.up_proj.weight", D::SharedFfn, D::Hidden},
    {R::SharedDown, "block_sparse_moe.shared_expert.down_proj.weight", D::Hidden, D::SharedFfn},
    {R::SharedExpertGate, "block_sparse_moe.shared_expert_gate.weight", D::SharedGateRows, D::Hidden},
    {R::ExpertBias, "block_sparse_moe.gate.e_score_correction_bias", D::BiasExperts},
};
constexpr auto kMixtralLayer = join(kLlamaAttention, kMixtralMoe);

// The Qwen MoE families' MLP under `mlp.`: the router mlp.gate, the experts
// mlp.experts.N.{gate,up,down}_proj (the stacked tensors' table names are transformers 5's fused
// ones: kQwenExperts), the shared expert and its sigmoid gate (model.shared_expert_ffn; Qwen2-MoE
// has one in every layer, Qwen3-MoE none: there it is tetrad's own and export refuses it, as the
// expert bias on both).
constexpr TensorEntry kQwenMoe[] = {
    {R::Router, "mlp.gate.weight", D::Experts, D::Hidden},
    {R::ExpertGateUp, "mlp.experts.gate_up_proj", D::ExpertsGateUp, D::Hidden},
    {R::ExpertDown, "mlp.experts.down_proj", D::ExpertsHidden, D::Ffn},
    {R::SharedGate, "mlp.shared_expert.gate_proj.weight", D::SharedFfn, D::Hidden},
    {R::SharedUp, "mlp.shared_expert.up_proj.weight", D::SharedFfn, D::Hidden},
    {R::SharedDown, "mlp.shared_expert.down_proj.weight", D::Hidden, D::SharedFfn},
    {R::SharedExpertGate, "mlp.shared_expert_gate.weight", D::SharedGateRows, D::Hidden},
    {R::ExpertBias, "mlp.gate.e_score_correction_bias", D::BiasExperts},
};
// Qwen2MoeForCausalLM (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (q, k, v biases).
constexpr auto kQwen2MoeLayer = join(kQwen2Attention, kQwenMoe);
// Qwen3MoeForCausalLM: Qwen3's attention (q/k RMSNorm, heads head_dim wide).
constexpr auto kQwen3MoeLayer = join(kQwen3Attention, kQwenMoe);

constexpr HfExpertNames kQwenExperts = {
    .experts = "mlp.experts.",
    .gate = "gate_proj.weight",
    .up = "up_proj.weight",
    .down = "down_proj.weight",
    .fused_router = "mlp.gate.weight",
    .fused_gate_up = "mlp.experts.gate_up_proj",
    .fused_down = "mlp.experts.down_proj",
};

constexpr HfExpertNames kMixtralExperts = {
    .experts = "block_sparse_moe.experts.",
    .gate = "w1.weight",
    .up = "w3.weight",
    .down = "w2.weight",
    .fused_router = "mlp.gate.weight",
    .fused_gate_up = "mlp.experts.gate_up_proj",
    .fused_down = "mlp.experts.down_proj",
};

// What every family after GPT-2 takes from Llama: RMSNorm, a SwiGLU MLP, rotary positions, no
// linear biases, grouped-query attention, the head tied or not, Llama's ends (embed_tokens; norm
// and lm_head) and names (model.layers.N.). Each family gives the rest.
struct LlamaLike {
  Family id;
  const char* name;
  const char* display;
  bool qkv_bias;
  bool qk_norm;
  bool independent_head_dim;
  std::span<const TensorEntry> layer;
  const char* hf_model_type;
  const char* hf_architecture;
  const HfExpertNames* hf_experts = nullptr;  // set: a mixture of experts (FamilyDesc::moe)
  bool hf_shared_expert = false;
};

constexpr FamilyDesc llama_like(const LlamaLike& f) {
  return {.id = f.id,
          .name = f.name,
          .display = f.display,
          .norm = NormKind::RMSNorm,
          .mlp = MlpKind::SwiGLU,
          .positions = Positions::Rope,
          .linear_biases = false,
          .qkv_bias = f.qkv_bias,
          .grouped_query_attention = true,
          .qk_norm = f.qk_norm,
          .independent_head_dim = f.independent_head_dim,
          .tied = TiedEmbeddings::Optional,
          .scaled_residual_init = false,
          .top = kLlamaTop,
          .layer = f.layer,
          .bottom = kLlamaBottom,
          .layer_prefix = "model.layers.",
          .hf_model_type = f.hf_model_type,
          .hf_architecture = f.hf_architecture,
          .hf_optional_prefix = "",
          .hf_tied_head = "lm_head.weight",
          .hf_ignored_buffers = kLlamaBuffers,
          .moe = f.hf_experts != nullptr,
          .hf_experts = f.hf_experts,
          .hf_shared_expert = f.hf_shared_expert};
}

const FamilyDesc kFamilies[] = {
    {.id = Family::GPT2,
     .name = "gpt2",
     .display = "GPT-2",
     .norm = NormKind::LayerNorm,
     .mlp = MlpKind::Gelu,
     .positions = Positions::Learned,
     .linear_biases = true,
     .qkv_bias = true,
     .grouped_query_attention = false,
     .qk_norm = false,
     .independent_head_dim = false,
     .tied = TiedEmbeddings::Always,
     .scaled_residual_init = true,  // Radford et al. 2019
     .top = kGpt2Top,
     .layer = kGpt2Layer,
     .bottom = kGpt2Bottom,
     .layer_prefix = "transformer.h.",
     .hf_model_type = "gpt2",
     .hf_architecture = "GPT2LMHeadModel",
     .hf_optional_prefix = "transformer.",
     .hf_tied_head = "lm_head.weight",
     .hf_ignored_buffers = kGpt2Buffers},
    llama_like({.id = Family::Llama,
                .name = "llama",
                .display = "Llama",
                .qkv_bias = false,
                .qk_norm = false,
                .independent_head_dim = true,  // LlamaConfig.head_dim (Mistral Nemo: 128, not 160)
                .layer = kLlamaLayer,
                .hf_model_type = "llama",
                .hf_architecture = "LlamaForCausalLM"}),
    llama_like({.id = Family::Qwen2,
                .name = "qwen2",
                .display = "Qwen2",
                .qkv_bias = true,
                .qk_norm = false,
                .independent_head_dim = false,
                .layer = kQwen2Layer,
                .hf_model_type = "qwen2",
                .hf_architecture = "Qwen2ForCausalLM"}),
    llama_like({.id = Family::Qwen3,
                .name = "qwen3",
                .display = "Qwen3",
                .qkv_bias = false,
                .qk_norm = true,
                .independent_head_dim = true,
                .layer = kQwen3Layer,
                .hf_model_type = "qwen3",
                .hf_architecture = "Qwen3ForCausalLM"}),
    llama_like({.id = Family::Mixtral,
                .name = "mixtral",
                .display = "Mixtral",
                .qkv_bias = false,
                .qk_norm = false,
                .independent_head_dim = true,  // MixtralConfig.head_dim, as Llama
                .layer = kMixtralLayer,
                .hf_model_type = "mixtral",
                .hf_architecture = "MixtralForCausalLM",
                .hf_experts = &kMixtralExperts}),
    llama_like({.id = Family::Qwen2Moe,
                .name = "qwen2_moe",
                .display = "Qwen2-MoE",
                .qkv_bias = true,
                .qk_norm = false,
                .independent_head_dim = false,
                .layer = kQwen2MoeLayer,
                .hf_model_type = "qwen2_moe",
                .hf_architecture = "Qwen2MoeForCausalLM",
                .hf_experts = &kQwenExperts,
                .hf_shared_expert = true}),
    llama_like({.id = Family::Qwen3Moe,
                .name = "qwen3_moe",
                .display = "Qwen3-MoE",
                .qkv_bias = false,
                .qk_norm = true,
                .independent_head_dim = true,
                .layer = kQwen3MoeLayer,
                .hf_model_type = "qwen3_moe",
                .hf_architecture = "Qwen3MoeForCausalLM",
                .hf_experts = &kQwenExperts}),
};

}  // namespace

const char* role_name(TensorRole r) {
  switch (r) {
    case R::TokenEmbedding: return "token embedding";
    case R::PositionEmbedding: return "position embedding";
    case R::AttnNorm: return "attention norm";
    case R::AttnNormBias: return "attention norm bias";
    case R::Qkv: return "q|k|v";
    case R::QkvBias: return "q|k|v bias";
    case R::Q: return "q";
    case R::K: return "k";
    case R::V: return "v";
    case R::QBias: return "q bias";
    case R::KBias: return "k bias";
    case R::VBias: return "v bias";
    case R::QNorm: return "q norm";
    case R::KNorm: return "k norm";
    case R::AttnOut: return "attention output";
    case R::AttnOutBias: return "attention output bias";
    case R::MlpNorm: return "MLP norm";
    case R::MlpNormBias: return "MLP norm bias";
    case R::MlpIn: return "MLP input";
    case R::MlpInBias: return "MLP input bias";
    case R::Gate: return "gate";
    case R::Up: return "up";
    case R::MlpOut: return "MLP output";
    case R::MlpOutBias: return "MLP output bias";
    case R::FinalNorm: return "final norm";
    case R::FinalNormBias: return "final norm bias";
    case R::Head: return "output head";
    case R::Router: return "router";
    case R::ExpertGateUp: return "experts' gate|up";
    case R::ExpertDown: return "experts' down projection";
    case R::SharedGate: return "shared expert's gate";
    case R::SharedUp: return "shared expert's up projection";
    case R::SharedDown: return "shared expert's down projection";
    case R::SharedExpertGate: return "shared expert's sigmoid gate";
    case R::ExpertBias: return "expert bias";
  }
  return "?";
}

std::span<const FamilyDesc> families() { return kFamilies; }

const FamilyDesc& family_desc(Family f) {
  for (const FamilyDesc& d : kFamilies)
    if (d.id == f) return d;
  fail("model family ", int(f), " is not registered");
}

std::string family_name(Family f) { return family_desc(f).name; }

std::string family_names_quoted() {
  std::string s;
  for (size_t i = 0; i < std::size(kFamilies); ++i)
    s += std::string(i == 0 ? "" : i + 1 == std::size(kFamilies) ? " or " : ", ") + "\"" +
         kFamilies[i].name + "\"";
  return s;
}

Family parse_family(const std::string& s) {
  for (const FamilyDesc& d : kFamilies)
    if (s == d.name) return d.id;
  fail("model.family: unknown family '", s, "'; expected ", family_names_quoted());
}

}  // namespace tetrad
