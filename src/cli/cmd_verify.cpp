// `tetrad verify`: check a checkpoint, a run's latest or a Hugging Face model folder completely:
// what every reader needs (config.json, which generate, eval, logits and export build the model
// from, and the tokenizer) besides the tensors (metadata, every chunk checksum, load, every value
// finite: the weights and the AdamW moments a checkpoint keeps).
#include <cctype>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/finite_weights.hpp"
#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/hf_config.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/checkpoint/sharded.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/hash.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/train/memory_check.hpp"

namespace fs = std::filesystem;

namespace tetrad::cli {

namespace {

// The tokenizer kept with the checkpoint must load (generate needs it) and, where the checkpoint
// records the shards' tokenizer (`expected` != 0), be there and be that one.
std::string verify_tokenizer(const std::string& dir, uint64_t expected) {
  const std::string path = data::find_tokenizer_file(dir);
  if (path.empty() && expected != 0)
    fail("checkpoint ", dir, ": its tokenizer (", hex64(expected), ", tokenizer.model or "
         "tokenizer.json) is missing; generate needs it to encode a prompt (copy it from the data "
         "folder the run was trained on)");
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

// config.json, which every reader builds the model from: there, parsed, describing `expected`
// (the model the tensors were saved for) where given.
ModelConfig verify_config(const std::string& dir, const ModelConfig* expected) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(dir) / "config.json", ec))
    fail("checkpoint ", dir, ": config.json is missing (generate, eval, logits and export build "
         "the model from it)");
  ModelConfig mc;
  try {
    mc = read_hf_config(dir);
  } catch (const Error& e) {
    fail("checkpoint ", dir, ": config.json is unusable (generate, eval, logits and export build "
         "the model from it): ", e.what());
  }
  if (expected) {
    const nlohmann::json a = hf_config_json(mc), b = hf_config_json(*expected);
    std::string diff;
    for (auto it = b.begin(); it != b.end(); ++it)
      if (!a.contains(it.key()) || a[it.key()] != it.value())
        diff += "\n  " + it.key() + ": config.json " + (a.contains(it.key()) ? a[it.key()].dump() : "(none)") +
                ", the checkpoint's tensors " + it.value().dump();
    if (!diff.empty())
      fail("checkpoint ", dir, ": config.json describes another model than the one its tensors "
           "were saved for (meta.json):", diff);
  }
  return mc;
}

// Every tensor of one array (the weights or a moment, table layout) holds finite values: a NaN or
// an infinity there gives NaN from the first step of whatever starts from it, and no checksum
// catches a state that was already bad when it was saved. Throws naming the tensor, its shape and
// its first bad element.
void verify_finite(const std::string& dir, const char* array, const ParamTable& table,
                   const float* data) {
  for (const ParamSpec& s : table.specs)
    check_finite_weights("checkpoint " + dir + ", " + array, s, data + s.offset);
}

// The AdamW moments a sharded checkpoint keeps (not an imported model's, which has none) finite,
// loaded one array at a time into `buf` (table.total floats, the one-rank layout).
void verify_finite_moments(const std::string& dir, const ModelConfig& mc, const ParamTable& table,
                           float* buf) {
  const parallel::ShardPlan plan =
      parallel::ShardPlan::build(mc, table, parallel::GridShape{}, parallel::GridCoord{});
  for (size_t i = 0; i < plan.tensors.size(); ++i)
    TETRAD_CHECK(plan.tensors[i].offset == table.specs[i].offset);
  load_sharded_checkpoint(dir, mc, 0, plan, nullptr, buf, nullptr);
  verify_finite(dir, "AdamW first moment (adam_m)", table, buf);
  load_sharded_checkpoint(dir, mc, 0, plan, nullptr, nullptr, buf);
  verify_finite(dir, "AdamW second moment (adam_v)", table, buf);
}

