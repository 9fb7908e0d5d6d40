#include "tetrad/data/tokenizer.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <system_error>
#include <vector>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/safetensors.hpp"
#include "tetrad/checkpoint/sharded.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/hash.hpp"

namespace fs = std::filesystem;

namespace tetrad {
namespace {

constexpr const char* kFilesKey = "checkpoint_files";  // reserved key in TrainerState::info
const char* const kRequired[] = {"config.json", "model.safetensors", "trainer_state.bin"};

// The step of a complete checkpoint folder name "step_<digits>", or -1.
int64_t parse_step_name(const std::string& name) {
  const std::string p = "step_";
  if (name.size() <= p.size() || name.compare(0, p.size(), p) != 0 || name.size() > p.size() + 18)
    return -1;
  int64_t v = 0;
  for (size_t i = p.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

struct StepDir {
  int64_t step;
  std::string name;
};

// Complete (renamed-into-place) checkpoint folders, newest first.
std::vector<StepDir> list_step_dirs(const fs::path& ckdir) {
  std::vector<StepDir> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(ckdir, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t step = parse_step_name(name);
    if (step >= 0 && e.is_directory(ec)) out.push_back({step, name});
  }
  std::sort(out.begin(), out.end(), [](const StepDir& a, const StepDir& b) { return a.step > b.step; });
  return out;
}

// Leftovers of an interrupted save or prune: "step_N.tmp" folders, "*.tmp-XXXXXX" files and
// folders from atomic writes, "*.old-PID" folders from a replace without atomic exchange,
// "step_N.pruning" folders a prune renamed before deleting them.
bool is_leftover(const std::string& name) {
  return (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) ||
         name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos ||
         name.find(".pruning") != std::string::npos;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

void remove_tree(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) fail("cannot remove '", p.string(), "': ", ec.message());
}

}  // namespace

std::string checkpoint_folder_name(int64_t step) {
  TETRAD_CHECK(step >= 0, "negative step ", step);
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%06lld", static_cast<long long>(step));
  return buf;
}

void publish_checkpoint(const std::string& run_dir, int64_t step, int keep_last, bool prune) {
  const fs::path ckdir = fs::path(run_dir) / "checkpoints";
  const std::string name = checkpoint_folder_name(step);
  write_file_atomic((ckdir / "latest").string(), name + "\n");
  if (prune) prune_checkpoints(run_dir, step, keep_last);
}

std::optional<bool> checkpoint_healthy(const std::string& dir) {
  std::error_code ec;
  try {
    nlohmann::json rec;
    if (is_sharded_checkpoint(dir)) {
      rec = read_sharded_meta(dir).value("extra", nlohmann::json::object());
    } else if (fs::exists(fs::path(dir) / "trainer_state.bin", ec)) {
      rec = verify_trainer_state((fs::path(dir) / "trainer_state.bin").string()).info;
    } else {
      return std::nullopt;
    }
    if (!rec.is_object() || !rec.contains("healthy") || !rec["healthy"].is_boolean())
      return std::nullopt;
    return rec["healthy"].get<bool>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void prune_checkpoints(const std::string& run_dir, int64_t step, int keep_last) {
  const fs::path ckdir = fs::path(run_dir) / "checkpoints";
  // Prune: later steps belong to an abandoned timeline; of the earlier ones keep keep_last - 1,
  // and besides them the newest healthy one when none of the kept ones is (a diverged run must
  // not prune away the last checkpoint worth resuming from). Unknown health (checkpoints written
  // before it was recorded) counts as healthy.
  const std::vector<StepDir> dirs = list_step_dirs(ckdir);
  std::vector<const StepDir*> drop;
  bool kept_healthy = checkpoint_healthy((ckdir / checkpoint_folder_name(step)).string()).value_or(true);
  int kept = 1;
  for (const auto& d : dirs) {
    if (d.step == step) continue;
    if (d.step > step) {
      drop.push_back(&d);
    } else if (keep_last > 0 && checkpoint_problem((ckdir / d.name).string())) {
      // A folder no resume can use (half-deleted by an older tetrad's prune, damaged) must not
      // take the place of a usable one among the kept.
      drop.push_back(&d);
    } else if (keep_last > 0 && kept >= keep_last) {
      if (!kept_healthy && checkpoint_healthy((ckdir / d.name).string()).value_or(true)) {
        kept_healthy = true;  // the last healthy one stays
        continue;
      }
      drop.push_back(&d);
    } else {
      ++kept;
      if (checkpoint_healthy((ckdir / d.name).string()).value_or(true)) kept_healthy = true;
    }
  }
  // Each folder first renamed out of the step_* namespace (one atomic rename: no reader or
  // resume ever sees a half-deleted checkpoint), then deleted; a kill in between leaves a
  // "*.pruning" folder that the next trainer removes (clean_run_folder).
  for (const StepDir* d : drop) {
    const fs::path gone = ckdir / (d->name + ".pruning");
    remove_tree(gone);
    std::error_code ec;
    fs::rename(ckdir / d->name, gone, ec);
    if (ec) fail("cannot rename '", (ckdir / d->name).string(), "' to prune it: ", ec.message());
  }
  if (!drop.empty()) fsync_dir(ckdir.string());
  for (const StepDir* d : drop) remove_tree(ckdir / (d->name + ".pruning"));
  fsync_dir(ckdir.string());
}

std::vector<int64_t> checkpoint_steps(const std::string& run_dir) {
  std::vector<int64_t> out;
  for (const auto& d : list_step_dirs(fs::path(run_dir) / "checkpoints")) out.push_back(d.step);
  return out;
}

void clean_run_folder(const std::string& run_dir, std::ostream& log) {
  const fs::path ckdir = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(ckdir, ec)) return;
  for (const auto& e : fs::directory_iterator(ckdir, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_leftover(name)) continue;
    log << "checkpoint: removing " << e.path().string()
        << (name.find(".pruning") != std::string::npos ? ", left by an interrupted prune\n"
                                                        : ", left by an interrupted save\n");
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (rm) fail("cannot remove '", e.path().string(), "': ", rm.message());
  }
}

namespace {

// The save behind both forms. write_model(tmp) writes model.safetensors and config.json into the
// folder; write_state(path, info) writes trainer_state.bin with the given info.
std::string save_run_checkpoint_impl(
    const std::string& run_dir, int64_t step, const nlohmann::json& state_info,
    const CheckpointOptions& opts, const std::function<void(const std::string&)>& write_model,
    const std::function<void(const std::string&, const nlohmann::json&)>& write_state) {
  if (!state_info.is_object() && !state_info.is_null())
    fail("save_run_checkpoint: TrainerState::info must be a JSON object, got ", state_info.dump());
  if (state_info.is_object() && state_info.contains(kFilesKey))
    fail("save_run_checkpoint: TrainerState::info key '", kFilesKey, "' is reserved");

  const fs::path ckdir = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  fs::create_directories(ckdir, ec);
  if (ec) fail("cannot create '", ckdir.string(), "': ", ec.message());
  const std::string name = checkpoint_folder_name(step);
  const fs::path final_dir = ckdir / name, tmp = ckdir / (name + ".tmp");
  remove_tree(tmp);
  fs::create_directory(tmp, ec);
  if (ec) fail("cannot create '", tmp.string(), "': ", ec.message());

  try {
    write_model(tmp.string());
    if (!opts.tokenizer_path.empty())
      data::copy_tokenizer_files(opts.tokenizer_path, tmp.string(),
                                 [](const std::string& a, const std::string& b) { copy_file_synced(a, b); });

    // trainer_state.bin last: it records the hashes of everything else in the folder.
    nlohmann::json files = nlohmann::json::object();
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.model", "tokenizer.json",
                          "tokenizer_config.json", "special_tokens_map.json"})
      if (fs::exists(tmp / f, ec)) files[f] = hex64(hash_file((tmp / f).string()));
    nlohmann::json info = state_info.is_object() ? state_info : nlohmann::json::object();
    info[kFilesKey] = files;
    write_state((tmp / "trainer_state.bin").string(), info);
    fsync_dir(tmp.string());
    replace_dir(tmp.string(), final_dir.string());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  publish_checkpoint(run_dir, step, opts.keep_last);
  return final_dir.string();
}

std::vector<int64_t> tensor_sizes(const ParamTable& table) {
  std::vector<int64_t> v;
  for (const auto& s : table.specs) v.push_back(s.numel);
  return v;
}

}  // namespace

std::string save_run_checkpoint(const std::string& run_dir, const ModelConfig& cfg,
                                const ParamTable& table, const float* params,
                                const TrainerState& state, const CheckpointOptions& opts) {
  TETRAD_CHECK(state.adam_m.size() == state.adam_v.size());
  return save_run_checkpoint_impl(
      run_dir, state.step, state.info, opts,
      [&](const std::string& dir) {
        write_hf_files(dir, cfg, table, params, opts.extra_metadata);
      },
      [&](const std::string& path, const nlohmann::json& info) {
        save_trainer_state(path, state.step, state.rng_state, info, state.adam_m.data(),
                           state.adam_v.data(), state.adam_m.size());
      });
}

std::string save_run_checkpoint_streamed(const std::string& run_dir, const ModelConfig& cfg,
                                         const ParamTable& table, const TensorSource& params,
                                         const TensorSource& adam_m, const TensorSource& adam_v,
                                         int64_t step, const std::vector<uint64_t>& rng_state,
                                         const nlohmann::json& info,
                                         const CheckpointOptions& opts) {
  TETRAD_CHECK(params && adam_m && adam_v, "save_run_checkpoint_streamed: missing source");
  return save_run_checkpoint_impl(
      run_dir, step, info, opts,
      [&](const std::string& dir) {
        write_hf_files_streamed(dir, cfg, table, params, opts.extra_metadata);
      },
      [&](const std::string& path, const nlohmann::json& full_info) {
        save_trainer_state_streamed(path, step, rng_state, full_info, tensor_sizes(table), adam_m,
                                    adam_v);
      });
}

std::optional<std::string> checkpoint_problem(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "the folder does not exist";
  // A sharded checkpoint (meta.json), or a folder of one whose meta.json is gone.
  if (is_sharded_checkpoint(dir)) return sharded_checkpoint_problem(dir);
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().starts_with("shard_"))
      return std::string(kShardedMetaFile) + " is missing (shard files without their metadata)";
  for (const char* f : kRequired)
    if (!fs::exists(fs::path(dir) / f, ec)) return std::string(f) + " is missing";
  try {
    const TrainerState s = verify_trainer_state((fs::path(dir) / "trainer_state.bin").string());
    if (!s.info.is_object() || !s.info.contains(kFilesKey) || !s.info[kFilesKey].is_object())
      return "trainer_state.bin records no file hashes (not written by save_run_checkpoint)";
    for (auto it = s.info[kFilesKey].begin(); it != s.info[kFilesKey].end(); ++it) {
      const fs::path p = fs::path(dir) / it.key();
      if (!fs::exists(p, ec)) return it.key() + " is missing";
      const std::string h = hex64(hash_file(p.string()));
      if (!it.value().is_string() || h != it.value().get<std::string>())
        return it.key() + ": content hash " + h + " differs from the one recorded in "
               "trainer_state.bin (" + it.value().dump() + ")";
    }
    read_hf_config(dir);
    SafetensorsReader check((fs::path(dir) / "model.safetensors").string());
  } catch (const Error& e) {
    return e.what();
  }
  return std::nullopt;
}

std::optional<FoundCheckpoint> find_latest_checkpoint(const std::string& run_dir, std::ostream& log) {
  std::vector<FoundCheckpoint> all = resume_candidates(run_dir, log, /*first_only=*/true);
  if (all.empty()) return std::nullopt;
  return all.front();
}

std::vector<FoundCheckpoint> resume_candidates(const std::string& run_dir, std::ostream& log,
                                               bool first_only) {
  std::vector<FoundCheckpoint> found;
  const fs::path ckdir = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(ckdir, ec)) return found;

