// Next-token sampling and autoregressive generation with the KV cache.
//
// generate and generate_greedy_batch drive any model with the decoding interface
//   config(), max_len(), start_cache(B), decode(tokens, B, Tq) -> const float* [B, V] logits of
//   each sequence's last new token (host memory), cache_position()
// which is parallel::ParallelTransformer, the one model, on any grid (every rank of a Y group gets
// the same whole-vocabulary logits, so with the same Rng every rank picks the same tokens), and
// the serial test oracle. Templates here so model/ does not depend on parallel/.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"

namespace tetrad {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (argmax)
  int top_k = 0;             // 0: no top-k filter
  double top_p = 1.0;        // nucleus: smallest set of tokens with probability mass >= top_p
  // > 0: only ids below it are sampled (the tokenizer's vocabulary when the model's is padded
  // larger: ids past it have no text). 0: every id of the model.
  int vocab_limit = 0;
};

// Picks one token from logits[V]. Greedy ties go to the lowest id. Throws Error on options out
// of range (temperature < 0, top_p not in (0, 1], top_k < 0).
int32_t sample_token(const float* logits, int V, const SamplingOptions& opt, Rng& rng);

// Generates up to max_new tokens after `prompt` (one sequence), stopping early at `stop_token`
// (if >= 0, not included) or when the model's maximum length is reached. on_token is called for
// each new token as it is produced (streaming). Returns the new tokens.
template <class Model>
std::vector<int32_t> generate(Model& model, const std::vector<int32_t>& prompt, int max_new,
                              const SamplingOptions& opt, Rng& rng, int32_t stop_token = -1,
                              const std::function<void(int32_t)>& on_token = {}) {
  if (prompt.empty()) fail("generation needs a non-empty prompt");
  if (max_new < 0) fail("tokens to generate must be >= 0, got ", max_new);
  const int max_len = model.max_len();
  if (int(prompt.size()) >= max_len)
    fail("prompt of ", prompt.size(), " tokens leaves no room: the model's maximum length is ",
         max_len);
  const int V = model.config().vocab_size;
  model.start_cache(1);
  const float* logits = model.decode(prompt.data(), 1, int(prompt.size()));
  std::vector<int32_t> out;
  while (int(out.size()) < max_new) {
    const int32_t tok = sample_token(logits, V, opt, rng);
    if (tok == stop_token) break;
    out.push_back(tok);
    if (on_token) on_token(tok);
    if (model.cache_position() >= max_len) break;
    logits = model.decode(&tok, 1, 1);
  }
  return out;
}

// Greedy continuation of B prompts of equal length at once (batched decoding, used by
// extraction metrics); ties go to the lowest id. Returns [B][n_new].
template <class Model>
std::vector<std::vector<int32_t>> generate_greedy_batch(
    Model& model, const std::vector<std::vector<int32_t>>& prompts, int n_new) {
  const int B = int(prompts.size());
  if (B == 0) return {};
  const int P = int(prompts[0].size());
  for (const auto& p : prompts)
    if (int(p.size()) != P) fail("batched generation needs prompts of equal length");
  if (P + n_new - 1 > model.max_len())
    fail("prefix ", P, " + ", n_new, " new tokens exceeds the model's maximum length ",
         model.max_len());
  const int V = model.config().vocab_size;
  std::vector<int32_t> flat;
  flat.reserve(size_t(B) * P);
  for (const auto& p : prompts) flat.insert(flat.end(), p.begin(), p.end());
  model.start_cache(B);
  const float* logits = model.decode(flat.data(), B, P);
  std::vector<std::vector<int32_t>> out(B);
  std::vector<int32_t> next(B);
  for (int s = 0; s < n_new; ++s) {
    for (int b = 0; b < B; ++b) {
      const float* row = logits + int64_t(b) * V;
      next[b] = int32_t(std::max_element(row, row + V) - row);
      out[b].push_back(next[b]);
    }
    if (s + 1 < n_new) logits = model.decode(next.data(), B, 1);
  }
  return out;
}

}  // namespace tetrad
