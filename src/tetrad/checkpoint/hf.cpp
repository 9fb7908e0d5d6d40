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
#include "tetrad/checkpoint/hf_config.hpp"
#include "tetrad/checkpoint/hf_tensors.hpp"
#include "tetrad/checkpoint/safetensors.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/json.hpp"

namespace fs = std::filesystem;

namespace tetrad {
namespace {

// Buffers HF models carry in their state dicts that are not parameters (any family's: a folder
// of another family is refused by its config before its tensors are read).
bool is_ignored_buffer(const std::string& name) {
  for (const FamilyDesc& f : families())
    for (const char* suffix : f.hf_ignored_buffers)
      if (name.ends_with(suffix)) return true;
  return false;
}


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
        const std::string text = read_small_file(index.string());
        check_json_depth(text, detail::concat("'", index.string(), "'"));
        j = nlohmann::json::parse(text);
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

// The tensors a folder holds, in table order: each parameter's first layout (hf_tensors.hpp),
// with the index of its parameter.
struct WrittenPiece {
  size_t spec;
  HfPiece piece;
};
std::vector<WrittenPiece> written_pieces(const ModelConfig& cfg, const ParamTable& table) {
  std::vector<WrittenPiece> v;
  for (size_t i = 0; i < table.specs.size(); ++i) {
    std::vector<HfLayout> layouts = hf_layouts(cfg, table.specs[i]);
    for (HfPiece& p : layouts.front()) v.push_back({i, std::move(p)});
  }
  return v;
}

// The safetensors writer for a model folder: names, file shapes, transposition and metadata,
// shared by the in-memory and streamed writers. `params` null: every tensor is declared (its
// data comes from write_streamed's fetch, k = the piece's index in `pieces`).
SafetensorsWriter hf_writer(const ModelConfig& cfg, const ParamTable& table, const float* params,
                            const std::vector<WrittenPiece>& pieces,
                            const nlohmann::json& extra_metadata) {
  cfg.validate();
  TETRAD_CHECK(build_param_table(cfg).total == table.total, "parameter table does not match config");
  SafetensorsWriter w;
  for (const auto& [i, p] : pieces) {
    if (params)
      w.add(p.name, p.shape, params + table.specs[i].offset + p.offset, StoreDtype::F32,
            p.transposed);
    else
      w.declare(p.name, p.shape, StoreDtype::F32, p.transposed);
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
  hf_writer(cfg, table, params, written_pieces(cfg, table), extra_metadata)
      .write_direct((fs::path(dir) / "model.safetensors").string());
  write_config(dir, cfg, extra_metadata);
}

void write_hf_files_streamed(const std::string& dir, const ModelConfig& cfg,
                             const ParamTable& table, const TensorSource& params,
                             const nlohmann::json& extra_metadata) {
  TETRAD_CHECK(bool(params), "write_hf_files_streamed: no params source");
  // All tensors are F32, so the writer asks for them in registration (= table) order: each
  // parameter is fetched once, in table order, and its pieces (an expert each) cut from it.
  const std::vector<WrittenPiece> pieces = written_pieces(cfg, table);
  std::vector<float> held;
  size_t held_spec = table.specs.size();
  auto fetch = [&](size_t k, float* out) {
    const auto& [i, p] = pieces[k];
    const ParamSpec& s = table.specs[i];
    if (p.offset == 0 && p.numel == s.numel) return params(i, out);
    if (held_spec != i) {
      held.resize(size_t(s.numel));
      params(i, held.data());
      held_spec = i;
    }
    std::copy_n(held.data() + p.offset, p.numel, out);
  };
  hf_writer(cfg, table, nullptr, pieces, extra_metadata)
      .write_streamed((fs::path(dir) / "model.safetensors").string(), true, fetch);
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



namespace {

// For a message about a mixture of experts' tensor (the router's or an expert's, by its role or,
// for a tensor the model does not have, its name): the sizes config.json gives the experts.
std::string moe_sizes(const ModelConfig& c, const std::string& tensor, const ParamSpec* s) {
  const HfExpertNames* x = c.desc().hf_experts;
  if (!x) return "";
  const bool moe = s ? s->role == TensorRole::Router || s->role == TensorRole::ExpertGateUp ||
                           s->role == TensorRole::ExpertDown
                     : tensor.find(".experts.") != std::string::npos;
  if (!moe) return "";
  return " (config.json: " + std::to_string(c.n_experts) + " experts of width " +
         std::to_string(c.ffn) + ", hidden size " + std::to_string(c.n_embd) + ")";
}

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
  // Some uploads name every tensor without the family's prefix (the original GPT-2's
  // "transformer."): recognised by the table's first tensor.
  const std::string prefix = expected.desc().hf_optional_prefix;
  const std::string& first = table.specs.front().name;
  const bool strip = !prefix.empty() && first.starts_with(prefix) && !files.file_of(first) &&
                     files.file_of(first.substr(prefix.size()));
  auto file_name = [&](const std::string& n) {
    return strip && n.compare(0, prefix.size(), prefix) == 0 ? n.substr(prefix.size()) : n;
  };

  // Each parameter's layout in this folder (hf_tensors.hpp): the first whose first tensor is
  // there; when none is, the layout export writes (its tensors are then named missing).
  std::vector<HfLayout> layouts;
  layouts.reserve(table.specs.size());
  for (const auto& s : table.specs) {
    std::vector<HfLayout> options = hf_layouts(expected, s);
    size_t pick = 0;
    for (size_t k = 0; k < options.size(); ++k)
      if (files.file_of(file_name(options[k].front().name))) {
        pick = k;
        break;
      }
    for (HfPiece& p : options[pick]) p.name = file_name(p.name);
    layouts.push_back(std::move(options[pick]));
  }

  // Presence and shapes first: these say most directly what does not match.
  std::vector<std::string> missing;
  const ParamSpec* first_missing = nullptr;
  std::set<std::string> used;
  for (size_t i = 0; i < layouts.size(); ++i)
    for (const HfPiece& p : layouts[i]) {
      const SafetensorsReader* f = files.file_of(p.name);
      if (!f) {
        missing.push_back(p.name);
        if (!first_missing) first_missing = &table.specs[i];
        continue;
      }
      used.insert(p.name);
      const TensorInfo& t = f->at(p.name);
      if (t.shape != p.shape)
        fail("checkpoint ", dir, ": tensor '", p.name, "' has shape ", shape_string(t.shape),
             " but this model expects ", shape_string(p.shape),
             moe_sizes(expected, p.name, &table.specs[i]));
    }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", '" : "'") + missing[i] + "'";
    if (missing.size() > 5) list += ", ...";
    fail("checkpoint ", dir, ": ", missing.size(), " tensor(s) of this model are missing: ", list,
         moe_sizes(expected, missing.front(), first_missing));
  }
  for (const auto& [name, f] : files.all()) {
    if (used.count(name) || is_ignored_buffer(name)) continue;
    if (name == expected.desc().hf_tied_head && expected.tie_embeddings) continue;  // tied copy
    fail("checkpoint ", dir, ": tensor '", name, "' (in '", f->path(),
         "') is not a parameter of this model", moe_sizes(expected, name, nullptr));
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
  const Positions positions = expected.desc().positions;
  if (positions == Positions::Rope) {
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
  if (positions == Positions::Learned) same("max_seq", got.max_seq, expected.max_seq);

  auto read = [&](size_t i, float* dst) {
    for (const HfPiece& p : layouts[i])
      files.file_of(p.name)->read_float(p.name, dst + p.offset, p.transposed);
  };
  if (params) {
    for (size_t i = 0; i < table.specs.size(); ++i) read(i, params + table.specs[i].offset);
    return;
  }
  int64_t largest = 0;
  for (const auto& s : table.specs) largest = std::max(largest, s.numel);
  std::vector<float> buf(static_cast<size_t>(largest));  // one tensor at a time
  for (size_t i = 0; i < table.specs.size(); ++i) {
    read(i, buf.data());
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
