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
#include "tetrad/checkpoint/safetensors.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/json.hpp"

namespace fs = std::filesystem;

namespace tetrad {
namespace {

std::vector<int64_t> hf_shape(const ParamSpec& s) {
  if (!s.hf_transposed) return s.shape;
  TETRAD_CHECK(s.shape.size() == 2, s.name);
  return {s.shape[1], s.shape[0]};
}

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
        check_json_depth(text, "'" + index.string() + "'");
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



void require_hf_tensor_layout(const ModelConfig& c, const std::string& what) {
  if (c.moe())
    fail(what, ": Hugging Face ", c.desc().display, " folders (each expert's tensors, "
         "block_sparse_moe.experts.N.w1 / w2 / w3) are not implemented yet; tetrad's own run "
         "checkpoints of a ", c.desc().display, " model save and resume");
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
  // Some uploads name every tensor without the family's prefix (the original GPT-2's
  // "transformer."): recognised by the table's first tensor.
  const std::string prefix = expected.desc().hf_optional_prefix;
  const std::string& first = table.specs.front().name;
  const bool strip = !prefix.empty() && first.starts_with(prefix) && !files.file_of(first) &&
                     files.file_of(first.substr(prefix.size()));
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
    if (name == expected.desc().hf_tied_head && expected.tie_embeddings) continue;  // tied copy
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
