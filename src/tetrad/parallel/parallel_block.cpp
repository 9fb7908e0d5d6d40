// ParallelTransformer: one transformer block's wiring on the grid, forward and backward.
//   x -> norm_1 -> qkv (normal) -> RoPE (Llama) -> attention over this rank's heads
//     -> proj (transposed) + x -> norm_2 -> fc (normal) -> GELU / SwiGLU -> fcproj (transposed) + .
// The backward mirrors it line for line; with recomputation it first recomputes what the forward
// did not keep (the whole block, or the attention). The layer's gathered weights are in place and
// its gradient blocks zeroed by the caller (the model's forward / backward loops).
#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>

#include "tetrad/parallel/activation_layout.hpp"

namespace tetrad::parallel {

namespace {
// This rank's heads of one micro-batch: q|k|v rows of QKVy, outputs of Ay, causal per sequence.
backend::AttentionArgs local_heads(int B, int T, int64_t nh, int64_t nkv, int64_t hd,
                                   int64_t qkv_row, int64_t out_row, backend::Precision precision) {
  backend::AttentionArgs d;
  d.precision = precision;
  d.B = B; d.Tq = T; d.Tk = T; d.n_head = int(nh); d.n_kv_head = int(nkv); d.head_dim = int(hd);
  d.q_stride = d.kv_stride = qkv_row; d.q_batch_stride = d.kv_batch_stride = T * qkv_row;
  d.out_stride = out_row; d.out_batch_stride = T * out_row;
  return d;
}
}  // namespace

backend::RopeArgs ParallelTransformer::rope_args(float* x, int64_t N, int T, int pos0) const {
  backend::RopeArgs r;
  r.x = x; r.N = N; r.T_seq = T; r.pos0 = pos0; r.n_heads = dims_.nhy + dims_.nkvy; r.head_dim = dims_.hd;
  r.stride = dims_.QKVy; r.cos = rope_cos_.as<float>(); r.sin = rope_sin_.as<float>();
  return r;
}

// Attention of layer l from its stored q|k|v (after RoPE): atty and lse.
void ParallelTransformer::attention_forward(int l, int B, int T) {
  auto& A = a_->layer[l];
  const backend::AttentionArgs d = local_heads(B, T, dims_.nhy, dims_.nkvy, dims_.hd, dims_.QKVy, dims_.Ay, attention_precision_);
  timed(Phase::Attention, [&] {
    ops().attention_forward(bq(), d, A.atty, A.lse, A.qkv, A.qkv + dims_.nhy * dims_.hd,
                            A.qkv + (dims_.nhy + dims_.nkvy) * dims_.hd);
  });
}

// Decoding: this step's Tq keys and values of each sequence appended to layer l's cache at
// pos0.., then each query attends over the cache's first pos0 + Tq positions (its own and the
// earlier ones: the query block is the key block's last Tq rows).
void ParallelTransformer::cached_attention(int l, int B, int Tq, int pos0) {
  auto& A = a_->layer[l];
  const int64_t KW = dims_.nkvy * dims_.hd;
  float* kc = cache_k(l);
  float* vc = cache_v(l);
  timed(Phase::Attention, [&] {
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < Tq; ++i) {
        const float* row = A.qkv + (int64_t(b) * Tq + i) * dims_.QKVy;
        const int64_t dst = (int64_t(b) * max_len_ + pos0 + i) * KW;
        bq().copy_on_device(kc + dst, row + dims_.nhy * dims_.hd, size_t(KW) * sizeof(float));
        bq().copy_on_device(vc + dst, row + (dims_.nhy + dims_.nkvy) * dims_.hd, size_t(KW) * sizeof(float));
      }
    backend::AttentionArgs d = local_heads(B, Tq, dims_.nhy, dims_.nkvy, dims_.hd, dims_.QKVy, dims_.Ay, attention_precision_);
    d.Tk = pos0 + Tq;
    d.kv_stride = KW;
    d.kv_batch_stride = int64_t(max_len_) * KW;
    ops().attention_forward(bq(), d, A.atty, nullptr, A.qkv, kc, vc);
  });
}

// One block from its input x (its weights gathered): every activation of a_->layer[l].
void ParallelTransformer::layer_forward(int l, const float* x, int B, int T, int pos0) {
  const int64_t N = int64_t(B) * T;
  const Layer& L = layers_[l];
  auto& A = a_->layer[l];
  norm_fwd(A.ln1, A.ln1_mean, A.ln1_rstd, x, L.ln1_w, L.ln1_b, N, A.ln1_16);
  normal_fwd(GemmSite::Qkv, A.qkv, act(A.ln1, A.ln1_16), L.qkv_w, L.qkv_b, N);
  if (positions_ == Positions::Rope)
    timed(Phase::Attention, [&] { ops().rope_forward(bq(), rope_args(A.qkv, N, T, std::max(pos0, 0))); });
  if (pos0 < 0) attention_forward(l, B, T);
  else cached_attention(l, B, T, pos0);
  q_.poll();
  transposed_fwd(GemmSite::Proj, A.resid_mid, x, f32(A.atty), L.proj_w, L.proj_b, N);
  norm_fwd(A.ln2, A.ln2_mean, A.ln2_rstd, A.resid_mid, L.ln2_w, L.ln2_b, N, A.ln2_16);
  normal_fwd(GemmSite::Fc, A.fc, act(A.ln2, A.ln2_16), L.fc_w, L.fc_b, N);
  mlp_activation(l, N);
  q_.poll();
  transposed_fwd(GemmSite::FcProj, A.resid_out, A.resid_mid, act(A.fc_act, A.fc_act16), L.fcproj_w,
                 L.fcproj_b, N);
  scratch_layer_ = l;  // with recomputation, the shared scratch now holds this layer
}

