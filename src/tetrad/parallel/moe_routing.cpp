#include "tetrad/parallel/moe_routing.hpp"

#include <algorithm>
#include <cmath>

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

int64_t expert_capacity(const ModelConfig& c, int64_t N) {
  if (c.moe_capacity_factor <= 0) return N;  // dropless: an expert may get every token
  const double cap = std::ceil(double(c.moe_capacity_factor) * double(N) *
                               double(c.experts_per_token) / double(c.n_experts));
  return std::min<int64_t>(N, int64_t(cap));
}

void route_tokens(const float* logits, int64_t N, const ModelConfig& c, MoeRouting& r,
                  const float* expert_bias) {
  route_local(logits, N, c, r, expert_bias);
  std::vector<double> share(size_t(routing_share_size(r.E)));
  routing_share(r, share.data());
  finish_routing(c, share.data(), 1, 0, r);
}

int64_t routing_share_size(int64_t E) { return 2 * E + 2; }

void routing_share(const MoeRouting& r, double* share) {
  for (int64_t e = 0; e < r.E; ++e) {
    share[e] = double(r.routed[size_t(e)]);
    share[r.E + e] = r.psum[size_t(e)];
  }
  share[2 * r.E] = r.zsum;
  share[2 * r.E + 1] = double(r.N);
}

void route_local(const float* logits, int64_t N, const ModelConfig& c, MoeRouting& r,
                 const float* expert_bias) {
  const int64_t E = c.n_experts, k = c.experts_per_token;
  r.N = N; r.E = E; r.k = k;
  r.probs.assign(size_t(N * E), 0.0);
  r.lse.assign(size_t(N), 0.0);
  r.choice.assign(size_t(N * k), -1);
  r.weight.assign(size_t(N * k), 0.0f);
  r.slots.assign(size_t(N * k), -1);
  r.routed.assign(static_cast<size_t>(E), 0);
  r.rows.assign(static_cast<size_t>(E), 0);
  r.first.assign(static_cast<size_t>(E), 0);
  const bool renorm = c.moe_renormalize();
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::vector<double> score(static_cast<size_t>(E));
  double zsum = 0;
  for (int64_t t = 0; t < N; ++t) {
    const float* x = logits + t * E;
    double mx = -INFINITY;
    for (int64_t e = 0; e < E; ++e) {
      if (!std::isfinite(x[e]))
        fail("mixture of experts: the router's logit of token ", t, " for expert ", e, " is ",
             x[e], " (the router's weights or the block's input are not finite)");
      mx = std::max(mx, double(x[e]));
    }
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(double(x[e]) - mx);
    double* p = r.probs.data() + t * E;
    for (int64_t e = 0; e < E; ++e) p[e] = std::exp(double(x[e]) - mx) / s;
    r.lse[size_t(t)] = mx + std::log(s);
    zsum += r.lse[size_t(t)] * r.lse[size_t(t)];
    for (int64_t e = 0; e < E; ++e) order[size_t(e)] = int32_t(e);
    // The k most probable (by probability + bias with the expert bias); on equal scores the
    // lower index first (a stable order).
    if (expert_bias) {
      for (int64_t e = 0; e < E; ++e) score[size_t(e)] = p[e] + double(expert_bias[e]);
    } else {
      std::copy(p, p + E, score.begin());
    }
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return score[size_t(a)] > score[size_t(b)] || (score[size_t(a)] == score[size_t(b)] && a < b);
    });
    double sel = 0;
    for (int64_t j = 0; j < k; ++j) sel += p[order[size_t(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[size_t(j)];
      r.choice[size_t(t * k + j)] = e;
      r.weight[size_t(t * k + j)] = float(renorm ? p[e] / sel : p[e]);
      ++r.routed[size_t(e)];
    }
  }
  r.psum.assign(static_cast<size_t>(E), 0.0);
  for (int64_t e = 0; e < E; ++e) {
    double P = 0;
    for (int64_t t = 0; t < N; ++t) P += r.probs[size_t(t * E + e)];
    r.psum[size_t(e)] = P;
  }
  r.zsum = zsum;
}

