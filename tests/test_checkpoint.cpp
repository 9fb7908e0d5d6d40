// Checkpoint formats: safetensors, Hugging Face folders, trainer state, run checkpoints.
// Every test writes under build/test_checkpoint/<test name>/ and checks what it reads back
// against what it wrote, bit for bit where the format is lossless.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "expect_error.hpp"
#include "support/random_model.hpp"
#include "support/test_files.hpp"
#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/checkpoint/safetensors.hpp"
#include "tetrad/checkpoint/trainer_state.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"

// Peak single allocation, counted while g_track_alloc is set (for the streamed checkpoint tests:
// no buffer larger than the largest tensor).
static std::atomic<bool> g_track_alloc{false};
static std::atomic<size_t> g_largest_alloc{0};
void* operator new(size_t n) {
  if (g_track_alloc.load(std::memory_order_relaxed)) {
    size_t cur = g_largest_alloc.load(std::memory_order_relaxed);
    while (n > cur && !g_largest_alloc.compare_exchange_weak(cur, n)) {
    }
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
// (operator delete is not replaced: libstdc++'s frees with std::free, which matches.)

namespace fs = std::filesystem;
using namespace tetrad;
using nlohmann::json;

namespace {

std::string test_dir() { return tetrad_test::test_dir("test_checkpoint"); }
using tetrad_test::random_floats;

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

void flip_byte(const std::string& path, size_t from_end) {
  std::string b = read_bytes(path);
  ASSERT_GT(b.size(), from_end);
  b[b.size() - 1 - from_end] ^= 0x5A;
  write_bytes(path, b);
}

// A safetensors file from a header text and a data section, for malformed-file tests.
void write_raw_safetensors(const std::string& path, const std::string& header, size_t data_bytes) {
  std::string b(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  b += header;
  b.append(data_bytes, '\0');
  write_bytes(path, b);
}

using tetrad_test::expect_error;

using tetrad_test::same_bits;

}  // namespace

// ------------------------------------------------------------------------------------------
// safetensors

TEST(Safetensors, F32RoundTripIsExact) {
  const std::string path = test_dir() + "/t.safetensors";
  const auto a = random_floats(15, 1), b = random_floats(7, 2);
  const float scalar = 3.25f;
  SafetensorsWriter w;
  w.add("a", {3, 5}, a.data());
  w.add("b", {7}, b.data());
  w.add("scalar", {}, &scalar);
  w.add("empty", {0, 4}, nullptr);
  w.set_metadata("format", "pt");
  w.set_metadata("note", "hello");
  w.write(path);

  // Header length plus 8 is a multiple of 8; no temporary file is left behind.
  const std::string bytes = read_bytes(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + (15 + 7 + 1) * 4);
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    EXPECT_EQ(e.path().filename(), "t.safetensors");

  SafetensorsReader r(path);
  EXPECT_EQ(r.tensors().size(), 4u);
  EXPECT_EQ(r.metadata().at("note"), "hello");
  EXPECT_EQ(r.at("a").shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(r.at("a").dtype, "F32");
  EXPECT_TRUE(same_bits(r.read_float("a"), a));
  EXPECT_TRUE(same_bits(r.read_float("b"), b));
  EXPECT_EQ(r.read_float("scalar"), std::vector<float>{3.25f});
  EXPECT_EQ(r.at("empty").numel, 0);
  EXPECT_EQ(r.find("nope"), nullptr);
  expect_error([&] { r.at("nope"); }, {path, "'nope'"});
}

TEST(Safetensors, TransposeOnWriteAndRead) {
  const std::string path = test_dir() + "/t.safetensors";
  // mem holds [2, 3] = the transpose of the file tensor [3, 2].
  const std::vector<float> mem = {0, 1, 2, 10, 11, 12};
  SafetensorsWriter w;
  w.add("w", {3, 2}, mem.data(), StoreDtype::F32, /*transpose=*/true);
  w.write(path);
  SafetensorsReader r(path);
  EXPECT_EQ(r.read_float("w"), (std::vector<float>{0, 10, 1, 11, 2, 12}));
  std::vector<float> back(6);
  r.read_float("w", back.data(), /*transpose=*/true);
  EXPECT_EQ(back, mem);
}

TEST(Safetensors, HalfPrecisionWithinRounding) {
  const std::string path = test_dir() + "/t.safetensors";
  auto v = random_floats(4096, 3);
  v[0] = 0.0f;
  v[1] = -1e-7f;  // subnormal in F16
  v[2] = 1e30f;   // inf in F16, finite in BF16
  SafetensorsWriter w;
  w.add("bf", {64, 64}, v.data(), StoreDtype::BF16);
  w.add("h", {4096}, v.data(), StoreDtype::F16);
  w.add("f", {4096}, v.data(), StoreDtype::F32);
  w.write(path);
  SafetensorsReader r(path);
  EXPECT_EQ(r.at("bf").dtype, "BF16");
  EXPECT_EQ(r.at("h").dtype, "F16");
  // The F32 tensor comes first in the data (decreasing element size keeps alignment).
  EXPECT_EQ(r.at("f").begin, 0u);
  const auto bf = r.read_float("bf"), h = r.read_float("h");
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_LE(std::fabs(bf[i] - v[i]), std::fabs(v[i]) * 0x1p-8f) << i;
    if (i == 2) {
      EXPECT_TRUE(std::isinf(h[i]));
    } else if (std::fabs(v[i]) >= 0x1p-14f) {
      EXPECT_LE(std::fabs(h[i] - v[i]), std::fabs(v[i]) * 0x1p-11f) << i;
    } else {
      EXPECT_LE(std::fabs(h[i] - v[i]), 0x1p-25f) << i;
    }
  }
}

TEST(Safetensors, ScalarConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);        // tie -> even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);    // tie -> even (up)
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_EQ(float_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(float_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_f16(0x1p-25f), 0x0000);               // tie -> even (zero)
  EXPECT_EQ(float_to_f16(1.5f * 0x1p-25f), 0x0001);
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f), 0x3C00);        // tie -> even
  EXPECT_EQ(float_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::nanf("")))));
  // Every 16-bit pattern converts to float and back unchanged (NaNs stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f16 = f16_to_float(uint16_t(h)), b16 = bf16_to_float(uint16_t(h));
    if (std::isnan(f16)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f16))));
    } else {
      EXPECT_EQ(float_to_f16(f16), h) << h;
    }
    if (std::isnan(b16)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(b16))));
    } else {
      EXPECT_EQ(float_to_bf16(b16), h) << h;
    }
  }
}

TEST(Safetensors, TruncatedFileRefused) {
  const std::string path = test_dir() + "/t.safetensors";
  const auto a = random_floats(100, 4);
  SafetensorsWriter w;
  w.add("a", {10, 10}, a.data());
  w.write(path);
  std::string b = read_bytes(path);
  write_bytes(path, b.substr(0, b.size() - 10));
  expect_error([&] { SafetensorsReader r(path); }, {path, "'a'", "truncated"});
  write_bytes(path, b.substr(0, 40));  // inside the header
  expect_error([&] { SafetensorsReader r(path); }, {path, "truncated"});
  write_bytes(path, b.substr(0, 5));
  expect_error([&] { SafetensorsReader r(path); }, {path, "5 bytes"});
  expect_error([&] { SafetensorsReader r(path + ".missing"); }, {path + ".missing"});
}

