// `tetrad logits`: the logits [T, V] of a token sequence (float32, little-endian), for checking
// against other implementations (scripts/hf_check.py).
#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/command.hpp"
#include "tetrad/checkpoint/hf_config.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/parallel/context_split.hpp"
#include "tetrad/parallel/grid.hpp"
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
  // one) and holds the whole-vocabulary logits; rank 0 writes them. A context axis (c > 1): each
  // C rank runs its two chunks of the sequence (as training and eval cut it), and the chunks'
  // logits are all-gathered over C and put back in sequence order.
  const std::string grid = inference_grid(o.grid, inference_world_size(), "logits", true);
  const int T = int(ids.size()), c = parallel::parse_grid(grid).c();
  if (c > 1 && T % (2 * c) != 0)
    fail("logits on grid '", grid, "': the context axis cuts the sequence into 2 x c = ", 2 * c,
         " chunks, but --tokens gives ", T, " tokens, not a multiple of ", 2 * c,
         " (give a multiple of ", 2 * c, " tokens, or a grid without c)");
  InferenceModel im = load_inference_model(dir, mc, grid, 1, T);
  const float* lg = nullptr;
  std::vector<float> whole;
  if (c > 1) {
    const parallel::ProcessGroups& g = *im.groups;
    const parallel::ContextSplit cs = parallel::ContextSplit::of(g.shape, g.coord);
    const int Tl = cs.local_len(T), Tc = cs.chunk_len(Tl);
    std::vector<int32_t> mine(static_cast<size_t>(Tl));
    cs.take(ids.data(), T, 1, T, mine.data());
    const float* local = im.model->forward_logits(mine.data(), 1, Tl);
    const size_t V = size_t(mc.vocab_size), per_rank = size_t(Tl) * V;
    std::vector<float> all(per_rank * size_t(c));
    g.c().allgather(local, all.data(), per_rank);
    whole.resize(size_t(T) * V);
    for (int r = 0; r < c; ++r)
      for (int j = 0; j < 2; ++j)
        std::copy_n(all.data() + size_t(r) * per_rank + size_t(j) * Tc * V, size_t(Tc) * V,
                    whole.data() + size_t(parallel::ContextSplit{c, r}.chunk_index(j)) * Tc * V);
    lg = whole.data();
  } else {
    lg = im.model->forward_logits(ids.data(), 1, T);
  }
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
                 "under mpirun: process grid x,y,z,d or the named form (c=2: the sequence's "
                 "chunks over the context axis; default 1,1,1,<ranks>); rank 0 writes the file");
  return [o](Context& ctx) { run(ctx, *o); };
}

}  // namespace

const Command logits_command{
    "logits", "write the logits [T, V] (float32, little-endian) of a token sequence", true, &setup};

}  // namespace tetrad::cli
