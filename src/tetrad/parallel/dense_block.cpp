// DenseBlock (dense_block.hpp): one dense transformer block's wiring on the grid, forward and
// backward (make_block.cpp chooses it or another shape by the family). The layer's gathered
// weights are in place and its gradient blocks zeroed by the caller (the model's forward /
// backward loops).
#include "tetrad/parallel/dense_block.hpp"

#include <algorithm>

#include "tetrad/backend/rope_tables.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

namespace k = kernels;

namespace {
// This rank's heads of one micro-batch: q|k|v rows of QKVy, outputs of Ay, causal per sequence.
backend::AttentionArgs local_heads(int B, int T, const LocalDims& d, backend::Precision precision) {
  backend::AttentionArgs a;
  a.precision = precision;
  a.B = B; a.Tq = T; a.Tk = T; a.n_head = int(d.nhy); a.n_kv_head = int(d.nkvy); a.head_dim = int(d.hd);
  a.q_stride = a.kv_stride = d.QKVy; a.q_batch_stride = a.kv_batch_stride = T * d.QKVy;
  a.out_stride = d.Ay; a.out_batch_stride = T * d.Ay;
  return a;
}
// ... with the micro-batch's document mask (data.document_mask), when on.
backend::AttentionArgs local_heads(int B, int T, const StepContext& ctx,
                                   backend::Precision precision) {
  backend::AttentionArgs a = local_heads(B, T, ctx.dims, precision);
  if (ctx.docs.mask) {
    TETRAD_CHECK(ctx.docs.dev != nullptr, "document mask on without the micro-batch's documents");
    a.doc_start = ctx.docs.dev;
    a.doc_batch_stride = T;
  }
  return a;
}
}  // namespace

DenseBlock::DenseBlock(const BlockParts& p)
    : ctx_(p.ctx), ops_(p.ops), a_(p.acts), mlp_(p.config.desc().mlp),
      positions_(p.config.desc().positions), recompute_(p.recompute),
      attention_precision_(p.attention_precision), max_len_(p.max_len) {
  // Each tensor's place in the block, by its role (fused groups follow their first tensor:
  // build_param_table checked that k, v follow q and up follows gate).
  layers_.resize(size_t(p.config.n_layer));
  for (size_t i = 0; i < p.table.specs.size(); ++i) {
    const ParamSpec& s = p.table.specs[i];
    if (s.layer < 0) continue;  // the model's ends
    const int ti = int(i);
    Weights& L = layers_[size_t(s.layer)];
    using R = TensorRole;
    switch (s.role) {
      case R::AttnNorm: L.ln1_w = ti; break;
      case R::AttnNormBias: L.ln1_b = ti; break;
      case R::Qkv: case R::Q: L.qkv_w = ti; break;
      case R::K: L.k_w = ti; break;
      case R::V: L.v_w = ti; break;
      case R::QkvBias: case R::QBias: L.qkv_b = ti; break;
      case R::KBias: L.k_b = ti; break;
      case R::VBias: L.v_b = ti; break;
      case R::AttnOut: L.proj_w = ti; break;
      case R::AttnOutBias: L.proj_b = ti; break;
      case R::MlpNorm: L.ln2_w = ti; break;
      case R::MlpNormBias: L.ln2_b = ti; break;
      case R::MlpIn: case R::Gate: L.fc_w = ti; break;
      case R::Up: L.up_w = ti; break;
      case R::MlpInBias: L.fc_b = ti; break;
      case R::MlpOut: L.fcproj_w = ti; break;
      case R::MlpOutBias: L.fcproj_b = ti; break;
      case R::QNorm: case R::KNorm:
        if (p.config.desc().qk_norm) break;  // the q/k norms bind their own (QkNorm)
        fail("tensor '", s.name, "' (", role_name(s.role), ") in a block without q/k norms");
      case R::Router: case R::ExpertGateUp: case R::ExpertDown: case R::SharedGate:
      case R::SharedUp: case R::SharedDown: case R::SharedExpertGate: case R::ExpertBias:
        if (p.config.moe()) break;  // the mixture of experts binds its own (MoeBlock)
        fail("tensor '", s.name, "' (", role_name(s.role), ") in a dense block");
      default: fail("tensor '", s.name, "' (", role_name(s.role), ") inside a block");
    }
  }
  if (positions_ == Positions::Rope) {
    const int64_t hd = ctx_.dims.hd, half = hd / 2;
    const ModelConfig& cfg = p.config;
    // The tables are built on the host once (the model's rotary settings) and copied over.
    const size_t n = size_t(cfg.max_seq) * size_t(half);
    std::vector<float> cos_host(n), sin_host(n);
    k::rope_tables(cos_host.data(), sin_host.data(), cfg.max_seq, hd, rope_frequencies(cfg));
    rope_cos_ = ctx_.be->alloc_array<float>(n);
    rope_sin_ = ctx_.be->alloc_array<float>(n);
    ctx_.bq().copy_to_device(rope_cos_.data(), cos_host.data(), n * sizeof(float));
    ctx_.bq().copy_to_device(rope_sin_.data(), sin_host.data(), n * sizeof(float));
    ctx_.bq().synchronize();
  }
  if (p.config.desc().qk_norm) qk_norm_ = std::make_unique<QkNorm>(p);
  if (ctx_.shape().c() > 1)
    context_ = std::make_unique<ContextAttention>(ctx_, p.local_batch, p.max_len / ctx_.shape().c(),
                                                  p.cp_comm, p.cp_skip_masked_pairs);
}

