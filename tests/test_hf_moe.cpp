// Mixture-of-experts Hugging Face folders (checkpoint/hf_tensors.hpp): the experts written one
// tensor per expert as the Hub names them, read back per expert, fused as transformers 5 holds
// them, or in tetrad's stacked layout; config.json's router and window settings; bad folders
// refused naming the tensor or field. The logits against transformers are
// scripts/check-hf-moe-parity.sh's (CTest HfParityMoe).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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

namespace fs = std::filesystem;
using namespace tetrad;
using nlohmann::json;
using tetrad_test::expect_error;

namespace {

std::string test_dir() { return tetrad_test::test_dir("test_hf_moe"); }

using Model = tetrad_test::RandomModel;
using tetrad_test::random_model;
using tetrad_test::same_bits;

using tetrad_test::drop_tensor;
using tetrad_test::read_json;
using tetrad_test::reshape_tensor;
using tetrad_test::rewrite_tensors;
using tetrad_test::write_json;

}  // namespace

// export writes the Hub's per-expert tensors (what MixtralForCausalLM.from_pretrained reads), and
// they load back bit for bit.
TEST(HfMoe, MixtralPerExpertRoundTripIsBitIdentical) {
  const std::string dir = test_dir() + "/mixtral";
  Model m = random_model(named_model("mixtral-tiny"), 7);
  const ModelConfig& c = m.cfg;
  save_hf(dir, c, m.table, m.params.data());
  const json cj = read_json(dir + "/config.json");
  EXPECT_EQ(cj["model_type"], "mixtral");
  EXPECT_EQ(cj["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(cj["num_local_experts"], c.n_experts);
  EXPECT_EQ(cj["num_experts_per_tok"], c.experts_per_token);
  EXPECT_EQ(cj["router_jitter_noise"], 0.0);
  EXPECT_TRUE(cj["sliding_window"].is_null());

  SafetensorsReader r(dir + "/model.safetensors");
  const int64_t F = c.ffn, C = c.n_embd, E = c.n_experts;
  EXPECT_EQ(r.find("model.layers.0.block_sparse_moe.experts.w1_w3"), nullptr);
  EXPECT_EQ(int64_t(r.tensors().size()),
            3 + int64_t(c.n_layer) * (7 + 3 * E));  // embed, norm, head; 7 + 3 per expert a layer
  const ParamSpec& gu = m.table.find("model.layers.1.block_sparse_moe.experts.w1_w3");
  const ParamSpec& dn = m.table.find("model.layers.1.block_sparse_moe.experts.w2");
  const ParamSpec& gate = m.table.find("model.layers.1.block_sparse_moe.gate.weight");
  EXPECT_EQ(r.at(gate.name).shape, (std::vector<int64_t>{E, C}));
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "model.layers.1.block_sparse_moe.experts." + std::to_string(e) + ".";
    EXPECT_EQ(r.at(p + "w1.weight").shape, (std::vector<int64_t>{F, C}));
    EXPECT_EQ(r.at(p + "w3.weight").shape, (std::vector<int64_t>{F, C}));
    EXPECT_EQ(r.at(p + "w2.weight").shape, (std::vector<int64_t>{C, F}));
    // Expert e's gate rows, then its up rows, of the stacked [E·2F, C]; its [C, F] of [E·C, F].
    EXPECT_EQ(r.read_float(p + "w1.weight")[3], m.params[size_t(gu.offset + e * 2 * F * C + 3)]);
    EXPECT_EQ(r.read_float(p + "w3.weight")[3], m.params[size_t(gu.offset + e * 2 * F * C + F * C + 3)]);
    EXPECT_EQ(r.read_float(p + "w2.weight")[5], m.params[size_t(dn.offset + e * C * F + 5)]);
  }
  std::vector<float> back(m.params.size(), -1.0f);
  load_hf_params(dir, c, m.table, back.data());
  EXPECT_TRUE(same_bits(back, m.params));
  // The streamed loader (fine-tuning on a grid) gives the same tensors.
  std::vector<float> streamed(m.params.size(), -1.0f);
  load_hf_params_streamed(dir, c, m.table, [&](size_t i, const float* d) {
    std::memcpy(streamed.data() + m.table.specs[i].offset, d, size_t(m.table.specs[i].numel) * 4);
  });
  EXPECT_TRUE(same_bits(streamed, m.params));
}

// The streamed writer (run checkpoints of a parallel run) writes the same bytes, fetching each
// parameter once, in table order.
TEST(HfMoe, StreamedWriterWritesTheSameBytes) {
  const std::string dir = test_dir();
  Model m = random_model(named_model("mixtral-tiny"), 8);
  fs::create_directories(dir + "/a");
  fs::create_directories(dir + "/b");
  write_hf_files(dir + "/a", m.cfg, m.table, m.params.data());
  std::vector<size_t> order;
  write_hf_files_streamed(dir + "/b", m.cfg, m.table, [&](size_t i, float* out) {
    order.push_back(i);
    std::memcpy(out, m.params.data() + m.table.specs[i].offset, size_t(m.table.specs[i].numel) * 4);
  });
  std::vector<size_t> expected(m.table.specs.size());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
  auto bytes = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  EXPECT_EQ(bytes(dir + "/a/model.safetensors"), bytes(dir + "/b/model.safetensors"));
}

// transformers 5's fused layout (save_pretrained(save_original_format=False)): mlp.gate.weight,
// mlp.experts.gate_up_proj [E, 2F, C], mlp.experts.down_proj [E, C, F]; and tetrad's stacked
// tensors under the table's names (run checkpoints written before the experts were split).
TEST(HfMoe, FusedAndStackedLayoutsLoad) {
  Model m = random_model(named_model("mixtral-tiny"), 9);
  const ModelConfig& c = m.cfg;
  const int64_t F = c.ffn, C = c.n_embd, E = c.n_experts;
  for (const char* layout : {"fused", "stacked"}) {
    SCOPED_TRACE(layout);
    const std::string dir = test_dir() + "/" + layout;
    save_hf(dir, c, m.table, m.params.data());
    const bool fused = std::string(layout) == "fused";
    std::vector<tetrad_test::AddedTensor> whole;  // each layer's experts in two tensors
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string L = "model.layers." + std::to_string(l) + ".";
      const ParamSpec& gu = m.table.find(L + "block_sparse_moe.experts.w1_w3");
      const ParamSpec& dn = m.table.find(L + "block_sparse_moe.experts.w2");
      if (fused) {
        whole.push_back({L + "mlp.experts.gate_up_proj", {E, 2 * F, C}, m.params.data() + gu.offset});
        whole.push_back({L + "mlp.experts.down_proj", {E, C, F}, m.params.data() + dn.offset});
      } else {
        whole.push_back({gu.name, gu.shape, m.params.data() + gu.offset});
        whole.push_back({dn.name, dn.shape, m.params.data() + dn.offset});
      }
    }
    rewrite_tensors(
        dir,
        [&](std::string& name, auto&, auto&) {
          if (name.find(".block_sparse_moe.experts.") != std::string::npos) return false;  // in whole
          if (fused && name.ends_with("block_sparse_moe.gate.weight"))
            name.replace(name.find("block_sparse_moe"), 16, "mlp");
          return true;
        },
        whole);
    std::vector<float> back(m.params.size(), -1.0f);
    load_hf_params(dir, c, m.table, back.data());
    EXPECT_TRUE(same_bits(back, m.params));
  }
}