TEST(Safetensors, BadHeaderRefused) {
  const std::string dir = test_dir(), path = dir + "/bad.safetensors";
  write_raw_safetensors(path, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], ", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "not valid JSON"});
  write_raw_safetensors(path, "[1, 2]  ", 0);
  expect_error([&] { SafetensorsReader r(path); }, {path, "'{'"});
  write_raw_safetensors(path, R"({"a": {"dtype": "F32", "shape": [2]}})", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "'a'", "data_offsets"});
  write_raw_safetensors(path, R"({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "'a'", "unknown dtype 'Q4'"});
  write_raw_safetensors(path, R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "'a'", "need 12"});
  write_raw_safetensors(path, R"({"__metadata__": {"x": 1}})", 0);
  expect_error([&] { SafetensorsReader r(path); }, {path, "__metadata__", "'x'"});
  // A header length far beyond the file.
  std::string b(8, '\0');
  b[6] = 1;
  write_bytes(path, b + "{}");
  expect_error([&] { SafetensorsReader r(path); }, {path, "header length"});
}

TEST(Safetensors, OffsetsOutOfRangeOverlappingOrGappedRefused) {
  const std::string path = test_dir() + "/bad.safetensors";
  write_raw_safetensors(path, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "'a'", "[8, 16]", "past the end"});
  write_raw_safetensors(path,
                        R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                        R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                        12);
  expect_error([&] { SafetensorsReader r(path); }, {path, "'a'", "'b'", "overlap"});
  write_raw_safetensors(path, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "[0, 4)"});
  write_raw_safetensors(path, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8);
  expect_error([&] { SafetensorsReader r(path); }, {path, "trailing"});
}

TEST(Safetensors, OtherDtypesListedButNotReadAsFloat) {
  const std::string path = test_dir() + "/i.safetensors";
  write_raw_safetensors(path, R"({"ids": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}})", 16);
  SafetensorsReader r(path);
  EXPECT_EQ(r.at("ids").dtype, "I64");
  std::vector<float> out(2);
  expect_error([&] { r.read_float("ids", out.data()); }, {path, "'ids'", "I64", "F32, BF16 and F16"});
}

// ------------------------------------------------------------------------------------------
// Hugging Face folders

namespace {

using Model = tetrad_test::RandomModel;
using tetrad_test::random_model;

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_embd, b.n_embd);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_kv_head, b.n_kv_head);
  EXPECT_EQ(a.ffn, b.ffn);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_seq, b.max_seq);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.init_std, b.init_std);
  if (a.desc().positions == Positions::Rope) {
    EXPECT_EQ(a.rope_theta, b.rope_theta);
  }
}

json read_json(const std::string& path) { return json::parse(read_bytes(path)); }

void write_json(const std::string& path, const json& j) { write_bytes(path, j.dump(2)); }

}  // namespace