// fc_act = GELU(fc) or SwiGLU(gate, up); in bf16 by the fused producer (or fp32 then a cast, on
// a backend without it) when the model stores bf16 activations.
void ParallelTransformer::mlp_activation(int l, int64_t N) {
  auto& A = a_->layer[l];
  ScopedPhase sp(prof_, Phase::Activation);
  const backend::OpTable& op = ops();
  if (A.fc_act16 && op.gelu_forward_bf16 && op.swiglu_forward_bf16) {
    switch (mlp_) {
      case MlpKind::Gelu: op.gelu_forward_bf16(bq(), A.fc_act16, A.fc, N * dims_.Fy); break;
      case MlpKind::SwiGLU: op.swiglu_forward_bf16(bq(), A.fc_act16, A.fc, N, dims_.Fy); break;
    }
    return;
  }
  // The backward's dfc_act is free here (forward, or a recompute before the layer's backward).
  float* out = A.fc_act16 ? a_->dfc_act : A.fc_act;
  switch (mlp_) {
    case MlpKind::Gelu: op.gelu_forward(bq(), out, A.fc, N * dims_.Fy); break;
    case MlpKind::SwiGLU: op.swiglu_forward(bq(), out, A.fc, N, dims_.Fy); break;
  }
  if (A.fc_act16) op.cast_f32_to_bf16(bq(), A.fc_act16, out, N * dims_.Fy);
}

// The block's backward from a_->dresid (the gradient of its output): a_->dresid becomes the
// gradient of its input x_in; the layer's parameter gradients accumulate into its blocks.
void ParallelTransformer::layer_backward(int l, const float* x_in, int B, int T) {
  const int64_t N = int64_t(B) * T;
  const Layer& L = layers_[l];
  Acts& a = *a_;
  auto& A = a.layer[l];
  // Recomputation: the scratch holds only the last layer run forward (the last one, at first).
  if (opt_.recompute == Recompute::Full && scratch_layer_ != l) layer_forward(l, x_in, B, T);
  if (opt_.recompute == Recompute::Selective && scratch_layer_ != l) {
    attention_forward(l, B, T);
    scratch_layer_ = l;
  }
  linear_bwd(GemmSite::FcProj, a.dfc_act, a.dresid, act(A.fc_act, A.fc_act16), L.fcproj_w,
             L.fcproj_b, N);
  timed(Phase::Activation, [&] {
    switch (mlp_) {
      case MlpKind::Gelu: ops().gelu_backward(bq(), a.dfc, a.dfc_act, A.fc, N * dims_.Fy); break;
      case MlpKind::SwiGLU: ops().swiglu_backward(bq(), a.dfc, a.dfc_act, A.fc, N, dims_.Fy); break;
    }
  });
  linear_bwd(GemmSite::Fc, a.dln, a.dfc, act(A.ln2, A.ln2_16), L.fc_w, L.fc_b, N);
  norm_bwd(a.dresid, a.dln, A.resid_mid, A.ln2_mean, A.ln2_rstd, L.ln2_w, L.ln2_b, N);
  linear_bwd(GemmSite::Proj, a.datty, a.dresid, f32(A.atty), L.proj_w, L.proj_b, N);
  const backend::AttentionArgs d = local_heads(B, T, dims_.nhy, dims_.nkvy, dims_.hd, dims_.QKVy, dims_.Ay, attention_precision_);
  timed(Phase::Attention, [&] {
    ops().attention_backward(bq(), d, a.dqkv, a.dqkv + dims_.nhy * dims_.hd, a.dqkv + (dims_.nhy + dims_.nkvy) * dims_.hd,
                             a.datty, A.qkv, A.qkv + dims_.nhy * dims_.hd, A.qkv + (dims_.nhy + dims_.nkvy) * dims_.hd,
                             A.atty, A.lse);
    if (positions_ == Positions::Rope) ops().rope_backward(bq(), rope_args(a.dqkv, N, T));
  });
  q_.poll();
  linear_bwd(GemmSite::Qkv, a.dln, a.dqkv, act(A.ln1, A.ln1_16), L.qkv_w, L.qkv_b, N);
  norm_bwd(a.dresid, a.dln, x_in, A.ln1_mean, A.ln1_rstd, L.ln1_w, L.ln1_b, N);
}

}  // namespace tetrad::parallel