const int32_t* DenseBlock::document_positions() const {
  if (!ctx_.docs.positions) return nullptr;
  TETRAD_CHECK(ctx_.docs.dev != nullptr, "document positions on without the micro-batch's documents");
  return ctx_.docs.dev;
}

backend::RopeArgs DenseBlock::rope_args(float* x, int64_t N, int T, int pos0) const {
  const LocalDims& d = ctx_.dims;
  backend::RopeArgs r;
  r.x = x; r.N = N; r.T_seq = T; r.pos0 = pos0; r.n_heads = d.nhy + d.nkvy; r.head_dim = d.hd;
  r.stride = d.QKVy; r.cos = rope_cos_.as<float>(); r.sin = rope_sin_.as<float>();
  return r;
}

void DenseBlock::rope(bool forward, float* x, int B, int T, int pos0, int b0) const {
  const backend::OpTable& op = ctx_.ops();
  auto run = forward ? op.rope_forward : op.rope_backward;
  const int32_t* docs = document_positions();
  if (!context_) {
    const int64_t r0 = int64_t(b0) * T;
    backend::RopeArgs r = rope_args(x + r0 * ctx_.dims.QKVy, int64_t(B) * T, T, pos0);
    r.doc_start = docs ? docs + r0 : nullptr;
    return run(ctx_.bq(), r);
  }
  TETRAD_CHECK(b0 == 0, "rope: sequences of a share with the context axis");
  // Each local chunk at its offset; per-document positions subtract the whole sequence's document
  // starts (positions of the whole sequence, as the chunk's own are).
  const ContextSplit& cs = context_->split();
  const int Tc = cs.chunk_len(T);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < cs.local_chunks(); ++j) {
      const int64_t row = int64_t(b) * T + int64_t(j) * Tc;
      backend::RopeArgs r = rope_args(x + row * ctx_.dims.QKVy, Tc, Tc, int(cs.chunk_offset(j, T)));
      r.doc_start = docs ? docs + row : nullptr;
      run(ctx_.bq(), r);
    }
}

// The X axis's share of attention's sequences. After the q|k|v layer's all-reduce over X every X
// rank holds all of its heads for every sequence, and attention would run Gx times over, once
// per X rank (the X grid's largest replicated work: 2x1x1x1 ran the whole model's attention on
// both ranks). Instead X rank x runs sequences [x nb, (x + 1) nb), nb = B / Gx (whole sequences:
// a sequence's tokens are contiguous rows), and the rows it computed are all-gathered over X:
// atty in the forward (the out-projection's GEMMs read every row), dq|dk|dv in the backward (the
// q|k|v layer's). Per sequence the same kernel on the same rows (AttentionArgs::chunk_B keeps
// the whole batch's work split): the same bits as every X rank running every sequence. Not with
// the context axis (its own exchange of keys and values) nor where Gx does not divide B.
DenseBlock::SequenceShare DenseBlock::sequence_share(int B) const {
  const comm::Communicator& gx = ctx_.g().x();
  if (gx.size() == 1 || context_ || B % gx.size() != 0) return {0, B, false};
  const int nb = B / gx.size();
  return {gx.rank() * nb, nb, true};
}

