// The dense transformer block on the grid (GPT-2, Llama, Qwen2, Qwen3; block.hpp's interface):
//   x -> norm_1 -> qkv (normal) [-> q/k norms (Qwen3: qk_norm.hpp)] -> RoPE (rotary positions)
//     -> attention over this rank's heads
//     -> proj (transposed) + x -> norm_2 -> fc (normal) -> GELU / SwiGLU -> fcproj (transposed) + .
// The family description chooses the norm (ParallelOps), the MLP activation and the positions;
// the biases are there where the parameter table has them (Qwen2's q, k, v biases, adjacent,
// are the q|k|v layer's one bias). The backward mirrors the forward line
// for line; with recomputation it first recomputes what the forward did not keep (the whole
// block, or the attention).
//
// It owns the rotary tables, the recompute bookkeeping (which layer the shared scratch holds)
// and the use of the activation buffer's dfc_act: within one call, the MLP's fp32 output before
// its bf16 cast (forward, on a backend without the fused producer) or the gradient of the MLP
// activation (backward). Its backward's other work buffers (dln, dqkv, datty, dfc) hold nothing
// between calls (the head's backward writes dln before the layers run); dresid carries the
// gradient from one part to the next.
#pragma once
#include <memory>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/parallel/block.hpp"
#include "tetrad/parallel/context_attention.hpp"
#include "tetrad/parallel/qk_norm.hpp"

namespace tetrad::parallel {

class DenseBlock : public TransformerBlock {
 public:
  explicit DenseBlock(const BlockParts& parts);

  void forward(int l, const float* x, int B, int T, const CachedKv* kv = nullptr) override;
  void backward(int l, const float* x_in, int B, int T) override;
  int scratch_layer() const override { return scratch_layer_; }
  void scratch_lost() override { scratch_layer_ = -1; }
  bool sequence_shardable() const override { return true; }
  int64_t scratch_bytes() const override { return context_ ? context_->bytes() : 0; }

 protected:
  // The block's MLP (another block shape replaces it: moe_block.hpp): forward from ln2 (its
  // normalised input, in place) to resid_out = resid_mid + MLP; backward from dresid (the
  // gradient of its output) to dln (the gradient of ln2), its weights' gradients accumulated.
  virtual void mlp_forward(int l, int64_t N);
  virtual void mlp_backward(int l, int64_t N);

  const StepContext& ctx_;
  ParallelOps& ops_;
  const ParallelActivations& a_;


 private:
  // One layer's tensors (parameter table indices; -1 where the family has none).
  struct Weights {
    int ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, k_w = -1, v_w = -1, k_b = -1, v_b = -1,
        proj_w = -1,
        proj_b = -1, ln2_w = -1, ln2_b = -1, fc_w = -1, fc_b = -1, up_w = -1, fcproj_w = -1,
        fcproj_b = -1;
  };
  // Attention of layer l from its stored q|k|v (after RoPE): atty and lse.
  void attention(int l, int B, int T);
  // This X rank's share of the B sequences' attention (dense_block.cpp): [b0, b0 + nb); split
  // when the X ranks share the sequences (their rows are then all-gathered over X).
  struct SequenceShare {
    int b0 = 0, nb = 0;
    bool split = false;
  };
  SequenceShare sequence_share(int B) const;
  backend::AttentionArgs share_args(int B, int T, const SequenceShare& s) const;
  void gather_sequences(float* p, const SequenceShare& s, int T, int64_t width,
                        const char* what) const;
  // Decoding: the new keys and values appended to the cache, then attention over it.
  void cached_attention(int l, int B, int Tq, const CachedKv& kv);
  // fc_act = GELU(fc) or SwiGLU(gate, up) of layer l (or its bf16 form).
  void mlp_activation(int l, int64_t N);
  // bf16 runs: layer l's stashed tensors (ActStore::Bf16Stash) cast from the fp32 working copy
  // into their bf16 slots after its forward (to_bf16), or back before its backward.
  void stash(int l, int64_t N, bool to_bf16) const;
  // Whether layer views A's stashed MLP input projection is written by the MLP activation's
  // forward and read by its backward in bf16 (Capabilities::bf16_stash_fused): no stash pass.
  bool fused_fc_stash(const LayerActs& A) const;
  // Whether the attention's backward reads layer views A's q|k|v and output from their stashed
  // bf16 copies (bf16 products, no context axis, Capabilities::attention_bf16_saved): neither
  // is cast back to fp32.
  bool saved_attention_bf16(const LayerActs& A) const;
  backend::RopeArgs rope_args(float* x, int64_t N, int T, int pos0) const;
  // The micro-batch's document starts when positions restart per document (RopeArgs::doc_start).
  const int32_t* document_positions() const;
  // RoPE (forward or its adjoint) on B sequences of T local tokens of x, from sequence b0 on,
  // at their true positions (with Gc > 1 each local chunk at its chunk's offset; b0 = 0 there).
  void rope(bool forward, float* x, int B, int T, int pos0, int b0 = 0) const;

  std::vector<Weights> layers_;
  MlpKind mlp_;
  Positions positions_;
  Recompute recompute_;
  backend::Precision attention_precision_;
  int max_len_;
  backend::DeviceBuffer rope_cos_, rope_sin_;  // [max_seq, hd/2] rotary tables
  // Attention over the context axis's gathered keys and values (Gc > 1; null otherwise).
  std::unique_ptr<ContextAttention> context_;
  // The per-head q/k norms between the q|k|v projection and RoPE (FamilyDesc::qk_norm; else null).
  std::unique_ptr<QkNorm> qk_norm_;
  int scratch_layer_ = -1;  // the layer whose recomputable activations the scratch holds
};

}  // namespace tetrad::parallel