TEST(HfFolder, Gpt2RoundTripIsBitIdentical) {
  const std::string dir = test_dir() + "/gpt2";
  Model m = random_model(named_model("tiny"), 10);
  save_hf(dir, m.cfg, m.table, m.params.data(), {{"run", "unit-test"}, {"bos_token_id", 0}});

  const json cj = read_json(dir + "/config.json");
  EXPECT_EQ(cj["model_type"], "gpt2");
  EXPECT_EQ(cj["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(cj["activation_function"], "gelu_new");
  EXPECT_EQ(cj["n_positions"], m.cfg.max_seq);
  EXPECT_EQ(cj["n_ctx"], m.cfg.max_seq);
  EXPECT_EQ(cj["layer_norm_epsilon"].get<double>(), 1e-5);  // written as 1e-05, not 9.99e-06
  EXPECT_EQ(cj["bos_token_id"], 0);
  EXPECT_TRUE(cj["eos_token_id"].is_null());
  EXPECT_EQ(cj["torch_dtype"], "float32");
  expect_same_config(read_hf_config(dir), m.cfg);

  SafetensorsReader r(dir + "/model.safetensors");
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("run"), "unit-test");
  EXPECT_EQ(r.find("lm_head.weight"), nullptr);  // tied: HF writes none either
  EXPECT_EQ(r.tensors().size(), m.table.specs.size());

  // Conv1D: the file holds [in, out] = [C, 3C]; memory holds [out, in] = [3C, C].
  const int64_t C = m.cfg.n_embd;
  const ParamSpec& s = m.table.find("transformer.h.1.attn.c_attn.weight");
  const TensorInfo& t = r.at("transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{C, 3 * C}));
  const auto file = r.read_float(t.name);
  const int64_t in = 5, out = 2 * C + 7;  // an element of the value block
  EXPECT_EQ(file[in * 3 * C + out], m.params[s.offset + out * C + in]);
  // Non-Conv1D tensors are stored as they are.
  const ParamSpec& wte = m.table.find("transformer.wte.weight");
  EXPECT_EQ(r.read_float("transformer.wte.weight")[3 * C + 4], m.params[wte.offset + 3 * C + 4]);

  std::vector<float> back(m.params.size(), -1.0f);
  load_hf_params(dir, m.cfg, m.table, back.data());
  EXPECT_TRUE(same_bits(back, m.params));
}

TEST(HfFolder, LlamaRoundTripIsBitIdentical) {
  const std::string dir = test_dir() + "/llama";
  Model m = random_model(named_model("llama-tiny"), 11);
  save_hf(dir, m.cfg, m.table, m.params.data());
  const json cj = read_json(dir + "/config.json");
  EXPECT_EQ(cj["model_type"], "llama");
  EXPECT_EQ(cj["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(cj["num_key_value_heads"], 2);
  EXPECT_EQ(cj["intermediate_size"], 192);
  EXPECT_EQ(cj["hidden_act"], "silu");
  EXPECT_EQ(cj["rms_norm_eps"].get<double>(), 1e-6);
  EXPECT_EQ(cj["rope_theta"].get<double>(), 10000.0);
  EXPECT_EQ(cj["tie_word_embeddings"], false);
  EXPECT_EQ(cj["attention_bias"], false);
  EXPECT_EQ(cj["mlp_bias"], false);
  expect_same_config(read_hf_config(dir), m.cfg);

  SafetensorsReader r(dir + "/model.safetensors");
  EXPECT_NE(r.find("lm_head.weight"), nullptr);
  // q/k/v keep HF's layout: [out, in] as in memory.
  const ParamSpec& k = m.table.find("model.layers.1.self_attn.k_proj.weight");
  EXPECT_EQ(r.at(k.name).shape, k.shape);
  EXPECT_EQ(r.read_float(k.name)[17 * 64 + 3], m.params[k.offset + 17 * 64 + 3]);

  std::vector<float> back(m.params.size(), -1.0f);
  load_hf_params(dir, m.cfg, m.table, back.data());
  EXPECT_TRUE(same_bits(back, m.params));
}

namespace {

// A random model of `cfg` saved as a Hugging Face folder at `dir`: its config.json names the
// family (`model_type`, Hugging Face's `architecture`), says whether the embeddings are tied and
// that no layer has a sliding window, and reads back as `cfg`; lm_head is there only when untied;
// `tensor` has `shape` and its values; the weights load back bit for bit. Returns config.json.
json expect_hf_round_trip(const std::string& dir, const ModelConfig& cfg, uint32_t seed,
                          const std::string& model_type, const std::string& architecture,
                          const std::string& tensor, const std::vector<int64_t>& shape) {
  Model m = random_model(cfg, seed);
  save_hf(dir, m.cfg, m.table, m.params.data());
  const json cj = read_json(dir + "/config.json");
  EXPECT_EQ(cj["model_type"], model_type);
  EXPECT_EQ(cj["architectures"][0], architecture);
  EXPECT_EQ(cj["tie_word_embeddings"], cfg.tie_embeddings);
  EXPECT_EQ(cj["use_sliding_window"], false);
  expect_same_config(read_hf_config(dir), m.cfg);

  SafetensorsReader r(dir + "/model.safetensors");
  EXPECT_EQ(r.find("lm_head.weight") != nullptr, !cfg.tie_embeddings);
  const ParamSpec& t = m.table.find(tensor);
  EXPECT_EQ(r.at(t.name).shape, shape);
  EXPECT_EQ(r.read_float(t.name)[5], m.params[t.offset + 5]);

  std::vector<float> back(m.params.size(), -1.0f);
  load_hf_params(dir, m.cfg, m.table, back.data());
  EXPECT_TRUE(same_bits(back, m.params));
  return cj;
}

}  // namespace

// Qwen2: its q, k, v biases under Hugging Face's names and shapes, tied (the default) and untied,
// rope theta kept; bit-identical both ways. A folder that lacks a bias names it.
TEST(HfFolder, Qwen2RoundTripIsBitIdentical) {
  for (bool tied : {true, false}) {
    ModelConfig cfg = named_model("qwen2-tiny");
    cfg.tie_embeddings = tied;
    const json cj = expect_hf_round_trip(test_dir() + "/qwen2", cfg, 12, "qwen2", "Qwen2ForCausalLM",
                                         "model.layers.1.self_attn.k_proj.bias",
                                         {cfg.n_kv_head * cfg.head_dim()});
    EXPECT_EQ(cj["rope_theta"].get<double>(), 1000000.0);
  }
  // A Llama folder of the same sizes has no biases: loading it as Qwen2 names what is missing.
  const std::string dir = test_dir() + "/qwen2_as_llama";
  ModelConfig llama = named_model("qwen2-tiny");
  llama.family = Family::Llama;
  Model l = random_model(llama, 13);
  save_hf(dir, l.cfg, l.table, l.params.data());
  json cj = read_json(dir + "/config.json");
  cj["model_type"] = "qwen2";
  for (const char* k : {"attention_bias", "mlp_bias"}) cj.erase(k);
  write_json(dir + "/config.json", cj);
  const ModelConfig q = named_model("qwen2-tiny");
  std::vector<float> out(size_t(build_param_table(q).total));
  try {
    load_hf_params(dir, q, build_param_table(q), out.data());
    ADD_FAILURE() << "a Qwen2 folder without biases was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("6 tensor(s) of this model are missing: "
                                         "'model.layers.0.self_attn.q_proj.bias', "
                                         "'model.layers.0.self_attn.k_proj.bias'"),
              std::string::npos) << e.what();
  }
}

// Qwen3: q_norm / k_norm [head_dim] under Hugging Face's names, heads 24 wide (head_dim said in
// config.json), tied and untied; bit-identical both ways. What tetrad's Qwen3 does not compute is
// refused by name; a folder without head_dim has Qwen3Config's 128.
TEST(HfFolder, Qwen3RoundTripIsBitIdentical) {
  for (bool tied : {true, false}) {
    const std::string dir = test_dir() + "/qwen3";
    ModelConfig cfg = named_model("qwen3-tiny");
    cfg.tie_embeddings = tied;
    const json cj = expect_hf_round_trip(dir, cfg, 14, "qwen3", "Qwen3ForCausalLM",
                                         "model.layers.1.self_attn.k_norm.weight", {24});
    EXPECT_EQ(cj["head_dim"], 24);
    EXPECT_EQ(cj["attention_bias"], false);
    EXPECT_EQ(read_hf_config(dir).head_dim(), 24);

    json j = cj;
    j.erase("head_dim");
    EXPECT_EQ(parse_hf_config(j, "cfg.json").head_dim(), 128);
    j = cj;
    j["attention_bias"] = true;
    expect_error([&] { parse_hf_config(j, "cfg.json"); }, {"cfg.json", "'attention_bias' = true", "Qwen3"});
    j = cj;
    j.erase("layer_types");  // the layers' kinds from the window fields, as transformers reads them
    j["use_sliding_window"] = true;
    j["sliding_window"] = 16;
    j["max_window_layers"] = 1;
    expect_error([&] { parse_hf_config(j, "cfg.json"); }, {"layer 1", "sliding window of 16"});
  }
}

TEST(HfFolder, TiedLlamaAndExtraBuffersAccepted) {
  const std::string dir = test_dir() + "/llama";
  ModelConfig cfg = named_model("llama-tiny");
  cfg.tie_embeddings = true;
  Model m = random_model(cfg, 12);
  save_hf(dir, m.cfg, m.table, m.params.data());
  EXPECT_EQ(read_json(dir + "/config.json")["tie_word_embeddings"], true);

  // Rewrite the file as an older transformers would: a tied lm_head copy and rotary buffers.
  SafetensorsWriter w;
  for (const auto& s : m.table.specs) w.add(s.name, s.shape, m.params.data() + s.offset);
  const ParamSpec& emb = m.table.find("model.embed_tokens.weight");
  w.add("lm_head.weight", emb.shape, m.params.data() + emb.offset);
  const std::vector<float> inv_freq(8, 0.5f);
  w.add("model.layers.0.self_attn.rotary_emb.inv_freq", {8}, inv_freq.data());
  w.set_metadata("format", "pt");
  w.write(dir + "/model.safetensors");

  std::vector<float> back(m.params.size());
  load_hf_params(dir, m.cfg, m.table, back.data());
  EXPECT_TRUE(same_bits(back, m.params));

  // Anything else the model does not have is refused.
  w.add("model.layers.0.self_attn.q_proj.bias", {8}, inv_freq.data());
  w.write(dir + "/model.safetensors");
  expect_error([&] { load_hf_params(dir, m.cfg, m.table, back.data()); },
               {dir, "'model.layers.0.self_attn.q_proj.bias'", "not a parameter"});
}

TEST(HfFolder, Gpt2NamesWithoutTransformerPrefix) {
  // As in the original gpt2 upload: no "transformer." prefix, and attn.bias mask buffers.
  const std::string dir = test_dir() + "/gpt2";
  Model m = random_model(named_model("tiny"), 13);
  save_hf(dir, m.cfg, m.table, m.params.data());
  SafetensorsWriter w;
  const std::string prefix = "transformer.";
  for (const auto& s : m.table.specs) {
    std::vector<int64_t> shape = s.shape;
    if (s.hf_transposed) std::swap(shape[0], shape[1]);
    w.add(s.name.substr(prefix.size()), shape, m.params.data() + s.offset, StoreDtype::F32,
          s.hf_transposed);
  }
  const std::vector<float> mask(64 * 64, 1.0f);
  for (int l = 0; l < m.cfg.n_layer; ++l)
    w.add("h." + std::to_string(l) + ".attn.bias", {1, 1, 64, 64}, mask.data());
  w.set_metadata("format", "pt");
  w.write(dir + "/model.safetensors");

  std::vector<float> back(m.params.size());
  load_hf_params(dir, m.cfg, m.table, back.data());
  EXPECT_TRUE(same_bits(back, m.params));
}

TEST(HfFolder, Bf16CheckpointLoadsWithinRounding) {
  const std::string dir = test_dir() + "/llama";
  Model m = random_model(named_model("llama-tiny"), 14);
  save_hf(dir, m.cfg, m.table, m.params.data());
  SafetensorsWriter w;
  for (const auto& s : m.table.specs)
    w.add(s.name, s.shape, m.params.data() + s.offset, StoreDtype::BF16);
  w.set_metadata("format", "pt");
  w.write(dir + "/model.safetensors");
  std::vector<float> back(m.params.size());
  load_hf_params(dir, m.cfg, m.table, back.data());
  for (size_t i = 0; i < back.size(); ++i)
    ASSERT_LE(std::fabs(back[i] - m.params[i]), std::fabs(m.params[i]) * 0x1p-8f) << i;
}

TEST(HfFolder, ShardedCheckpointLoads) {
  const std::string dir = test_dir() + "/llama";
  Model m = random_model(named_model("llama-tiny"), 15);
  save_hf(dir, m.cfg, m.table, m.params.data());
  fs::remove(dir + "/model.safetensors");
  SafetensorsWriter w1, w2;
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  for (size_t i = 0; i < m.table.specs.size(); ++i) {
    const auto& s = m.table.specs[i];
    const bool first = i < m.table.specs.size() / 2;
    (first ? w1 : w2).add(s.name, s.shape, m.params.data() + s.offset);
    index["weight_map"][s.name] = first ? "model-00001-of-00002.safetensors"
                                        : "model-00002-of-00002.safetensors";
  }
  w1.write(dir + "/model-00001-of-00002.safetensors");
  w2.write(dir + "/model-00002-of-00002.safetensors");
  write_json(dir + "/model.safetensors.index.json", index);
  std::vector<float> back(m.params.size());
  load_hf_params(dir, m.cfg, m.table, back.data());
  EXPECT_TRUE(same_bits(back, m.params));
}

TEST(HfFolder, WrongFamilyRefused) {
  const std::string dir = test_dir() + "/llama";
  Model m = random_model(named_model("llama-tiny"), 16);
  save_hf(dir, m.cfg, m.table, m.params.data());
  Model g = random_model(named_model("tiny"), 17);
  const std::string msg = expect_error([&] { load_hf_params(dir, g.cfg, g.table, g.params.data()); },
                                       {});
  EXPECT_EQ(msg, "checkpoint " + dir + " is a llama model, but the config asks for gpt2");
}

TEST(HfFolder, WrongShapeRefused) {
  const std::string root = test_dir(), dir = root + "/llama";
  Model m = random_model(named_model("llama-tiny"), 18);
  save_hf(dir, m.cfg, m.table, m.params.data());
  ModelConfig other = m.cfg;
  other.ffn = 256;
  ParamTable t = build_param_table(other);
  std::vector<float> buf(size_t(t.total));
  const std::string msg = expect_error([&] { load_hf_params(dir, other, t, buf.data()); }, {});
  EXPECT_EQ(msg, "checkpoint " + dir +
                     ": tensor 'model.layers.0.mlp.gate_proj.weight' has shape [192, 64] but "
                     "this model expects [256, 64]");

  // A GPT-2 Conv1D shape is reported in the file's layout.
  const std::string gdir = root + "/gpt2";
  Model g = random_model(named_model("tiny"), 19);
  save_hf(gdir, g.cfg, g.table, g.params.data());
  ModelConfig wide = g.cfg;
  wide.ffn = 128;
  ParamTable wt = build_param_table(wide);
  std::vector<float> wbuf(size_t(wt.total));
  expect_error([&] { load_hf_params(gdir, wide, wt, wbuf.data()); },
               {"tensor 'transformer.h.0.mlp.c_fc.weight' has shape [64, 256] but this model "
                "expects [64, 128]"});

  // Same shapes, different head count: caught from config.json.
  ModelConfig heads = m.cfg;
  heads.n_head = 8;
  heads.n_kv_head = 4;
  ParamTable ht = build_param_table(heads);
  ASSERT_EQ(ht.total, m.table.total);
  expect_error([&] { load_hf_params(dir, heads, ht, buf.data()); }, {dir, "n_head = 4", "8"});
  ModelConfig eps = m.cfg;
  eps.norm_eps = 1e-5f;
  expect_error([&] { load_hf_params(dir, eps, m.table, buf.data()); },
               {dir, "norm_eps = 1e-06 but the config asks for 1e-05"});

  // A missing tensor.
  SafetensorsWriter w;
  for (const auto& s : m.table.specs)
    if (s.name != "model.norm.weight") w.add(s.name, s.shape, m.params.data() + s.offset);
  w.set_metadata("format", "pt");
  w.write(dir + "/model.safetensors");
  expect_error([&] { load_hf_params(dir, m.cfg, m.table, m.params.data()); },
               {dir, "missing", "'model.norm.weight'"});
}

TEST(HfFolder, ConfigErrorsNameTheProblem) {
  const std::string root = test_dir(), dir = root + "/m";
  Model m = random_model(named_model("llama-tiny"), 20);
  save_hf(dir, m.cfg, m.table, m.params.data());
  const std::string cfg_path = dir + "/config.json";
  const json good = read_json(cfg_path);
  auto with = [&](const std::function<void(json&)>& edit) {
    json j = good;
    edit(j);
    write_json(cfg_path, j);
  };
  with([](json& j) { j["model_type"] = "mistral"; });
  expect_error([&] { read_hf_config(dir); }, {cfg_path, "model_type 'mistral'", "\"gpt2\", \"llama\", \"qwen2\", \"qwen3\", \"mixtral\", \"qwen2_moe\" or \"qwen3_moe\""});
  with([](json& j) { j.erase("model_type"); });
  expect_error([&] { read_hf_config(dir); }, {cfg_path, "missing field 'model_type'"});
  with([](json& j) { j.erase("hidden_size"); });
  expect_error([&] { read_hf_config(dir); }, {cfg_path, "missing field 'hidden_size'"});
  with([](json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; });
  expect_error([&] { read_hf_config(dir); },
               {cfg_path, "'rope_scaling' has rope type \"linear\"", "does not implement"});
  with([](json& j) { j["hidden_act"] = "gelu"; });
  expect_error([&] { read_hf_config(dir); }, {cfg_path, "hidden_act 'gelu'"});
  with([](json& j) { j["attention_bias"] = true; });
  expect_error([&] { read_hf_config(dir); }, {cfg_path, "attention_bias"});
  with([](json& j) { j["num_attention_heads"] = "4"; });
  expect_error([&] { read_hf_config(dir); }, {cfg_path, "'num_attention_heads' must be an integer"});
  with([](json& j) { j["num_key_value_heads"] = 3; });
  expect_error([&] { read_hf_config(dir); }, {cfg_path, "n_kv_head"});
  // Fields transformers defaults are optional.
  with([](json& j) {
    j.erase("rms_norm_eps");
    j.erase("num_key_value_heads");
    j.erase("rope_theta");
    j.erase("rope_parameters");
  });
  const ModelConfig d = read_hf_config(dir);
  EXPECT_EQ(d.norm_eps, 1e-6f);
  EXPECT_EQ(d.n_kv_head, d.n_head);

  const std::string gdir = root + "/g";
  Model g = random_model(named_model("tiny"), 21);
  save_hf(gdir, g.cfg, g.table, g.params.data());
  const std::string gpath = gdir + "/config.json";
  json gj = read_json(gpath);
  gj["activation_function"] = "relu";
  write_json(gpath, gj);
  expect_error([&] { read_hf_config(gdir); }, {gpath, "activation_function 'relu'"});
  gj["activation_function"] = "gelu_pytorch_tanh";
  gj["n_inner"] = nullptr;  // HF's default: 4 * n_embd
  gj.erase("n_positions");
  write_json(gpath, gj);
  const ModelConfig gc = read_hf_config(gdir);
  EXPECT_EQ(gc.ffn, 4 * gc.n_embd);
  EXPECT_EQ(gc.max_seq, g.cfg.max_seq);  // from n_ctx
  expect_error([&] { read_hf_config(root + "/none"); }, {"has no config.json"});
}

// config.json as transformers 4.x and 5.x write it (tests/data/hf_configs/, made with
// scripts/make-hf-config-fixtures.py): rope_theta at the top level or inside rope_parameters,
// llama3 scaling in rope_scaling or rope_parameters.
TEST(HfConfig, ReadsTransformers4And5Layouts) {
  const std::string fx = std::string(TETRAD_SOURCE_DIR) + "/tests/data/hf_configs/";
  auto load = [&](const std::string& name) {
    return parse_hf_config(read_json(fx + name), fx + name);
  };
  for (const char* v : {"tf4", "tf5"}) {
    SCOPED_TRACE(v);
    const ModelConfig plain = load(std::string("llama_theta500k_") + v + ".json");
    EXPECT_EQ(plain.rope_theta, 500000.0f);
    EXPECT_EQ(plain.rope_type, "default");
    EXPECT_EQ(plain.n_kv_head, 2);
    const ModelConfig l3 = load(std::string("llama3_scaled_") + v + ".json");
    EXPECT_EQ(l3.rope_theta, 500000.0f);
    EXPECT_EQ(l3.rope_type, "llama3");
    EXPECT_EQ(l3.rope_factor, 8.0);
    EXPECT_EQ(l3.rope_low_freq_factor, 1.0);
    EXPECT_EQ(l3.rope_high_freq_factor, 4.0);
    EXPECT_EQ(l3.rope_original_max_position, 32);
    const ModelConfig g = load(std::string("gpt2_") + v + ".json");
    EXPECT_EQ(g.family, Family::GPT2);
    EXPECT_EQ(g.n_embd, 64);
  }
}

TEST(HfConfig, RefusesWhatTetradDoesNotImplementByKeyAndValue) {
  const std::string fx = std::string(TETRAD_SOURCE_DIR) + "/tests/data/hf_configs/";
  for (const char* v : {"tf4", "tf5"}) {
    SCOPED_TRACE(v);
    const json base = read_json(fx + "llama_theta500k_" + v + ".json");
    auto refused = [&](const std::function<void(json&)>& edit,
                       const std::vector<std::string>& parts) {
      json j = base;
      edit(j);
      expect_error([&] { parse_hf_config(j, "cfg.json"); }, parts);
    };
    refused([](json& j) { j["attention_bias"] = true; }, {"cfg.json", "'attention_bias' = true"});
    refused([](json& j) { j["mlp_bias"] = true; }, {"'mlp_bias' = true"});
    refused([](json& j) { j["sliding_window"] = 4096; }, {"'sliding_window' = 4096"});
    {  // Llama's heads may have a width of their own (LlamaConfig.head_dim); Qwen2's may not.
      json j = base;
      j["head_dim"] = 24;
      const ModelConfig c = parse_hf_config(j, "cfg.json");
      EXPECT_EQ(c.head_dim(), 24);
      EXPECT_EQ(c.q_dim(), c.n_head * 24);
      EXPECT_EQ(parse_hf_config(hf_config_json(c), "again").head_dim(), 24);
      j["head_dim"] = c.n_embd / c.n_head;  // the usual width, said: nothing set
      EXPECT_EQ(parse_hf_config(j, "cfg.json").explicit_head_dim, 0);
    }
    refused([](json& j) { j["model_type"] = "qwen2"; j["head_dim"] = 32; },
            {"head_dim = 32", "Qwen2", "hidden_size / num_attention_heads = 16"});
    refused([](json& j) { j["hidden_act"] = "gelu"; }, {"hidden_act 'gelu'", "silu"});
    refused([](json& j) { j["layer_types"] = {"full_attention", "sliding_attention"}; },
            {"'layer_types'", "\"sliding_attention\""});
    // Each rope dict alone (the fixture's own layout removed first).
    auto only = [](json& j) {
      j.erase("rope_scaling");
      j.erase("rope_parameters");
    };
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
      refused([&](json& j) { only(j); j[key] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 500000.0}}; },
              {std::string("'") + key + "' has rope type \"yarn\"", "\"default\" and \"llama3\""});
      refused([&](json& j) { only(j); j[key] = {{"type", "dynamic"}, {"factor", 2.0}}; },
              {std::string("'") + key + "' has rope type \"dynamic\""});
      refused([&](json& j) {
        only(j);
        j[key] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                  {"high_freq_factor", 4.0}};
      }, {"lacks 'original_max_position_embeddings'"});
      refused([&](json& j) {
        only(j);
        j[key] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
      }, {std::string("'") + key + ".partial_rotary_factor' = 0.5"});
    }
    refused([](json& j) { j["rope_theta"] = 10000.0; j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}}; },
            {"'rope_parameters.rope_theta' = 500000.0", "disagrees with 'rope_theta'"});
    refused([](json& j) {
      j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 32}};
      j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
    }, {"rope type \"llama3\"", "\"default\""});
  }
  const json g = read_json(fx + "gpt2_tf5.json");
  json bad = g;
  bad["activation_function"] = "relu";
  expect_error([&] { parse_hf_config(bad, "g.json"); }, {"activation_function 'relu'"});
  bad = g;
  bad["scale_attn_by_inverse_layer_idx"] = true;
  expect_error([&] { parse_hf_config(bad, "g.json"); }, {"'scale_attn_by_inverse_layer_idx' = true"});
}

