// Qwen2-MoE and Qwen3-MoE Hugging Face folders (model/family.cpp, checkpoint/hf_config.cpp): the
// experts written one tensor per expert under the Hub's names (mlp.experts.N.gate_proj ...), the
// Qwen2-MoE shared expert and its gate, transformers 5's fused tensors read as well; config.json
// both ways (num_experts or num_local_experts, moe_intermediate_size, norm_topk_prob,
// shared_expert_intermediate_size); settings tetrad does not implement and bad tensors refused
// by name. The logits against transformers are scripts/check-hf-moe-parity.sh's (HfParityMoe).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "expect_error.hpp"
#include "support/hf_folder.hpp"
#include "support/random_model.hpp"
#include "support/test_files.hpp"
#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/hf_config.hpp"
#include "tetrad/checkpoint/safetensors.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"

using namespace tetrad;
using nlohmann::json;
using tetrad_test::expect_error;

namespace {

std::string test_dir() { return tetrad_test::test_dir("test_hf_qwen_moe"); }

using Model = tetrad_test::RandomModel;
using tetrad_test::drop_tensor;
using tetrad_test::random_model;
using tetrad_test::read_json;
using tetrad_test::reshape_tensor;
using tetrad_test::rewrite_tensors;
using tetrad_test::same_bits;

// Every expert's gate, up and down under the Hub's names, each a slice of the stacked tensors.
void expect_per_expert(const Model& m, const std::string& dir) {
  const ModelConfig& c = m.cfg;
  SafetensorsReader r(dir + "/model.safetensors");
  const int64_t F = c.ffn, C = c.n_embd, E = c.n_experts;
  EXPECT_EQ(r.find("model.layers.0.mlp.experts.gate_up_proj"), nullptr);
  const ParamSpec& gu = m.table.find("model.layers.1.mlp.experts.gate_up_proj");
  const ParamSpec& dn = m.table.find("model.layers.1.mlp.experts.down_proj");
  EXPECT_EQ(r.at("model.layers.1.mlp.gate.weight").shape, (std::vector<int64_t>{E, C}));
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
    EXPECT_EQ(r.at(p + "gate_proj.weight").shape, (std::vector<int64_t>{F, C}));
    EXPECT_EQ(r.at(p + "up_proj.weight").shape, (std::vector<int64_t>{F, C}));
    EXPECT_EQ(r.at(p + "down_proj.weight").shape, (std::vector<int64_t>{C, F}));
    EXPECT_EQ(r.read_float(p + "gate_proj.weight")[3], m.params[size_t(gu.offset + e * 2 * F * C + 3)]);
    EXPECT_EQ(r.read_float(p + "up_proj.weight")[3], m.params[size_t(gu.offset + e * 2 * F * C + F * C + 3)]);
    EXPECT_EQ(r.read_float(p + "down_proj.weight")[5], m.params[size_t(dn.offset + e * C * F + 5)]);
  }
}

}  // namespace

TEST(HfQwenMoe, Qwen3MoeRoundTripIsBitIdentical) {
  const std::string dir = test_dir() + "/qwen3_moe";
  Model m = random_model(named_model("qwen3-moe-tiny"), 7);
  const ModelConfig& c = m.cfg;
  save_hf(dir, c, m.table, m.params.data());
  const json cj = read_json(dir + "/config.json");
  EXPECT_EQ(cj["model_type"], "qwen3_moe");
  EXPECT_EQ(cj["architectures"][0], "Qwen3MoeForCausalLM");
  EXPECT_EQ(cj["num_experts"], 8);
  EXPECT_EQ(cj["moe_intermediate_size"], 48);
  EXPECT_EQ(cj["num_experts_per_tok"], 2);
  EXPECT_EQ(cj["norm_topk_prob"], false);
  EXPECT_EQ(cj["head_dim"], 24);
  EXPECT_EQ(cj["decoder_sparse_step"], 1);
  EXPECT_EQ(cj["mlp_only_layers"], json::array());
  EXPECT_FALSE(cj.contains("shared_expert_intermediate_size"));
  expect_per_expert(m, dir);
  SafetensorsReader r(dir + "/model.safetensors");
  EXPECT_EQ(r.at("model.layers.0.self_attn.q_norm.weight").shape, (std::vector<int64_t>{24}));
  // embed, norm, head; per layer 2 norms, q, k, v, o, q/k norms, router and 3 per expert.
  EXPECT_EQ(int64_t(r.tensors().size()), 3 + int64_t(c.n_layer) * (9 + 3 * c.n_experts));
  std::vector<float> back(m.params.size(), -1.0f);
  load_hf_params(dir, c, m.table, back.data());
  EXPECT_TRUE(same_bits(back, m.params));
  const ModelConfig rc = read_hf_config(dir);
  EXPECT_EQ(rc.family, Family::Qwen3Moe);
  EXPECT_EQ(rc.head_dim(), 24);
  EXPECT_FALSE(rc.norm_topk_prob);
  EXPECT_EQ(rc.n_experts, 8);
  EXPECT_EQ(rc.ffn, 48);
  EXPECT_EQ(rc.shared_expert_ffn, 0);
}

