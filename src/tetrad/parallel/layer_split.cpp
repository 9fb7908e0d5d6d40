#include "tetrad/parallel/layer_split.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <tuple>

#include "tetrad/core/error.hpp"
#include "tetrad/model/params.hpp"

namespace tetrad::parallel {

LayerSplit LayerSplit::even(int n_layer, int V) {
  if (V < 1) fail("pipeline layer split: virtual stages must be >= 1, got ", V);
  if (n_layer < V)
    fail("model.n_layer (", n_layer, ") is smaller than the pipeline's virtual stages Gp x "
         "parallel.virtual_stages = ", V, ": every stage needs at least one layer");
  LayerSplit s;
  const int base = n_layer / V, extra = n_layer % V;
  s.bounds.push_back(0);
  for (int j = 0; j < V; ++j) s.bounds.push_back(s.bounds.back() + base + (j < extra ? 1 : 0));
  return s;
}

LayerSplit LayerSplit::from_counts(const std::vector<int>& counts, int n_layer) {
  if (counts.empty()) fail("pipeline layer split: no layer counts given");
  LayerSplit s;
  s.bounds.push_back(0);
  for (size_t j = 0; j < counts.size(); ++j) {
    if (counts[j] < 1)
      fail("parallel.pipeline_layers: virtual stage ", j, " gets ", counts[j],
           " layers; every virtual stage needs at least 1");
    s.bounds.push_back(s.bounds.back() + counts[j]);
  }
  if (s.bounds.back() != n_layer)
    fail("parallel.pipeline_layers: the layer counts sum to ", s.bounds.back(),
         ", expected model.n_layer = ", n_layer);
  return s;
}

std::vector<int> LayerSplit::counts() const {
  std::vector<int> c;
  for (size_t j = 0; j + 1 < bounds.size(); ++j) c.push_back(bounds[j + 1] - bounds[j]);
  return c;
}

std::pair<int, int> LayerSplit::layers(int j) const {
  if (j < 0 || j >= virtual_stages())
    fail("pipeline layer split: virtual stage ", j, " outside 0..", virtual_stages() - 1);
  return {bounds[size_t(j)], bounds[size_t(j) + 1]};
}

int LayerSplit::virtual_stage_of(int l) const {
  if (l < 0 || l >= n_layer())
    fail("pipeline: layer ", l, " is outside the model's layers 0..", n_layer() - 1);
  // The last bound <= l names the virtual stage (bounds strictly increase).
  return int(std::upper_bound(bounds.begin(), bounds.end(), l) - bounds.begin()) - 1;
}

std::string LayerSplit::to_string() const {
  std::ostringstream os;
  const auto c = counts();
  for (size_t j = 0; j < c.size(); ++j) os << (j ? "," : "") << c[j];
  return os.str();
}

StageCosts stage_costs(const ModelConfig& c, int seq_len) {
  if (seq_len < 1) fail("pipeline layer split: sequence length must be >= 1, got ", seq_len);
  // Every layer has the same weights: count layer 0's GEMM weights.
  double layer_weights = 0;
  for (const auto& p : build_param_table(c).specs)
    if (p.layer == 0 && p.kind == ParamKind::Linear && p.shape.size() == 2)
      layer_weights += double(p.numel);
  const double C = c.n_embd, V = c.vocab_size;
  StageCosts s;
  // 2 FLOPs per weight forward, 4 backward; attention scores and values 4 A T forward, 8 backward
  // (A = n_head * head_dim)
  // (flops_per_token's convention, causal masking not discounted).
  s.layer = 6.0 * layer_weights + 12.0 * double(c.q_dim()) * seq_len;
  // Output head GEMM [V, C] (6 FLOPs per weight as above) and the loss: softmax forward (max,
  // exp, sum, divide: about 4 per vocabulary entry) and its gradient (softmax minus one-hot: 1).
  s.head = 6.0 * C * V + 5.0 * V;
  // The lookup itself copies; the position add (learned positions) is C forward, and the
  // backward scatter-adds the gradient into the token (and position) table: C each.
  s.embedding = c.desc().positions == Positions::Learned ? 3.0 * C : 1.0 * C;
  return s;
}

std::vector<double> virtual_stage_costs(const LayerSplit& split, const StageCosts& costs) {
  const int V = split.virtual_stages();
  std::vector<double> out(size_t(V), 0.0);
  for (int j = 0; j < V; ++j) {
    const auto [l0, l1] = split.layers(j);
    out[size_t(j)] = (l1 - l0) * costs.layer + (j == 0 ? costs.embedding : 0.0) +
                     (j == V - 1 ? costs.head : 0.0);
  }
  return out;
}

LayerSplit balanced_split(int n_layer, int p, int v, const StageCosts& costs) {
  if (p < 1 || v < 1)
    fail("pipeline layer split: stages (", p, ") and virtual stages (", v, ") must be >= 1");
  const int V = p * v;
  (void)LayerSplit::even(n_layer, V);  // checks n_layer >= V
  if (!(costs.layer > 0) || costs.embedding < 0 || costs.head < 0)
    fail("pipeline layer split: a layer's cost must be positive and the embedding's and head's "
         "non-negative (got layer ", costs.layer, ", embedding ", costs.embedding, ", head ",
         costs.head, ")");
  // Cost of virtual stage j holding n layers.
  auto cost = [&](int j, int n) {
    return n * costs.layer + (j == 0 ? costs.embedding : 0.0) + (j == V - 1 ? costs.head : 0.0);
  };
  // Two dynamic programs over (virtual stages placed, layers used), both exact:
  //  1. the smallest possible busiest-stage cost B;
  //  2. among splits whose every stage costs <= B, the smallest sum of squared costs (the most
  //     even one; decides ties deterministically).
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const int L = n_layer;
  // best[j][l]: first j virtual stages hold the first l layers.
  std::vector<std::vector<double>> best(size_t(V) + 1, std::vector<double>(size_t(L) + 1, kInf));
  best[0][0] = 0;
  for (int j = 1; j <= V; ++j)
    for (int l = j; l <= L - (V - j); ++l)
      for (int n = 1; n <= l - (j - 1); ++n)
        if (best[size_t(j) - 1][size_t(l - n)] < kInf)
          best[size_t(j)][size_t(l)] =
              std::min(best[size_t(j)][size_t(l)],
                       std::max(best[size_t(j) - 1][size_t(l - n)], cost(j - 1, n)));
  const double bottleneck = best[size_t(V)][size_t(L)];
  const double limit = bottleneck * (1 + 1e-12);  // costs are sums of doubles: allow rounding
  std::vector<std::vector<double>> sq(size_t(V) + 1, std::vector<double>(size_t(L) + 1, kInf));
  std::vector<std::vector<int>> take(size_t(V) + 1, std::vector<int>(size_t(L) + 1, 0));
  sq[0][0] = 0;
  for (int j = 1; j <= V; ++j)
    for (int l = j; l <= L - (V - j); ++l)
      for (int n = 1; n <= l - (j - 1); ++n) {
        const double c = cost(j - 1, n);
        const double prev = sq[size_t(j) - 1][size_t(l - n)];
        if (c > limit || prev == kInf) continue;
        if (prev + c * c < sq[size_t(j)][size_t(l)]) {
          sq[size_t(j)][size_t(l)] = prev + c * c;
          take[size_t(j)][size_t(l)] = n;
        }
      }
  TETRAD_CHECK(sq[size_t(V)][size_t(L)] < kInf, "balanced split found no split within its bound");
  std::vector<int> counts(static_cast<size_t>(V));
  for (int j = V, l = L; j >= 1; --j) {
    counts[size_t(j) - 1] = take[size_t(j)][size_t(l)];
    l -= counts[size_t(j) - 1];
  }
  // 3. With interleaving (v > 1) a rank's busy time is the sum of its v chunks, which the
  //    virtual-stage bound leaves open (e.g. 12 layers, p = v = 2, head 1.15 layers: 3,4,3,2 and
  //    3,3,4,2 both have a busiest virtual stage of 4 layers, but their ranks carry 6 | 7.15 and
  //    7 | 6.15). Move single layers between virtual stages while that keeps every virtual stage
  //    within the bound and lowers (the busiest rank, then the sum of squares); each move lowers
  //    that pair, so this ends.
  if (v > 1) {
    auto score = [&](const std::vector<int>& n) {
      std::vector<double> rank(size_t(p), 0.0);
      double squares = 0, worst_stage = 0;
      for (int j = 0; j < V; ++j) {
        const double c = cost(j, n[size_t(j)]);
        rank[size_t(j % p)] += c;
        squares += c * c;
        worst_stage = std::max(worst_stage, c);
      }
      return std::tuple{worst_stage <= limit, *std::max_element(rank.begin(), rank.end()), squares};
    };
    auto better = [](const auto& a, const auto& b) {
      const double eps = 1e-12 * (1 + std::abs(std::get<1>(b)));
      if (std::get<1>(a) < std::get<1>(b) - eps) return true;
      return std::abs(std::get<1>(a) - std::get<1>(b)) <= eps &&
             std::get<2>(a) < std::get<2>(b) * (1 - 1e-12);
    };
    for (bool moved = true; moved;) {
      moved = false;
      auto current = score(counts);
      for (int from = 0; from < V && !moved; ++from)
        for (int to = 0; to < V && !moved; ++to) {
          if (from == to || counts[size_t(from)] < 2) continue;
          std::vector<int> n = counts;
          --n[size_t(from)];
          ++n[size_t(to)];
          const auto s = score(n);
          if (std::get<0>(s) && better(s, current)) {
            counts = n;
            moved = true;
          }
        }
    }
  }
  return LayerSplit::from_counts(counts, n_layer);
}

namespace {
// Splits "3, 1,2" into integers; empty optional-like flag when not a list of integers.
bool parse_counts(const std::string& spec, std::vector<int>& out) {
  out.clear();
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) return false;
    item = item.substr(b, e - b + 1);
    if (item.empty() || item.size() > 9 ||
        !std::all_of(item.begin(), item.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      return false;
    out.push_back(std::stoi(item));
  }
  return !out.empty() && spec.back() != ',';
}
}  // namespace

void check_layer_split_spec(const std::string& spec) {
  std::vector<int> counts;
  if (spec == "even" || spec == "balanced") return;
  if (!parse_counts(spec, counts))
    fail("parallel.pipeline_layers: expected \"even\", \"balanced\" or a comma list of layer "
         "counts per virtual stage (e.g. \"3,1\"), got \"", spec, "\"");
  for (size_t j = 0; j < counts.size(); ++j)
    if (counts[j] < 1)
      fail("parallel.pipeline_layers: virtual stage ", j, " gets ", counts[j],
           " layers in \"", spec, "\"; every virtual stage needs at least 1");
}

LayerSplit resolve_layer_split(const std::string& spec, const ModelConfig& c, int seq_len, int p,
                               int v) {
  check_layer_split_spec(spec);
  if (p < 1 || v < 1)
    fail("pipeline layer split: stages (", p, ") and virtual stages (", v, ") must be >= 1");
  const int V = p * v;
  if (spec == "even") return LayerSplit::even(c.n_layer, V);
  if (spec == "balanced") return balanced_split(c.n_layer, p, v, stage_costs(c, seq_len));
  std::vector<int> counts;
  parse_counts(spec, counts);
  if (int(counts.size()) != V)
    fail("parallel.pipeline_layers = \"", spec, "\" gives ", counts.size(),
         " layer counts; expected one per virtual stage: Gp x parallel.virtual_stages = ", p,
         " x ", v, " = ", V, " (summing to model.n_layer = ", c.n_layer, ")");
  return LayerSplit::from_counts(counts, c.n_layer);
}

}  // namespace tetrad::parallel