void finish_routing(const ModelConfig& c, const double* shares, int ranks, int me, MoeRouting& r) {
  const int64_t N = r.N, E = r.E, k = r.k, w = routing_share_size(E);
  // The totals over the ranks, and the choices of each expert on the ranks before this one.
  r.total_N = 0;
  r.total_routed.assign(static_cast<size_t>(E), 0);
  std::vector<int64_t> before(static_cast<size_t>(E), 0);
  std::vector<double> P(static_cast<size_t>(E), 0.0);
  double zsum = 0;
  for (int q = 0; q < ranks; ++q) {
    const double* s = shares + q * w;
    for (int64_t e = 0; e < E; ++e) {
      r.total_routed[size_t(e)] += int64_t(s[e]);
      if (q < me) before[size_t(e)] += int64_t(s[e]);
      P[size_t(e)] += s[E + e];
    }
    zsum += s[2 * E];
    r.total_N += int64_t(s[2 * E + 1]);
  }
  // The dispatch: each expert takes its choices in token order up to its capacity (of the whole
  // micro-batch; the ranks before this one took theirs first).
  const int64_t cap = expert_capacity(c, r.total_N);
  r.rows.assign(static_cast<size_t>(E), 0);
  r.slots.assign(size_t(N * k), -1);
  for (int64_t i = 0; i < N * k; ++i) {
    const int32_t e = r.choice[size_t(i)];
    if (before[size_t(e)] + r.rows[size_t(e)] < cap) ++r.rows[size_t(e)];
    else r.slots[size_t(i)] = -2;  // dropped (marked; rows are numbered below)
  }
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    r.first[size_t(e)] = row;
    row += r.rows[size_t(e)];
  }
  r.kept = row;
  r.dropped = N * k - row;
  std::vector<int64_t> next(r.first);
  for (int64_t i = 0; i < N * k; ++i) {
    if (r.slots[size_t(i)] == -2) {
      r.slots[size_t(i)] = -1;
      continue;
    }
    r.slots[size_t(i)] = int32_t(next[size_t(r.choice[size_t(i)])]++);
  }
  r.total_rows.assign(static_cast<size_t>(E), 0);
  r.total_dropped = 0;
  for (int64_t e = 0; e < E; ++e) {
    r.total_rows[size_t(e)] = std::min(r.total_routed[size_t(e)], cap);
    r.total_dropped += r.total_routed[size_t(e)] - r.total_rows[size_t(e)];
  }
  // Load balancing: f_e = routed_e / N (summing to k over the experts), P_e = mean_t p[t, e].
  const double Nt = double(r.total_N);
  double aux = 0;
  for (int64_t e = 0; e < E; ++e)
    aux += double(r.total_routed[size_t(e)]) / Nt * (P[size_t(e)] / Nt);
  r.aux = double(E) * aux;
  r.z = zsum / Nt;
}

void router_backward(const MoeRouting& r, const float* dw, bool renormalize, double aux_scale,
                     double z_scale, float* dlogits) {
  const int64_t N = r.N, E = r.E, k = r.k;
  const double Nt = double(r.total_N);
  std::vector<double> dp(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    const double* p = r.probs.data() + t * E;
    std::fill(dp.begin(), dp.end(), 0.0);
    if (renormalize) {
      // w_j = p_j / S with S the sum of the chosen p: dp_j = (dw_j - Σ_i dw_i w_i) / S.
      double S = 0, gw = 0;
      for (int64_t j = 0; j < k; ++j) S += p[r.choice[size_t(t * k + j)]];
      for (int64_t j = 0; j < k; ++j)
        gw += double(dw[t * k + j]) * (p[r.choice[size_t(t * k + j)]] / S);
      for (int64_t j = 0; j < k; ++j)
        dp[size_t(r.choice[size_t(t * k + j)])] += (double(dw[t * k + j]) - gw) / S;
    } else {
      for (int64_t j = 0; j < k; ++j) dp[size_t(r.choice[size_t(t * k + j)])] += double(dw[t * k + j]);
    }
    if (aux_scale != 0)
      for (int64_t e = 0; e < E; ++e)
        dp[size_t(e)] += aux_scale * double(E) * double(r.total_routed[size_t(e)]) / Nt / Nt;
    double pdp = 0;
    for (int64_t e = 0; e < E; ++e) pdp += p[e] * dp[size_t(e)];
    const double zg = z_scale * 2.0 * r.lse[size_t(t)] / Nt;
    for (int64_t e = 0; e < E; ++e)
      dlogits[t * E + e] = float(p[e] * (dp[size_t(e)] - pdp) + zg * p[e]);
  }
}

void update_expert_bias_values(float* bias, const int64_t* load, int64_t E, float rate) {
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) total += load[e];
  // sign(mean - load_e) with the mean total / E, compared as total vs E load_e (exact).
  for (int64_t e = 0; e < E; ++e) {
    const int64_t d = total - E * load[e];
    bias[e] += d > 0 ? rate : d < 0 ? -rate : 0.0f;
  }
}

void MoeStats::add_load(int layer, int n_layer, const MoeRouting& r) {
  TETRAD_CHECK(r.total_routed.size() == size_t(r.E), "the expert load of a routing that "
               "finish_routing has not completed");
  if (load.empty()) load.assign(size_t(n_layer) * size_t(r.E), 0);
  n_experts = r.E;
  for (int64_t e = 0; e < r.E; ++e) load[size_t(layer * r.E + e)] += r.total_routed[size_t(e)];
}

double MoeStats::load_imbalance() const {
  double worst = 0;
  if (load.empty() || n_experts <= 0) return worst;
  for (size_t l0 = 0; l0 < load.size(); l0 += size_t(n_experts)) {
    int64_t total = 0, most = 0;
    for (size_t e = 0; e < size_t(n_experts); ++e) {
      total += load[l0 + e];
      most = std::max(most, load[l0 + e]);
    }
    if (total > 0) worst = std::max(worst, double(most) * double(n_experts) / double(total));
  }
  return worst;
}

void MoeStats::add(const MoeRouting& r) {
  ++layers;
  aux += r.aux;
  z += r.z;
  dropped += r.total_dropped;
  routed += r.total_N * r.k;
  for (int64_t n : r.total_rows) {
    if (min_rows < 0 || n < min_rows) min_rows = n;
    if (n > max_rows) max_rows = n;
  }
}

}  // namespace tetrad::parallel