// A Hugging Face model folder (an export): config.json, every tensor read and checked against
// it, every value finite, the tokenizer.
void verify_hf_folder(const std::string& dir) {
  const ModelConfig mc = verify_config(dir, nullptr);
  check_model_fits_host(mc, dir, "verify", 1);
  const ParamTable table = build_param_table(mc);
  std::vector<float> params(size_t(table.total));
  load_hf_params(dir, mc, table, params.data());
  verify_finite(dir, "weights", table, params.data());
  const std::string tok = verify_tokenizer(dir, 0);
  std::cout << "ok: " << dir << " (Hugging Face model folder) verified: config.json, "
            << table.specs.size() << " tensors of " << table.total
            << " parameters load, every value finite; " << tok << "\n";
}

void run(Context& ctx, const std::string& model_dir) {
  refuse_unfinished(model_dir);  // what an interrupted export or import left
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
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail("'", dir, "' is not a folder (give a run folder, a checkpoint folder or a model folder)");
  if (!is_sharded_checkpoint(dir) && !fs::exists(fs::path(dir) / "trainer_state.bin", ec) &&
      fs::exists(fs::path(dir) / "model.safetensors", ec))
    return verify_hf_folder(dir);
  if (!is_sharded_checkpoint(dir)) {
    if (auto problem = checkpoint_problem(dir)) fail("checkpoint ", dir, ": ", *problem);
    const ModelConfig mc = verify_config(dir, nullptr);
    check_model_fits_host(mc, dir, "verify", 1);
    const ParamTable table = build_param_table(mc);
    // Tensor by tensor (the load checks the recorded file hashes first): no whole copy held.
    auto finite = [&](const char* array) {
      return [&dir, &table, array](size_t i, const float* data) {
        check_finite_weights("checkpoint " + dir + ", " + array, table.specs[i], data);
      };
    };
    load_run_checkpoint_streamed(dir, mc, table, finite("weights"),
                                 finite("AdamW first moment (adam_m)"),
                                 finite("AdamW second moment (adam_v)"));
    const std::string tok = verify_tokenizer(dir, 0);
    std::cout << "ok: " << dir << " (Hugging Face folder + trainer_state.bin) verified, every "
              << "value of the weights and moments finite, " << tok << "\n";
    return;
  }
  verify_sharded_checkpoint(dir);
  const ModelConfig mc = sharded_model_config(dir);
  verify_config(dir, &mc);
  check_model_fits_host(mc, dir, "verify", 1);
  const ParamTable table = build_param_table(mc);
  std::vector<float> params(size_t(table.total));
  const ShardedCheckpointInfo info = load_sharded_params(dir, mc, table, params.data());
  verify_finite(dir, "weights", table, params.data());
  if (info.has_moments) verify_finite_moments(dir, mc, table, params.data());
  const nlohmann::json meta = read_sharded_meta(dir);
  int64_t bytes = 0;
  for (const auto& f : meta["files"]) bytes += f["data_bytes"].get<int64_t>();
  const std::string tok = verify_tokenizer(dir, info.tokenizer_identity);
  std::cout << "ok: " << dir << " verified: step " << info.step << ", grid "
            << info.grid.to_string() << ", " << meta["files"].size() << " shard file(s), "
            << bytes << " bytes, every chunk checksum matches, loads, every value of the weights"
            << (info.has_moments ? " and moments" : "") << " finite; config.json describes it; "
            << tok << "\n";
}

Runner setup(CLI::App& sub) {
  auto model_dir = std::make_shared<std::string>();
  sub.add_option("-m,--model", *model_dir,
                 "run folder (its `latest` checkpoint), checkpoint folder or Hugging Face model "
                 "folder")
      ->required();
  return [model_dir](Context& ctx) { run(ctx, *model_dir); };
}

}  // namespace

const Command verify_command{
    "verify", "check a checkpoint completely: metadata, every shard's every chunk checksum, load",
    true, &setup};

}  // namespace tetrad::cli
