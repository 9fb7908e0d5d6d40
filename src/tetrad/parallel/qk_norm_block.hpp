// The dense block with an RMSNorm on each query and key head (Qwen3; block.hpp's interface):
//   x -> norm_1 -> qkv -> q_norm on each q head, k_norm on each k head -> RoPE -> attention ...
// the rest as DenseBlock (dense_block.hpp). The norms are per head (backend op head_norm_*), so a
// rank holding some of the heads (Y) normalises them without communication; their weights, one
// head_dim vector each, are whole on every rank, and their gradients, partial over this rank's
// heads, are summed over Y before they join the gradient blocks. The norm's input and statistics
// are the layer's qk_in and qk_rstd activations (activation_layout.hpp).
#pragma once
#include <vector>

#include "tetrad/parallel/dense_block.hpp"

namespace tetrad::parallel {

class QkNormBlock final : public DenseBlock {
 public:
  explicit QkNormBlock(const BlockParts& parts);

 protected:
  void qkv_forward_extra(int l, int64_t N) override;
  void qkv_backward_extra(int l, int64_t N) override;

 private:
  struct Norms {
    int q = -1, k = -1;  // parameter table indices of q_norm and k_norm
  };
  // The op's arguments for this rank's q heads (k = false) or k heads of layer l.
  backend::HeadNormArgs args(int l, int64_t N, bool k, float* rows) const;

  std::vector<Norms> norms_;
  float eps_;
  backend::DeviceBuffer dw_;  // [head_dim]: one norm's weight gradient of this rank's heads
};

}  // namespace tetrad::parallel