// Exported config.json carries both layouts, and reads back to the same model.
TEST(HfConfig, ExportWritesBothLayoutsAndReadsBack) {
  ModelConfig c = named_model("llama-tiny");
  c.rope_theta = 500000.0f;
  c.rope_type = "llama3";
  c.rope_factor = 8;
  c.rope_low_freq_factor = 1;
  c.rope_high_freq_factor = 4;
  c.rope_original_max_position = 32;
  const json j = hf_config_json(c);
  EXPECT_EQ(j["rope_theta"].get<double>(), 500000.0);
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 32);
  EXPECT_EQ(j["rope_parameters"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_parameters"]["rope_theta"].get<double>(), 500000.0);
  EXPECT_EQ(j["rope_parameters"]["factor"].get<double>(), 8.0);
  const ModelConfig back = parse_hf_config(j, "exported");
  EXPECT_EQ(back.rope_type, "llama3");
  EXPECT_EQ(back.rope_factor, 8.0);
  EXPECT_EQ(back.rope_original_max_position, 32);
  EXPECT_EQ(back.rope_theta, 500000.0f);
  ModelConfig d = named_model("llama-tiny");
  const json jd = hf_config_json(d);
  EXPECT_TRUE(jd["rope_scaling"].is_null());
  EXPECT_EQ(jd["rope_parameters"], json({{"rope_type", "default"}, {"rope_theta", 10000.0}}));
  // A checkpoint for one rope refuses to load into a model of another.
  const std::string dir = test_dir() + "/l3";
  Model m = random_model(c, 30);
  save_hf(dir, m.cfg, m.table, m.params.data());
  expect_error([&] { load_hf_params(dir, d, m.table, m.params.data()); },
               {dir, "rope"});
}

TEST(HfFolder, SaveReplacesModelFoldersOnly) {
  const std::string root = test_dir();
  Model a = random_model(named_model("tiny"), 22), b = random_model(named_model("tiny"), 23);
  save_hf(root + "/m", a.cfg, a.table, a.params.data());
  save_hf(root + "/m", b.cfg, b.table, b.params.data());  // replaces
  std::vector<float> back(b.params.size());
  load_hf_params(root + "/m", b.cfg, b.table, back.data());
  EXPECT_TRUE(same_bits(back, b.params));
  for (const auto& e : fs::directory_iterator(root)) EXPECT_EQ(e.path().filename(), "m");

  fs::create_directories(root + "/notes");
  write_bytes(root + "/notes/todo.txt", "keep me");
  expect_error([&] { save_hf(root + "/notes", a.cfg, a.table, a.params.data()); },
               {"refusing to replace", root + "/notes"});
  EXPECT_EQ(read_bytes(root + "/notes/todo.txt"), "keep me");
}

// ------------------------------------------------------------------------------------------
// Trainer state

namespace {
TrainerState random_state(int64_t numel, int64_t step) {
  TrainerState s;
  s.step = step;
  s.rng_state = {0x0123456789abcdefull, ~0ull, 0, 42};
  s.info = {{"data", {{"shard", 3}, {"offset", 123456789012ll}}},
            {"config_hash", "deadbeefdeadbeef"},
            {"lr", 3e-4}};
  s.adam_m = random_floats(size_t(numel), uint32_t(step));
  s.adam_v = random_floats(size_t(numel), uint32_t(step + 1));
  return s;
}
}  // namespace

TEST(TrainerState, RoundTripIsExact) {
  const std::string path = test_dir() + "/trainer_state.bin";
  const TrainerState s = random_state(1000, 77);
  save_trainer_state(path, s);
  const TrainerState r = load_trainer_state(path, 1000);
  EXPECT_EQ(r.step, 77);
  EXPECT_EQ(r.rng_state, s.rng_state);
  EXPECT_EQ(r.info, s.info);
  EXPECT_TRUE(same_bits(r.adam_m, s.adam_m));
  EXPECT_TRUE(same_bits(r.adam_v, s.adam_v));
  const TrainerState v = verify_trainer_state(path);
  EXPECT_EQ(v.step, 77);
  EXPECT_TRUE(v.adam_m.empty());

  const std::string bytes = read_bytes(path);
  EXPECT_EQ(bytes.substr(0, 8), "TTRDSTAT");
  uint32_t version;
  std::memcpy(&version, bytes.data() + 8, 4);
  EXPECT_EQ(version, kTrainerStateVersion);
  uint64_t json_len;
  std::memcpy(&json_len, bytes.data() + 12, 8);
  EXPECT_EQ(bytes.size(), 20 + json_len + 2 * 1000 * 4 + 8);
}

TEST(TrainerState, CorruptionRefused) {
  const std::string path = test_dir() + "/trainer_state.bin";
  save_trainer_state(path, random_state(500, 5));
  const std::string good = read_bytes(path);

  flip_byte(path, 100);  // inside adam_v
  expect_error([&] { load_trainer_state(path, 500); }, {path, "checksum mismatch"});
  expect_error([&] { verify_trainer_state(path); }, {path, "checksum mismatch"});

  write_bytes(path, good.substr(0, good.size() - 1000));
  expect_error([&] { load_trainer_state(path, 500); }, {path, "truncated"});
  write_bytes(path, good.substr(0, 10));
  expect_error([&] { load_trainer_state(path, 500); }, {path, "truncated"});

  std::string b = good;
  b[0] = 'X';
  write_bytes(path, b);
  expect_error([&] { load_trainer_state(path, 500); }, {path, "TTRDSTAT"});

  b = good;
  b[8] = 9;
  write_bytes(path, b);
  expect_error([&] { load_trainer_state(path, 500); }, {path, "version 9", "newer"});

  write_bytes(path, good);
  expect_error([&] { load_trainer_state(path, 501); }, {path, "500 parameters", "501"});
  expect_error([&] { load_trainer_state(path + ".missing", 500); }, {path + ".missing"});
}

// ------------------------------------------------------------------------------------------
// Run checkpoints

namespace {
std::string latest_of(const std::string& run) {
  std::string s = read_bytes(run + "/checkpoints/latest");
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}
std::vector<std::string> step_folders(const std::string& run) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints"))
    if (e.is_directory()) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}
}  // namespace

