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
  bool quick_ceilings = true;
};

void run_bench(const BenchOptions& opt, std::ostream& out);

}  // namespace tetrad