backend::AttentionArgs DenseBlock::share_args(int B, int T, const SequenceShare& s) const {
  backend::AttentionArgs args = local_heads(B, T, ctx_, attention_precision_);
  args.B = s.nb;
  args.chunk_B = B;
  if (args.doc_start) args.doc_start += int64_t(s.b0) * T;
  return args;
}

// Rows [b0 T, (b0 + nb) T) of p ([B T, width]) from every X rank: all of them on each.
void DenseBlock::gather_sequences(float* p, const SequenceShare& s, int T, int64_t width,
                                  const char* what) const {
  if (!s.split) return;
  const comm::Communicator& gx = ctx_.g().x();
  const int64_t n = int64_t(s.nb) * T * width;
  ctx_.q().run(gx.iallgather(p + int64_t(s.b0) * T * width, p, size_t(n), ctx_.q().ready()), gx,
               "allgather", what, ctx_.prof ? ctx_.prof->layer : -2,
               n * gx.size() * int64_t(sizeof(float)));
}

void DenseBlock::attention(int l, int B, int T) {
  const auto& A = a_.layer[size_t(l)];
  const LocalDims& d = ctx_.dims;
  if (context_) {
    ScopedPhase sp(ctx_.prof, Phase::Attention);
    return context_->forward(local_heads(B, T, ctx_, attention_precision_), A.atty, A.lse, A.qkv,
                             l);
  }
  const SequenceShare s = sequence_share(B);
  {
    ScopedPhase sp(ctx_.prof, Phase::Attention);
    const float* qkv = A.qkv + int64_t(s.b0) * T * d.QKVy;
    ctx_.ops().attention_forward(ctx_.bq(), share_args(B, T, s), A.atty + int64_t(s.b0) * T * d.Ay,
                                 A.lse + int64_t(s.b0) * d.nhy * T, qkv, qkv + d.nhy * d.hd,
                                 qkv + (d.nhy + d.nkvy) * d.hd);
  }
  gather_sequences(A.atty, s, T, d.Ay, "attention out");
}

// This step's Tq keys and values of each sequence appended to layer l's cache at pos0.., then
// each query attends over the cache's first pos0 + Tq positions (its own and the earlier ones:
// the query block is the key block's last Tq rows).
void DenseBlock::cached_attention(int l, int B, int Tq, const CachedKv& kv) {
  const auto& A = a_.layer[size_t(l)];
  const LocalDims& d = ctx_.dims;
  const int64_t KW = d.nkvy * d.hd;
  backend::Queue& q = ctx_.bq();
  ScopedPhase sp(ctx_.prof, Phase::Attention);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < Tq; ++i) {
      const float* row = A.qkv + (int64_t(b) * Tq + i) * d.QKVy;
      const int64_t dst = (int64_t(b) * max_len_ + kv.pos0 + i) * KW;
      q.copy_on_device(kv.k + dst, row + d.nhy * d.hd, size_t(KW) * sizeof(float));
      q.copy_on_device(kv.v + dst, row + (d.nhy + d.nkvy) * d.hd, size_t(KW) * sizeof(float));
    }
  backend::AttentionArgs args = local_heads(B, Tq, d, attention_precision_);
  args.Tk = kv.pos0 + Tq;
  args.kv_stride = KW;
  args.kv_batch_stride = int64_t(max_len_) * KW;
  ctx_.ops().attention_forward(q, args, A.atty, nullptr, A.qkv, kv.k, kv.v);
}

