// The micro-batch search (planner.hpp, PlanInput::search_micro_batch): a grid's fastest
// micro-batch and accumulation count within memory (docs/planner.md, "Micro-batch search").
#include <string>
#include <vector>

#include "tetrad/planner/planner.hpp"

namespace tetrad::planner {

std::vector<int64_t> micro_batch_candidates(const PlanInput& in, const GridShape& g) {
  const int64_t slots = parallel::token_slots(g);
  std::vector<int64_t> out;
  if (slots < 1 || in.global_batch < 1 || in.global_batch % slots != 0) return out;
  const int64_t n = in.global_batch / slots;  // sequences per (z, d) replica per step
  std::vector<int64_t> large;
  for (int64_t b = 1; b * b <= n; ++b)
    if (n % b == 0) {
      out.push_back(b * slots);
      if (b * b != n) large.push_back(n / b * slots);
    }
  out.insert(out.end(), large.rbegin(), large.rend());
  return out;
}

Estimate estimate_searching_micro_batch(const PlanInput& in, const GridShape& g, const Machine& m) {
  PlanInput fixed = in;
  fixed.search_micro_batch = false;
  fixed.micro_batch_per_replica = fixed.micro_batch_per_data_group = 0;
  const std::vector<int64_t> candidates = micro_batch_candidates(in, g);
  if (candidates.empty()) {
    Estimate e;
    e.grid = g;
    set_flop_counts(e, in);
    e.reject = "does not divide: global batch (" + std::to_string(in.global_batch) +
               ") is not divisible by Gz x Gd = " + std::to_string(parallel::token_slots(g)) +
               " (every (z, d) replica needs whole sequences)";
    return e;
  }
  Estimate best, first;
  bool have_best = false;
  for (size_t i = 0; i < candidates.size(); ++i) {
    fixed.micro_batch = candidates[i];
    Estimate e = estimate(fixed, g, m);
    if (i == 0) first = e;
    if (e.valid && (!have_best || e.step < best.step)) best = std::move(e), have_best = true;
    // Memory grows with the micro-batch (activations; 1F1B keeps min(Gp, m) of them in flight,
    // b x min(Gp, B / b) sequences, which does not shrink as b grows): no larger one fits.
    else if (!e.valid && e.reject.starts_with("does not fit")) break;
  }
  if (have_best) return best;
  first.reject += " (the smallest micro-batch, " + std::to_string(candidates.front()) +
                  " sequences, " + std::to_string(candidates.front() / parallel::token_slots(g)) +
                  " per replica)";
  return first;
}

}  // namespace tetrad::planner
