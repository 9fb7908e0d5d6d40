// config.json <-> ModelConfig (hf_config.hpp).
#include "tetrad/checkpoint/hf_config.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/json.hpp"

namespace fs = std::filesystem;

namespace tetrad {

std::string float_text(float f) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::string(buf, r.ptr);
}

namespace {

// The float as the double its shortest decimal denotes: 1e-5f is written as 1e-05 (not
// 9.999999747378752e-06), and reading it back gives 1e-5f again.
double json_float(float f) { return std::strtod(float_text(f).c_str(), nullptr); }

// --- config.json field access with messages naming the file and field ---------------------

struct ConfigReader {
  const nlohmann::json& j;
  const std::string& where;

  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t integer(const char* k) const {
    if (!has(k)) fail(where, ": missing field '", k, "'");
    if (!j[k].is_number_integer())
      fail(where, ": field '", k, "' must be an integer, got ", j[k].dump());
    return j[k].get<int64_t>();
  }
  int size(const char* k) const {
    int64_t v = integer(k);
    if (v <= 0 || v > (int64_t(1) << 30))
      fail(where, ": field '", k, "' must be a positive size, got ", v);
    return int(v);
  }
  int size_or(const char* k, int dflt) const { return has(k) ? size(k) : dflt; }
  double number_or(const char* k, double dflt) const {
    if (!has(k)) return dflt;
    if (!j[k].is_number()) fail(where, ": field '", k, "' must be a number, got ", j[k].dump());
    return j[k].get<double>();
  }
  bool boolean_or(const char* k, bool dflt) const {
    if (!has(k)) return dflt;
    if (!j[k].is_boolean()) fail(where, ": field '", k, "' must be true or false, got ", j[k].dump());
    return j[k].get<bool>();
  }
  std::string string_or(const char* k, const std::string& dflt) const {
    if (!has(k)) return dflt;
    if (!j[k].is_string()) fail(where, ": field '", k, "' must be a string, got ", j[k].dump());
    return j[k].get<std::string>();
  }
  void require_false(const char* k, const char* why) const {
    if (boolean_or(k, false)) fail(where, ": '", k, "' = true is not supported (", why, ")");
  }
};

}  // namespace

nlohmann::json hf_config_json(const ModelConfig& c, const nlohmann::json& extra) {
  nlohmann::json bos = nullptr, eos = nullptr;
  if (extra.is_object()) {
    if (extra.contains("bos_token_id") && extra["bos_token_id"].is_number_integer())
      bos = extra["bos_token_id"];
    if (extra.contains("eos_token_id") && extra["eos_token_id"].is_number_integer())
      eos = extra["eos_token_id"];
  }
  nlohmann::json j;
  if (c.family == Family::GPT2) {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"n_embd", c.n_embd},
         {"n_layer", c.n_layer},
         {"n_head", c.n_head},
         {"n_inner", c.ffn},
         {"n_positions", c.max_seq},
         {"n_ctx", c.max_seq},
         {"vocab_size", c.vocab_size},
         {"layer_norm_epsilon", json_float(c.norm_eps)},
         {"activation_function", "gelu_new"},
         {"initializer_range", json_float(c.init_std)},
         {"tie_word_embeddings", true},
         // tetrad trains without dropout; HF's defaults (0.1) would differ when fine-tuning.
         {"attn_pdrop", 0.0},
         {"embd_pdrop", 0.0},
         {"resid_pdrop", 0.0},
         {"scale_attn_weights", true},
         {"scale_attn_by_inverse_layer_idx", false},
         {"reorder_and_upcast_attn", false},
         {"bos_token_id", bos},
         {"eos_token_id", eos},
         {"use_cache", true},
         {"torch_dtype", "float32"}};
  } else {
    j = {{"architectures", {"LlamaForCausalLM"}},
         {"model_type", "llama"},
         {"hidden_size", c.n_embd},
         {"intermediate_size", c.ffn},
         {"num_hidden_layers", c.n_layer},
         {"num_attention_heads", c.n_head},
         {"num_key_value_heads", c.n_kv_head},
         {"head_dim", c.head_dim()},
         {"max_position_embeddings", c.max_seq},
         {"rms_norm_eps", json_float(c.norm_eps)},
         {"rope_theta", json_float(c.rope_theta)},
         {"rope_scaling", nullptr},
         {"vocab_size", c.vocab_size},
         {"tie_word_embeddings", c.tie_embeddings},
         {"hidden_act", "silu"},
         {"attention_bias", false},
         {"attention_dropout", 0.0},
         {"mlp_bias", false},
         {"pretraining_tp", 1},
         {"initializer_range", json_float(c.init_std)},
         {"bos_token_id", bos},
         {"eos_token_id", eos},
         {"use_cache", true},
         {"torch_dtype", "float32"}};
  }
  return j;
}

