// VocabParallel (vocab_parallel.hpp): the vocabulary-parallel ends of the model, Megatron's scheme
// over Y. The embedding table, output head and logits are split by vocabulary rows over Y (Vy =
// V/Gy rows per rank, [Vy, Cx] blocks); the lookup sums every Y rank's slice, the cross-entropy
// combines per-slice maxima, Σ exp and the target logit with all-reduces over Y, and greedy
// decoding compares each slice's best logit after an all-gather over Y.
#include "tetrad/parallel/vocab_parallel.hpp"

#include <algorithm>
#include <cstring>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/context_split.hpp"

namespace tetrad::parallel {

VocabParallel::VocabParallel(const StepContext& ctx, ParallelOps& ops, GradReducer& grads,
                             const ParallelActivations& acts, Tensors tensors, int64_t vocab,
                             int64_t tokens, int sequences, bool bf16_loss_grad)
    : ctx_(ctx), ops_(ops), grads_(grads), a_(acts), t_(tensors), vocab_(vocab),
      bf16_loss_grad_(bf16_loss_grad) {
  backend::Backend& be = *ctx.be;
  if (!be.capabilities().host_visible)
    for (auto& b : ids_dev_) b = be.alloc_array<int32_t>(size_t(tokens));
  row_max_ = be.alloc_array<float>(size_t(tokens));
  sums_ = be.alloc_array<double>(2 * size_t(tokens));
  scalar_ = be.alloc_array<double>(1);
  argmax_idx_ = be.alloc_array<int32_t>(size_t(sequences));
  argmax_val_ = be.alloc_array<float>(size_t(sequences));
}

const int32_t* VocabParallel::device_ids(const int32_t* host, int64_t n, int slot) {
  if (ctx_.be->capabilities().host_visible) return host;
  ctx_.bq().copy_to_device(ids_dev_[slot].data(), host, size_t(n) * sizeof(int32_t));
  return ids_dev_[slot].as<int32_t>();
}

double VocabParallel::read_scalar(const double* dev) {
  double v = 0;
  ctx_.bq().copy_to_host(&v, dev, sizeof v);
  ctx_.bq().synchronize();
  return v;
}

// Each document piece of the micro-batch's rows (StepContext::docs.host): f(first row, length,
// position of the first row in its document), a piece being a document's consecutive tokens
// inside one sequence (with a context axis, inside one local chunk: a piece of a document that
// began on another rank's chunk starts past 0).
template <class F>
void VocabParallel::for_each_document(int64_t N, int T, F&& f) const {
  const int32_t* starts = ctx_.docs.host;
  const ContextSplit cs = ContextSplit::of(ctx_.shape(), ctx_.g().coord);
  const int Tc = cs.chunk_len(T);
  for (int64_t r0 = 0; r0 < N;) {
    int64_t r1 = r0 + 1;  // the piece ends where the next document, sequence or chunk begins
    while (r1 < N && r1 % Tc != 0 && starts[r1] == starts[r0]) ++r1;
    f(r0, r1 - r0, cs.position(int(r0 % T), T) - starts[r0]);
    r0 = r1;
  }
}

// Vocabulary-parallel lookup of this rank's tokens into emb [N, Cx]: each Y rank copies the rows
// of its vocabulary slice (zeros elsewhere) and the slices are summed over Y; then the position
// table (GPT-2).
void VocabParallel::embedding_forward(const int32_t* inputs, int64_t N, int T, int pos0) {
  const LocalDims& d = ctx_.dims;
  ScopedPhase sp(ctx_.prof, Phase::Embedding);
  for (int64_t t = 0; t < N; ++t)
    if (inputs[t] < 0 || inputs[t] >= vocab_)
      fail("token id ", inputs[t], " at position ", t, " is outside the model's vocabulary [0, ",
           vocab_, ")");
  const int64_t v0 = d.Vy * ctx_.g().coord.y();
  if (ops_.sequence_sharded()) {
    // Every row is non-zero on one Y rank only (the owner of its id), so the sum over Y is
    // exact in any order, and adding the positions on rank y = 0 first gives the same bits as
    // adding them after the sum (x + p = p + x). The sum is scattered by rows into emb.
    const comm::Communicator& gy = ctx_.g().y();
    float* full = a_.dfull;  // free in the forward
    ctx_.ops().embedding_gather(ctx_.bq(), full, device_ids(inputs, N, 0),
                                ops_.w(t_.token_embedding), v0, d.Vy, N, d.Cx);
    if (t_.position_embedding >= 0 && ctx_.g().coord.y() == 0) add_positions(full, N, T, pos0);
    const int64_t rows = ops_.stream_rows(N);
    ctx_.q().run(gy.ireduce_scatter_sum(full, a_.emb, size_t(rows * d.Cx), ctx_.q().ready()), gy,
                 "reduce_scatter", "embedding", -1, N * d.Cx * int64_t(sizeof(float)));
    return;
  }
  ctx_.ops().embedding_gather(ctx_.bq(), a_.emb, device_ids(inputs, N, 0),
                              ops_.w(t_.token_embedding), v0, d.Vy, N, d.Cx);
  ctx_.sum_over(ctx_.g().y(), a_.emb, N * d.Cx, "embedding");
  if (t_.position_embedding >= 0) add_positions(a_.emb, N, T, pos0);
}

// The position table's rows added to x [N, Cx] (N / T sequences of T tokens on this rank): from
// pos0, each local chunk from its chunk's offset in the sequence with a context axis, or from
// each document's start (data.document_positions).
void VocabParallel::add_positions(float* x, int64_t N, int T, int pos0) {
  const LocalDims& d = ctx_.dims;
  if (ctx_.docs.positions && ctx_.docs.host) {  // positions restart at each document's start
    for_each_document(N, T, [&](int64_t row, int64_t len, int64_t pos) {
      ctx_.ops().position_add(ctx_.bq(), x + row * d.Cx,
                              ops_.w(t_.position_embedding) + pos * d.Cx, len, len, d.Cx);
    });
    return;
  }
  const float* P = ops_.w(t_.position_embedding) + int64_t(pos0) * d.Cx;
  const ContextSplit cs = ContextSplit::of(ctx_.shape(), ctx_.g().coord);
  if (!cs.active()) return ctx_.ops().position_add(ctx_.bq(), x, P, N, T, d.Cx);
  // Context axis: each local chunk of each sequence from its chunk's offset in the sequence.
  const int Tc = cs.chunk_len(T);
  for (int64_t b = 0; b < N / T; ++b)
    for (int j = 0; j < cs.local_chunks(); ++j)
      ctx_.ops().position_add(ctx_.bq(), x + (b * T + int64_t(j) * Tc) * d.Cx,
                              P + cs.chunk_offset(j, T) * d.Cx, Tc, Tc, d.Cx);
}

// The embedding's backward from dresid: the rows of this rank's vocabulary slice accumulate into
// the token embedding's gradient block (not with the sparse embedding gradient, whose rows go
// over Z: GradReducer::accumulate_embedding_rows), every position into the position table's.
void VocabParallel::embedding_backward(const float* demb, const int32_t* inputs, int64_t N, int T) {
  const LocalDims& d = ctx_.dims;
  ScopedPhase sp(ctx_.prof, Phase::Embedding);
  float* dE = grads_.sparse_embedding() ? nullptr : ops_.gw(t_.token_embedding);
  const int64_t v0 = d.Vy * ctx_.g().coord.y();
  float* dP = ops_.gw(t_.position_embedding);
  if (dE)
    ctx_.ops().embedding_scatter_add(ctx_.bq(), dE, 0, d.Vy * d.Cx, demb,
                                     device_ids(inputs, N, 0), v0, d.Vy, N, d.Cx);
  if (!dP) return;
  if (ctx_.docs.positions && ctx_.docs.host) {  // per document, as the forward
    for_each_document(N, T, [&](int64_t row, int64_t len, int64_t pos) {
      ctx_.ops().position_grad(ctx_.bq(), dP + pos * d.Cx, demb + row * d.Cx, len, len, d.Cx);
    });
    return;
  }
  const ContextSplit cs = ContextSplit::of(ctx_.shape(), ctx_.g().coord);
  if (!cs.active()) return ctx_.ops().position_grad(ctx_.bq(), dP, demb, N, T, d.Cx);
  const int Tc = cs.chunk_len(T);
  for (int64_t b = 0; b < N / T; ++b)
    for (int j = 0; j < cs.local_chunks(); ++j)
      ctx_.ops().position_grad(ctx_.bq(), dP + cs.chunk_offset(j, T) * d.Cx,
                               demb + (b * T + int64_t(j) * Tc) * d.Cx, Tc, Tc, d.Cx);
}

void VocabParallel::start_embedding_ids(const int32_t* inputs, int64_t N) {
  grads_.start_embedding_ids(device_ids(inputs, N, 0), N);
}

VocabParallel::RowShare VocabParallel::loss_rows(int64_t N) const {
  const comm::Communicator& gx = ctx_.g().x();
  RowShare r;
  r.split = gx.size() > 1 && N % gx.size() == 0;
  r.n = r.split ? N / gx.size() : N;
  r.r0 = r.split ? r.n * gx.rank() : 0;
  r.share = r.split && !(bf16_loss_grad_ && ops_.dy16_copies(GemmSite::Head).second);
  return r;
}

// Output head: a normal layer on the embedding's block -> logits [N, V/Gy]. The sum over X of
// the partial logits is the step's largest activation message ([N, V/Gy], 64 MiB on small);
// where the loss reads only this X rank's rows (cross_entropy), it is reduce-scattered by rows
// in place instead (on 2 X ranks half the bytes and the same bits, ParallelOps::normal_fwd_rows;
// elsewhere the all-reduce).
void VocabParallel::head_forward(int64_t N, bool whole) {
  const RowShare r = loss_rows(N);
  logit_rows_only_ = !whole && r.share;
  if (logit_rows_only_)
    ops_.normal_fwd_rows(GemmSite::Head, a_.logits, a_.logits, act(a_.lnf, a_.lnf16), t_.head,
                         -1, N, r.r0, r.n);
  else
    ops_.gemm_allreduce(GemmSite::Head, a_.logits, act(a_.lnf, a_.lnf16), t_.head, N);
}

// dlogits [N, Vy] -> din [N, Cx] (sum over Y), d(head block): a normal layer's backward.
const float* VocabParallel::head_backward(float* din, int64_t N) {
  const float* d = ops_.linear_bwd(GemmSite::Head, din, a_.logits, act(a_.lnf, a_.lnf16), t_.head,
                                   -1, N, dlogits16_);
  dlogits16_ = false;
  return d;
}

// Vocabulary-parallel cross-entropy over Y: global row max, then Σ exp and the target logit
// (from the rank that owns it) in one all-reduce, then the losses and, with grad, logits ->
// dlogits in place (the op table's ce_* pieces).
//
// The X ranks hold the same logits (the head's sum over X) and would each run the whole loss: on
// X > 1 (N divisible by Gx) rank x computes the row statistics of its rows [x N/Gx, (x+1) N/Gx)
// only, and they are all-gathered over X ([N] maxima, [N, 2] sums: small); every rank then runs
// ce_loss over all N rows (the same losses and the same total, summed in row order). The gradient
// too is computed on the rank's rows and its rows all-gathered (fp32 dlogits in place, or the
// bf16 copy as stored), except where the head's backward reads the transposed bf16 copy, which
// is not gathered by rows: every rank writes all of it from the gathered statistics. Each op
// works row by row, so every value is the one the whole-batch op gives.
double VocabParallel::cross_entropy(const int32_t* targets, int64_t N, float grad_scale,
                                    bool with_grad) {
  ScopedPhase sp(ctx_.prof, Phase::Loss);
  const int64_t Vy = ctx_.dims.Vy, v0 = Vy * ctx_.g().coord.y();
  for (int64_t t = 0; t < N; ++t)
    if (targets[t] >= vocab_)
      fail("target token id ", targets[t], " at position ", t,
           " is outside the model's vocabulary [0, ", vocab_, ")");
  const comm::Communicator& gy = ctx_.g().y();
  const comm::Communicator& gx = ctx_.g().x();
  backend::Queue& q = ctx_.bq();
  float* L = a_.logits;
  float* mx = row_max_.as<float>();
  const int32_t* tg = device_ids(targets, N, 1);
  const backend::OpTable& op = ctx_.ops();
  double* st = sums_.as<double>();
  // This rank's rows: all of them, or its 1/Gx share (the only rows of the logits the head
  // wrote, where head_forward's whole was false).
  const RowShare rows = loss_rows(N);
  const bool split = rows.split;
  const int64_t n = rows.n, r0 = rows.r0;
  TETRAD_CHECK(!logit_rows_only_ || rows.share, "cross_entropy: the logits hold this X rank's "
               "rows only, but the loss reads every row");
  float* Lr = L + r0 * Vy;
  if (gy.size() == 1 && ctx_.be->capabilities().ce_row_stats_fused) {
    op.ce_row_max_sum_exp_target(q, mx + r0, st + 2 * r0, Lr, tg + r0, v0, Vy, n);  // one read
  } else {
    op.ce_row_max(q, mx + r0, Lr, n, Vy);
    if (gy.size() > 1)
      ctx_.q().run(gy.iallreduce_max(mx + r0, size_t(n), ctx_.q().ready()), gy, "allreduce_max",
                   "logit max", -1, n * int64_t(sizeof(float)));
    op.ce_sum_exp_target(q, st + 2 * r0, Lr, mx + r0, tg + r0, v0, Vy, n);
    ctx_.sum_over(gy, st + 2 * r0, 2 * n, "softmax sums");
  }
  if (split) {
    ctx_.q().run(gx.iallgather(mx + r0, mx, size_t(n), ctx_.q().ready()), gx, "allgather",
                 "logit max", -1, N * int64_t(sizeof(float)));
    ctx_.q().run(gx.iallgather(st + 2 * r0, st, size_t(2 * n), ctx_.q().ready()), gx,
                 "allgather", "softmax sums", -1, 2 * N * int64_t(sizeof(double)));
  }
  op.ce_loss(q, a_.losses, scalar_.as<double>(), st, mx, tg, N);
  const double total = read_scalar(scalar_.as<double>());
  dlogits16_ = false;
  if (with_grad) {
    // With bf16 activations the head's backward GEMMs read dlogits in bf16 only: written here
    // in one pass over the logits rather than as fp32 dlogits that the head's cast reads back
    // (on gpt2-124m 2 x 206 MB less traffic). Not with a pipeline: its stash keeps the fp32
    // logits buffer (as dlogits) between micro-batches, not the bf16 copies.
    if (bf16_loss_grad_) {
      const auto [d16, d16t] = ops_.dy16_copies(GemmSite::Head);
      if (split && !d16t) {
        op.ce_grad_bf16(q, d16 + r0 * Vy, nullptr, Lr, mx + r0, st + 2 * r0, tg + r0, v0, Vy, n,
                        grad_scale);
        ctx_.q().run(gx.iallgather(d16 + r0 * Vy, d16, size_t(n * Vy), ctx_.q().ready()), gx,
                     "allgather", "dlogits", -1, N * Vy * 2);
      } else {
        op.ce_grad_bf16(q, d16, d16t, L, mx, st, tg, v0, Vy, N, grad_scale);
      }
      dlogits16_ = true;
    } else {
      op.ce_grad(q, Lr, mx + r0, st + 2 * r0, tg + r0, v0, Vy, n, grad_scale);
      if (split)
        ctx_.q().run(gx.iallgather(Lr, L, size_t(n * Vy), ctx_.q().ready()), gx, "allgather",
                     "dlogits", -1, N * Vy * int64_t(sizeof(float)));
    }
  }
  return total;
}

std::vector<int32_t> VocabParallel::greedy_last(int B, int T) {
  TETRAD_CHECK(!logit_rows_only_, "greedy_last after a head forward of the loss's rows only");
  const int64_t Vy = ctx_.dims.Vy;
  const int64_t v0 = int64_t(ctx_.g().coord.y()) * Vy;  // first vocabulary id of this rank's slice
  std::vector<double> mine(2 * size_t(B));              // (best logit, its global id) per sequence
  // Each sequence's last row: rows T*Vy apart, starting at row T-1.
  backend::Queue& q = ctx_.bq();
  ctx_.ops().row_argmax(q, argmax_idx_.as<int32_t>(), argmax_val_.as<float>(),
                        a_.logits + int64_t(T - 1) * Vy, B, Vy, int64_t(T) * Vy);
  std::vector<int32_t> idx(static_cast<size_t>(B));
  std::vector<float> val(static_cast<size_t>(B));
  q.copy_to_host(idx.data(), argmax_idx_.data(), idx.size() * sizeof(int32_t));
  q.copy_to_host(val.data(), argmax_val_.data(), val.size() * sizeof(float));
  q.synchronize();
  for (int b = 0; b < B; ++b) {
    mine[2 * b] = val[size_t(b)];
    mine[2 * b + 1] = double(v0 + idx[size_t(b)]);
  }
  const int gy = ctx_.g().y().size();
  std::vector<double> all(mine.size() * size_t(gy));
  if (gy == 1) {
    all = mine;
  } else {
    ScopedPhase comm_phase(ctx_.prof, Phase::Comm);
    ctx_.g().host().y().allgather(mine.data(), all.data(), mine.size());  // host vectors
  }
  std::vector<int32_t> next(B);
  for (int b = 0; b < B; ++b) {
    double best = all[2 * b], id = all[2 * b + 1];
    for (int r = 1; r < gy; ++r) {
      const double v = all[(size_t(r) * B + b) * 2], i = all[(size_t(r) * B + b) * 2 + 1];
      if (v > best || (v == best && i < id)) best = v, id = i;
    }
    next[b] = int32_t(id);
  }
  return next;
}

// Decoding: the head on each sequence's last new row only (rows Tq*Cx apart, from row Tq-1): a
// normal layer, partial over X.
const float* VocabParallel::last_row_logits(int B, int Tq) {
  const LocalDims& d = ctx_.dims;
  const int64_t last = int64_t(Tq - 1) * d.Cx;
  logit_rows_only_ = false;
  ops_.gemm(gemm_site_name(GemmSite::Head), false, true, B, d.Vy, d.Cx,
            act(a_.lnf ? a_.lnf + last : nullptr, a_.lnf16 ? a_.lnf16 + last : nullptr),
            int64_t(Tq) * d.Cx, ops_.weight_operand(t_.head), d.Cx, 0.0f, a_.logits, d.Vy);
  ctx_.sum_over(ctx_.g().x(), a_.logits, int64_t(B) * d.Vy, gemm_site_name(GemmSite::Head));
  return whole_vocabulary(B);
}

// Rank y holds columns [y*Vy, (y+1)*Vy) of every row: gathered over Y as [Gy][rows][Vy], then
// laid out row by row.
const float* VocabParallel::whole_vocabulary(int64_t rows) {
  TETRAD_CHECK(!logit_rows_only_, "whole_vocabulary after a head forward of the loss's rows only");
  const int gy = ctx_.g().y().size();
  const int64_t Vy = ctx_.dims.Vy;
  backend::Queue& q = ctx_.bq();
  const size_t slice = size_t(rows) * size_t(Vy);
  host_logits_.resize(slice * size_t(gy));
  if (gy == 1) {
    q.copy_to_host(host_logits_.data(), a_.logits, slice * sizeof(float));
    q.synchronize();
    return host_logits_.data();
  }
  std::vector<float> mine(slice);
  q.copy_to_host(mine.data(), a_.logits, slice * sizeof(float));
  q.synchronize();
  gathered_logits_.resize(slice * size_t(gy));
  {
    ScopedPhase comm_phase(ctx_.prof, Phase::Comm);
    ctx_.g().host().y().allgather(mine.data(), gathered_logits_.data(), slice);  // host vectors
  }
  const int64_t V = int64_t(gy) * Vy;
  for (int r = 0; r < gy; ++r)
    for (int64_t t = 0; t < rows; ++t)
      std::memcpy(host_logits_.data() + t * V + int64_t(r) * Vy,
                  gathered_logits_.data() + size_t(r) * slice + size_t(t) * size_t(Vy),
                  size_t(Vy) * sizeof(float));
  return host_logits_.data();
}

}  // namespace tetrad::parallel
