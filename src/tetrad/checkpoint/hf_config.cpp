// config.json <-> ModelConfig (hf_config.hpp).
#include "tetrad/checkpoint/hf_config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

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

// Llama's rotary settings in either layout: transformers 4.x writes `rope_theta` at the top level
// and `rope_scaling` (null, or {"rope_type" (older: "type"), scaling fields}); 5.x writes
// `rope_parameters` = {"rope_type", "rope_theta", scaling fields}. Both layouts may be present;
// where they overlap they must agree. Rope types other than "default" and "llama3", and fields
// of a rope dict tetrad does not implement, are refused by name.
// `default_theta`: the family's theta where config.json gives none (transformers' default_theta:
// 10000, Mixtral's 1e6).
void read_rope(const nlohmann::json& j, const std::string& where, ModelConfig& c,
               double default_theta = 10000.0) {
  auto number = [&](const nlohmann::json& v, const std::string& key) {
    if (!v.is_number()) fail(where, ": '", key, "' must be a number, got ", v.dump());
    return v.get<double>();
  };
  bool have_theta = false;
  double theta = default_theta;
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

namespace {

// Each family's config.json, both ways: its own fields (model_type and architectures come from
// the family's description). A family is registered by an entry in kConfigFormats.
using Ids = const nlohmann::json&;
nlohmann::json gpt2_config_json(const ModelConfig& c, Ids bos, Ids eos) {
  return {{"n_embd", c.n_embd},
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
}

nlohmann::json llama_config_json(const ModelConfig& c, Ids bos, Ids eos) {
  return {{"hidden_size", c.n_embd},
          {"intermediate_size", c.ffn},
          {"num_hidden_layers", c.n_layer},
          {"num_attention_heads", c.n_head},
          {"num_key_value_heads", c.n_kv_head},
          {"head_dim", c.head_dim()},
          {"max_position_embeddings", c.max_seq},
          {"rms_norm_eps", json_float(c.norm_eps)},
          // Both layouts (the rope_* fields of read_rope): transformers 4.x reads rope_theta
          // and rope_scaling, 5.x rope_parameters.
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

// Qwen2ForCausalLM: Llama's fields less the bias switches (q, k, v biases are the
// architecture's); full attention said both ways (no sliding-window layer).
nlohmann::json qwen2_config_json(const ModelConfig& c, Ids bos, Ids eos) {
  nlohmann::json j = llama_config_json(c, bos, eos);
  for (const char* k : {"attention_bias", "mlp_bias", "pretraining_tp", "head_dim"}) j.erase(k);
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = c.n_layer;
  j["layer_types"] = std::vector<std::string>(size_t(c.n_layer), "full_attention");
  return j;
}

// Qwen3ForCausalLM: Qwen2's fields with the head width said (head_dim) and no q, k, v biases
// (attention_bias false: Qwen3's q_norm / k_norm are the architecture's).
nlohmann::json qwen3_config_json(const ModelConfig& c, Ids bos, Ids eos) {
  nlohmann::json j = qwen2_config_json(c, bos, eos);
  j["head_dim"] = c.head_dim();
  j["attention_bias"] = false;
  return j;
}

void read_gpt2_config(const nlohmann::json& j, const std::string& where, ConfigReader& r,
                      ModelConfig& c) {
  (void)j;
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
}

// The fields Llama and the families built on its block (Qwen2) share: sizes, RMSNorm, rotary
// positions, tied or untied head, SiLU gate; logit scaling and capping refused by name.
void read_llama_like_config(const nlohmann::json& j, const std::string& where, ConfigReader& r,
                            ModelConfig& c, const char* display, double default_theta = 10000.0) {
  c.n_embd = r.size("hidden_size");
  c.ffn = r.size("intermediate_size");
  c.n_layer = r.size("num_hidden_layers");
  c.n_head = r.size("num_attention_heads");
  c.n_kv_head = r.size_or("num_key_value_heads", c.n_head);
  c.vocab_size = r.size("vocab_size");
  c.max_seq = r.size("max_position_embeddings");
  c.norm_eps = float(r.number_or("rms_norm_eps", 1e-6));
  read_rope(j, where, c, default_theta);
  c.init_std = float(r.number_or("initializer_range", 0.02));
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
  const std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu")
    fail(where, ": hidden_act '", act, "' is not supported; tetrad's ", display, " uses \"silu\"");
  for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping", "logit_scale"})
    if (r.has(k))
      fail(where, ": '", k, "' = ", j[k].dump(), " is not supported (tetrad's ", display,
           " does not scale or cap logits; expected null)");
  // head_dim: the family's own width where it has one (ModelConfig::explicit_head_dim; left 0
  // when it is hidden_size / num_attention_heads anyway), else only that width.
  if (r.has("head_dim") && !j["head_dim"].is_null() &&
      (c.n_embd % c.n_head != 0 || r.integer("head_dim") != c.n_embd / c.n_head)) {
    if (!c.desc().independent_head_dim)
      fail(where, ": head_dim = ", r.integer("head_dim"), " is not supported; tetrad's ", display,
           " uses hidden_size / num_attention_heads = ", c.n_embd / c.n_head);
    c.explicit_head_dim = r.size("head_dim");
  }
}

// 'layer_types' (transformers 5 writes it), each entry one of `allowed`; the list, or empty.
std::vector<std::string> layer_types(const nlohmann::json& j, const std::string& where,
                                     const ConfigReader& r, int n_layer,
                                     std::initializer_list<const char*> allowed) {
  std::vector<std::string> types;
  if (!r.has("layer_types")) return types;
  if (!j["layer_types"].is_array())
    fail(where, ": 'layer_types' must be a list, got ", j["layer_types"].dump());
  std::string names;
  for (const char* a : allowed) names += std::string(names.empty() ? "\"" : ", \"") + a + "\"";
  for (const auto& t : j["layer_types"]) {
    bool known = false;
    for (const char* a : allowed) known = known || (t.is_string() && t.get<std::string>() == a);
    if (!known)
      fail(where, ": 'layer_types' holds ", t.dump(), ", which is not supported (expected ", names,
           ")");
    types.push_back(t.get<std::string>());
  }
  if (int(types.size()) != n_layer)
    fail(where, ": 'layer_types' has ", types.size(), " entries for ", n_layer, " layers");
  return types;
}

void read_llama_config(const nlohmann::json& j, const std::string& where, ConfigReader& r,
                       ModelConfig& c) {
  read_llama_like_config(j, where, r, c, "Llama");
  r.require_false("attention_bias", "tetrad's Llama has no attention biases");
  r.require_false("mlp_bias", "tetrad's Llama has no MLP biases");
  r.require_false("use_sliding_window", "tetrad's attention is full causal attention");
  if (r.has("sliding_window"))
    fail(where, ": 'sliding_window' = ", j["sliding_window"].dump(),
         " is not supported (tetrad's attention is full causal attention; expected null)");
  layer_types(j, where, r, c.n_layer, {"full_attention"});
}

// The sliding-window fields of Qwen2 / Qwen2.5 and Qwen3 as transformers reads them: the window is sliding_window when
// use_sliding_window is true (else none), and layer i is a sliding-window layer when
// 'layer_types' says so or, without that list, when there is a window and i >= max_window_layers.
// Such a layer computes what full attention does only when the window covers every position
// (sliding_window >= max_position_embeddings); otherwise it is refused, naming the fields (as a
// sliding layer without a window, which transformers refuses too). Published Qwen2.5 folders
// and Qwen3 folders have use_sliding_window = false.
void read_qwen_sliding_window(const nlohmann::json& j, const std::string& where, ConfigReader& r,
                              ModelConfig& c) {
  const bool window = r.boolean_or("use_sliding_window", false) && r.has("sliding_window");
  const int max_window_layers = r.has("max_window_layers") ? int(r.integer("max_window_layers")) : 28;
  std::vector<std::string> types =
      layer_types(j, where, r, c.n_layer, {"full_attention", "sliding_attention"});
  std::string from = "layer_types";
  if (types.empty()) {
    from = "use_sliding_window = true and max_window_layers = " + std::to_string(max_window_layers);
    for (int i = 0; i < c.n_layer; ++i)
      types.push_back(window && i >= max_window_layers ? "sliding_attention" : "full_attention");
  }
  const auto first = std::find(types.begin(), types.end(), "sliding_attention");
  if (first == types.end()) return;
  const int layer = int(first - types.begin());
  if (!window)
    fail(where, ": layer ", layer, " is a sliding-window layer ('", from, "') but no window is set "
         "(use_sliding_window = ", r.boolean_or("use_sliding_window", false) ? "true" : "false",
         ", sliding_window = ", r.has("sliding_window") ? j["sliding_window"].dump() : "null", ")");
  const int64_t size = r.integer("sliding_window");
  if (size < c.max_seq)
    fail(where, ": layer ", layer, " attends through a sliding window of ", size,
         " positions ('sliding_window', with '", from, "'), which is not supported: tetrad's "
         "attention is full causal attention, the same only for a window of at least "
         "max_position_embeddings = ", c.max_seq, " (set use_sliding_window = false, or "
         "sliding_window >= ", c.max_seq, ")");
}

// Qwen2 / Qwen2.5: Llama's fields; biases on q, k, v are the architecture's (no field).
void read_qwen2_config(const nlohmann::json& j, const std::string& where, ConfigReader& r,
                       ModelConfig& c) {
  read_llama_like_config(j, where, r, c, "Qwen2");
  read_qwen_sliding_window(j, where, r, c);
}

// Qwen3: Qwen2's fields and sliding-window rules; heads head_dim wide (Qwen3Config's default,
// 128, when the field is absent); no attention biases (attention_bias = true refused: tetrad's
// Qwen3 has q_norm / k_norm and no q, k, v or o biases).
void read_qwen3_config(const nlohmann::json& j, const std::string& where, ConfigReader& r,
                       ModelConfig& c) {
  read_llama_like_config(j, where, r, c, "Qwen3");
  if (!r.has("head_dim") || j["head_dim"].is_null()) c.explicit_head_dim = 128;
  r.require_false("attention_bias", "tetrad's Qwen3 has no attention biases");
  read_qwen_sliding_window(j, where, r, c);
}

// MixtralForCausalLM: Llama's fields (no biases) with the mixture of experts: intermediate_size
// is each expert's width; top-k weights always renormalised; router jitter refused. The
// router's z-loss, capacity factor and balancing method, which transformers has no field for,
// are written under tetrad_* names (transformers keeps unknown fields) and read back.
nlohmann::json mixtral_config_json(const ModelConfig& c, Ids bos, Ids eos) {
  if (!c.norm_topk_prob)
    fail("config.json for Mixtral: norm_topk_prob = false has no Mixtral field (Mixtral always "
         "renormalises its top-k weights)");
  nlohmann::json j = llama_config_json(c, bos, eos);
  for (const char* k : {"attention_bias", "mlp_bias", "pretraining_tp"}) j.erase(k);
  j["num_local_experts"] = c.n_experts;
  j["num_experts_per_tok"] = c.experts_per_token;
  j["router_aux_loss_coef"] = json_float(c.router_aux_loss_coef);
  j["router_jitter_noise"] = 0.0;
  j["output_router_logits"] = false;
  j["sliding_window"] = nullptr;
  j["tetrad_router_z_loss_coef"] = json_float(c.router_z_loss_coef);
  j["tetrad_moe_capacity_factor"] = json_float(c.moe_capacity_factor);
  j["tetrad_moe_balance"] = c.moe_balance;
  // tetrad's own MoE parts (run checkpoints; `export` refuses them: require_hf_exportable).
  if (c.moe_expert_bias()) j["tetrad_expert_bias_rate"] = json_float(c.expert_bias_rate);
  if (c.shared_expert_ffn > 0) j["tetrad_shared_expert_ffn"] = c.shared_expert_ffn;
  return j;
}

// A sliding attention window changes nothing when it covers every position the model takes
// (max_position_embeddings); a shorter one is refused by name.
void refuse_short_window(const nlohmann::json& j, const std::string& where, const ConfigReader& r,
                         const ModelConfig& c, const char* display) {
  if (!r.has("sliding_window")) return;
  const int64_t w = r.integer("sliding_window");
  if (w < c.max_seq)
    fail(where, ": 'sliding_window' = ", j["sliding_window"].dump(), " is not supported: tetrad's ",
         display, " attends over every earlier position (full causal attention), the same as a "
         "window only when the window covers max_position_embeddings = ", c.max_seq,
         " (set sliding_window to null, or to at least ", c.max_seq, ")");
}

// The router settings transformers' MoE configs have and tetrad implements or refuses: top-k
// within the experts (checked by validate()), no router jitter, the aux coefficient.
// `shared_expert_field`: the family reads shared_expert_intermediate_size itself (Qwen2-MoE).
void read_router_config(const nlohmann::json& j, const std::string& where, ConfigReader& r,
                        ModelConfig& c, bool shared_expert_field = false) {
  c.experts_per_token = r.size("num_experts_per_tok");
  if (c.experts_per_token > c.n_experts)
    fail(where, ": num_experts_per_tok = ", c.experts_per_token, " is larger than the ",
         c.n_experts, " experts: a token cannot be routed to more experts than there are");
  c.router_aux_loss_coef = float(r.number_or("router_aux_loss_coef", 0.001));
  if (!(c.router_aux_loss_coef >= 0))
    fail(where, ": router_aux_loss_coef = ", j["router_aux_loss_coef"].dump(), " must be >= 0");
  if (r.number_or("router_jitter_noise", 0.0) != 0.0)
    fail(where, ": router_jitter_noise = ", j["router_jitter_noise"].dump(),
         " is not supported (tetrad's router adds no noise; expected 0)");
  // Router settings of other MoE families (DeepSeek's sigmoid scores, group-limited top-k,
  // scaled weights, shared experts, dense first layers; Switch's z-loss): a folder that carries
  // one at a value that would change the router is not this family's router, and is refused by
  // name rather than run with a router it does not describe.
  struct Neutral {
    const char* key;
    const char* value;  // its neutral value as JSON ("null": only null or absent)
  };
  static constexpr Neutral kOtherRouters[] = {
      {"scoring_func", "\"softmax\""}, {"topk_method", "\"greedy\""}, {"n_group", "1"},
      {"topk_group", "1"}, {"routed_scaling_factor", "1"}, {"n_shared_experts", "0"},
      {"shared_expert_intermediate_size", "0"}, {"first_k_dense_replace", "0"},
      {"moe_layer_freq", "1"}, {"router_z_loss_coef", "0"}, {"moe_capacity_factor", "0"}};
  for (const Neutral& n : kOtherRouters) {
    if (!r.has(n.key)) continue;
    if (shared_expert_field && std::string(n.key) == "shared_expert_intermediate_size") continue;
    const nlohmann::json neutral = nlohmann::json::parse(n.value);
    if (j[n.key] == neutral) continue;
    fail(where, ": '", n.key, "' = ", j[n.key].dump(), " is a router setting tetrad does not "
         "implement for this family (expected ", neutral.dump(), " or no field; tetrad's router "
         "is a softmax over every expert, then the top k, without shared experts",
         std::string(n.key) == "router_z_loss_coef" ? "; its z-loss is 'tetrad_router_z_loss_coef'"
         : std::string(n.key) == "moe_capacity_factor" ? "; its capacity factor is "
                                                          "'tetrad_moe_capacity_factor'" : "",
         ")");
  }
  c.router_z_loss_coef = float(r.number_or("tetrad_router_z_loss_coef", 0.0));
  c.moe_capacity_factor = float(r.number_or("tetrad_moe_capacity_factor", 0.0));
  c.moe_balance = r.string_or("tetrad_moe_balance", "aux_loss");
  c.expert_bias_rate = float(r.number_or("tetrad_expert_bias_rate", 0.001));
  c.shared_expert_ffn = int(r.number_or("tetrad_shared_expert_ffn", 0.0));
}

void read_mixtral_config(const nlohmann::json& j, const std::string& where, ConfigReader& r,
                         ModelConfig& c) {
  read_llama_like_config(j, where, r, c, "Mixtral", /*default_theta=*/1e6);
  r.require_false("attention_bias", "tetrad's Mixtral has no attention biases");
  c.n_experts = r.size("num_local_experts");
  if (r.has("num_experts") && r.integer("num_experts") != c.n_experts)
    fail(where, ": num_experts = ", j["num_experts"].dump(), " disagrees with num_local_experts = ",
         c.n_experts);
  read_router_config(j, where, r, c);
  refuse_short_window(j, where, r, c, "Mixtral");
  layer_types(j, where, r, c.n_layer, {"full_attention"});
  c.norm_topk_prob = true;  // Mixtral always renormalises its top-k weights
}

// The MoE fields the Qwen MoE configs share (Qwen2MoeConfig, Qwen3MoeConfig): the experts'
// count, width and top k, the top-k renormalisation (norm_topk_prob, default false), every layer
// sparse; tetrad's own router settings under tetrad_* names as Mixtral's.
void qwen_moe_fields_json(const ModelConfig& c, nlohmann::json& j) {
  j["num_experts"] = c.n_experts;
  j["moe_intermediate_size"] = c.ffn;
  j["num_experts_per_tok"] = c.experts_per_token;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = nlohmann::json::array();
  j["router_aux_loss_coef"] = json_float(c.router_aux_loss_coef);
  j["output_router_logits"] = false;
  j["tetrad_router_z_loss_coef"] = json_float(c.router_z_loss_coef);
  j["tetrad_moe_capacity_factor"] = json_float(c.moe_capacity_factor);
  j["tetrad_moe_balance"] = c.moe_balance;
  if (c.moe_expert_bias()) j["tetrad_expert_bias_rate"] = json_float(c.expert_bias_rate);
}

// Qwen2MoeForCausalLM: Qwen2's fields (q, k, v biases: qkv_bias) with the experts and the shared
// expert. intermediate_size is the width of a dense layer's MLP, which tetrad's model has none
// of (every layer sparse): written as the experts' width.
nlohmann::json qwen2_moe_config_json(const ModelConfig& c, Ids bos, Ids eos) {
  nlohmann::json j = qwen2_config_json(c, bos, eos);
  qwen_moe_fields_json(c, j);
  j["qkv_bias"] = true;
  j["shared_expert_intermediate_size"] = c.shared_expert_ffn;
  return j;
}

// Qwen3MoeForCausalLM: Qwen3's fields (head_dim, no attention bias) with the experts; a shared
// expert is tetrad's own (tetrad_shared_expert_ffn, as Mixtral's).
nlohmann::json qwen3_moe_config_json(const ModelConfig& c, Ids bos, Ids eos) {
  nlohmann::json j = qwen3_config_json(c, bos, eos);
  qwen_moe_fields_json(c, j);
  if (c.shared_expert_ffn > 0) j["tetrad_shared_expert_ffn"] = c.shared_expert_ffn;
  return j;
}

// The experts of a Qwen MoE config.json: num_experts (transformers 5 writes it as
// num_local_experts; both must agree), moe_intermediate_size each expert's width, the router
// (norm_topk_prob default false); every layer sparse (decoder_sparse_step 1, mlp_only_layers
// empty), else refused by name: tetrad's layers are all of one kind.
void read_qwen_moe_fields(const nlohmann::json& j, const std::string& where, ConfigReader& r,
                          ModelConfig& c, bool shared_expert_field) {
  if (!r.has("num_experts") && !r.has("num_local_experts")) fail(where, ": missing field 'num_experts'");
  c.n_experts = r.has("num_experts") ? r.size("num_experts") : r.size("num_local_experts");
  if (r.has("num_experts") && r.has("num_local_experts") &&
      r.integer("num_local_experts") != c.n_experts)
    fail(where, ": num_local_experts = ", j["num_local_experts"].dump(),
         " disagrees with num_experts = ", c.n_experts);
  c.ffn = r.size("moe_intermediate_size");
  read_router_config(j, where, r, c, shared_expert_field);
  c.norm_topk_prob = r.boolean_or("norm_topk_prob", false);
  if (r.has("decoder_sparse_step") && r.integer("decoder_sparse_step") != 1)
    fail(where, ": decoder_sparse_step = ", j["decoder_sparse_step"].dump(), " is not supported: "
         "tetrad's ", c.desc().display, " has a mixture of experts in every layer (expected 1)");
  if (r.has("mlp_only_layers") &&
      (!j["mlp_only_layers"].is_array() || !j["mlp_only_layers"].empty()))
    fail(where, ": mlp_only_layers = ", j["mlp_only_layers"].dump(), " is not supported: tetrad's ",
         c.desc().display, " has a mixture of experts in every layer (expected [])");
}

void read_qwen2_moe_config(const nlohmann::json& j, const std::string& where, ConfigReader& r,
                           ModelConfig& c) {
  read_llama_like_config(j, where, r, c, "Qwen2-MoE");
  if (!r.boolean_or("qkv_bias", true))
    fail(where, ": qkv_bias = false is not supported (tetrad's Qwen2-MoE has biases on q, k and v, "
         "as every published Qwen2-MoE)");
  read_qwen_sliding_window(j, where, r, c);
  read_qwen_moe_fields(j, where, r, c, /*shared_expert_field=*/true);
  c.shared_expert_ffn = r.size("shared_expert_intermediate_size");
}

// Qwen3-MoE: Qwen3's attention fields, but heads hidden_size / num_attention_heads wide when
// head_dim is absent (Qwen3MoeConfig has no head_dim default of its own).
void read_qwen3_moe_config(const nlohmann::json& j, const std::string& where, ConfigReader& r,
                           ModelConfig& c) {
  read_llama_like_config(j, where, r, c, "Qwen3-MoE");
  r.require_false("attention_bias", "tetrad's Qwen3-MoE has no attention biases");
  read_qwen_sliding_window(j, where, r, c);
  read_qwen_moe_fields(j, where, r, c, /*shared_expert_field=*/false);
}

struct ConfigFormat {
  Family family;
  nlohmann::json (*write)(const ModelConfig&, Ids bos, Ids eos);
  void (*read)(const nlohmann::json&, const std::string& where, ConfigReader&, ModelConfig&);
};
constexpr ConfigFormat kConfigFormats[] = {
    {Family::GPT2, gpt2_config_json, read_gpt2_config},
    {Family::Llama, llama_config_json, read_llama_config},
    {Family::Qwen2, qwen2_config_json, read_qwen2_config},
    {Family::Qwen3, qwen3_config_json, read_qwen3_config},
    {Family::Mixtral, mixtral_config_json, read_mixtral_config},
    {Family::Qwen2Moe, qwen2_moe_config_json, read_qwen2_moe_config},
    {Family::Qwen3Moe, qwen3_moe_config_json, read_qwen3_moe_config},
};

const ConfigFormat& config_format(Family f) {
  for (const ConfigFormat& k : kConfigFormats)
    if (k.family == f) return k;
  fail("model family '", family_name(f), "' has no Hugging Face config format");
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
  nlohmann::json j = config_format(c.family).write(c, bos, eos);
  j["architectures"] = nlohmann::json::array({c.desc().hf_architecture});
  j["model_type"] = c.desc().hf_model_type;
  return j;
}

ModelConfig parse_hf_config(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail(where, ": expected a JSON object");
  ConfigReader r{j, where};
  if (!r.has("model_type")) fail(where, ": missing field 'model_type'");
  const std::string type = r.string_or("model_type", "");
  ModelConfig c;
  const FamilyDesc* family = nullptr;
  std::string known;
  for (const FamilyDesc& d : families()) {
    if (type == d.hf_model_type) family = &d;
    known += std::string(known.empty() ? "" : &d == &families().back() ? " or " : ", ") + "\"" +
             d.hf_model_type + "\"";
  }
  if (!family) fail(where, ": model_type '", type, "' is not supported; expected ", known);
  c.family = family->id;
  config_format(c.family).read(j, where, r, c);
  try {
    c.validate();
  } catch (const Error& e) {
    fail(where, ": inconsistent sizes: ", e.what());
  }
  return c;
}

ModelConfig read_hf_config(const std::string& dir) {
  refuse_unfinished(dir);  // what an interrupted export or import left is no model
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

void require_hf_exportable(const ModelConfig& c) {
  if (c.moe() && c.shared_expert_ffn > 0 && !c.desc().hf_shared_expert)
    fail("export: model.shared_expert_ffn = ", c.shared_expert_ffn, ": a Hugging Face ",
         c.desc().display, " has no shared expert (transformers would drop its weights); tetrad's "
         "own run checkpoints save and resume it");
  if (c.moe() && c.shared_expert_ffn == 0 && c.desc().hf_shared_expert)
    fail("export: model.shared_expert_ffn = 0: a Hugging Face ", c.desc().display, " has a shared "
         "expert with its gate in every layer (shared_expert_intermediate_size); train the model "
         "with one, or keep it in tetrad's run checkpoints");
  if (c.moe() && c.moe_expert_bias())
    fail("export: model.moe_balance = \"", c.moe_balance, "\": a Hugging Face ", c.desc().display,
         " has no expert bias (its router would choose other experts than the trained model's); "
         "tetrad's own run checkpoints save and resume it");
}

}  // namespace tetrad