TEST(HfQwenMoe, Qwen2MoeWithItsSharedExpertRoundTrips) {
  const std::string dir = test_dir() + "/qwen2_moe";
  Model m = random_model(named_model("qwen2-moe-tiny"), 8);
  const ModelConfig& c = m.cfg;
  save_hf(dir, c, m.table, m.params.data());
  const json cj = read_json(dir + "/config.json");
  EXPECT_EQ(cj["model_type"], "qwen2_moe");
  EXPECT_EQ(cj["architectures"][0], "Qwen2MoeForCausalLM");
  EXPECT_EQ(cj["shared_expert_intermediate_size"], 96);
  EXPECT_EQ(cj["qkv_bias"], true);
  EXPECT_EQ(cj["num_experts"], 4);
  expect_per_expert(m, dir);
  SafetensorsReader r(dir + "/model.safetensors");
  const int64_t C = c.n_embd;
  EXPECT_EQ(r.at("model.layers.0.mlp.shared_expert.gate_proj.weight").shape, (std::vector<int64_t>{96, C}));
  EXPECT_EQ(r.at("model.layers.0.mlp.shared_expert.up_proj.weight").shape, (std::vector<int64_t>{96, C}));
  EXPECT_EQ(r.at("model.layers.0.mlp.shared_expert.down_proj.weight").shape, (std::vector<int64_t>{C, 96}));
  EXPECT_EQ(r.at("model.layers.0.mlp.shared_expert_gate.weight").shape, (std::vector<int64_t>{1, C}));
  EXPECT_EQ(r.at("model.layers.0.self_attn.k_proj.bias").shape, (std::vector<int64_t>{2 * 16}));
  std::vector<float> back(m.params.size(), -1.0f);
  load_hf_params(dir, c, m.table, back.data());
  EXPECT_TRUE(same_bits(back, m.params));
  const ModelConfig rc = read_hf_config(dir);
  EXPECT_EQ(rc.family, Family::Qwen2Moe);
  EXPECT_EQ(rc.shared_expert_ffn, 96);
  EXPECT_FALSE(rc.norm_topk_prob);
}

// transformers 5's fused layout (save_original_format=False): mlp.experts.gate_up_proj
// [E, 2F, C] and down_proj [E, C, F], the table's own names.
TEST(HfQwenMoe, FusedExpertsLoad) {
  Model m = random_model(named_model("qwen3-moe-tiny"), 9);
  const ModelConfig& c = m.cfg;
  const int64_t F = c.ffn, C = c.n_embd, E = c.n_experts;
  const std::string dir = test_dir() + "/fused";
  save_hf(dir, c, m.table, m.params.data());
  std::vector<tetrad_test::AddedTensor> whole;  // each layer's experts in two tensors
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string L = "model.layers." + std::to_string(l) + ".mlp.experts.";
    const ParamSpec& gu = m.table.find(L + "gate_up_proj");
    const ParamSpec& dn = m.table.find(L + "down_proj");
    whole.push_back({gu.name, {E, 2 * F, C}, m.params.data() + gu.offset});
    whole.push_back({dn.name, {E, C, F}, m.params.data() + dn.offset});
  }
  rewrite_tensors(
      dir, [](std::string& name, auto&, auto&) { return name.find(".mlp.experts.") == std::string::npos; },
      whole);
  std::vector<float> back(m.params.size(), -1.0f);
  load_hf_params(dir, c, m.table, back.data());
  EXPECT_TRUE(same_bits(back, m.params));
}

// Missing or mis-shaped expert and shared-expert tensors: refused naming the tensor.
TEST(HfQwenMoe, BadTensorsRefusedByName) {
  Model m = random_model(named_model("qwen2-moe-tiny"), 10);
  const ModelConfig& c = m.cfg;
  const std::string base = test_dir();
  const std::string sizes = "(config.json: 4 experts of width 48, hidden size 64)";
  // Each folder: (its name, the tensor dropped or the shape it gets, what the error names).
  auto refused = [&](const std::string& name, const std::string& tensor, std::vector<int64_t> shape,
                     std::initializer_list<std::string> parts) {
    SCOPED_TRACE(name);
    const std::string dir = base + "/" + name;
    save_hf(dir, c, m.table, m.params.data());
    if (shape.empty())
      drop_tensor(dir, tensor);
    else
      reshape_tensor(dir, tensor, shape);
    expect_error([&] { load_hf_params(dir, c, m.table, m.params.data()); }, parts);
  };
  refused("missing_expert", "model.layers.1.mlp.experts.2.up_proj.weight", {},
          {base + "/missing_expert", "'model.layers.1.mlp.experts.2.up_proj.weight'", sizes});
  refused("shape_expert", "model.layers.0.mlp.experts.3.down_proj.weight", {64, 40},
          {"'model.layers.0.mlp.experts.3.down_proj.weight'", "[64, 40]", "[64, 48]", sizes});
  refused("missing_shared_gate", "model.layers.0.mlp.shared_expert_gate.weight", {},
          {base + "/missing_shared_gate", "'model.layers.0.mlp.shared_expert_gate.weight'"});
  refused("shape_shared", "model.layers.1.mlp.shared_expert.down_proj.weight", {64, 80},
          {"'model.layers.1.mlp.shared_expert.down_proj.weight'", "[64, 80]", "[64, 96]"});
}