// One block from its input x (its weights gathered): every activation of layer l's views.
void DenseBlock::forward(int l, const float* x, int B, int T, const CachedKv* kv) {
  const int64_t N = int64_t(B) * T;
  const Weights& L = layers_[size_t(l)];
  const auto& A = a_.layer[size_t(l)];
  ops_.norm_fwd(A.ln1, A.ln1_mean, A.ln1_rstd, x, L.ln1_w, L.ln1_b, N, A.ln1_16);
  // With the X ranks sharing the sequences only this rank's rows of q|k|v are read after RoPE
  // (attention's forward and backward): the q|k|v sums are reduce-scattered by rows, and the bias
  // and RoPE run on those rows (dqkv, a backward work buffer, is free here for the partial sums).
  // The q/k norms read every row (their statistics are saved per row): the all-reduce stays.
  const SequenceShare s = kv ? SequenceShare{0, B, false} : sequence_share(B);
  if (s.split && !qk_norm_)
    ops_.normal_fwd_rows(GemmSite::Qkv, A.qkv, a_.dqkv, act(A.ln1, A.ln1_16), L.qkv_w, L.qkv_b,
                         N, int64_t(s.b0) * T, int64_t(s.nb) * T);
  else
    ops_.normal_fwd(GemmSite::Qkv, A.qkv, act(A.ln1, A.ln1_16), L.qkv_w, L.qkv_b, N);
  if (qk_norm_) qk_norm_->forward(l, N);
  if (positions_ == Positions::Rope) {
    ScopedPhase sp(ctx_.prof, Phase::Attention);
    rope(true, A.qkv, s.nb, T, kv ? kv->pos0 : 0, s.b0);
  }
  if (!kv) attention(l, B, T);
  else cached_attention(l, B, T, *kv);
  ctx_.q().poll();
  // A stashed attention output is cast to its bf16 copy now and the out-projection reads that:
  // the GEMM would round it to bf16 itself (the same bits), so the stash costs no pass of its own.
  if (A.atty16) {
    ScopedPhase sp(ctx_.prof, Phase::Other, "bf16 stash");
    ctx_.ops().cast_f32_to_bf16(ctx_.bq(), A.atty16, A.atty, N * ctx_.dims.Ay);
  }
  ops_.transposed_fwd(GemmSite::Proj, A.resid_mid, x, act(A.atty, A.atty16), L.proj_w, L.proj_b, N);
  ops_.norm_fwd(A.ln2, A.ln2_mean, A.ln2_rstd, A.resid_mid, L.ln2_w, L.ln2_b, N, A.ln2_16);
  mlp_forward(l, N);
  scratch_layer_ = l;  // with recomputation, the shared scratch now holds this layer
  stash(l, N, true);
}

void DenseBlock::stash(int l, int64_t N, bool to_bf16) const {
  if (N == 0) return;
  const int ways = int(N / ops_.stream_rows(N));
  const auto& A = a_.layer[size_t(l)];
  const auto tensors = stashed_tensors(A, N, ctx_.dims, ways);
  if (tensors.empty()) return;
  ScopedPhase sp(ctx_.prof, Phase::Other, to_bf16 ? "bf16 stash" : "bf16 unstash");
  for (const StashedTensor& t : tensors) {
    // Passes the producers and consumers make unnecessary: the MLP activation writes the MLP
    // input projection's bf16 copy and its backward reads it (fused_fc_stash); the attention
    // output is cast right after the attention (forward: the out-projection reads the copy);
    // the attention's backward reads q|k|v and its output from their copies where it can
    // (saved_attention_bf16; the out-projection's backward reads the output's copy anyway).
    if (t.f32 == A.fc && fused_fc_stash(A)) continue;
    if (t.f32 == A.atty && to_bf16) continue;
    if ((t.f32 == A.qkv || t.f32 == A.atty) && !to_bf16 && saved_attention_bf16(A)) continue;
    if (to_bf16) ctx_.ops().cast_f32_to_bf16(ctx_.bq(), t.bf16, t.f32, t.n);
    else ctx_.ops().cast_bf16_to_f32(ctx_.bq(), t.f32, t.bf16, t.n);
  }
}

bool DenseBlock::saved_attention_bf16(const LayerActs& A) const {
  return !context_ && A.qkv16 && A.atty16 && attention_precision_ == backend::Precision::BF16 &&
         ctx_.be->capabilities().attention_bf16_saved;
}

bool DenseBlock::fused_fc_stash(const LayerActs& A) const {
  return A.fc16 && A.fc_act16 && ctx_.be->capabilities().bf16_stash_fused;
}

