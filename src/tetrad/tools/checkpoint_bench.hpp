// `tetrad bench-checkpoint`: write and read bandwidth of sharded checkpoints and the time an
// asynchronous save blocks training, on a model's real shard layout (random values; no
// training), one rank or a grid under mpirun. bench/checkpoint.sh runs it beside dd on the same
// disk; docs/checkpoints.md has the results.
#pragma once
#include <iosfwd>
#include <string>

namespace tetrad {

struct CheckpointBenchOptions {
  std::string model = "small";  // named model configuration
  std::string dir;              // run folder to write checkpoints into (deleted first)
  std::string grid = "1,1,1,1";
  int repeats = 3;              // saves of each kind; the median is reported
  double step_ms = 50;          // simulated training step while an async save runs
};

// Prints a human-readable summary and one JSON line (prefixed "json: ") on rank 0.
void run_checkpoint_bench(const CheckpointBenchOptions& opt, std::ostream& out);

}  // namespace tetrad
