// ParallelTransformer: the vocabulary-parallel ends of the model, Megatron's scheme over Y. The
// embedding table, output head and logits are split by vocabulary rows over Y (Vy = V/Gy rows
// per rank, [Vy, Cx] blocks); the lookup sums every Y rank's slice, the cross-entropy combines
// per-slice maxima, Σ exp and the target logit with all-reduces over Y, and greedy decoding
// compares each slice's best logit after an all-gather over Y.
#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>
#include <cstring>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/activation_layout.hpp"

namespace tetrad::parallel {

// Vocabulary-parallel lookup of this rank's tokens into a_->emb [N, Cx]: each Y rank copies the
// rows of its vocabulary slice (zeros elsewhere) and the slices are summed over Y; then the
// position table (GPT-2).
void ParallelTransformer::embedding_forward(const int32_t* inputs, int64_t N, int T, int pos0) {
  const int64_t V = cfg_.vocab_size;
  Acts& a = *a_;
  ScopedPhase sp(prof_, Phase::Embedding);
  for (int64_t t = 0; t < N; ++t)
    if (inputs[t] < 0 || inputs[t] >= V)
      fail("token id ", inputs[t], " at position ", t, " is outside the model's vocabulary [0, ", V, ")");
  const int64_t v0 = dims_.Vy * g_.coord.y();
  ops().embedding_gather(bq(), a.emb, device_ids(inputs, N, 0), w(wte_), v0, dims_.Vy, N, dims_.Cx);
  sum_over(g_.y(), a.emb, N * dims_.Cx, "embedding");
  if (wpe_ >= 0) ops().position_add(bq(), a.emb, w(wpe_) + int64_t(pos0) * dims_.Cx, N, T, dims_.Cx);
}

// The embedding's backward from a_->dresid: the rows of this rank's vocabulary slice accumulate
// into the token embedding's gradient block (not with the sparse embedding gradient, whose rows
// go over Z: accumulate_embedding_rows), every position into the position table's.
void ParallelTransformer::embedding_backward(const int32_t* inputs, int64_t N, int T) {
  Acts& a = *a_;
  ScopedPhase sp(prof_, Phase::Embedding);
  float* dE = reduce_->sparse_embedding() ? nullptr : gw(wte_);  // sparse: accumulate_embedding_rows
  const int64_t v0 = dims_.Vy * g_.coord.y();
  float* dP = gw(wpe_);
  if (dE)
    ops().embedding_scatter_add(bq(), dE, 0, dims_.Vy * dims_.Cx, a.dresid, device_ids(inputs, N, 0), v0,
                                dims_.Vy, N, dims_.Cx);
  if (dP) ops().position_grad(bq(), dP, a.dresid, N, T, dims_.Cx);
}

// Vocabulary-parallel cross-entropy over Y: global row max, then Σ exp and the target logit
// (from the rank that owns it) in one all-reduce, then the losses and, with grad, logits ->
// dlogits in place (the op table's ce_* pieces).
double ParallelTransformer::cross_entropy(const int32_t* targets, int64_t N, float grad_scale,
                                          bool with_grad) {
  ScopedPhase sp(prof_, Phase::Loss);
  const int64_t V = cfg_.vocab_size, v0 = dims_.Vy * g_.coord.y();
  for (int64_t t = 0; t < N; ++t)
    if (targets[t] >= V)
      fail("target token id ", targets[t], " at position ", t, " is outside the model's vocabulary [0, ", V, ")");
  float* L = a_->logits;
  float* mx = row_max_.as<float>();
  const int32_t* tg = device_ids(targets, N, 1);
  const backend::OpTable& op = ops();
  double* st = stats_.data();
  if (g_.y().size() == 1 && be_->capabilities().ce_row_stats_fused) {
    op.ce_row_max_sum_exp_target(bq(), mx, st, L, tg, v0, dims_.Vy, N);  // the same values, one read
  } else {
    op.ce_row_max(bq(), mx, L, N, dims_.Vy);
    if (g_.y().size() > 1)
      q_.run(g_.y().iallreduce_max(mx, size_t(N), q_.ready()), g_.y(), "allreduce_max", "logit max",
             -1, N * int64_t(sizeof(float)));
    op.ce_sum_exp_target(bq(), st, L, mx, tg, v0, dims_.Vy, N);
    sum_over(g_.y(), st, 2 * N, "softmax sums");
  }
  op.ce_loss(bq(), a_->losses, scalar_.as<double>(), st, mx, tg, N);
  const double total = read_scalar(scalar_.as<double>());
  head_dy16_ready_ = false;
  if (with_grad) {
    // With bf16 activations the head's backward GEMMs read dlogits in bf16 only: written here
    // in one pass over the logits rather than as fp32 dlogits that the head's cast reads back
    // (on gpt2-124m 2 x 206 MB less traffic). Not with a pipeline: its stash keeps the fp32
    // logits buffer (as dlogits) between micro-batches, not the bf16 copies.
    if (bf16_acts_ && g_.shape.p() == 1 && be_->capabilities().bf16_loss_grad) {
      const auto [d16, d16t] = dy16_copies(site_layout(GemmSite::Head));
      op.ce_grad_bf16(bq(), d16, d16t, L, mx, st, tg, v0, dims_.Vy, N, grad_scale);
      head_dy16_ready_ = true;
    } else {
      op.ce_grad(bq(), L, mx, st, tg, v0, dims_.Vy, N, grad_scale);
    }
  }
  return total;
}

std::vector<int32_t> ParallelTransformer::greedy_next_tokens(const int32_t* inputs, int B,
                                                             int T) {
  forward(inputs, B, T);
  const int64_t v0 = int64_t(g_.coord.y()) * dims_.Vy;  // first vocabulary id of this rank's slice
  std::vector<double> mine(2 * size_t(B));        // (best logit, its global id) per sequence
  // Each sequence's last row: rows T*Vy apart, starting at row T-1.
  ops().row_argmax(bq(), argmax_idx_.as<int32_t>(), argmax_val_.as<float>(),
                   a_->logits + int64_t(T - 1) * dims_.Vy, B, dims_.Vy, int64_t(T) * dims_.Vy);
  std::vector<int32_t> idx(static_cast<size_t>(B));
  std::vector<float> val(static_cast<size_t>(B));
  bq().copy_to_host(idx.data(), argmax_idx_.data(), idx.size() * sizeof(int32_t));
  bq().copy_to_host(val.data(), argmax_val_.data(), val.size() * sizeof(float));
  bq().synchronize();
  for (int b = 0; b < B; ++b) {
    mine[2 * b] = val[size_t(b)];
    mine[2 * b + 1] = double(v0 + idx[size_t(b)]);
  }
  const int gy = g_.y().size();
  std::vector<double> all(mine.size() * size_t(gy));
  if (gy == 1) {
    all = mine;
  } else {
    ScopedPhase comm_phase(prof_, Phase::Comm);
    g_.host().y().allgather(mine.data(), all.data(), mine.size());  // host vectors
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

}  // namespace tetrad::parallel
