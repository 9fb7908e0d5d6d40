// `tetrad import`: a run folder whose checkpoint (step 0, zero moments) is a Hugging Face model.
// The run folder is built beside --out and renamed into place when complete. An existing run
// folder is replaced only with --overwrite, and never while a trainer holds its lock (the lock is
// held from the check to the swap, so no trainer starts there meanwhile).
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/finite_weights.hpp"
#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/output_path.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/checkpoint/run_lock.hpp"
#include "tetrad/checkpoint/sharded_saver.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/signals.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/train/memory_check.hpp"

namespace fs = std::filesystem;

namespace tetrad::cli {

namespace {

struct Options {
  std::string hf, out, tokenizer;
  bool overwrite = false;
};

// What stands at --out, checked before anything is read: nothing or an empty folder (fine), a run
// folder (replaced only with --overwrite, under its trainer's lock, which `lock` then holds), or
// anything else (refused).
void claim_destination(const std::string& out, bool overwrite, std::unique_ptr<RunLock>& lock) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(out, ec);
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st))
    fail("import --out '", out, "' exists and is not a folder; give a new folder for the run");
  const std::vector<int64_t> steps = checkpoint_steps(out);
  const bool empty = fs::is_empty(out, ec);
  const bool run_folder = !enclosing_run_folder(out).empty() &&
                          fs::equivalent(enclosing_run_folder(out), out, ec);
  if (!empty && !run_folder)
    fail("import --out '", out, "' is a folder that holds other things than a run (no "
         "checkpoints/ or metrics.jsonl); not replacing it, even with --overwrite. Give a new or "
         "empty folder for the run");
  if (!steps.empty() && !overwrite) {
    std::string latest = checkpoint_folder_name(steps.front());
    try {
      if (auto found = find_latest_checkpoint(out, std::cerr)) latest = fs::path(found->dir).filename().string();
    } catch (const Error&) {
    }
    fail("import --out '", out, "' already holds a trained run (", steps.size(),
         " checkpoint(s), the latest ", out, "/checkpoints/", latest,
         "); not replacing it. Give a new folder for the imported run, or pass --overwrite to "
         "replace that run (its checkpoints, metrics.jsonl and config.toml) by the import");
  }
  if (!empty && !overwrite)
    fail("import --out '", out, "' is a run folder without checkpoints; not replacing it. Give a "
         "new folder for the imported run, or pass --overwrite to replace it");
  try {
    lock = std::make_unique<RunLock>(out);
  } catch (const Error& e) {
    fail("import --out '", out, "': ", e.what());
  }
}

void run(const Options& o) {
  const AbandonOnSignal stop("import");  // SIGINT/SIGTERM: the unfinished output goes
  std::string out = o.out;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  std::unique_ptr<RunLock> lock;
  claim_destination(out, o.overwrite, lock);
  const ModelConfig mc = read_hf_config(o.hf);
  check_model_fits_host(mc, o.hf, "import", 1);
  const ParamTable table = build_param_table(mc);
  std::vector<float> params(size_t(table.total));
  load_hf_params(o.hf, mc, table, params.data());
  // Refused by the tensor's name and first bad element, before anything is written.
  for (const ParamSpec& s : table.specs)
    check_finite_weights("import --hf '" + o.hf + "'", s, params.data() + s.offset);
  ShardedCheckpointInfo info;
  info.has_moments = false;
  std::string tok = o.tokenizer;
  if (!tok.empty() && fs::is_directory(tok)) tok = data::find_tokenizer_file(tok);
  if (tok.empty()) tok = data::find_tokenizer_file(o.hf);
  if (!tok.empty()) info.tokenizer_identity = data::Tokenizer::load(tok).identity();
  check_abandon(out);
  const std::string tmp = make_temp_sibling(out, "import");
  std::string dir;
  try {
    dir = save_sharded_checkpoint_serial(tmp, mc, table, params.data(), nullptr, nullptr, info,
                                         tok, 0);
    fsync_dir(tmp);
    check_abandon();
    seal_temp_sibling(tmp);
    if (lock) replace_dir(tmp, out);  // the old run folder (with our lock file) goes
    else publish_new_dir(tmp, out);
  } catch (...) {
    abandon_temp_sibling(tmp, out);
  }
  dir = (fs::path(out) / fs::path(dir).lexically_relative(tmp)).string();
  std::cout << "imported " << o.hf << " -> " << dir << "\n";
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("--hf", o->hf, "Hugging Face folder (config.json + model.safetensors)")->required();
  sub.add_option("-o,--out", o->out,
                 "run folder to create (an existing run is replaced only with --overwrite, never "
                 "while its trainer runs)")->required();
  sub.add_flag("--overwrite", o->overwrite,
               "replace the run folder at --out (its checkpoints, metrics.jsonl, config.toml)");
  sub.add_option("--tokenizer", o->tokenizer,
                 "tokenizer file or folder to keep with it (default: the one in --hf)");
  return [o](Context&) { run(*o); };
}

}  // namespace

const Command import_command{
    "import", "make a run folder whose checkpoint (step 0, zero moments) is a Hugging Face model",
    false, &setup};

}  // namespace tetrad::cli