ModelConfig parse_hf_config(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail(where, ": expected a JSON object");
  ConfigReader r{j, where};
  if (!r.has("model_type")) fail(where, ": missing field 'model_type'");
  const std::string type = r.string_or("model_type", "");
  ModelConfig c;
  if (type == "gpt2") {
    c.family = Family::GPT2;
    c.n_embd = r.size("n_embd");
    c.n_layer = r.size("n_layer");
    c.n_head = r.size("n_head");
    c.n_kv_head = c.n_head;
    c.ffn = r.size_or("n_inner", 4 * c.n_embd);
    c.vocab_size = r.size("vocab_size");
    if (!r.has("n_positions") && !r.has("n_ctx")) fail(where, ": missing field 'n_positions'");
    c.max_seq = r.has("n_positions") ? r.size("n_positions") : r.size("n_ctx");
    c.norm_eps = float(r.number_or("layer_norm_epsilon", 1e-5));
    c.init_std = float(r.number_or("initializer_range", 0.02));
    const std::string act = r.string_or("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      fail(where, ": activation_function '", act,
           "' is not supported; tetrad's GPT-2 uses the tanh GELU (\"gelu_new\" or "
           "\"gelu_pytorch_tanh\")");
    if (!r.boolean_or("tie_word_embeddings", true))
      fail(where, ": tie_word_embeddings = false is not supported for gpt2 (tetrad's GPT-2 ties "
                  "the output head to the token embedding)");
    if (!r.boolean_or("scale_attn_weights", true))
      fail(where, ": scale_attn_weights = false is not supported");
    r.require_false("scale_attn_by_inverse_layer_idx", "attention is scaled by 1/sqrt(head_dim) only");
    r.require_false("add_cross_attention", "decoder-only models only");
    c.tie_embeddings = true;
  } else if (type == "llama") {
    c.family = Family::Llama;
    c.n_embd = r.size("hidden_size");
    c.ffn = r.size("intermediate_size");
    c.n_layer = r.size("num_hidden_layers");
    c.n_head = r.size("num_attention_heads");
    c.n_kv_head = r.size_or("num_key_value_heads", c.n_head);
    c.vocab_size = r.size("vocab_size");
    c.max_seq = r.size("max_position_embeddings");
    c.norm_eps = float(r.number_or("rms_norm_eps", 1e-6));
    c.rope_theta = float(r.number_or("rope_theta", 10000.0));
    c.init_std = float(r.number_or("initializer_range", 0.02));
    c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
    const std::string act = r.string_or("hidden_act", "silu");
    if (act != "silu")
      fail(where, ": hidden_act '", act, "' is not supported; tetrad's Llama uses \"silu\"");
    if (r.has("rope_scaling"))
      fail(where, ": rope_scaling ", j["rope_scaling"].dump(),
           " is not supported; only plain rotary positions (rope_scaling: null)");
    r.require_false("attention_bias", "tetrad's Llama has no attention biases");
    r.require_false("mlp_bias", "tetrad's Llama has no MLP biases");
    if (r.has("head_dim") && r.integer("head_dim") != c.n_embd / c.n_head)
      fail(where, ": head_dim = ", r.integer("head_dim"),
           " is not supported; tetrad's Llama uses hidden_size / num_attention_heads = ",
           c.n_embd / c.n_head);
  } else {
    fail(where, ": model_type '", type, "' is not supported; expected \"gpt2\" or \"llama\"");
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail(where, ": inconsistent sizes: ", e.what());
  }
  return c;
}

ModelConfig read_hf_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("checkpoint ", dir, " has no config.json");
  nlohmann::json j;
  const std::string text = read_small_file(path);
  check_json_depth(text, "'" + path + "'");
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& ex) {
    fail("'", path, "' is not valid JSON (", ex.what(), ")");
  }
  return parse_hf_config(j, path);
}

}  // namespace tetrad
