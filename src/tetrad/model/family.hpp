// A model family as data: what its blocks are made of (norm, MLP, positions, biases, tied
// embeddings), its parameter table (every tensor with its role, Hugging Face name and shape) and
// the names its Hugging Face folders use. Code that depends on the family switches on these
// properties and on tensor roles, never on the family itself or on tensor names; so a new family
// (Qwen: q/k/v biases, per-head q/k RMSNorm) is a new entry in family.cpp plus the parts its new
// properties and roles need, not branches in the old ones.
//
// Pure data: no ModelConfig here (model_config.hpp includes this header); params.cpp turns an
// entry's symbolic shapes into sizes.
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace tetrad {

enum class Family { GPT2, Llama, Qwen2, Qwen3, Mixtral, Qwen2Moe, Qwen3Moe };

enum class NormKind { LayerNorm, RMSNorm };  // LayerNorm: mean and variance, weight and bias
enum class MlpKind { Gelu, SwiGLU };         // SwiGLU: gate|up fused into one input GEMM
enum class Positions { Learned, Rope };      // a position table added to the embedding | rotary
enum class TiedEmbeddings { Always, Optional };

// What a tensor is to the model. Sharding (parallel/sharding.cpp), initialisation
// (init_parameter) and the model's wiring switch on the role.
enum class TensorRole {
  TokenEmbedding,     // [V, C]
  PositionEmbedding,  // [S, C], learned positions
  AttnNorm, AttnNormBias,
  Qkv, QkvBias,       // one fused q|k|v tensor ([q rows | k rows | v rows], GPT-2's c_attn)
  Q, K, V,            // separate tensors, adjacent so one GEMM covers them (kFusedGroups)
  QBias, KBias, VBias,  // their biases (Qwen2), adjacent: one bias vector of the q|k|v GEMM
  QNorm, KNorm,       // per-head RMSNorm weights of q and k [head_dim] (Qwen3), every head's
  AttnOut, AttnOutBias,
  MlpNorm, MlpNormBias,
  MlpIn, MlpInBias,   // the GELU MLP's input layer
  Gate, Up,           // the SwiGLU MLP's halves, adjacent (gate rows first)
  MlpOut, MlpOutBias,
  FinalNorm, FinalNormBias,
  Head,               // the untied output head [V, C]; a tied model has none
  // Mixture of experts (FamilyDesc::moe): the router [E, C]; every expert's gate|up stacked
  // expert by expert [E * 2F, C] (expert e's F gate rows, then its F up rows); every expert's
  // down projection stacked [E * C, F] (expert e's [C, F]).
  Router, ExpertGateUp, ExpertDown,
  // Optional parts of a mixture of experts (absent unless the config asks for them): the shared
  // expert (Qwen2-MoE's form: a SwiGLU MLP of its own width every token goes through, gate and up
  // adjacent [Fs, C] each, down [C, Fs]) and its gate [1, C] (output scaled by sigmoid(x · w));
  // DeepSeek-V3's expert bias [E] (added to the router's scores for the top-k selection only; not
  // trained by the optimizer, updated after each step from the experts' load).
  SharedGate, SharedUp, SharedDown, SharedExpertGate, ExpertBias,
};
const char* role_name(TensorRole r);

// Roles computed on as one GEMM operand: in every layer they follow each other in the table (and
// so in every buffer laid out in its order). build_param_table fails when they do not.
inline constexpr TensorRole kFusedQkv[] = {TensorRole::Q, TensorRole::K, TensorRole::V};
inline constexpr TensorRole kFusedQkvBias[] = {TensorRole::QBias, TensorRole::KBias,
                                               TensorRole::VBias};
inline constexpr TensorRole kFusedGateUp[] = {TensorRole::Gate, TensorRole::Up};
inline constexpr TensorRole kFusedSharedGateUp[] = {TensorRole::SharedGate, TensorRole::SharedUp};
inline constexpr std::span<const TensorRole> kFusedGroups[] = {kFusedQkv, kFusedQkvBias,
                                                               kFusedGateUp, kFusedSharedGateUp};

// Symbolic sizes of a tensor's dimensions (params.cpp evaluates them for a config).
enum class Dim {
  None,      // a 1-D tensor's second dimension
  Vocab,     // V
  Hidden,    // C
  Positions, // S = max_seq
  Ffn,       // F, the MLP's inner size
  QHeads,    // n_head * head_dim
  KvHeads,   // n_kv_head * head_dim
  QkvHeads,  // (n_head + 2 n_kv_head) * head_dim
  HeadDim,   // head_dim
  Experts,          // E = n_experts
  ExpertsGateUp,    // E * 2F
  ExpertsHidden,    // E * C
  // Sizes of the optional MoE parts, 0 when the config has none (a tensor with a dimension of
  // size 0 is not in the table): the shared expert's width Fs, its gate's one row, and E with
  // the expert bias.
  SharedFfn,        // Fs = shared_expert_ffn
  SharedGateRows,   // 1 with a shared expert
  BiasExperts,      // E with the expert bias
};

// One tensor of the table: per-layer names are the family's layer prefix + layer index + "." +
// name. hf_transposed: Hugging Face stores [cols, rows] (GPT-2's Conv1D weights).
struct TensorEntry {
  TensorRole role;
  const char* name;
  Dim rows;
  Dim cols = Dim::None;
  bool hf_transposed = false;
};

// How a mixture of experts' tensors are named in Hugging Face folders (FamilyDesc::hf_experts).
// tetrad holds every expert of a layer in one stacked tensor (TensorRole::ExpertGateUp [E·2F, C],
// ExpertDown [E·C, F]); a folder holds them either one tensor per expert, the Hub's layout and
// what transformers 5's save_pretrained writes (layer prefix + `experts` + N + "." + gate / up /
// down, each [F, C] or [C, F]), or fused as transformers 5 holds them in memory (layer prefix +
// fused_gate_up [E, 2F, C] with each expert's gate rows first, fused_down [E, C, F]; written by
// save_pretrained(save_original_format=False)), with the router then named fused_router.
// checkpoint/hf_tensors.cpp maps between them.
struct HfExpertNames {
  const char* experts;  // "block_sparse_moe.experts."
  const char* gate;     // "w1.weight"
  const char* up;       // "w3.weight"
  const char* down;     // "w2.weight"
  const char* fused_router;   // "mlp.gate.weight"
  const char* fused_gate_up;  // "mlp.experts.gate_up_proj"
  const char* fused_down;     // "mlp.experts.down_proj"
};

struct FamilyDesc {
  Family id;
  const char* name;     // "gpt2" (model.family, checkpoints)
  const char* display;  // "GPT-2" (messages)
  NormKind norm;
  MlpKind mlp;
  Positions positions;
  bool linear_biases;             // every linear layer but the head has a bias
  bool qkv_bias;                  // the q|k|v layer has a bias (every one, with linear_biases)
  bool grouped_query_attention;   // n_kv_head may be smaller than n_head
  // Each query and key head RMS-normalised over its head_dim after the projection, before the
  // rotary positions (Qwen3's q_norm / k_norm: roles QNorm, KNorm; parallel/qk_norm.hpp, run by every block).
  bool qk_norm;
  // The head width may differ from n_embd / n_head (ModelConfig::explicit_head_dim; Qwen3's
  // 128-wide heads); false: head_dim = n_embd / n_head, any other value refused.
  bool independent_head_dim;
  TiedEmbeddings tied;
  bool scaled_residual_init;      // AttnOut / MlpOut drawn with init_std / sqrt(2 n_layer)
  // The parameter table in memory order: the tensors before the blocks, one block's, after.
  std::span<const TensorEntry> top, layer, bottom;
  const char* layer_prefix;       // "transformer.h."
  // Hugging Face: config.json's model_type and architectures[0]; a prefix some uploads leave off
  // every tensor name (the original GPT-2's "transformer."; "" if none); state-dict buffers that
  // are not parameters (name suffixes).
  const char* hf_model_type;
  const char* hf_architecture;
  const char* hf_optional_prefix;
  const char* hf_tied_head;  // a tied model's folder may still hold the head under this name
  std::span<const char* const> hf_ignored_buffers;
  // The MLP of every block is a mixture of experts (ModelConfig's n_experts SwiGLU experts of
  // width ffn, a router choosing experts_per_token of them per token): parallel/moe_block.
  bool moe = false;
  // With moe: the expert tensors' Hugging Face names (null for a dense family).
  const HfExpertNames* hf_experts = nullptr;
  // With moe: the family's Hugging Face model has a shared expert with its sigmoid gate in every
  // layer (Qwen2-MoE; config.json's shared_expert_intermediate_size is model.shared_expert_ffn).
  // Without, a shared expert is tetrad's own and `export` refuses it.
  bool hf_shared_expert = false;

  // Rows of the MLP's input GEMM per inner-size unit: 2 when gate and up are fused.
  int mlp_in_factor() const { return mlp == MlpKind::SwiGLU ? 2 : 1; }
};

// Every family, in the order of Family.
std::span<const FamilyDesc> families();
const FamilyDesc& family_desc(Family f);
std::string family_name(Family f);  // "gpt2" | "llama" | "qwen2" | "qwen3" | "mixtral" | ...
Family parse_family(const std::string& s);  // throws Error naming the accepted values
// "\"gpt2\", \"llama\", ..., \"qwen2_moe\" or \"qwen3_moe\"": the accepted names, for messages.
std::string family_names_quoted();

}  // namespace tetrad
