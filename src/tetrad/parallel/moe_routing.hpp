// The mixture of experts' router on the host (moe_block.hpp runs it between the router's GEMM and
// the dispatch): softmax over the experts in double, the top k per token, the combine weights
// (renormalised or not, as the family says), the dispatch plan (each kept choice's row in expert
// order; drops past an expert's capacity, in token order), the load-balancing and z losses, and
// the gradient of the router's logits. Pure arithmetic on host vectors: the block copies the
// logits over and the plan back; nothing here touches a device.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tetrad/model/model_config.hpp"

namespace tetrad::parallel {

struct MoeRouting {
  int64_t N = 0, E = 0, k = 0;
  std::vector<double> probs;     // [N, E] softmax of the logits
  std::vector<double> lse;       // [N] log-sum-exp of each token's logits
  std::vector<int32_t> choice;   // [N, k] experts, most probable first (lowest index on ties)
  std::vector<float> weight;     // [N, k] combine weights
  std::vector<int32_t> slots;    // [N, k] the choice's row in expert order, -1 when dropped
  std::vector<int64_t> routed;   // [E] choices routed to each expert (before any drop)
  std::vector<int64_t> rows;     // [E] rows each expert computes (its kept choices)
  std::vector<int64_t> first;    // [E] its first row
  int64_t kept = 0, dropped = 0; // rows computed, choices dropped
  std::vector<double> psum;      // [E] Σ_t probs[t, e] over these tokens
  double zsum = 0;               // Σ_t lse_t² over these tokens
  // The micro-batch's whole set of tokens: these and those of the other ranks that hold some of
  // its tokens (ProcessGroups::tokens(); on one rank the same as the local values). The
  // router's losses, their gradients and the statistics are of these.
  int64_t total_N = 0, total_dropped = 0;
  std::vector<int64_t> total_routed, total_rows;  // [E]
  double aux = 0;                // E Σ_e (routed_e / N) · mean_t probs[t, e] (Switch / Mixtral)
  double z = 0;                  // mean_t lse_t² (ST-MoE's router z-loss)
};

// The routing of N tokens by their router logits [N, E] (fp32, row-major) under c's settings
// (experts_per_token, moe_renormalize(), moe_capacity_factor), these tokens being the whole
// micro-batch: route_local, then finish_routing with this rank's share alone. expert_bias [E]
// (DeepSeek-V3's aux-loss-free balancing; null: none): as route_local's.
void route_tokens(const float* logits, int64_t N, const ModelConfig& c, MoeRouting& r,
                  const float* expert_bias = nullptr);

// DeepSeek-V3's update of one layer's expert bias after an optimizer step, from the choices
// routed to each expert over the step (every micro-batch, the whole global batch):
// bias_e += rate * sign(mean load - load_e), so an overloaded expert is chosen less and an idle
// one more.
void update_expert_bias_values(float* bias, const int64_t* load, int64_t E, float rate);

// The routing in two halves around an exchange between the ranks that hold the micro-batch's
// tokens. route_local: the probabilities, top k, combine weights and counts of these tokens.
// routing_share: what this rank contributes to the others (routing_share_size(E) doubles: the
// routed counts, probability sums, z sum and token count). finish_routing: given every rank's
// share in group order (`ranks` of them, this rank's at `me`), the totals, the losses and the
// dispatch plan; under a capacity factor an expert's capacity is of the whole micro-batch and
// its choices are taken in group order then token order (the ranks in group order must hold the
// micro-batch's tokens in order: Z and D, not C). expert_bias [E] (null: none) is added to the
// probabilities for the top-k selection only: the combine weights are the unbiased
// probabilities of the chosen experts.
void route_local(const float* logits, int64_t N, const ModelConfig& c, MoeRouting& r,
                 const float* expert_bias = nullptr);
int64_t routing_share_size(int64_t E);
void routing_share(const MoeRouting& r, double* share);
void finish_routing(const ModelConfig& c, const double* shares, int ranks, int me, MoeRouting& r);

// Most rows an expert takes from N tokens: ceil(capacity_factor * N * k / E), or N (dropless).
int64_t expert_capacity(const ModelConfig& c, int64_t N);

// The gradient of the logits [N, E] (overwritten): from the combine weights' gradient dw [N, k]
// (0 for dropped choices), plus aux_scale · d(aux)/d(logits) and z_scale · d(z)/d(logits), the
// losses being those of the whole micro-batch (total_N tokens, total_routed). The
// counts routed_e are constants (the top k is a selection), as in every implementation.
void router_backward(const MoeRouting& r, const float* dw, bool renormalize, double aux_scale,
                     double z_scale, float* dlogits);

// The router's losses and the experts' load over the forward passes since the last take:
// sums over layers and micro-batches, and the least and most rows an expert computed in one
// layer of one micro-batch.
struct MoeStats {
  int64_t layers = 0;  // layer forward passes counted
  double aux = 0, z = 0;
  int64_t min_rows = -1, max_rows = -1, dropped = 0, routed = 0;
  // Choices routed to each expert of each layer [n_layer * E] (layer l's at l * E; zeros for the
  // layers of other pipeline stages), summed over the forward passes: the expert bias's load.
  // Of the whole micro-batch (MoeRouting::total_routed), so the same on every rank of a stage.
  std::vector<int64_t> load;
  int64_t n_experts = 0;  // E, with load
  void add(const MoeRouting& r);
  void add_load(int layer, int n_layer, const MoeRouting& r);
  // The most loaded expert's choices over the mean, the largest over the layers (1: balanced).
  double load_imbalance() const;
  double mean_aux() const { return layers ? aux / double(layers) : 0.0; }
  double mean_z() const { return layers ? z / double(layers) : 0.0; }
};

}  // namespace tetrad::parallel
