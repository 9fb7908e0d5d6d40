// `tetrad eval`: loss and perplexity of a model on a prepared split.
#include <cmath>
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/train/inference.hpp"
#include "tetrad/train/evaluate.hpp"

namespace tetrad::cli {

namespace {

struct Options {
  std::string model_dir, data_dir = "data/kjv", split = "val", grid;
  int batches = 20, micro_batch = 4, seq_len = 0;
};

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("-m,--model", o->model_dir, "model folder or run folder")->required();
  sub.add_option("-d,--data", o->data_dir, "prepared data folder")->capture_default_str();
  sub.add_option("--split", o->split, "train | val")->capture_default_str();
  sub.add_option("--batches", o->batches)->capture_default_str()
      ->check(int_in(1, 1 << 30, "--batches"));
  sub.add_option("--micro-batch", o->micro_batch)->capture_default_str()
      ->check(int_in(1, 1 << 20, "--micro-batch"));
  sub.add_option("--seq-len", o->seq_len, "default: the model's max_seq")
      ->check(int_in(0, 1 << 24, "--seq-len"));
  sub.add_option("--grid", o->grid,
                 "under mpirun: process grid x,y,z,d or named (c=2,d=2; default 1,1,1,<ranks>); "
                 "the micro-batches are dealt out over Z x D, each C rank takes its chunks of "
                 "every sequence, rank 0 prints");
  return [o](Context& ctx) {
    const std::string dir = ctx.resolve_model_dir(o->model_dir);
    const std::string grid = inference_grid(o->grid, inference_world_size(), "eval", true);
    std::ostream null_stream(nullptr);
    std::ostream& eout = ctx.root() ? std::cout : null_stream;
    const double loss = evaluate_checkpoint(dir, o->data_dir, o->split, o->micro_batch, o->seq_len,
                                            o->batches, eout, grid);
    eout << "loss " << loss << " | perplexity " << std::exp(loss) << "\n";
  };
}

}  // namespace

const Command eval_command{"eval", "loss and perplexity of a model on a prepared split", true,
                           &setup};

}  // namespace tetrad::cli
