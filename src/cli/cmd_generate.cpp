// `tetrad generate`: sample text from a model (KV cache), streamed as it is sampled.
#include <algorithm>
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/checkpoint/hf_config.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/model/sampling.hpp"
#include "tetrad/train/inference.hpp"

namespace tetrad::cli {

namespace {

struct Options {
  std::string model_dir, prompt = "In the beginning", grid;
  int max_new = 100;
  SamplingOptions sampling;
  uint64_t seed = 1;
};

void run(Context& ctx, Options& o) {
  const std::string dir = ctx.resolve_model_dir(o.model_dir);
  const ModelConfig mc = read_hf_config(dir);
  const std::string tok_file = data::find_tokenizer_file(dir);
  if (tok_file.empty())
    fail("model folder '", dir, "' has no tokenizer.model or tokenizer.json to encode the prompt with");
  auto tok = data::Tokenizer::load(tok_file);
  o.sampling.vocab_limit = tok.vocab_size();  // a padded model vocabulary: ids past it have no text
  const std::string grid = inference_grid(o.grid, inference_world_size(), "generate");
  InferenceModel im = load_inference_model(dir, mc, grid, 1, mc.max_seq);
  const bool root = im.groups->world.rank() == 0;
  std::ostream null_stream(nullptr);
  std::ostream& gout = root ? std::cout : null_stream;
  Rng rng(o.seed);  // the same seed on every rank: every rank samples the same tokens
  std::vector<int32_t> ids = tok.encode(o.prompt);
  gout << o.prompt << std::flush;
  std::vector<int32_t> sofar;
  std::string printed;
  generate(*im.model, ids, o.max_new, o.sampling, rng, tok.eos_id(), [&](int32_t t) {
    if (!root) return;
    // Decode the whole continuation and print what is new, so multi-token characters and
    // SentencePiece's word-boundary spaces come out right while streaming.
    sofar.push_back(t);
    std::vector<int32_t> all = ids;
    all.insert(all.end(), sofar.begin(), sofar.end());
    const std::string text = tok.decode(all);
    const std::string base = tok.decode(ids);
    const std::string cont = text.substr(std::min(text.size(), base.size()));
    // A character whose bytes are not all sampled yet decodes as U+FFFD: wait for the rest.
    if (cont.ends_with("\xEF\xBF\xBD")) return;
    if (cont.size() > printed.size()) {
      std::cout << cont.substr(printed.size()) << std::flush;
      printed = cont;
    }
  });
  gout << "\n";
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("-m,--model", o->model_dir, "model folder or run folder")->required();
  sub.add_option("-p,--prompt", o->prompt)->capture_default_str();
  sub.add_option("-n,--max-new", o->max_new, "tokens to generate")->capture_default_str()
      ->check(int_in(1, 1 << 24, "-n/--max-new"));
  sub.add_option("-t,--temperature", o->sampling.temperature, "0 = greedy")->capture_default_str()
      ->check(finite_at_least(0, "-t/--temperature"));
  sub.add_option("--top-k", o->sampling.top_k, "0 = off")->capture_default_str()
      ->check(int_in(0, 1 << 30, "--top-k"));
  sub.add_option("--top-p", o->sampling.top_p, "nucleus mass, 1 = off")->capture_default_str()
      ->check(probability_mass("--top-p"));
  sub.add_option("--seed", o->seed)->capture_default_str();
  sub.add_option("--grid", o->grid,
                 "under mpirun: process grid x,y,z,d (default 1,1,1,<ranks>); every rank decodes "
                 "the prompt with its share of the model, rank 0 prints");
  return [o](Context& ctx) { run(ctx, *o); };
}

}  // namespace

const Command generate_command{"generate", "sample text from a model (KV cache)", true, &setup};

}  // namespace tetrad::cli
