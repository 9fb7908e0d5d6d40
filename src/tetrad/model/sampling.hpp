// Next-token sampling and autoregressive generation with the KV cache.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "tetrad/core/rng.hpp"
#include "tetrad/model/transformer.hpp"

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
std::vector<int32_t> generate(Transformer<float>& model, const std::vector<int32_t>& prompt,
                              int max_new, const SamplingOptions& opt, Rng& rng,
                              int32_t stop_token = -1,
                              const std::function<void(int32_t)>& on_token = {});

// Greedy continuation of B prompts of equal length at once (batched decoding, used by
// extraction metrics). Returns [B][n_new].
std::vector<std::vector<int32_t>> generate_greedy_batch(
    Transformer<float>& model, const std::vector<std::vector<int32_t>>& prompts, int n_new);

}  // namespace tetrad
