#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/sharded.hpp"

#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <system_error>
#include <type_traits>
#include <vector>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/safetensors.hpp"
#include "tetrad/core/error.hpp"

namespace fs = std::filesystem;

namespace tetrad {
namespace {

// The shortest decimal that reads back as the same float, as a double: 1e-5f is written as
// 1e-05 (not 9.999999747378752e-06), and reading it back gives 1e-5f again.
std::string float_text(float f) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::string(buf, r.ptr);
}
double json_float(float f) { return std::strtod(float_text(f).c_str(), nullptr); }

std::vector<int64_t> hf_shape(const ParamSpec& s) {
  if (!s.hf_transposed) return s.shape;
  TETRAD_CHECK(s.shape.size() == 2, s.name);
  return {s.shape[1], s.shape[0]};
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Buffers HF models carry in their state dicts that are not parameters.
bool is_ignored_buffer(const std::string& name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
         ends_with(name, ".rotary_emb.inv_freq");
}

// --- config.json field access with messages naming the file and field ---------------------

// Llama's rotary settings in either layout: transformers 4.x writes `rope_theta` at the top level
// and `rope_scaling` (null, or {"rope_type" (older: "type"), scaling fields}); 5.x writes
// `rope_parameters` = {"rope_type", "rope_theta", scaling fields}. Both layouts may be present;
// where they overlap they must agree. Rope types other than "default" and "llama3", and fields
// of a rope dict tetrad does not implement, are refused by name.
void read_rope(const nlohmann::json& j, const std::string& where, ModelConfig& c) {
  auto number = [&](const nlohmann::json& v, const std::string& key) {
    if (!v.is_number()) fail(where, ": '", key, "' must be a number, got ", v.dump());
    return v.get<double>();
  };
  bool have_theta = false;
  double theta = 10000.0;
  std::string theta_from;
  auto set_theta = [&](const nlohmann::json& v, const std::string& key) {
    const double t = number(v, key);
    if (!(t > 0)) fail(where, ": '", key, "' = ", v.dump(), " must be positive");
    if (have_theta && t != theta)
      fail(where, ": '", key, "' = ", v.dump(), " disagrees with '", theta_from, "' = ", theta);
    have_theta = true;
    theta = t;
    theta_from = key;
  };
  if (j.contains("rope_theta") && !j["rope_theta"].is_null()) set_theta(j["rope_theta"], "rope_theta");
  std::string type = "default", type_from;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const nlohmann::json& d = j[key];
    const std::string k = key;
    if (!d.is_object()) fail(where, ": '", k, "' must be an object or null, got ", d.dump());
    std::string t = "default";
    for (const char* tk : {"rope_type", "type"})
      if (d.contains(tk)) {
        if (!d[tk].is_string()) fail(where, ": '", k, ".", tk, "' must be a string, got ", d[tk].dump());
        t = d[tk].get<std::string>();
      }
    if (t != "default" && t != "llama3")
      fail(where, ": '", k, "' has rope type \"", t, "\" (", d.dump(),
           "), which tetrad does not implement; supported: \"default\" and \"llama3\"");
    if (!type_from.empty() && t != type)
      fail(where, ": '", k, "' has rope type \"", t, "\" but '", type_from, "' has \"", type, "\"");
    type = t;
    type_from = k;
    if (d.contains("rope_theta") && !d["rope_theta"].is_null()) set_theta(d["rope_theta"], k + ".rope_theta");
    static const char* const llama3_keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                              "original_max_position_embeddings"};
    for (auto it = d.begin(); it != d.end(); ++it) {
      const std::string& f = it.key();
      if (f == "rope_type" || f == "type" || f == "rope_theta") continue;
      bool known = false;
      if (t == "llama3")
        for (const char* lk : llama3_keys) known = known || f == lk;
      // Fields transformers leaves at their neutral value change nothing.
      if (!known && f == "partial_rotary_factor" && it.value().is_number() && it.value() == 1) continue;
      if (!known && f == "attention_factor" && (it.value().is_null() || (it.value().is_number() && it.value() == 1))) continue;
      if (!known)
        fail(where, ": '", k, ".", f, "' = ", it.value().dump(), " is not supported for rope type \"",
             t, "\" (tetrad implements ", t == "llama3" ? "factor, low_freq_factor, high_freq_factor and "
             "original_max_position_embeddings" : "no scaling fields", " there)");
    }
    if (t == "llama3") {
      for (const char* lk : llama3_keys)
        if (!d.contains(lk) || d[lk].is_null())
          fail(where, ": '", k, "' (rope type llama3) lacks '", lk, "'");
      const double factor = number(d["factor"], k + ".factor");
      const double lo = number(d["low_freq_factor"], k + ".low_freq_factor");
      const double hi = number(d["high_freq_factor"], k + ".high_freq_factor");
      const nlohmann::json& om = d["original_max_position_embeddings"];
      if (!om.is_number_integer() || om.get<int64_t>() <= 0 || om.get<int64_t>() > (int64_t(1) << 30))
        fail(where, ": '", k, ".original_max_position_embeddings' must be a positive integer, got ", om.dump());
      if (c.rope_type == "llama3" &&
          (factor != c.rope_factor || lo != c.rope_low_freq_factor || hi != c.rope_high_freq_factor ||
           om.get<int64_t>() != c.rope_original_max_position))
        fail(where, ": 'rope_parameters' and 'rope_scaling' give different llama3 scaling");
      c.rope_type = "llama3";
      c.rope_factor = factor;
      c.rope_low_freq_factor = lo;
      c.rope_high_freq_factor = hi;
      c.rope_original_max_position = int(om.get<int64_t>());
      if (!(factor >= 1) || !(lo > 0) || !(hi > lo))
        fail(where, ": '", k, "' = ", d.dump(), ": llama3 scaling needs factor >= 1 and "
             "high_freq_factor > low_freq_factor > 0");
    }
  }
  c.rope_type = type;
  c.rope_theta = float(theta);
  if (double(c.rope_theta) != theta)
    fail(where, ": '", theta_from, "' = ", theta, " is not exact in single precision (tetrad keeps "
         "rope theta as a float)");
}

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