// A folder whose expert tensors are missing, mis-shaped or more than config.json's experts:
// refused naming the tensor and config.json's expert sizes.
TEST(HfMoe, BadExpertTensorsRefusedByName) {
  Model m = random_model(named_model("mixtral-tiny"), 10);
  const ModelConfig& c = m.cfg;
  const std::string base = test_dir();
  const std::string sizes = "(config.json: 4 experts of width 96, hidden size 64)";
  {
    const std::string dir = base + "/missing";
    save_hf(dir, c, m.table, m.params.data());
    drop_tensor(dir, "model.layers.1.block_sparse_moe.experts.3.w3.weight");
    expect_error([&] { load_hf_params(dir, c, m.table, m.params.data()); },
                 {dir, "1 tensor(s) of this model are missing",
                  "'model.layers.1.block_sparse_moe.experts.3.w3.weight'", sizes});
  }
  {
    const std::string dir = base + "/shape";
    save_hf(dir, c, m.table, m.params.data());
    reshape_tensor(dir, "model.layers.0.block_sparse_moe.experts.2.w2.weight", {64, 48});
    expect_error([&] { load_hf_params(dir, c, m.table, m.params.data()); },
                 {"'model.layers.0.block_sparse_moe.experts.2.w2.weight'", "[64, 48]", "[64, 96]",
                  sizes});
  }
  {
    // A folder of 6 experts read with a config of 4 (its config.json edited): the 5th is extra.
    ModelConfig six = c;
    six.n_experts = 6;
    Model s = random_model(six, 11);
    const std::string dir = base + "/more";
    save_hf(dir, six, s.table, s.params.data());
    json cj = read_json(dir + "/config.json");
    cj["num_local_experts"] = 4;
    write_json(dir + "/config.json", cj);
    // The router [6, C] against [4, C] first.
    expect_error([&] { load_hf_params(dir, c, m.table, m.params.data()); },
                 {"'model.layers.0.block_sparse_moe.gate.weight'", "[6, 64]", "[4, 64]", sizes});
  }
  {
    const std::string dir = base + "/fused_shape";
    save_hf(dir, c, m.table, m.params.data());
    rewrite_tensors(dir, [](std::string& n, std::vector<int64_t>& shape, std::vector<float>& d) {
      if (n.find(".experts.") == std::string::npos) return true;
      // Only layer 0's gate|up, fused with the experts' halves in the wrong order of dimensions.
      if (n == "model.layers.0.block_sparse_moe.experts.0.w1.weight") {
        n = "model.layers.0.mlp.experts.gate_up_proj";
        shape = {96, 2, 64};  // [F, 2, C]: not [E, 2F, C]
        d.resize(96 * 2 * 64);
        return true;
      }
      return !n.starts_with("model.layers.0.") || n.find(".w2.") != std::string::npos;
    });
    expect_error([&] { load_hf_params(dir, c, m.table, m.params.data()); },
                 {"'model.layers.0.mlp.experts.gate_up_proj'", "[96, 2, 64]", "[4, 192, 64]"});
  }
}

