#include "tetrad/model/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tetrad/core/error.hpp"

namespace tetrad {

int32_t sample_token(const float* logits, int V, const SamplingOptions& opt, Rng& rng) {
  if (!(opt.temperature >= 0) || !std::isfinite(opt.temperature))
    fail("temperature must be a finite number >= 0 (0 = greedy), got ", opt.temperature);
  if (!(opt.top_p > 0 && opt.top_p <= 1)) fail("top_p must be in (0, 1], got ", opt.top_p);
  if (opt.top_k < 0) fail("top_k must be >= 0 (0 = off), got ", opt.top_k);
  if (opt.vocab_limit > 0) V = std::min(V, opt.vocab_limit);
  if (opt.temperature == 0 || opt.top_k == 1)
    return int32_t(std::max_element(logits, logits + V) - logits);

  // Candidates sorted by logit (descending, ties by id), cut by top-k, softmax, cut by top-p.
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  const int k = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(k);
  std::vector<double> prob(k);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += prob[i] = std::exp((logits[idx[i]] - mx) / opt.temperature);
  int keep = k;
  if (opt.top_p < 1) {
    double acc = 0;
    for (int i = 0; i < k; ++i) {
      acc += prob[i] / sum;
      if (acc >= opt.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = 0;
  for (int i = 0; i < keep; ++i) total += prob[i];
  double u = rng.uniform() * total;
  for (int i = 0; i < keep; ++i) {
    u -= prob[i];
    if (u < 0) return idx[i];
  }
  return idx[keep - 1];
}

std::vector<int32_t> generate(Transformer<float>& model, const std::vector<int32_t>& prompt,
                              int max_new, const SamplingOptions& opt, Rng& rng,
                              int32_t stop_token, const std::function<void(int32_t)>& on_token) {
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

std::vector<std::vector<int32_t>> generate_greedy_batch(
    Transformer<float>& model, const std::vector<std::vector<int32_t>>& prompts, int n_new) {
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