// The tensors of a folder: model.safetensors, or the shards listed by
// model.safetensors.index.json.
class FolderTensors {
 public:
  explicit FolderTensors(const std::string& dir) {
    const fs::path single = fs::path(dir) / "model.safetensors";
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    std::error_code ec;
    if (fs::exists(single, ec)) {
      files_.push_back(std::make_unique<SafetensorsReader>(single.string()));
    } else if (fs::exists(index, ec)) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(read_small_file(index.string()));
      } catch (const nlohmann::json::exception& ex) {
        fail("checkpoint ", dir, ": '", index.string(), "' is not valid JSON (", ex.what(), ")");
      }
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        fail("checkpoint ", dir, ": '", index.string(), "' has no object 'weight_map'");
      std::map<std::string, size_t> shard_index;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string())
          fail("checkpoint ", dir, ": weight_map entry '", it.key(), "' is not a file name");
        const std::string file = it.value().get<std::string>();
        if (file.find('/') != std::string::npos || file == ".." || file == ".")
          fail("checkpoint ", dir, ": weight_map names '", file, "', which is not a file name");
        auto [pos, added] = shard_index.emplace(file, files_.size());
        if (added) files_.push_back(std::make_unique<SafetensorsReader>((fs::path(dir) / file).string()));
      }
    } else if (fs::exists(fs::path(dir) / "pytorch_model.bin", ec)) {
      fail("checkpoint ", dir, " has only pytorch_model.bin; tetrad reads safetensors. Convert it "
           "with transformers: AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir, "
           "safe_serialization=True)");
    } else {
      fail("checkpoint ", dir, " has no model.safetensors (nor model.safetensors.index.json)");
    }
    for (const auto& f : files_)
      for (const auto& t : f->tensors()) {
        auto [it, added] = where_.emplace(t.name, f.get());
        if (!added)
          fail("checkpoint ", dir, ": tensor '", t.name, "' appears in both '",
               it->second->path(), "' and '", f->path(), "'");
      }
  }
  const SafetensorsReader* file_of(const std::string& name) const {
    auto it = where_.find(name);
    return it == where_.end() ? nullptr : it->second;
  }
  const std::map<std::string, const SafetensorsReader*>& all() const { return where_; }

 private:
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, const SafetensorsReader*> where_;
};

