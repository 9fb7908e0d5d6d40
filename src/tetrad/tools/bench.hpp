// `tetrad bench`: the standard configurations trained on random tokens, timed, and reported
// against this machine's own ceilings and (when available) PyTorch on the same CPU.
// See docs/benchmarks.md for what each number means.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

namespace tetrad {

struct BenchOptions {
  std::vector<std::string> configs = {"tiny", "small", "gpt2-124m"};
  int steps = 5;
  int warmup = 2;
  int threads = 0;        // 0: all cores
  std::string json_path;  // also write one JSON object per line here
  std::string anchor_cmd; // "" = auto (python3 bench/pytorch_gpt2.py if torch imports), "none"
  std::string precision = "fp32";  // "fp32" | "bf16" (kernels/precision.hpp)
  bool quick_ceilings = false;  // the longer measurement is steadier on a shared machine
};

void run_bench(const BenchOptions& opt, std::ostream& out);

// Parallel mode, run under mpirun: every grid of the world size that divides the model trains
// the configuration on the same global batch (its standard micro-batch); rank 0 prints tokens/s,
// the time split into compute and communication (slowest rank), and per-rank memory of
// parameters + gradients + Adam against the serial figure / G. Compare with `tetrad bench` on one
// rank with as many threads as ranks here (bench/parallel.sh does both).
void run_bench_grids(const BenchOptions& opt, std::ostream& out);

}  // namespace tetrad
