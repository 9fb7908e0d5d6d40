// The learning problem of the bf16 training-curve tests (test_precision_mpi.cpp,
// test_bf16_grad_comm_mpi.cpp): kSteps steps of kB sequences of kT tokens from a learnable stream,
// and the optimizer settings they train with. Header only.
#pragma once
#include <cstdint>
#include <vector>

#include "tetrad/core/rng.hpp"
#include "tetrad/train/config.hpp"

namespace learnable_stream {

constexpr int kB = 8, kT = 16, kSteps = 200;

inline tetrad::TrainConfig train_config() {
  tetrad::TrainConfig t;
  t.lr = 3e-3;
  t.warmup_steps = 10;
  t.max_steps = kSteps;
  return t;
}

// Step `step`'s batch: kB sequences of kT + 1 tokens, x[t+1] = (5 x[t] + 7 + r) mod V, r uniform
// in {0..3} (best loss ln 4).
inline std::vector<int32_t> batch(int step, int V) {
  tetrad::Rng r(500 + uint64_t(step));
  std::vector<int32_t> t(size_t(kB) * (kT + 1));
  for (int b = 0; b < kB; ++b) {
    int32_t v = int32_t(r.next_u64() % uint64_t(V));
    for (int i = 0; i <= kT; ++i) {
      t[size_t(b) * (kT + 1) + i] = v;
      v = int32_t((5 * int64_t(v) + 7 + int64_t(r.next_u64() % 4)) % V);
    }
  }
  return t;
}

}  // namespace learnable_stream
