// Helpers that both modes of `tetrad bench` share (tools/bench.cpp: serial, tools/bench_grids.cpp:
// --grids): the run's shape, random tokens, the trainer's optimizer, resident memory, medians.
// Internal to tools/; not an interface.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/train/optimizer.hpp"
#include "tetrad/train/run_plan.hpp"
#include "tetrad/train/trainer.hpp"

namespace tetrad::bench_detail {

// Tokens per sequence of a bench run: --seq, or the configuration's max_seq (0); refused past it.
inline int bench_seq(int seq, const ModelConfig& mc, const std::string& name) {
  if (seq < 0 || seq > mc.max_seq)
    fail("--seq ", seq, ": expected 1..", mc.max_seq, " (model ", name, "'s max_seq; 0: max_seq)");
  return seq > 0 ? seq : mc.max_seq;
}

// The run configuration of one bench run: `settings` (bench_settings) with the model, a
// micro-batch of B sequences (the whole job's) of T tokens, M micro-batches per step and the
// grid ("": one rank).
inline RunConfig bench_run_config(RunConfig settings, const std::string& name,
                                  const ModelConfig& mc, int B, int T, int M,
                                  const std::string& grid) {
  settings.model_name = name;
  settings.model = mc;
  settings.grid = grid;
  settings.train.micro_batch = B;
  settings.train.seq_len = T;
  settings.train.grad_accum = M;
  return settings;
}

// Standard micro-batch of each configuration (benchmarks.md).
inline int standard_batch(const std::string& name) {
  if (name == "gpt2-124m") return 1;
  return 4;
}

// Resident memory by kind, bytes (/proc/self/status: RssAnon, RssFile, RssShmem; zeros where
// unreadable). What grows during the steps beyond the formula shows where it lives: the heap
// (anonymous), library code run for the first time (file-backed), MPI's shared-memory segments.
struct ResidentKinds {
  double anon = 0, file = 0, shmem = 0;
};
inline ResidentKinds resident_kinds() {
  ResidentKinds k;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return k;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "RssAnon: %lld kB", &kb) == 1) k.anon = double(kb) * 1024;
    if (std::sscanf(line, "RssFile: %lld kB", &kb) == 1) k.file = double(kb) * 1024;
    if (std::sscanf(line, "RssShmem: %lld kB", &kb) == 1) k.shmem = double(kb) * 1024;
  }
  std::fclose(f);
  return k;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Random tokens of a bench run (seed 7), as many as `count`, below the vocabulary size.
inline std::vector<int32_t> random_tokens(size_t count, int vocab_size) {
  Rng rng(7);
  std::vector<int32_t> tokens(count);
  for (auto& t : tokens) t = int32_t(rng.next_u64() % uint64_t(vocab_size));
  return tokens;
}

// The trainer's AdamW over the model's optimizer layout (default TrainConfig), on `device`.
inline AdamW make_adam(parallel::ParallelTransformer& model, backend::Backend& device) {
  TrainConfig tc;
  const parallel::OptimizerLayout& ol = model.optimizer_layout();
  return AdamW(decay_ranges(model.table(), tc, ol.param_offsets, ol.sizes, ol.state_offsets,
                            ol.grad_offsets),
               ol.state_size, tc, device);
}

}  // namespace tetrad::bench_detail
