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

}  // namespace tetrad
