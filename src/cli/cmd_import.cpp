// `tetrad import`: a run folder whose checkpoint (step 0, zero moments) is a Hugging Face model.
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/sharded_saver.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/model/params.hpp"

namespace fs = std::filesystem;

namespace tetrad::cli {

namespace {

struct Options {
  std::string hf, out, tokenizer;
};

void run(const Options& o) {
  const ModelConfig mc = read_hf_config(o.hf);
  const ParamTable table = build_param_table(mc);
  std::vector<float> params(size_t(table.total));
  load_hf_params(o.hf, mc, table, params.data());
  ShardedCheckpointInfo info;
  info.has_moments = false;
  std::string tok = o.tokenizer;
  if (!tok.empty() && fs::is_directory(tok)) tok = data::find_tokenizer_file(tok);
  if (tok.empty()) tok = data::find_tokenizer_file(o.hf);
  if (!tok.empty()) info.tokenizer_identity = data::Tokenizer::load(tok).identity();
  const std::string dir = save_sharded_checkpoint_serial(o.out, mc, table, params.data(), nullptr,
                                                         nullptr, info, tok, 0);
  std::cout << "imported " << o.hf << " -> " << dir << "\n";
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("--hf", o->hf, "Hugging Face folder (config.json + model.safetensors)")->required();
  sub.add_option("-o,--out", o->out, "run folder to create")->required();
  sub.add_option("--tokenizer", o->tokenizer,
                 "tokenizer file or folder to keep with it (default: the one in --hf)");
  return [o](Context&) { run(*o); };
}

}  // namespace

const Command import_command{
    "import", "make a run folder whose checkpoint (step 0, zero moments) is a Hugging Face model",
    false, &setup};

}  // namespace tetrad::cli
