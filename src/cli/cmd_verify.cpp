// `tetrad verify`: check a checkpoint completely (metadata, every chunk checksum, load, tokenizer).
#include <cctype>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/checkpoint/sharded.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/hash.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/model/params.hpp"

namespace fs = std::filesystem;

namespace tetrad::cli {

namespace {

// The tokenizer kept with the checkpoint must load (generate needs it) and, where the checkpoint
// records the shards' tokenizer (`expected` != 0), be that one.
std::string verify_tokenizer(const std::string& dir, uint64_t expected) {
  const std::string path = data::find_tokenizer_file(dir);
  if (path.empty()) return "no tokenizer";
  const std::string file = fs::path(path).filename().string();
  uint64_t id = 0;
  try {
    id = data::Tokenizer::load(path).identity();
  } catch (const std::exception& e) {
    fail("checkpoint ", dir, ": ", file, " does not load (damaged?): ", e.what());
  }
  if (expected != 0 && id != expected)
    fail("checkpoint ", dir, ": ", file, " (identity ", hex64(id),
         ") is not the tokenizer the model was trained with (the checkpoint records ",
         hex64(expected), ")");
  return "tokenizer " + hex64(id) + " loads";
}

void run(Context& ctx, const std::string& model_dir) {
  std::string dir = model_dir;
  if (fs::exists(model_dir + "/checkpoints")) {
    // The run's `latest` must name a complete checkpoint: no fallback here.
    const std::string latest = model_dir + "/checkpoints/latest";
    if (!fs::exists(latest)) fail("run folder '", model_dir, "' has no checkpoints/latest");
    std::string name = read_small_file(latest);
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    dir = model_dir + "/checkpoints/" + name;
    ctx.resolved_run_checkpoint = dir;
  }
  if (!is_sharded_checkpoint(dir)) {
    if (auto problem = checkpoint_problem(dir)) fail("checkpoint ", dir, ": ", *problem);
    const std::string tok = verify_tokenizer(dir, 0);
    std::cout << "ok: " << dir << " (Hugging Face folder + trainer_state.bin) verified, " << tok << "\n";
    return;
  }
  verify_sharded_checkpoint(dir);
  const ModelConfig mc = sharded_model_config(dir);
  const ParamTable table = build_param_table(mc);
  std::vector<float> params(size_t(table.total));
  const ShardedCheckpointInfo info = load_sharded_params(dir, mc, table, params.data());
  const nlohmann::json meta = read_sharded_meta(dir);
  int64_t bytes = 0;
  for (const auto& f : meta["files"]) bytes += f["data_bytes"].get<int64_t>();
  const std::string tok = verify_tokenizer(dir, info.tokenizer_identity);
  std::cout << "ok: " << dir << " verified: step " << info.step << ", grid "
            << info.grid.to_string() << ", " << meta["files"].size() << " shard file(s), "
            << bytes << " bytes, every chunk checksum matches, loads; " << tok << "\n";
}

Runner setup(CLI::App& sub) {
  auto model_dir = std::make_shared<std::string>();
  sub.add_option("-m,--model", *model_dir, "run folder (its `latest` checkpoint) or checkpoint folder")
      ->required();
  return [model_dir](Context& ctx) { run(ctx, *model_dir); };
}

}  // namespace

const Command verify_command{
    "verify", "check a checkpoint completely: metadata, every shard's every chunk checksum, load",
    true, &setup};

}  // namespace tetrad::cli