// Does `dir` look like something save_hf may replace?
bool replaceable_model_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  if (fs::is_empty(dir, ec)) return true;
  return fs::exists(fs::path(dir) / "config.json", ec) ||
         fs::exists(fs::path(dir) / "model.safetensors", ec);
}

}  // namespace

namespace {
nlohmann::json rope_scaling_json(const ModelConfig& c) {
  if (!c.rope_llama3()) return nullptr;
  return {{"rope_type", "llama3"},
          {"factor", c.rope_factor},
          {"low_freq_factor", c.rope_low_freq_factor},
          {"high_freq_factor", c.rope_high_freq_factor},
          {"original_max_position_embeddings", c.rope_original_max_position}};
}
nlohmann::json rope_parameters_json(const ModelConfig& c) {
  nlohmann::json p = c.rope_llama3() ? rope_scaling_json(c) : nlohmann::json{{"rope_type", "default"}};
  p["rope_theta"] = json_float(c.rope_theta);
  return p;
}
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
         // Both layouts (the rope_* fields of read_rope): transformers 4.x reads rope_theta and
         // rope_scaling, 5.x rope_parameters.
         {"rope_theta", json_float(c.rope_theta)},
         {"rope_scaling", rope_scaling_json(c)},
         {"rope_parameters", rope_parameters_json(c)},
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

namespace {

// The safetensors writer for a model folder: names, file shapes, transposition and metadata,
// shared by the in-memory and streamed writers. `params` null: every tensor is declared (its
// data comes from write_streamed's fetch, k = the tensor's table index).
SafetensorsWriter hf_writer(const ModelConfig& cfg, const ParamTable& table, const float* params,
                            const nlohmann::json& extra_metadata) {
  cfg.validate();
  TETRAD_CHECK(build_param_table(cfg).total == table.total, "parameter table does not match config");
  SafetensorsWriter w;
  for (const auto& s : table.specs) {
    if (params)
      w.add(s.name, hf_shape(s), params + s.offset, StoreDtype::F32, s.hf_transposed);
    else
      w.declare(s.name, hf_shape(s), StoreDtype::F32, s.hf_transposed);
  }
  w.set_metadata("format", "pt");  // transformers refuses safetensors files without it
  w.set_metadata("producer", "tetrad");
  if (extra_metadata.is_object()) {
    for (auto it = extra_metadata.begin(); it != extra_metadata.end(); ++it)
      w.set_metadata(it.key(), it.value().is_string() ? it.value().get<std::string>()
                                                      : it.value().dump());
  } else if (!extra_metadata.is_null()) {
    fail("save_hf: extra_metadata must be a JSON object, got ", extra_metadata.dump());
  }
  return w;
}

void write_config(const std::string& dir, const ModelConfig& cfg,
                  const nlohmann::json& extra_metadata) {
  write_file_synced((fs::path(dir) / "config.json").string(),
                    hf_config_json(cfg, extra_metadata).dump(2) + "\n");
}

}  // namespace

void write_hf_files(const std::string& dir, const ModelConfig& cfg, const ParamTable& table,
                    const float* params, const nlohmann::json& extra_metadata) {
  TETRAD_CHECK(params != nullptr || table.total == 0, "write_hf_files: null params");
  hf_writer(cfg, table, params, extra_metadata)
      .write_direct((fs::path(dir) / "model.safetensors").string());
  write_config(dir, cfg, extra_metadata);
}

void write_hf_files_streamed(const std::string& dir, const ModelConfig& cfg,
                             const ParamTable& table, const TensorSource& params,
                             const nlohmann::json& extra_metadata) {
  TETRAD_CHECK(bool(params), "write_hf_files_streamed: no params source");
  // All tensors are F32, so the writer asks for them in registration (= table) order.
  hf_writer(cfg, table, nullptr, extra_metadata)
      .write_streamed((fs::path(dir) / "model.safetensors").string(), true, params);
  write_config(dir, cfg, extra_metadata);
}

void save_hf(const std::string& dir_in, const ModelConfig& cfg, const ParamTable& table,
             const float* params, const nlohmann::json& extra_metadata) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::error_code ec;
  if (fs::exists(dir, ec) && !replaceable_model_dir(dir))
    fail("save_hf: refusing to replace '", dir,
         "': it exists and is not a model folder (no config.json or model.safetensors)");
  const fs::path parent = fs::path(dir).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) fail("cannot create directory '", parent.string(), "': ", ec.message());
  }
  std::string templ = dir + ".tmp-XXXXXX";
  if (!::mkdtemp(templ.data()))
    fail("cannot create a temporary folder beside '", dir, "': ", std::strerror(errno));
  const std::string tmp = templ;
  try {
    ::chmod(tmp.c_str(), 0755);
    write_hf_files(tmp, cfg, table, params, extra_metadata);
    fsync_dir(tmp);
    replace_dir(tmp, dir);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
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
    read_rope(j, where, c);
    c.init_std = float(r.number_or("initializer_range", 0.02));
    c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
    const std::string act = r.string_or("hidden_act", "silu");
    if (act != "silu")
      fail(where, ": hidden_act '", act, "' is not supported; tetrad's Llama uses \"silu\"");
    r.require_false("attention_bias", "tetrad's Llama has no attention biases");
    r.require_false("mlp_bias", "tetrad's Llama has no MLP biases");
    r.require_false("use_sliding_window", "tetrad's attention is full causal attention");
    if (r.has("sliding_window"))
      fail(where, ": 'sliding_window' = ", j["sliding_window"].dump(),
           " is not supported (tetrad's attention is full causal attention; expected null)");
    if (r.has("layer_types")) {
      if (!j["layer_types"].is_array())
        fail(where, ": 'layer_types' must be a list, got ", j["layer_types"].dump());
      for (const auto& t : j["layer_types"])
        if (t != "full_attention")
          fail(where, ": 'layer_types' holds ", t.dump(),
               ", which is not supported (tetrad's layers are all \"full_attention\")");
    }
    for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping", "logit_scale"})
      if (r.has(k))
        fail(where, ": '", k, "' = ", j[k].dump(), " is not supported (tetrad's Llama does not "
             "scale or cap logits; expected null)");
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
  try {
    j = nlohmann::json::parse(read_small_file(path));
  } catch (const nlohmann::json::exception& ex) {
    fail("'", path, "' is not valid JSON (", ex.what(), ")");
  }
  return parse_hf_config(j, path);
}

