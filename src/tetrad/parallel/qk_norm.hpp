// The RMSNorm on each query and key head (Qwen3, Qwen3-MoE), a part of the block (block.hpp's
// DenseBlock, and so the MoeBlock built on it, run it where FamilyDesc::qk_norm says):
//   x -> norm_1 -> qkv -> q_norm on each q head, k_norm on each k head -> RoPE -> attention ...
// The norms are per head (backend op head_norm_*), so a rank holding some of the heads (Y)
// normalises them without communication; their weights, one head_dim vector each, are whole on
// every rank, and their gradients, partial over this rank's heads, are summed over Y before they
// join the gradient blocks. The norm's input and statistics are the layer's qk_in and qk_rstd
// activations (activation_layout.hpp). With the context axis each rank normalises its own
// chunks' rows; with sequence sharding the rows are the all-gathered q|k|v rows of its heads.
#pragma once
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/parallel/block.hpp"

namespace tetrad::parallel {

class QkNorm {
 public:
  explicit QkNorm(const BlockParts& parts);

  // On layer l's q|k|v rows [N, QKVy] after the projection (with its bias), before the rotary
  // positions; and the backward on dqkv after the rotary adjoint, before the projection's.
  void forward(int l, int64_t N);
  void backward(int l, int64_t N);

 private:
  struct Norms {
    int q = -1, k = -1;  // parameter table indices of q_norm and k_norm
  };
  // The op's arguments for this rank's q heads (k = false) or k heads of layer l.
  backend::HeadNormArgs args(int l, int64_t N, bool k, float* rows) const;

  const StepContext& ctx_;
  ParallelOps& ops_;
  const ParallelActivations& a_;
  std::vector<Norms> norms_;
  float eps_;
  backend::DeviceBuffer dw_;  // [head_dim]: one norm's weight gradient of this rank's heads
};

}  // namespace tetrad::parallel
