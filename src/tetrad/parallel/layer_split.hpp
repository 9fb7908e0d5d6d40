// How the model's layers split into pipeline virtual stages (docs/parallel.md, "Layer split").
//
// A pipeline of Gp stages with v chunks per stage has V = Gp x v virtual stages; virtual stage j
// runs on stage j % Gp and holds a contiguous run of layers. Virtual stage 0 also runs the
// embedding, virtual stage V - 1 the final norm, the output head and the loss. The split is
// chosen by parallel.pipeline_layers:
//   "even"      today's default: L / V layers each, the first L % V one layer more.
//   "balanced"  the layer counts that minimise the busiest virtual stage's cost (per-token
//               forward + backward FLOPs of its layers, plus the embedding on the first and the
//               head + loss on the last); among those, the one with the least busy rank (with
//               interleaving a rank runs v virtual stages), then the smallest sum of squared
//               costs (the most even). Every virtual stage keeps at least one layer.
//   "a,b,c,..." explicit layer counts, one per virtual stage (V of them, each >= 1, sum L).
// Everything that needs to know which layers a stage runs (sharding, the model, the pipeline
// driver, checkpoints, the planner, the benchmark) takes a LayerSplit, so they all agree.
// Pure functions: no MPI.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "tetrad/model/model_config.hpp"

namespace tetrad::parallel {

struct LayerSplit {
  // bounds[j] .. bounds[j + 1] are the layers of virtual stage j; bounds.front() = 0,
  // bounds.back() = n_layer. Empty: no split chosen (a grid without a pipeline axis).
  std::vector<int> bounds;

  // L / V each, the first L % V one more. Throws Error when V < 1 or L < V.
  static LayerSplit even(int n_layer, int V);
  // From one layer count per virtual stage. Throws Error unless each is >= 1 and they sum to
  // n_layer (the message names the expected count and sum).
  static LayerSplit from_counts(const std::vector<int>& counts, int n_layer);

  int virtual_stages() const { return bounds.empty() ? 0 : int(bounds.size()) - 1; }
  int n_layer() const { return bounds.empty() ? 0 : bounds.back(); }
  std::vector<int> counts() const;
  // [first, last) layers of virtual stage j.
  std::pair<int, int> layers(int j) const;
  // The virtual stage that runs layer l (throws Error outside 0..n_layer-1).
  int virtual_stage_of(int l) const;
  // The pipeline stage (0..p-1) that runs layer l: virtual stage j runs on stage j % p.
  int stage_of(int l, int p) const { return virtual_stage_of(l) % p; }
  std::string to_string() const;  // "3,1"
  bool operator==(const LayerSplit&) const = default;
};

// Relative per-token cost (forward + backward FLOPs) of the pieces a virtual stage can hold,
// in the convention of flops_per_token(): a layer's weights 6 FLOPs per weight, its attention
// 12 C T; the head 6 C V (its GEMM) plus the loss's softmax and cross-entropy; the embedding's
// lookup and gradient scatter (a few FLOPs per hidden element).
struct StageCosts {
  double layer = 0, embedding = 0, head = 0;
};
StageCosts stage_costs(const ModelConfig& c, int seq_len);

// The split of n_layer over p stages x v chunks minimising the busiest virtual stage (see the
// header comment). Throws Error when n_layer < p v.
LayerSplit balanced_split(int n_layer, int p, int v, const StageCosts& costs);
// The cost of each virtual stage of `split` under `costs`.
std::vector<double> virtual_stage_costs(const LayerSplit& split, const StageCosts& costs);

// Parses parallel.pipeline_layers ("even", "balanced" or a comma list) into the split for p
// stages x v chunks of model `c` trained at seq_len tokens. Throws Error naming the key, what
// was given and what was expected.
LayerSplit resolve_layer_split(const std::string& spec, const ModelConfig& c, int seq_len, int p,
                               int v);
// Checks the spec's syntax without a model or grid (config validation): "even", "balanced", or
// a comma list of positive integers.
void check_layer_split_spec(const std::string& spec);

}  // namespace tetrad::parallel