namespace {

// load_hf_params and load_hf_params_streamed: every check, then each tensor read straight into
// `params` (when given) or into one buffer handed to `sink`.
void load_hf_impl(const std::string& dir, const ModelConfig& expected, const ParamTable& table,
                  float* params, const TensorSink* sink) {
  TETRAD_CHECK(build_param_table(expected).total == table.total,
               "parameter table does not match config");
  const ModelConfig got = read_hf_config(dir);
  if (got.family != expected.family)
    fail("checkpoint ", dir, " is a ", family_name(got.family), " model, but the config asks for ",
         family_name(expected.family));
  if (got.tie_embeddings != expected.tie_embeddings)
    fail("checkpoint ", dir, (got.tie_embeddings ? " ties" : " does not tie"),
         " the output head to the token embedding (tie_word_embeddings = ",
         got.tie_embeddings ? "true" : "false", "), but the config asks for ",
         expected.tie_embeddings ? "tied" : "untied", " embeddings");

  FolderTensors files(dir);
  // The original GPT-2 upload names tensors without the "transformer." prefix.
  const std::string prefix = "transformer.";
  const bool strip = expected.family == Family::GPT2 &&
                     !files.file_of("transformer.wte.weight") && files.file_of("wte.weight");
  auto file_name = [&](const std::string& n) {
    return strip && n.compare(0, prefix.size(), prefix) == 0 ? n.substr(prefix.size()) : n;
  };

  // Presence and shapes first: these say most directly what does not match.
  std::vector<std::string> missing;
  std::set<std::string> used;
  for (const auto& s : table.specs) {
    const std::string name = file_name(s.name);
    const SafetensorsReader* f = files.file_of(name);
    if (!f) {
      missing.push_back(name);
      continue;
    }
    used.insert(name);
    const TensorInfo& t = f->at(name);
    if (t.shape != hf_shape(s))
      fail("checkpoint ", dir, ": tensor '", name, "' has shape ", shape_string(t.shape),
           " but this model expects ", shape_string(hf_shape(s)));
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", '" : "'") + missing[i] + "'";
    if (missing.size() > 5) list += ", ...";
    fail("checkpoint ", dir, ": ", missing.size(), " tensor(s) of this model are missing: ", list);
  }
  for (const auto& [name, f] : files.all()) {
    if (used.count(name) || is_ignored_buffer(name)) continue;
    if (name == "lm_head.weight" && expected.tie_embeddings) continue;  // tied copy
    fail("checkpoint ", dir, ": tensor '", name, "' (in '", f->path(),
         "') is not a parameter of this model");
  }