// config.json: the settings tetrad does not implement refused naming the field.
TEST(HfQwenMoe, ConfigSettingsRefusedByName) {
  auto refused = [&](json bad, std::initializer_list<std::string> parts) {
    expect_error([&] { parse_hf_config(bad, "config.json"); }, parts);
  };
  for (const char* name : {"qwen2-moe-tiny", "qwen3-moe-tiny"}) {
    SCOPED_TRACE(name);
    const json j = hf_config_json(named_model(name));
    json x = j;
    x["decoder_sparse_step"] = 2;
    refused(x, {"decoder_sparse_step = 2", "every layer", "expected 1"});
    x = j;
    x["mlp_only_layers"] = {1};
    refused(x, {"mlp_only_layers = [1]", "expected []"});
    x = j;
    x["num_experts_per_tok"] = 9;
    refused(x, {"num_experts_per_tok = 9", "larger than"});
    x = j;
    x["num_local_experts"] = 6;
    refused(x, {"num_local_experts = 6", "disagrees with num_experts"});
    x = j;
    x["use_sliding_window"] = true;
    x["sliding_window"] = 16;
    x["layer_types"] = {"sliding_attention", "sliding_attention"};
    refused(x, {"sliding window of 16"});
    x = j;
    x["router_jitter_noise"] = 0.1;
    refused(x, {"router_jitter_noise = 0.1"});
    x = j;
    x.erase("moe_intermediate_size");
    refused(x, {"missing field 'moe_intermediate_size'"});
  }
  json q2 = hf_config_json(named_model("qwen2-moe-tiny"));
  q2["qkv_bias"] = false;
  refused(q2, {"qkv_bias = false"});
  json q3 = hf_config_json(named_model("qwen3-moe-tiny"));
  q3["attention_bias"] = true;
  refused(q3, {"'attention_bias' = true"});
  q3 = hf_config_json(named_model("qwen3-moe-tiny"));
  q3["shared_expert_intermediate_size"] = 64;  // not Qwen3-MoE's
  refused(q3, {"'shared_expert_intermediate_size' = 64"});
  // transformers 5 writes num_local_experts only; without head_dim the heads are
  // hidden_size / num_attention_heads wide (Qwen3MoeConfig has no default of its own).
  q3 = hf_config_json(named_model("qwen3-moe-tiny"));
  q3["num_local_experts"] = q3["num_experts"];
  q3.erase("num_experts");
  q3.erase("head_dim");
  q3.erase("norm_topk_prob");
  const ModelConfig r = parse_hf_config(q3, "config.json");
  EXPECT_EQ(r.n_experts, 8);
  EXPECT_EQ(r.head_dim(), 16);
  EXPECT_FALSE(r.norm_topk_prob);
}

// export refuses what the family's Hugging Face model would not reproduce: a shared expert on
// Qwen3-MoE, none on Qwen2-MoE, the expert bias on either.
TEST(HfQwenMoe, ExportRefusesPartsTheFamilyLacks) {
  ModelConfig q3 = named_model("qwen3-moe-tiny");
  q3.shared_expert_ffn = 32;
  expect_error([&] { require_hf_exportable(q3); },
               {"model.shared_expert_ffn = 32", "Qwen3-MoE has no shared expert"});
  ModelConfig q2 = named_model("qwen2-moe-tiny");
  q2.shared_expert_ffn = 0;
  expect_error([&] { require_hf_exportable(q2); },
               {"model.shared_expert_ffn = 0", "Qwen2-MoE has a shared expert"});
  q2 = named_model("qwen2-moe-tiny");
  q2.moe_balance = "expert_bias";
  expect_error([&] { require_hf_exportable(q2); }, {"model.moe_balance = \"expert_bias\""});
  require_hf_exportable(named_model("qwen2-moe-tiny"));
  require_hf_exportable(named_model("qwen3-moe-tiny"));
}