TEST(RunCheckpoint, SaveLatestKeepLastAndLoad) {
  const std::string run = test_dir();
  EXPECT_EQ(checkpoint_folder_name(123), "step_000123");
  EXPECT_EQ(checkpoint_folder_name(12345678), "step_12345678");
  std::ostringstream log;
  EXPECT_FALSE(find_latest_checkpoint(run, log).has_value());  // a fresh run

  const std::string tok = run + "/tok.model";
  write_bytes(tok, "not really a sentencepiece model");
  Model m = random_model(named_model("llama-tiny"), 30);
  CheckpointOptions opts;
  opts.tokenizer_path = tok;
  opts.keep_last = 3;
  for (int64_t step : {100, 200, 300, 400}) {
    m.params[0] = float(step);
    const std::string dir = save_run_checkpoint(run, m.cfg, m.table, m.params.data(),
                                                random_state(m.table.total, step), opts);
    EXPECT_EQ(dir, run + "/checkpoints/" + checkpoint_folder_name(step));
    EXPECT_EQ(latest_of(run), checkpoint_folder_name(step));
  }
  EXPECT_EQ(step_folders(run),
            (std::vector<std::string>{"step_000200", "step_000300", "step_000400"}));
  const std::string d400 = run + "/checkpoints/step_000400";
  EXPECT_EQ(read_bytes(d400 + "/tokenizer.model"), "not really a sentencepiece model");
  EXPECT_FALSE(checkpoint_problem(d400).has_value());

  auto found = find_latest_checkpoint(run, log);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->dir, d400);
  EXPECT_EQ(found->step, 400);
  EXPECT_EQ(log.str(), "");  // nothing to report on the normal path

  std::vector<float> params(m.params.size());
  const TrainerState s = load_run_checkpoint(found->dir, m.cfg, m.table, params.data());
  EXPECT_TRUE(same_bits(params, m.params));
  const TrainerState want = random_state(m.table.total, 400);
  EXPECT_EQ(s.step, 400);
  EXPECT_EQ(s.rng_state, want.rng_state);
  EXPECT_EQ(s.info, want.info);  // the recorded file hashes are not handed back
  EXPECT_TRUE(same_bits(s.adam_m, want.adam_m));
  EXPECT_TRUE(same_bits(s.adam_v, want.adam_v));

  // The folder is a Hugging Face folder as it is.
  EXPECT_EQ(read_hf_config(found->dir).family, Family::Llama);
}