  // The fields the shapes cannot show.
  auto same = [&](const char* field, auto a, auto b) {
    if (a == b) return;
    if constexpr (std::is_floating_point_v<decltype(a)>)
      fail("checkpoint ", dir, ": config.json has ", field, " = ", float_text(a),
           " but the config asks for ", float_text(b));
    else
      fail("checkpoint ", dir, ": config.json has ", field, " = ", a, " but the config asks for ", b);
  };
  same("n_layer", got.n_layer, expected.n_layer);
  same("n_head", got.n_head, expected.n_head);
  same("n_kv_head", got.n_kv_head, expected.n_kv_head);
  same("norm_eps", got.norm_eps, expected.norm_eps);
  if (expected.family == Family::Llama) {
    same("rope_theta", got.rope_theta, expected.rope_theta);
    same("rope type", got.rope_type, expected.rope_type);
    if (expected.rope_llama3()) {
      same("rope factor", got.rope_factor, expected.rope_factor);
      same("rope low_freq_factor", got.rope_low_freq_factor, expected.rope_low_freq_factor);
      same("rope high_freq_factor", got.rope_high_freq_factor, expected.rope_high_freq_factor);
      same("rope original_max_position_embeddings", got.rope_original_max_position,
           expected.rope_original_max_position);
    }
  }
  // (Llama's max_position_embeddings bounds nothing in the weights: a shorter run is fine.)
  if (expected.family == Family::GPT2) same("max_seq", got.max_seq, expected.max_seq);

  if (params) {
    for (const auto& s : table.specs) {
      const std::string name = file_name(s.name);
      files.file_of(name)->read_float(name, params + s.offset, s.hf_transposed);
    }
    return;
  }
  int64_t largest = 0;
  for (const auto& s : table.specs) largest = std::max(largest, s.numel);
  std::vector<float> buf(static_cast<size_t>(largest));  // one tensor at a time
  for (size_t i = 0; i < table.specs.size(); ++i) {
    const ParamSpec& s = table.specs[i];
    const std::string name = file_name(s.name);
    files.file_of(name)->read_float(name, buf.data(), s.hf_transposed);
    (*sink)(i, buf.data());
  }
}

}  // namespace

void load_hf_params(const std::string& dir, const ModelConfig& expected, const ParamTable& table,
                    float* params) {
  TETRAD_CHECK(params != nullptr || table.total == 0, "load_hf_params: null params");
  // A sharded training checkpoint is read as the one-rank grid: the whole tensors.
  if (is_sharded_checkpoint(dir)) {
    load_sharded_params(dir, expected, table, params);
    return;
  }
  load_hf_impl(dir, expected, table, params, nullptr);
}

void load_hf_params_streamed(const std::string& dir, const ModelConfig& expected,
                             const ParamTable& table, const TensorSink& params) {
  TETRAD_CHECK(bool(params), "load_hf_params_streamed: no params sink");
  if (is_sharded_checkpoint(dir)) {
    std::vector<float> all(size_t(table.total));
    load_sharded_params(dir, expected, table, all.data());
    for (size_t i = 0; i < table.specs.size(); ++i) params(i, all.data() + table.specs[i].offset);
    return;
  }
  load_hf_impl(dir, expected, table, nullptr, &params);
}

}  // namespace tetrad
