// Checks that hold for any model with the decoding interface (the serial oracle Transformer<float>
// and parallel::ParallelTransformer): forward_logits, start_cache, decode, cache_position. Header
// only (templates); GoogleTest assertions, so call them from a test body.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tetrad/core/rng.hpp"

namespace tetrad_test {

// n token ids in [0, V), the same for the same seed.
inline std::vector<int32_t> random_tokens(int n, int V, uint64_t seed) {
  tetrad::Rng r(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(r.next_u64() % uint64_t(V));
  return t;
}

// The KV cache gives what the full forward gives: two sequences of T = 20 tokens (seed 3) fed 12
// at once, then one at a time; every position's logits within 1e-4 of the full forward's, and the
// cache at position T at the end. `m` must hold 2 sequences of at least T tokens; V its vocabulary.
template <typename Model>
void expect_kv_cache_decoding_matches_full_forward(Model& m, int V, const std::string& name) {
  const int T = 20;
  const std::vector<int32_t> x = random_tokens(2 * T, V, 3);
  const float* f = m.forward_logits(x.data(), 2, T);
  const std::vector<float> full(f, f + size_t(2) * T * V);
  m.start_cache(2);
  std::vector<int32_t> chunk;
  for (int b = 0; b < 2; ++b) chunk.insert(chunk.end(), x.begin() + b * T, x.begin() + b * T + 12);
  const float* lg = m.decode(chunk.data(), 2, 12);
  for (int pos = 11; pos < T; ++pos) {
    for (int b = 0; b < 2; ++b)
      for (int v = 0; v < V; ++v)
        ASSERT_NEAR(lg[b * V + v], full[(size_t(b) * T + pos) * V + v], 1e-4)
            << name << " b=" << b << " pos=" << pos;
    if (pos + 1 < T) {
      int32_t next[2] = {x[pos + 1], x[T + pos + 1]};
      lg = m.decode(next, 2, 1);
    }
  }
  EXPECT_EQ(m.cache_position(), T);
}

}  // namespace tetrad_test