TEST(RunCheckpoint, FallsBackToPreviousGoodCheckpoint) {
  const std::string run = test_dir();
  Model m = random_model(named_model("tiny"), 31);
  for (int64_t step : {10, 20, 30})
    save_run_checkpoint(run, m.cfg, m.table, m.params.data(), random_state(m.table.total, step));
  const std::string ck = run + "/checkpoints";

  // Damaged weights in the newest: a flipped byte deep in the data.
  flip_byte(ck + "/step_000030/model.safetensors", 1000);
  std::ostringstream log;
  auto found = find_latest_checkpoint(run, log);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 20);
  EXPECT_NE(log.str().find("step_000030"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("model.safetensors: content hash"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("resuming from " + ck + "/step_000020"), std::string::npos) << log.str();
  expect_error([&] {
    std::vector<float> p(m.params.size());
    load_run_checkpoint(ck + "/step_000030", m.cfg, m.table, p.data());
  }, {"step_000030", "damaged"});

  // Damaged trainer state in the next one, and no latest pointer at all.
  flip_byte(ck + "/step_000020/trainer_state.bin", 20);
  fs::remove(ck + "/latest");
  log.str("");
  found = find_latest_checkpoint(run, log);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 10);
  EXPECT_NE(log.str().find("latest is missing"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("checksum mismatch"), std::string::npos) << log.str();

  // A missing file.
  fs::remove(ck + "/step_000010/config.json");
  log.str("");
  expect_error([&] { find_latest_checkpoint(run, log); },
               {"no valid checkpoint", "step_000010: config.json is missing", "step_000020",
                "step_000030"});
}

TEST(RunCheckpoint, InterruptedSaveIsIgnoredAndCleanedUp) {
  const std::string run = test_dir();
  Model m = random_model(named_model("tiny"), 32);
  save_run_checkpoint(run, m.cfg, m.table, m.params.data(), random_state(m.table.total, 5));
  const std::string ck = run + "/checkpoints";
  // A crash mid-save of step 6: its temporary folder, and a half-written pointer.
  fs::create_directories(ck + "/step_000006.tmp");
  write_bytes(ck + "/step_000006.tmp/model.safetensors", "partial");
  write_bytes(ck + "/latest.tmp-abc123", "step_0000");
  std::ostringstream log;
  auto found = find_latest_checkpoint(run, log);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 5);
  // Finding is read-only (the .tmp folder may be a running trainer's save in progress): the
  // leftovers stay until the run folder's lock holder cleans them at its start.
  EXPECT_TRUE(fs::exists(ck + "/step_000006.tmp"));
  EXPECT_TRUE(fs::exists(ck + "/latest.tmp-abc123"));
  clean_run_folder(run, log);
  EXPECT_FALSE(fs::exists(ck + "/step_000006.tmp"));
  EXPECT_FALSE(fs::exists(ck + "/latest.tmp-abc123"));
  EXPECT_NE(log.str().find("interrupted save"), std::string::npos);

  // `latest` naming a folder that is not there falls back too.
  write_bytes(ck + "/latest", "step_000999\n");
  log.str("");
  found = find_latest_checkpoint(run, log);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 5);
  EXPECT_NE(log.str().find("step_000999"), std::string::npos);
}