  const std::vector<StepDir> dirs = list_step_dirs(ckdir);
  std::vector<std::string> rejected;
  std::string tried;
  const fs::path latest = ckdir / "latest";
  const bool has_latest = fs::exists(latest, ec);
  if (has_latest) {
    const std::string name = trim(read_small_file(latest.string()));
    std::optional<std::string> problem;
    if (parse_step_name(name) < 0) {
      problem = "it is not a checkpoint folder name";
    } else {
      problem = checkpoint_problem((ckdir / name).string());
      tried = name;
      if (!problem) {
        found.push_back(FoundCheckpoint{(ckdir / name).string(), parse_step_name(name)});
        if (first_only) return found;
      }
    }
    if (problem) {
      log << "checkpoint: " << latest.string() << " names '" << name << "', which cannot be used: "
          << *problem << "\n";
      rejected.push_back(name + ": " + *problem);
    }
  } else if (!dirs.empty()) {
    log << "checkpoint: " << latest.string() << " is missing; looking for the newest valid "
        << "checkpoint\n";
  }

  for (const auto& d : dirs) {
    if (d.name == tried) continue;
    const std::string path = (ckdir / d.name).string();
    if (auto problem = checkpoint_problem(path)) {
      log << "checkpoint: skipping " << path << ": " << *problem << "\n";
      rejected.push_back(d.name + ": " + *problem);
      continue;
    }
    if (found.empty()) log << "checkpoint: resuming from " << path << ", the newest valid checkpoint\n";
    found.push_back(FoundCheckpoint{path, d.step});
    if (first_only) return found;
  }
  if (!found.empty() || rejected.empty()) return found;
  std::string why;
  for (const auto& r : rejected) why += "\n  " + r;
  fail("no valid checkpoint in ", ckdir.string(), ":", why,
       "\n(delete that folder, or point the run at a new run directory, to start afresh)");
}

TrainerState load_run_checkpoint_streamed(const std::string& dir, const ModelConfig& cfg,
                                          const ParamTable& table, const TensorSink& params,
                                          const TensorSink& adam_m, const TensorSink& adam_v) {
  TETRAD_CHECK(params && adam_m && adam_v, "load_run_checkpoint_streamed: missing sink");
  // Verifies the trainer state's checksum and the recorded hashes before any sink runs.
  if (auto problem = checkpoint_problem(dir)) fail("checkpoint ", dir, " is damaged: ", *problem);
  load_hf_params_streamed(dir, cfg, table, params);
  TrainerState s = load_trainer_state_streamed((fs::path(dir) / "trainer_state.bin").string(),
                                               tensor_sizes(table), adam_m, adam_v,
                                               /*already_verified=*/true);
  if (s.info.is_object()) s.info.erase(kFilesKey);
  return s;
}

TrainerState load_run_checkpoint(const std::string& dir, const ModelConfig& cfg,
                                 const ParamTable& table, float* params) {
  std::vector<float> m(size_t(table.total)), v(size_t(table.total));
  auto into = [&](float* base) {
    return [&table, base](size_t i, const float* data) {
      const ParamSpec& s = table.specs[i];
      std::memcpy(base + s.offset, data, size_t(s.numel) * sizeof(float));
    };
  };
  TrainerState s = load_run_checkpoint_streamed(dir, cfg, table, into(params), into(m.data()),
                                                into(v.data()));
  s.adam_m = std::move(m);
  s.adam_v = std::move(v);
  return s;
}

}  // namespace tetrad
