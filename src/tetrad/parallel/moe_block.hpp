// The mixture-of-experts block on the grid (Mixtral's; block.hpp's interface): the dense block's
// attention half (dense_block.hpp), then in place of its MLP
//   ln2 -> router (fp32 GEMM [N, E]) -> softmax, top k, combine weights (host: moe_routing.hpp)
//     -> the tokens' rows in expert order (moe_permute) -> each expert's SwiGLU MLP over its rows
//     (grouped GEMMs: gate|up, SwiGLU, down) -> the weighted combine back to the tokens
//     (moe_unpermute) + resid_mid.
// Dropless by default (an expert computes every row routed to it, however uneven); with
// ModelConfig::moe_capacity_factor the choices past an expert's capacity are dropped and
// counted. The router's losses (the load-balancing auxiliary loss and the z-loss, with their
// coefficients, averaged over the layers) enter the backward weighted like grad_scale * N tokens
// of the cross-entropy; their values and the experts' load are the block's MoeStats.
//
// Optional parts (model/family.hpp's SharedGate.. and ExpertBias roles): the shared expert
// (Qwen2-MoE's form) adds sigmoid(ln2 · w_gate) * SwiGLU-MLP_shared(ln2) to every token's output;
// its weights are dense ones (whole on every rank, reduced over every data rank, also with
// E > 1). The expert bias (DeepSeek-V3's aux-loss-free balancing) is added to the router's
// probabilities for the top-k selection only, and is updated after each optimizer step from the
// step's load (MoeStats::load, ParallelTransformer::update_expert_bias), not by the optimizer.
//
// The backward recomputes the routing from the layer's stored logits (the same plan bit for
// bit), so it needs no host state kept from the forward: pipeline chunks and recomputation
// restore the activations alone. On the tensor axes the router's logits are summed over X (the
// routing sees the whole hidden vector and is the same on every X and Y rank), the rows carry
// this rank's Cx columns and each expert is split over X and Y like the dense MLP (its GEMMs'
// partial sums over X and Y: expert_mlp.hpp). With the expert-parallel fold (GridShape::e() > 1)
// each rank holds n_experts / E of them and the rows travel to them and back by all-to-all
// (expert_parallel.hpp). Precision bf16: the experts' GEMMs in bf16 (the bf16 weight copy, the
// SwiGLU output in bf16 with bf16 activations; expert_mlp.hpp), the router, its input (ln2) and
// everything after its logits in fp32; master weights, gradients fp32.
#pragma once
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/parallel/dense_block.hpp"
#include "tetrad/parallel/expert_parallel.hpp"
#include "tetrad/parallel/moe_routing.hpp"

namespace tetrad::parallel {

class MoeBlock final : public DenseBlock {
 public:
  explicit MoeBlock(const BlockParts& parts);

  // The dense block's backward; a forward it reruns (full recomputation) is not counted again
  // in the statistics.
  void backward(int l, const float* x_in, int B, int T) override {
    recomputing_ = true;
    DenseBlock::backward(l, x_in, B, T);
    recomputing_ = false;
  }
  void set_grad_scale(float grad_scale) override { grad_scale_ = grad_scale; }
  int64_t expert_exchange_bytes() const override { return ep_ ? ep_->bytes() : 0; }
  MoeStats take_moe_stats() override {
    MoeStats s = stats_;
    stats_ = MoeStats{};
    return s;
  }

 private:
  struct Experts {
    int router = -1, gate_up = -1, down = -1;  // parameter table indices
    int shared_gu = -1, shared_down = -1, shared_gate = -1, bias = -1;  // -1: not in the model
  };
  void mlp_forward(int l, int64_t N) override;
  void mlp_backward(int l, int64_t N) override;
  // The shared expert: forward adds its gated output to resid_out; backward adds its input
  // gradient to dln and accumulates its weights' gradients (after the routed experts').
  void shared_forward(int l, int64_t N);
  void shared_backward(int l, int64_t N);
  // The gate's sigmoid of layer l's stored logits into sgate_ (host and device), and the
  // identity plan (token t to row t) the combine op scales the shared rows with.
  void shared_gate(int l, int64_t N);
  bool sequence_shardable() const override { return false; }  // parallel.sequence_shard: not yet
  // The layer's routing from its stored logits, and the plan uploaded for the permutation ops.
  void route(int l, int64_t N);
  // The experts' weights as their GEMMs read them, in the model's precision; the layer's
  // SwiGLU output (bf16 with bf16 activations).
  ExpertGemms expert_gemms(const Experts& X) const;
  ExpertAct expert_act(const LayerActs& A) const;

  const ModelConfig& cfg_;
  std::vector<Experts> experts_;
  MoeRouting routing_;
  std::unique_ptr<ExpertParallel> ep_;  // E > 1: the experts' exchange; null: every expert here
  bool grad16_;  // the experts' backward on bf16 gradient copies (ExpertGrad16)
  MoeStats stats_;
  float grad_scale_ = 0.0f;
  bool recomputing_ = false;
  std::vector<float> logits_host_, dw_host_, dlogits_host_, bias_host_, sgate_host_;
  std::vector<double> shares_;  // every token rank's routing_share, in group order
  backend::DeviceArray<int32_t> slots_;      // [N k] the routing's plan
  backend::DeviceArray<float> weights_, dw_;  // [N k] combine weights and their gradient
  backend::DeviceArray<float> dlogits_;       // [N E]
  backend::DeviceArray<int32_t> ident_;       // [N] 0..N-1 (the shared expert's combine)
  backend::DeviceArray<float> sgate_, dsgate_;  // [N] sigmoid gate and its gradient
};

}  // namespace tetrad::parallel
