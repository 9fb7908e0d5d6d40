// `tetrad export`: a run's latest checkpoint (or a checkpoint) as a Hugging Face folder, with its
// tokenizer. The folder is built beside --out and renamed into place when complete; --out inside
// a run folder, or over an existing model folder without --overwrite, is refused
// (checkpoint/output_path.hpp).
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/command.hpp"
#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/hf_config.hpp"
#include "tetrad/checkpoint/output_path.hpp"
#include "tetrad/core/signals.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/train/memory_check.hpp"

namespace fs = std::filesystem;

namespace tetrad::cli {

namespace {

struct Options {
  std::string model_dir, out;
  bool overwrite = false;
};

void run(Context& ctx, const Options& o) {
  const AbandonOnSignal stop("export");  // SIGINT/SIGTERM: the unfinished output goes
  check_reader_output(o.out, o.overwrite, true, "export", "--out");
  // Replaced only if it was there when checked (empty, or --overwrite): an --out that appears
  // meanwhile (another export) is refused when publishing, never replaced.
  std::error_code exists_ec;
  const bool existed = fs::exists(o.out, exists_ec);
  const std::string dir = ctx.resolve_model_dir(o.model_dir);
  const ModelConfig mc = read_hf_config(dir);
  require_hf_exportable(mc);
  check_model_fits_host(mc, dir, "export", 1);
  const ParamTable table = build_param_table(mc);
  std::vector<float> params(size_t(table.total));
  load_hf_params(dir, mc, table, params.data());
  // The tokenizer goes along, so the folder is complete for AutoTokenizer; its BOS/EOS ids go
  // into config.json.
  const std::string tok_file = data::find_tokenizer_file(dir);
  nlohmann::json extra = nlohmann::json::object();
  std::optional<data::Tokenizer> tok;
  if (!tok_file.empty()) {
    tok.emplace(data::Tokenizer::load(tok_file));
    if (tok->bos_id() >= 0) extra["bos_token_id"] = tok->bos_id();
    if (tok->eos_id() >= 0) extra["eos_token_id"] = tok->eos_id();
  }
  check_abandon(o.out);
  const std::string tmp = make_temp_sibling(o.out, "export");
  try {
    write_hf_files(tmp, mc, table, params.data(), extra);
    if (tok) data::write_hf_tokenizer_files(*tok, tmp, mc.max_seq);
    fsync_dir(tmp);
    check_abandon();
    seal_temp_sibling(tmp);
    if (existed) replace_dir(tmp, o.out);  // checked: empty, or --overwrite
    else publish_new_dir(tmp, o.out);
  } catch (...) {
    abandon_temp_sibling(tmp, o.out);
  }
  if (!tok) std::cerr << "tetrad: warning: " << dir << " has no tokenizer; the exported folder has none\n";
  std::cout << "exported " << dir << " -> " << o.out << "\n";
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("-m,--model", o->model_dir, "run folder or checkpoint")->required();
  sub.add_option("-o,--out", o->out,
                 "output folder (not inside a run folder; an existing model folder is replaced "
                 "only with --overwrite)")->required();
  sub.add_flag("--overwrite", o->overwrite, "replace an existing model folder at --out");
  return [o](Context& ctx) { run(ctx, *o); };
}

}  // namespace

const Command export_command{"export", "copy a run's latest checkpoint as a Hugging Face folder",
                             true, &setup};

}  // namespace tetrad::cli