void DenseBlock::mlp_forward(int l, int64_t N) {
  const Weights& L = layers_[size_t(l)];
  const auto& A = a_.layer[size_t(l)];
  ops_.normal_fwd(GemmSite::Fc, A.fc, act(A.ln2, A.ln2_16), L.fc_w, L.fc_b, N);
  mlp_activation(l, N);
  ctx_.q().poll();
  ops_.transposed_fwd(GemmSite::FcProj, A.resid_out, A.resid_mid, act(A.fc_act, A.fc_act16),
                      L.fcproj_w, L.fcproj_b, N);
}

// fc_act = GELU(fc) or SwiGLU(gate, up); in bf16 by the fused producer (or fp32 into dfc_act
// then a cast, on a backend without it) when the model stores bf16 activations.
void DenseBlock::mlp_activation(int l, int64_t N) {
  const auto& A = a_.layer[size_t(l)];
  const int64_t Fy = ctx_.dims.Fy;
  ScopedPhase sp(ctx_.prof, Phase::Activation);
  const backend::OpTable& op = ctx_.ops();
  backend::Queue& q = ctx_.bq();
  if (fused_fc_stash(A)) {  // fc's stashed bf16 copy in the same pass
    switch (mlp_) {
      case MlpKind::Gelu: op.gelu_forward_bf16_x(q, A.fc_act16, A.fc16, A.fc, N * Fy); break;
      case MlpKind::SwiGLU: op.swiglu_forward_bf16_x(q, A.fc_act16, A.fc16, A.fc, N, Fy); break;
    }
    return;
  }
  if (A.fc_act16 && op.gelu_forward_bf16 && op.swiglu_forward_bf16) {
    switch (mlp_) {
      case MlpKind::Gelu: op.gelu_forward_bf16(q, A.fc_act16, A.fc, N * Fy); break;
      case MlpKind::SwiGLU: op.swiglu_forward_bf16(q, A.fc_act16, A.fc, N, Fy); break;
    }
    return;
  }
  // dfc_act is this block's and free here (forward, or a recompute before the layer's backward).
  float* out = A.fc_act16 ? a_.dfc_act : A.fc_act;
  switch (mlp_) {
    case MlpKind::Gelu: op.gelu_forward(q, out, A.fc, N * Fy); break;
    case MlpKind::SwiGLU: op.swiglu_forward(q, out, A.fc, N, Fy); break;
  }
  if (A.fc_act16) op.cast_f32_to_bf16(q, A.fc_act16, out, N * Fy);
}

