// `tetrad logits`: the logits [T, V] of a token sequence (float32, little-endian), for checking
// against other implementations (scripts/hf_check.py).
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/command.hpp"
#include "tetrad/checkpoint/hf_config.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/train/inference.hpp"

namespace tetrad::cli {

namespace {

struct Options {
  std::string model_dir, tokens_csv, out, grid;
};

void run(Context& ctx, const Options& o) {
  const std::string dir = ctx.resolve_model_dir(o.model_dir);
  const ModelConfig mc = read_hf_config(dir);
  std::vector<int32_t> ids;
  std::stringstream ss(o.tokens_csv);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      ids.push_back(std::stoi(item));
    } catch (const std::exception&) {
      fail("--tokens: '", item, "' is not an integer token id");
    }
  }
  if (ids.empty()) fail("--tokens: no token ids given");
  if (int64_t(ids.size()) > mc.max_seq)
    fail("--tokens: ", ids.size(), " tokens but the model's maximum length is ", mc.max_seq);
  // On a grid every rank runs the sequence with its share of the model (each Z x D slot the same
  // one) and holds the whole-vocabulary logits; rank 0 writes them.
  const std::string grid = inference_grid(o.grid, inference_world_size(), "logits");
  InferenceModel im = load_inference_model(dir, mc, grid, 1, int(ids.size()));
  const float* lg = im.model->forward_logits(ids.data(), 1, int(ids.size()));
  if (im.groups->world.rank() == 0) {
    std::ofstream f(o.out, std::ios::binary);
    f.write(reinterpret_cast<const char*>(lg), std::streamsize(ids.size() * mc.vocab_size * sizeof(float)));
    f.flush();
    if (!f) fail("cannot write '", o.out, "'");
    std::cout << "wrote logits [" << ids.size() << ", " << mc.vocab_size << "] to " << o.out << "\n";
  }
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("-m,--model", o->model_dir, "model folder or run folder")->required();
  sub.add_option("--tokens", o->tokens_csv, "comma-separated token ids")->required();
  sub.add_option("-o,--out", o->out, "output file")->required();
  sub.add_option("--grid", o->grid,
                 "under mpirun: process grid x,y,z,d (default 1,1,1,<ranks>); rank 0 "
                 "writes the file");
  return [o](Context& ctx) { run(ctx, *o); };
}

}  // namespace

const Command logits_command{
    "logits", "write the logits [T, V] (float32, little-endian) of a token sequence", true, &setup};

}  // namespace tetrad::cli
