// `tetrad bench-checkpoint`: sharded checkpoint write/read bandwidth (tools/checkpoint_bench).
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/tools/checkpoint_bench.hpp"

namespace tetrad::cli {

namespace {

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<CheckpointBenchOptions>();
  sub.add_option("--model-name", o->model, "named model configuration")->capture_default_str();
  sub.add_option("--dir", o->dir, "run folder for the checkpoints (deleted first)")->required();
  sub.add_option("--grid", o->grid, "x,y,z,d (under mpirun)")->capture_default_str();
  sub.add_option("--repeats", o->repeats, "saves of each kind (median reported)")->capture_default_str();
  return [o](Context&) { run_checkpoint_bench(*o, std::cout); };
}

}  // namespace

const Command bench_checkpoint_command{
    "bench-checkpoint", "sharded checkpoint write/read bandwidth and async blocked time", false,
    &setup};

}  // namespace tetrad::cli