// config.json: the router's settings read and refused by name; sliding windows refused only
// where they would change the result; transformers' defaults (rope theta 1e6).
TEST(HfMoe, MixtralConfigFields) {
  const ModelConfig c = named_model("mixtral-tiny");
  const json j = hf_config_json(c);
  EXPECT_EQ(parse_hf_config(j, "config.json").rope_theta, 1e6f);
  auto refused = [&](json bad, std::initializer_list<std::string> parts) {
    expect_error([&] { parse_hf_config(bad, "config.json"); }, parts);
  };
  json x = j;
  x["num_experts_per_tok"] = 5;
  refused(x, {"config.json", "num_experts_per_tok = 5", "4 experts"});
  x = j;
  x["router_jitter_noise"] = 0.01;
  refused(x, {"router_jitter_noise = 0.01"});
  x = j;
  x["scoring_func"] = "sigmoid";
  refused(x, {"'scoring_func' = \"sigmoid\"", "softmax"});
  x = j;
  x["n_shared_experts"] = 2;
  refused(x, {"'n_shared_experts' = 2"});
  x = j;
  x["num_experts"] = 8;
  refused(x, {"num_experts = 8", "num_local_experts = 4"});
  x = j;
  x["sliding_window"] = 32;
  refused(x, {"'sliding_window' = 32", "max_position_embeddings = 64"});
  x = j;
  x["attention_bias"] = true;
  refused(x, {"'attention_bias' = true"});
  // A window covering every position changes nothing; neutral values of other routers' fields
  // are accepted; no rope field: Mixtral's theta 1e6.
  x = j;
  x["sliding_window"] = 64;
  x["scoring_func"] = "softmax";
  x["output_router_logits"] = true;
  for (const char* k : {"rope_theta", "rope_parameters", "rope_scaling"}) x.erase(k);
  const ModelConfig r = parse_hf_config(x, "config.json");
  EXPECT_EQ(r.rope_theta, 1e6f);
  EXPECT_TRUE(r.norm_topk_prob);
  EXPECT_EQ(r.n_experts, 4);
}