TEST(RunCheckpoint, ResumingFromAnEarlierStepDropsTheAbandonedOnes) {
  const std::string run = test_dir();
  Model m = random_model(named_model("tiny"), 33);
  CheckpointOptions keep_all;
  keep_all.keep_last = 0;
  for (int64_t step : {1, 2, 3})
    save_run_checkpoint(run, m.cfg, m.table, m.params.data(), random_state(m.table.total, step),
                        keep_all);
  // Resumed from step 1 (say 2 and 3 were damaged), the run saves step 2 again: step 3 belongs
  // to the abandoned timeline and goes.
  save_run_checkpoint(run, m.cfg, m.table, m.params.data(), random_state(m.table.total, 2),
                      keep_all);
  EXPECT_EQ(step_folders(run), (std::vector<std::string>{"step_000001", "step_000002"}));
  EXPECT_EQ(latest_of(run), "step_000002");
  TrainerState bad = random_state(m.table.total, 4);
  bad.info["checkpoint_files"] = "mine";
  expect_error([&] { save_run_checkpoint(run, m.cfg, m.table, m.params.data(), bad); },
               {"reserved"});
}

// ------------------------------------------------------------------------------------------
// Streamed checkpoints (one tensor in memory at a time)

namespace {

int64_t largest_tensor(const ParamTable& t) {
  int64_t m = 0;
  for (const auto& s : t.specs) m = std::max(m, s.numel);
  return m;
}

// Records the calls ("p3", "m0", ...) and copies from / into flat buffers laid out by the table.
struct Recorder {
  const ParamTable& table;
  std::vector<std::string> calls;
  TensorSource source(char tag, const std::vector<float>& flat) {
    return [this, tag, &flat](size_t i, float* out) {
      calls.push_back(tag + std::to_string(i));
      ASSERT_LT(i, table.specs.size());
      const ParamSpec& s = table.specs[i];
      std::memcpy(out, flat.data() + s.offset, size_t(s.numel) * 4);
    };
  }
  TensorSink sink(char tag, std::vector<float>& flat) {
    return [this, tag, &flat](size_t i, const float* data) {
      calls.push_back(tag + std::to_string(i));
      ASSERT_LT(i, table.specs.size());
      const ParamSpec& s = table.specs[i];
      std::memcpy(flat.data() + s.offset, data, size_t(s.numel) * 4);
    };
  }
  std::vector<std::string> expected(const std::string& tags) const {
    std::vector<std::string> v;
    for (char t : tags)
      for (size_t i = 0; i < table.specs.size(); ++i) v.push_back(t + std::to_string(i));
    return v;
  }
};

// Fixed-size I/O staging buffers (hash_file, file copy, trainer-state verification) do not grow
// with the model; anything bigger must be a buffer of one tensor.
constexpr size_t kIoBuffer = size_t(1) << 20;
size_t tensor_bound(const ParamTable& t) { return std::max(size_t(largest_tensor(t)) * 4, kIoBuffer); }

// Runs f with allocation tracking; returns the largest single allocation it made.
template <typename F>
size_t largest_allocation(F&& f) {
  g_largest_alloc = 0;
  g_track_alloc = true;
  try {
    f();
  } catch (...) {
    g_track_alloc = false;
    throw;
  }
  g_track_alloc = false;
  return g_largest_alloc;
}

}  // namespace

