// Model families and tensor roles as data (model/family.hpp): the registered families' tables,
// the fused-group check, sharding by role, the config.json formats, and GEMM sites by enum.
#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "tetrad/checkpoint/hf_config.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/model/family.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/gemm_layouts.hpp"
#include "tetrad/parallel/sharding.hpp"

using namespace tetrad;
using parallel::ShardLayout;
using parallel::ShardPlan;
using parallel::GridShape;
using parallel::GridCoord;

namespace {

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> layer_names(const ParamTable& t, int layer) {
  std::vector<std::string> names;
  for (const ParamSpec& s : t.specs)
    if (s.layer == layer) names.push_back(s.name);
  return names;
}

// A Llama-like layer's tensors in table order under Hugging Face's names: the attention's q, k
// and v weights, then `after_qkv` (self_attn.<name>: a family's q/k/v biases or q/k norms), then
// o_proj and the SwiGLU MLP.
std::vector<std::string> llama_layer_names(int layer, const std::vector<std::string>& after_qkv) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  std::vector<std::string> names = {p + "input_layernorm.weight", p + "self_attn.q_proj.weight",
                                    p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"};
  for (const std::string& n : after_qkv) names.push_back(p + "self_attn." + n);
  for (const char* n : {"self_attn.o_proj.weight", "post_attention_layernorm.weight",
                        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
    names.push_back(p + n);
  return names;
}

}  // namespace

TEST(ModelFamily, RegistryNamesRoundTrip) {
  ASSERT_EQ(families().size(), 7u);
  for (const FamilyDesc& f : families()) {
    EXPECT_EQ(parse_family(f.name), f.id);
    EXPECT_EQ(&family_desc(f.id), &f);
  }
  EXPECT_EQ(family_names_quoted(), "\"gpt2\", \"llama\", \"qwen2\", \"qwen3\", \"mixtral\", \"qwen2_moe\" or \"qwen3_moe\"");
  const std::string e = error_of([] { parse_family("bert"); });
  EXPECT_NE(e.find("unknown family 'bert'; expected \"gpt2\", \"llama\", \"qwen2\", \"qwen3\", \"mixtral\", \"qwen2_moe\" or \"qwen3_moe\""),
            std::string::npos) << e;
}

// The tables as they were written by hand before they became data: same names, order, shapes.
TEST(ModelFamily, Gpt2TableOrderNamesAndRoles) {
  const ModelConfig c = named_model("tiny");
  const ParamTable t = build_param_table(c);
  ASSERT_EQ(t.specs.size(), 2u + 12u * size_t(c.n_layer) + 2u);
  EXPECT_EQ(t.specs[0].name, "transformer.wte.weight");
  EXPECT_EQ(t.specs[0].role, TensorRole::TokenEmbedding);
  EXPECT_EQ(t.specs[1].role, TensorRole::PositionEmbedding);
  EXPECT_EQ(t.specs[1].shape, (std::vector<int64_t>{c.max_seq, c.n_embd}));
  EXPECT_EQ(layer_names(t, 1),
            (std::vector<std::string>{
                "transformer.h.1.ln_1.weight", "transformer.h.1.ln_1.bias",
                "transformer.h.1.attn.c_attn.weight", "transformer.h.1.attn.c_attn.bias",
                "transformer.h.1.attn.c_proj.weight", "transformer.h.1.attn.c_proj.bias",
                "transformer.h.1.ln_2.weight", "transformer.h.1.ln_2.bias",
                "transformer.h.1.mlp.c_fc.weight", "transformer.h.1.mlp.c_fc.bias",
                "transformer.h.1.mlp.c_proj.weight", "transformer.h.1.mlp.c_proj.bias"}));
  const ParamSpec& qkv = t.find("transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(qkv.role, TensorRole::Qkv);
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{3 * c.n_embd, c.n_embd}));
  EXPECT_TRUE(qkv.hf_transposed);
  EXPECT_EQ(t.find("transformer.h.0.mlp.c_proj.weight").role, TensorRole::MlpOut);
  EXPECT_EQ(t.specs.back().name, "transformer.ln_f.bias");
  EXPECT_EQ(t.specs.back().role, TensorRole::FinalNormBias);
  EXPECT_EQ(t.try_find("lm_head.weight"), nullptr);  // tied
  int64_t offset = 0;
  for (const ParamSpec& s : t.specs) {
    EXPECT_EQ(s.offset, offset) << s.name;
    EXPECT_EQ(s.kind, role_kind(s.role)) << s.name;
    offset += s.numel;
  }
  EXPECT_EQ(offset, t.total);
}

TEST(ModelFamily, LlamaTableOrderNamesAndRoles) {
  ModelConfig c = named_model("llama-tiny");
  const ParamTable t = build_param_table(c);
  EXPECT_EQ(t.specs[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(layer_names(t, 0), llama_layer_names(0, {}));
  const int64_t hd = c.head_dim();
  EXPECT_EQ(t.find("model.layers.0.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{c.n_kv_head * hd, c.n_embd}));
  EXPECT_EQ(t.find("model.layers.0.self_attn.o_proj.weight").role, TensorRole::AttnOut);
  EXPECT_EQ(t.specs.back().name, "lm_head.weight");
  EXPECT_EQ(t.specs.back().role, TensorRole::Head);
  c.tie_embeddings = true;
  EXPECT_EQ(build_param_table(c).specs.back().name, "model.norm.weight");
}

// The head width is a config value (ModelConfig::explicit_head_dim, read through head_dim()):
// unset it is n_embd / n_head and every size follows it; a family whose heads are n_embd / n_head
// wide (GPT-2, Qwen2) refuses another value, naming it, the width it has and the families with
// a width of their own.
TEST(ModelFamily, HeadDimIsAConfigValueTheFamiliesTieToTheirWidth) {
  for (const char* name : {"tiny", "qwen2-tiny"}) {
    ModelConfig c = named_model(name);
    EXPECT_EQ(c.head_dim(), c.n_embd / c.n_head) << name;
    EXPECT_EQ(c.q_dim(), c.n_embd) << name;
    EXPECT_EQ(c.kv_dim(), c.n_kv_head * c.head_dim()) << name;
    EXPECT_EQ(c.qkv_dim(), c.q_dim() + 2 * c.kv_dim()) << name;
    const int64_t total = count_parameters(c);
    c.explicit_head_dim = c.n_embd / c.n_head;  // the same width, set: accepted, same table
    EXPECT_NO_THROW(c.validate()) << name;
    EXPECT_EQ(count_parameters(c), total) << name;
    EXPECT_FALSE(c.desc().independent_head_dim) << name;
    c.explicit_head_dim = 2 * (c.n_embd / c.n_head);
    const std::string e = error_of([&] { c.validate(); });
    EXPECT_NE(e.find("model.head_dim = " + std::to_string(c.explicit_head_dim)), std::string::npos) << e;
    EXPECT_NE(e.find("n_embd / n_head = " + std::to_string(c.n_embd / c.n_head)), std::string::npos) << e;
    EXPECT_NE(e.find(c.desc().display), std::string::npos) << e;
    EXPECT_NE(e.find("\"llama\""), std::string::npos) << e;
    c.explicit_head_dim = -1;
    EXPECT_NE(error_of([&] { c.validate(); }).find("model.head_dim must be positive"), std::string::npos);
  }
}

// A family with heads of their own width (Llama: LlamaConfig.head_dim): q is n_head * head_dim
// rows, k and v n_kv_head * head_dim, o_proj reads n_head * head_dim; n_embd need not be a
// multiple of n_head.
TEST(ModelFamily, IndependentHeadDimSizesEveryAttentionTensor) {
  ModelConfig c = named_model("llama-tiny");
  ASSERT_TRUE(c.desc().independent_head_dim);
  c.explicit_head_dim = 24;
  c.n_embd = 60;  // not a multiple of n_head = 4 heads of 24
  ASSERT_NO_THROW(c.validate());
  EXPECT_EQ(c.q_dim(), c.n_head * 24);
  const ParamTable t = build_param_table(c);
  EXPECT_EQ(t.find("model.layers.0.self_attn.q_proj.weight").shape, (std::vector<int64_t>{c.n_head * 24, 60}));
  EXPECT_EQ(t.find("model.layers.1.self_attn.k_proj.weight").shape, (std::vector<int64_t>{c.n_kv_head * 24, 60}));
  EXPECT_EQ(t.find("model.layers.1.self_attn.o_proj.weight").shape, (std::vector<int64_t>{60, c.n_head * 24}));
  c.explicit_head_dim = 25;  // rotary positions pair a head's halves
  EXPECT_NE(error_of([&] { c.validate(); }).find("even head dimension"), std::string::npos);
}

// Qwen3: Llama's tensors plus q_norm and k_norm, each [head_dim] (24 in qwen3-tiny, not
// n_embd / n_head = 16), after the adjacent q, k, v; q is n_head * 24 rows, o_proj reads as many.
TEST(ModelFamily, Qwen3TableHasTheQkNormsAndItsOwnHeadWidth) {
  const ModelConfig c = named_model("qwen3-tiny");
  EXPECT_EQ(c.family, Family::Qwen3);
  EXPECT_TRUE(c.desc().qk_norm);
  EXPECT_EQ(c.head_dim(), 24);
  EXPECT_NE(c.head_dim(), c.n_embd / c.n_head);
  const ParamTable t = build_param_table(c);
  EXPECT_EQ(layer_names(t, 1), llama_layer_names(1, {"q_norm.weight", "k_norm.weight"}));
  for (const char* n : {"q_norm", "k_norm"}) {
    const ParamSpec& s = t.find(std::string("model.layers.0.self_attn.") + n + ".weight");
    EXPECT_EQ(s.shape, (std::vector<int64_t>{24}));
    EXPECT_EQ(s.kind, ParamKind::Norm);
  }
  EXPECT_EQ(t.find("model.layers.0.self_attn.q_proj.weight").shape, (std::vector<int64_t>{4 * 24, 64}));
  EXPECT_EQ(t.find("model.layers.0.self_attn.o_proj.weight").shape, (std::vector<int64_t>{64, 4 * 24}));
  // A layer's q/k norms are no part of the dense block: building it alone refuses them by name.
  EXPECT_EQ(t.find("model.layers.0.self_attn.q_norm.weight").role, TensorRole::QNorm);
}

// Qwen2: Llama's tensors plus q, k and v biases after the three weights (one bias of the fused
// q|k|v GEMM); tied by default (qwen2-tiny, as Qwen2.5's small models), untied on request.
TEST(ModelFamily, Qwen2TableHasTheQkvBiasesAfterTheWeights) {
  ModelConfig c = named_model("qwen2-tiny");
  EXPECT_EQ(c.family, Family::Qwen2);
  const ParamTable t = build_param_table(c);
  EXPECT_EQ(layer_names(t, 1),
            llama_layer_names(1, {"q_proj.bias", "k_proj.bias", "v_proj.bias"}));
  const int64_t hd = c.head_dim();
  const ParamSpec& qb = t.find("model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(qb.role, TensorRole::QBias);
  EXPECT_EQ(qb.kind, ParamKind::Bias);
  EXPECT_EQ(qb.shape, (std::vector<int64_t>{c.n_head * hd}));
  EXPECT_EQ(t.find("model.layers.0.self_attn.k_proj.bias").shape, (std::vector<int64_t>{c.n_kv_head * hd}));
  EXPECT_EQ(t.find("model.layers.0.self_attn.v_proj.bias").role, TensorRole::VBias);
  EXPECT_EQ(t.specs.back().name, "model.norm.weight");  // tied: no head
  c.tie_embeddings = false;
  EXPECT_EQ(build_param_table(c).specs.back().name, "lm_head.weight");
  // Parameters: Llama's of the same sizes plus the biases (q|k|v rows per layer).
  ModelConfig llama = c;
  llama.family = Family::Llama;
  EXPECT_EQ(count_parameters(c), count_parameters(llama) + int64_t(c.n_layer) * c.qkv_dim());
}

// The fused GEMMs read q|k|v and gate|up as one operand: a table whose order breaks a group is
// refused where it is built, naming the tensors.
TEST(ModelFamily, FusedGroupsMustBeAdjacent) {
  const ParamTable good = build_param_table(named_model("llama-tiny"));
  EXPECT_NO_THROW(check_fused_groups(good));
  auto swapped = [&](const std::string& a, const std::string& b) {
    ParamTable t = good;
    auto ia = std::find_if(t.specs.begin(), t.specs.end(), [&](auto& s) { return s.name == a; });
    auto ib = std::find_if(t.specs.begin(), t.specs.end(), [&](auto& s) { return s.name == b; });
    std::iter_swap(ia, ib);
    int64_t offset = 0;
    for (ParamSpec& s : t.specs) s.offset = offset, offset += s.numel;
    return t;
  };
  std::string e = error_of([&] {
    check_fused_groups(swapped("model.layers.1.self_attn.k_proj.weight",
                               "model.layers.1.self_attn.v_proj.weight"));
  });
  EXPECT_NE(e.find("'model.layers.1.self_attn.q_proj.weight' (q) must be followed by the "
                   "layer's k tensor"), std::string::npos) << e;
  EXPECT_NE(e.find("found 'model.layers.1.self_attn.v_proj.weight' (v)"), std::string::npos) << e;
  e = error_of([&] {
    check_fused_groups(swapped("model.layers.0.mlp.up_proj.weight",
                               "model.layers.0.mlp.down_proj.weight"));
  });
  EXPECT_NE(e.find("'model.layers.0.mlp.gate_proj.weight' (gate) must be followed by the "
                   "layer's up tensor"), std::string::npos) << e;
  // A tensor between members of a group (here: the group's last member moved to the end).
  ParamTable t = good;
  std::rotate(t.specs.begin() + 3, t.specs.begin() + 4, t.specs.end());  // v_proj of layer 0 last
  int64_t offset = 0;
  for (ParamSpec& s : t.specs) s.offset = offset, offset += s.numel;
  EXPECT_THROW(check_fused_groups(t), Error);
}

// Sharding follows the role: on X = 2, Y = 2 every GEMM weight is a Normal or Transposed block,
// the fused q|k|v tensor gives each y its own heads' q, k and v rows, and the norms are
// column-split vectors; the same roles get the same layouts in both families.
TEST(ModelFamily, ShardingByRole) {
  const GridShape g{2, 2, 1, 1};
  for (const char* name : {"tiny", "llama-tiny", "qwen2-tiny", "qwen3-tiny"}) {
    const ModelConfig c = named_model(name);
    const ParamTable t = build_param_table(c);
    const ShardPlan plan = ShardPlan::build(c, t, g, GridCoord{1, 1, 0, 0});
    for (const parallel::TensorShard& s : plan.tensors) {
      ShardLayout want = ShardLayout::ColsX;
      switch (s.spec->role) {
        case TensorRole::AttnOut:
        case TensorRole::MlpOut:
          want = ShardLayout::Transposed;
          break;
        case TensorRole::QkvBias:
        case TensorRole::QBias:
        case TensorRole::KBias:
        case TensorRole::VBias:
        case TensorRole::MlpInBias:
          want = ShardLayout::RowsY;
          break;
        case TensorRole::PositionEmbedding:
        case TensorRole::AttnNorm:
        case TensorRole::AttnNormBias:
        case TensorRole::MlpNorm:
        case TensorRole::MlpNormBias:
        case TensorRole::FinalNorm:
        case TensorRole::FinalNormBias:
        case TensorRole::AttnOutBias:
        case TensorRole::MlpOutBias:
          want = ShardLayout::ColsX;
          break;
        case TensorRole::QNorm:  // one head's width: whole on every rank
        case TensorRole::KNorm:
          want = ShardLayout::Replicated;
          break;
        default:
          want = ShardLayout::Normal;
      }
      EXPECT_EQ(s.layout, want) << name << " " << s.spec->name;
      EXPECT_EQ(s.z_sharded, want == ShardLayout::Normal || want == ShardLayout::Transposed)
          << s.spec->name;
    }
    if (c.family == Family::GPT2) {
      const parallel::TensorShard& qkv = plan.tensors[size_t(&t.find("transformer.h.0.attn.c_attn.weight") - t.specs.data())];
      const int64_t C = c.n_embd, half = C / 2;
      ASSERT_EQ(qkv.rows.size(), size_t(3 * half));
      EXPECT_EQ(qkv.rows[0], half);              // y = 1: the second half of the q rows,
      EXPECT_EQ(qkv.rows[size_t(half)], C + half);  // of the k rows
      EXPECT_EQ(qkv.rows[size_t(2 * half)], 2 * C + half);  // and of the v rows
    }
    if (c.family == Family::Qwen2) {  // y = 1: the second half of each of the q, k, v biases
      const ParamSpec& kb = t.find("model.layers.0.self_attn.k_proj.bias");
      const parallel::TensorShard& k = plan.tensors[size_t(&kb - t.specs.data())];
      const int64_t half = kb.numel / 2;
      ASSERT_EQ(k.rows.size(), size_t(half));
      EXPECT_EQ(k.rows[0], half);
    }
  }
}

// A mixture of experts on the tensor axes (docs/moe.md, "On the tensor axes X and Y"): the router
// by columns over X on every Y rank (Z-sharded), each expert's gate|up a normal layer (its gate
// rows and its up rows each over Y, columns over X) and its down a transposed one; over the four
// ranks of x=2,y=2 (and the expert fold E = 2 over D = 2) every element is held by exactly the
// ranks of one X/Y block.
TEST(ModelFamily, ExpertsShardOverXAndYLikeTheDenseMlp) {
  const ModelConfig c = named_model("mixtral-tiny");
  const ParamTable t = build_param_table(c);
  const int64_t C = c.n_embd, F = c.ffn, n = c.n_experts, El = n / 2;
  GridShape g{2, 2, 1, 2};
  g.set_e(2);
  std::vector<std::vector<int>> held(t.specs.size());
  for (size_t i = 0; i < t.specs.size(); ++i) held[i].assign(size_t(t.specs[i].numel), 0);
  for (int d = 0; d < 2; ++d)
    for (int y = 0; y < 2; ++y)
      for (int x = 0; x < 2; ++x) {
        const ShardPlan plan = ShardPlan::build(c, t, g, GridCoord{x, y, 0, d});
        for (size_t i = 0; i < t.specs.size(); ++i) {
          const parallel::TensorShard& s = plan.tensors[i];
          const TensorRole r = s.spec->role;
          if (r != TensorRole::Router && r != TensorRole::ExpertGateUp &&
              r != TensorRole::ExpertDown)
            continue;
          EXPECT_TRUE(s.z_sharded) << s.spec->name;
          const int64_t K = s.spec->shape[1];
          if (r == TensorRole::Router) {
            EXPECT_EQ(s.layout, ShardLayout::ColsX);
            EXPECT_EQ(int64_t(s.rows.size()), n);
            EXPECT_EQ(s.col0, C / 2 * x);
          } else if (r == TensorRole::ExpertGateUp) {  // experts [El d, El (d + 1)), El = n / E
            EXPECT_EQ(s.layout, ShardLayout::Normal);
            ASSERT_EQ(int64_t(s.rows.size()), El * 2 * F / 2);
            EXPECT_EQ(s.rows[0], El * d * 2 * F + y * F / 2);                  // its first gate row
            EXPECT_EQ(s.rows[size_t(F / 2)], El * d * 2 * F + F + y * F / 2);  // its first up row
            EXPECT_EQ(s.col0, C / 2 * x);
          } else {
            EXPECT_EQ(s.layout, ShardLayout::Transposed);
            ASSERT_EQ(int64_t(s.rows.size()), El * C / 2);
            EXPECT_EQ(s.rows[0], El * d * C + x * C / 2);
            EXPECT_EQ(s.col0, F / 2 * y);
          }
          if (r == TensorRole::Router && d > 0) continue;  // the router: on every replica
          for (int64_t row : s.rows)
            for (int64_t j = s.col0; j < s.col0 + s.cols; ++j) ++held[i][size_t(row * K + j)];
        }
      }
  for (size_t i = 0; i < t.specs.size(); ++i) {
    const TensorRole r = t.specs[i].role;
    if (r != TensorRole::Router && r != TensorRole::ExpertGateUp && r != TensorRole::ExpertDown)
      continue;
    const int want = r == TensorRole::Router ? 2 : 1;  // the router: on both Y ranks
    for (size_t j = 0; j < held[i].size(); ++j)
      ASSERT_EQ(held[i][j], want) << t.specs[i].name << " element " << j;
  }
}

TEST(ModelFamily, ConfigJsonRoundTripsEveryFamily) {
  for (const char* name : {"tiny", "llama-tiny", "qwen2-tiny", "qwen3-tiny", "mixtral-tiny",
                           "qwen2-moe-tiny", "qwen3-moe-tiny"}) {
    const ModelConfig c = named_model(name);
    const nlohmann::json j = hf_config_json(c);
    EXPECT_EQ(j["model_type"], c.desc().hf_model_type);
    EXPECT_EQ(j["architectures"], nlohmann::json::array({c.desc().hf_architecture}));
    const ModelConfig back = parse_hf_config(j, "config.json");
    EXPECT_EQ(back.family, c.family);
    EXPECT_EQ(build_param_table(back).total, build_param_table(c).total);
  }
  nlohmann::json j = hf_config_json(named_model("tiny"));
  j["model_type"] = "deepseek_v3";
  const std::string e = error_of([&] { parse_hf_config(j, "config.json"); });
  EXPECT_NE(e.find("model_type 'deepseek_v3' is not supported; expected \"gpt2\", \"llama\", "
                   "\"qwen2\", \"qwen3\", \"mixtral\", \"qwen2_moe\" or \"qwen3_moe\""),
            std::string::npos) << e;
}

// Qwen2's config.json as transformers writes it: tied or untied, rope theta in either layout,
// and its sliding-window fields, accepted where they leave every layer full attention (as
// published Qwen2.5 folders have them) and refused by name where a window would cut attention.
TEST(ModelFamily, Qwen2ConfigReadsRopeTiesAndRefusesASlidingWindowThatWouldCut) {
  ModelConfig c = named_model("qwen2-tiny");
  c.tie_embeddings = false;
  c.rope_theta = 500000.0f;
  nlohmann::json j = hf_config_json(c);
  EXPECT_EQ(j["use_sliding_window"], false);
  EXPECT_TRUE(j["sliding_window"].is_null());
  EXPECT_FALSE(j.contains("attention_bias"));
  ModelConfig back = parse_hf_config(j, "config.json");
  EXPECT_EQ(back.family, Family::Qwen2);
  EXPECT_FALSE(back.tie_embeddings);
  EXPECT_EQ(back.rope_theta, 500000.0f);
  EXPECT_EQ(back.n_kv_head, c.n_kv_head);
  // transformers 4.x's layout: rope_theta at the top, a window given but switched off.
  j.erase("rope_parameters");
  j.erase("layer_types");
  j["rope_theta"] = 1000000.0;
  j["sliding_window"] = 16;
  j["max_window_layers"] = 0;
  j["tie_word_embeddings"] = true;
  back = parse_hf_config(j, "config.json");
  EXPECT_EQ(back.rope_theta, 1000000.0f);
  EXPECT_TRUE(back.tie_embeddings);
  auto refused = [&](const nlohmann::json& bad, const std::string& want) {
    const std::string e = error_of([&] { parse_hf_config(bad, "config.json"); });
    EXPECT_NE(e.find(want), std::string::npos) << e;
  };
  // Switched on: layers from max_window_layers on use a 16-position window of 64 positions.
  nlohmann::json w = j;
  w["use_sliding_window"] = true;
  w["max_window_layers"] = 1;
  refused(w, "config.json: layer 1 attends through a sliding window of 16 positions "
             "('sliding_window', with 'use_sliding_window = true and max_window_layers = 1')");
  refused(w, "the same only for a window of at least max_position_embeddings = 64");
  // ... unless no layer reaches max_window_layers, or the window covers every position.
  w["max_window_layers"] = c.n_layer;
  EXPECT_NO_THROW(parse_hf_config(w, "config.json"));
  w["max_window_layers"] = 0;
  w["sliding_window"] = c.max_seq;
  EXPECT_NO_THROW(parse_hf_config(w, "config.json"));
  // transformers 5's per-layer list.
  nlohmann::json lt = j;
  lt["layer_types"] = {"full_attention", "sliding_attention"};
  lt["use_sliding_window"] = true;
  refused(lt, "layer 1 attends through a sliding window of 16 positions ('sliding_window', with "
              "'layer_types')");
  lt["use_sliding_window"] = false;
  refused(lt, "layer 1 is a sliding-window layer ('layer_types') but no window is set "
              "(use_sliding_window = false, sliding_window = 16)");
  lt["layer_types"] = {"full_attention", "chunked_attention"};
  refused(lt, "'layer_types' holds \"chunked_attention\", which is not supported (expected "
              "\"full_attention\", \"sliding_attention\")");
  lt["layer_types"] = {"full_attention"};
  refused(lt, "'layer_types' has 1 entries for 2 layers");
  // Rope scaling tetrad does not implement, and a head width other than hidden / heads.
  nlohmann::json r = j;
  r["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  refused(r, "'rope_scaling' has rope type \"yarn\"");
  r = j;
  r["head_dim"] = 32;
  refused(r, "head_dim = 32 is not supported; tetrad's Qwen2 uses hidden_size / "
             "num_attention_heads = 16");
  r = j;
  r["hidden_act"] = "gelu";
  refused(r, "hidden_act 'gelu' is not supported; tetrad's Qwen2 uses \"silu\"");
}

TEST(ModelFamily, GemmSitesByEnumNamesForIo) {
  using parallel::GemmSite;
  for (GemmSite s : {GemmSite::Qkv, GemmSite::Proj, GemmSite::Fc, GemmSite::FcProj, GemmSite::Head})
    EXPECT_EQ(parallel::gemm_site_index(parallel::gemm_site_name(s)), int(s));
  EXPECT_STREQ(parallel::gemm_site_name(GemmSite::FcProj), "fcproj");
  EXPECT_EQ(parallel::gemm_site_index("mlp"), -1);
}

// What the fused GEMMs read: on every grid, a group's shards are one run of the local buffer
// and of the layer's gathered block (k right after q, v after k, up after gate).
TEST(ModelFamily, FusedGroupsStayAdjacentInEveryShardPlan) {
  for (const char* name : {"llama-tiny", "qwen2-tiny"}) {
  const ModelConfig c = named_model(name);
  const ParamTable t = build_param_table(c);
  int expected_groups = 0;  // per layer
  for (std::span<const TensorRole> group : kFusedGroups)
    for (const TensorEntry& e : c.desc().layer) expected_groups += e.role == group[0];
  for (const GridShape g : {GridShape{1, 1, 1, 1}, GridShape{2, 1, 1, 1}, GridShape{1, 2, 1, 1},
                            GridShape{1, 1, 2, 1}, GridShape{2, 2, 2, 1}})
    for (int y = 0; y < g.y(); ++y)
      for (int z = 0; z < g.z(); ++z) {
        const ShardPlan plan = ShardPlan::build(c, t, g, GridCoord{0, y, z, 0});
        int groups = 0;
        for (size_t i = 0; i < t.specs.size(); ++i)
          for (std::span<const TensorRole> group : kFusedGroups) {
            if (t.specs[i].role != group[0]) continue;
            ++groups;
            for (size_t k = 1; k < group.size(); ++k) {
              const parallel::TensorShard &a = plan.tensors[i + k - 1], &b = plan.tensors[i + k];
              EXPECT_EQ(b.offset, a.offset + a.shard_numel) << b.spec->name;
              // The gathered block: a Z-sharded tensor's all-gathered size, a vector's own.
              EXPECT_EQ(b.block_offset,
                        a.block_offset + (a.z_sharded ? a.shard_numel * g.z() : a.block_numel))
                  << b.spec->name;
            }
          }
        EXPECT_EQ(groups, expected_groups * c.n_layer) << name;
      }
  }
}