// The block's backward from dresid (the gradient of its output): dresid becomes the gradient of
// its input x_in; the layer's parameter gradients accumulate into its blocks.
void DenseBlock::backward(int l, const float* x_in, int B, int T) {
  const int64_t N = int64_t(B) * T;
  const Weights& L = layers_[size_t(l)];
  const ParallelActivations& a = a_;
  const auto& A = a.layer[size_t(l)];
  const LocalDims& d = ctx_.dims;
  const backend::OpTable& op = ctx_.ops();
  backend::Queue& q = ctx_.bq();
  // Recomputation: the scratch holds only the last layer run forward (the last one, at first).
  if (recompute_ == Recompute::Full && scratch_layer_ != l) forward(l, x_in, B, T);
  // bf16 runs: the tensors kept in bf16 back into their fp32 working copies (always from the
  // bf16 copy, also for the layer whose forward ran last: every layer's backward reads the same
  // rounded values, whatever the grid or schedule ran before it).
  stash(l, N, false);
  if (recompute_ == Recompute::Selective && scratch_layer_ != l) {
    attention(l, B, T);
    scratch_layer_ = l;
  }
  // dresid: the stream's gradient (this rank's rows with sequence sharding: stream_grad gathers
  // all of them for the transposed layer; the normal layer's summed dIn is again the rows).
  // The summed dIn of the MLP's first layer: in dln, or its rows in dfull (sequence sharding).
  mlp_backward(l, N);
  const float* dln2 = ops_.sequence_sharded() ? a.dfull : a.dln;
  ops_.norm_bwd(a.dresid, dln2, A.resid_mid, A.ln2_mean, A.ln2_rstd, L.ln2_w, L.ln2_b, N);
  ops_.linear_bwd(GemmSite::Proj, a.datty, ops_.stream_grad(a.dresid, N), act(A.atty, A.atty16),
                  L.proj_w, L.proj_b, N);
  const SequenceShare s = sequence_share(B);
  {
    ScopedPhase sp(ctx_.prof, Phase::Attention);
    const int64_t k0 = d.nhy * d.hd, v0 = (d.nhy + d.nkvy) * d.hd;
    const int64_t r0 = int64_t(s.b0) * T, q0 = r0 * d.QKVy, o0 = r0 * d.Ay;
    if (context_) {
      context_->backward(local_heads(B, T, ctx_, attention_precision_), a.dqkv, a.datty, A.qkv,
                         A.atty, A.lse, l);
    } else if (saved_attention_bf16(A)) {  // q|k|v and the output from their bf16 copies
      backend::AttentionArgs args = share_args(B, T, s);
      args.saved_bf16 = true;
      op.attention_backward(q, args, a.dqkv + q0, a.dqkv + q0 + k0, a.dqkv + q0 + v0,
                            a.datty + o0, A.qkv16 + q0, A.qkv16 + q0 + k0, A.qkv16 + q0 + v0,
                            A.atty16 + o0, A.lse + int64_t(s.b0) * d.nhy * T);
    } else {
      op.attention_backward(q, share_args(B, T, s), a.dqkv + q0, a.dqkv + q0 + k0,
                            a.dqkv + q0 + v0, a.datty + o0, A.qkv + q0, A.qkv + q0 + k0,
                            A.qkv + q0 + v0, A.atty + o0, A.lse + int64_t(s.b0) * d.nhy * T);
    }
  }
  if (positions_ == Positions::Rope) {  // row by row: on this rank's sequences, then gathered
    ScopedPhase sp(ctx_.prof, Phase::Attention);
    rope(false, a.dqkv, s.nb, T, 0, s.b0);
  }
  gather_sequences(a.dqkv, s, T, d.QKVy, "attention dqkv");
  if (qk_norm_) qk_norm_->backward(l, N);
  ctx_.q().poll();
  const float* dln1 = ops_.linear_bwd(GemmSite::Qkv, a.dln, a.dqkv, act(A.ln1, A.ln1_16), L.qkv_w, L.qkv_b, N);
  ops_.norm_bwd(a.dresid, dln1, x_in, A.ln1_mean, A.ln1_rstd, L.ln1_w, L.ln1_b, N);
}

void DenseBlock::mlp_backward(int l, int64_t N) {
  const Weights& L = layers_[size_t(l)];
  const ParallelActivations& a = a_;
  const auto& A = a.layer[size_t(l)];
  const backend::OpTable& op = ctx_.ops();
  backend::Queue& q = ctx_.bq();
  ops_.linear_bwd(GemmSite::FcProj, a.dfc_act, ops_.stream_grad(a.dresid, N),
                  act(A.fc_act, A.fc_act16), L.fcproj_w, L.fcproj_b, N);
  {
    ScopedPhase sp(ctx_.prof, Phase::Activation);
    const int64_t Fy = ctx_.dims.Fy;
    if (fused_fc_stash(A)) {  // fc read from its stashed bf16 copy (not cast back: stash())
      switch (mlp_) {
        case MlpKind::Gelu: op.gelu_backward_x16(q, a.dfc, a.dfc_act, A.fc16, N * Fy); break;
        case MlpKind::SwiGLU: op.swiglu_backward_x16(q, a.dfc, a.dfc_act, A.fc16, N, Fy); break;
      }
    } else {
      switch (mlp_) {
        case MlpKind::Gelu: op.gelu_backward(q, a.dfc, a.dfc_act, A.fc, N * Fy); break;
        case MlpKind::SwiGLU: op.swiglu_backward(q, a.dfc, a.dfc_act, A.fc, N, Fy); break;
      }
    }
  }
  ops_.linear_bwd(GemmSite::Fc, a.dln, a.dfc, act(A.ln2, A.ln2_16), L.fc_w, L.fc_b, N);
}

}  // namespace tetrad::parallel