TEST(StreamedCheckpoint, SaveIsByteIdenticalAndCallsInOrder) {
  for (const char* name : {"tiny", "llama-tiny"}) {
    SCOPED_TRACE(name);
    const std::string root = test_dir() + "/" + name;
    ModelConfig cfg = named_model(name);
    cfg.n_layer *= 8;  // big enough that a whole-model buffer would exceed the bound below
    Model m = random_model(cfg, 40);
    const TrainerState st = random_state(m.table.total, 1234);
    const std::string tok = root + "/tok.model";
    fs::create_directories(root);
    write_bytes(tok, "tokenizer bytes");
    CheckpointOptions opts;
    opts.tokenizer_path = tok;
    opts.extra_metadata = {{"run", "streamed"}, {"bos_token_id", 1}};

    const std::string a = save_run_checkpoint(root + "/a", m.cfg, m.table, m.params.data(), st, opts);
    Recorder rec{m.table, {}};
    std::string b;
    const auto p = rec.source('p', m.params), mm = rec.source('m', st.adam_m),
               vv = rec.source('v', st.adam_v);
    const size_t peak = largest_allocation([&] {
      b = save_run_checkpoint_streamed(root + "/b", m.cfg, m.table, p, mm, vv, st.step,
                                       st.rng_state, st.info, opts);
    });
    EXPECT_EQ(rec.calls, rec.expected("pmv"));
    EXPECT_LE(peak, tensor_bound(m.table));
    EXPECT_LT(tensor_bound(m.table), size_t(m.table.total) * 4);  // the bound means something

    EXPECT_EQ(fs::path(b).filename(), fs::path(a).filename());
    for (const char* f : {"model.safetensors", "config.json", "trainer_state.bin", "tokenizer.model"}) {
      SCOPED_TRACE(f);
      const std::string x = read_bytes(a + "/" + f), y = read_bytes(b + "/" + f);
      EXPECT_FALSE(x.empty());
      EXPECT_TRUE(x == y);
    }
    EXPECT_EQ(read_bytes(root + "/a/checkpoints/latest"), read_bytes(root + "/b/checkpoints/latest"));
    EXPECT_FALSE(checkpoint_problem(b).has_value());
  }
}

TEST(StreamedCheckpoint, LoadIsBitIdenticalAndCallsInOrder) {
  for (const char* name : {"tiny", "llama-tiny"}) {
    SCOPED_TRACE(name);
    const std::string root = test_dir() + "/" + name;
    ModelConfig cfg = named_model(name);
    cfg.n_layer *= 8;  // big enough that a whole-model buffer would exceed the bound below
    Model m = random_model(cfg, 41);
    ASSERT_LT(tensor_bound(m.table), size_t(m.table.total) * 4);
    const TrainerState st = random_state(m.table.total, 77);
    const std::string dir = save_run_checkpoint(root, m.cfg, m.table, m.params.data(), st);

    std::vector<float> p0(m.params.size());
    const TrainerState want = load_run_checkpoint(dir, m.cfg, m.table, p0.data());

    const size_t n = size_t(m.table.total);
    std::vector<float> p(n), mm(n), vv(n);
    Recorder rec{m.table, {}};
    const auto ps = rec.sink('p', p), ms = rec.sink('m', mm), vs = rec.sink('v', vv);
    TrainerState got;
    const size_t peak = largest_allocation(
        [&] { got = load_run_checkpoint_streamed(dir, m.cfg, m.table, ps, ms, vs); });
    EXPECT_LE(peak, tensor_bound(m.table));
    EXPECT_EQ(rec.calls, rec.expected("pmv"));
    EXPECT_TRUE(same_bits(p, p0));
    EXPECT_TRUE(same_bits(p, m.params));
    EXPECT_TRUE(same_bits(mm, want.adam_m));
    EXPECT_TRUE(same_bits(vv, want.adam_v));
    EXPECT_TRUE(same_bits(mm, st.adam_m));
    EXPECT_TRUE(same_bits(vv, st.adam_v));
    EXPECT_EQ(got.step, want.step);
    EXPECT_EQ(got.rng_state, want.rng_state);
    EXPECT_EQ(got.info, want.info);
    EXPECT_EQ(got.info, st.info);  // checkpoint_files removed
    EXPECT_TRUE(got.adam_m.empty());
    EXPECT_TRUE(got.adam_v.empty());

    // An HF folder (GPT-2: Conv1D weights transposed in the file).
    const std::string hf = root + "/hf";
    save_hf(hf, m.cfg, m.table, m.params.data());
    std::vector<float> h0(n), h1(n);
    load_hf_params(hf, m.cfg, m.table, h0.data());
    Recorder hrec{m.table, {}};
    const auto hs = hrec.sink('p', h1);
    const size_t hpeak =
        largest_allocation([&] { load_hf_params_streamed(hf, m.cfg, m.table, hs); });
    EXPECT_LE(hpeak, tensor_bound(m.table));
    EXPECT_EQ(hrec.calls, hrec.expected("p"));
    EXPECT_TRUE(same_bits(h1, h0));
    EXPECT_TRUE(same_bits(h1, m.params));
  }
}

TEST(StreamedCheckpoint, CorruptTrainerStateRefusedBeforeAnySink) {
  const std::string root = test_dir();
  Model m = random_model(named_model("tiny"), 42);
  const TrainerState st = random_state(m.table.total, 5);
  const std::string dir = save_run_checkpoint(root, m.cfg, m.table, m.params.data(), st);
  const std::string ts = dir + "/trainer_state.bin";
  flip_byte(ts, 100);  // inside adam_v

  int calls = 0;
  TensorSink count = [&](size_t, const float*) { ++calls; };
  expect_error([&] { load_run_checkpoint_streamed(dir, m.cfg, m.table, count, count, count); },
               {dir, "checksum mismatch"});
  EXPECT_EQ(calls, 0);

  std::vector<int64_t> sizes;
  for (const auto& s : m.table.specs) sizes.push_back(s.numel);
  expect_error([&] { load_trainer_state_streamed(ts, sizes, count, count); },
               {ts, "checksum mismatch"});
  EXPECT_EQ(calls, 0);

  // Intact file, but chunks that do not add up to the stored moments: refused before any sink.
  save_trainer_state(ts, st);
  sizes.back() += 1;
  expect_error([&] { load_trainer_state_streamed(ts, sizes, count, count); },
               {ts, "different model"});
  EXPECT_EQ(calls, 0);

  // A damaged model.safetensors (recorded hash differs) is refused before any sink too.
  const std::string dir2 =
      save_run_checkpoint(root + "/again", m.cfg, m.table, m.params.data(), st);
  flip_byte(dir2 + "/model.safetensors", 10);
  expect_error([&] { load_run_checkpoint_streamed(dir2, m.cfg, m.table, count, count, count); },
               {dir2, "model.safetensors"});
  EXPECT_EQ(calls, 0);
}

TEST(StreamedCheckpoint, FailingSourceLeavesNoCheckpoint) {
  const std::string run = test_dir();
  Model m = random_model(named_model("tiny"), 43);
  const TrainerState st = random_state(m.table.total, 9);
  TensorSource p = [&](size_t i, float* out) {
    const ParamSpec& s = m.table.specs[i];
    std::memcpy(out, m.params.data() + s.offset, size_t(s.numel) * 4);
  };
  TensorSource boom = [&](size_t, float*) { fail("gather failed"); };
  expect_error([&] {
    save_run_checkpoint_streamed(run, m.cfg, m.table, p, boom, boom, 9, st.rng_state, st.info);
  }, {"gather failed"});
  std::ostringstream log;
  EXPECT_FALSE(find_latest_checkpoint(run, log).has_value());
}
