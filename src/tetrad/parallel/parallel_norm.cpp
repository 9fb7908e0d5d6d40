// ParallelOps (parallel_ops.hpp): LayerNorm / RMSNorm over a hidden size split across X, exact.
// Each rank sums its Cx = C/Gx columns per row, the row statistics are all-reduced over X (mean
// then variance for LayerNorm, mean square for RMSNorm; backward: Σ dn and Σ dn·n), then every
// rank normalises its own columns. Weight and bias gradients accumulate per column, in token order.
#include "tetrad/parallel/parallel_ops.hpp"

namespace tetrad::parallel {

using backend::RowStat;
using backend::StatFinish;

void ParallelOps::norm_fwd(float* out, float* mean, float* rstd, const float* x, int wi,
                           int bi, int64_t N_all, uint16_t* out16) {
  const int64_t C = n_embd_;
  // Sequence sharding: this rank's rows of the stream; the output goes to their place in the
  // whole output and is all-gathered over Y after.
  const int64_t N = stream_rows(N_all), off = stream_row0(N_all) * ctx_.dims.Cx;
  if (out) out += off;
  if (out16) out16 += off;
  const float eps = eps_;
  double* st = stats_.data();
  ScopedPhase sp(ctx_.prof, Phase::Norm);
  const backend::OpTable& op = ctx_.ops();
  if (norm_ == NormKind::LayerNorm) {
    op.norm_row_stats(ctx_.bq(), RowStat::Sum, st, 1, x, nullptr, N, ctx_.dims.Cx);
    ctx_.sum_over(ctx_.g().x(), st, N, "norm mean");
    op.norm_finish_stats(ctx_.bq(), StatFinish::Mean, mean, st, N, C, eps);
    op.norm_row_stats(ctx_.bq(), RowStat::CenteredSquares, st, 1, x, mean, N, ctx_.dims.Cx);
    ctx_.sum_over(ctx_.g().x(), st, N, "norm var");
  } else {
    op.norm_row_stats(ctx_.bq(), RowStat::Squares, st, 1, x, nullptr, N, ctx_.dims.Cx);
    ctx_.sum_over(ctx_.g().x(), st, N, "norm ms");
  }
  op.norm_finish_stats(ctx_.bq(), StatFinish::Rstd, rstd, st, N, C, eps);
  const float* m = norm_ == NormKind::LayerNorm ? mean : nullptr;
  if (!out16) {
    op.norm_apply(ctx_.bq(), out, x, m, rstd, w(wi), w(bi), N, ctx_.dims.Cx);
  } else if (op.norm_apply_bf16) {  // bf16 only: the output feeds GEMMs only
    op.norm_apply_bf16(ctx_.bq(), out16, x, m, rstd, w(wi), w(bi), N, ctx_.dims.Cx);
  } else {  // a backend without the fused form: fp32 into the free tmp, then a cast
    op.norm_apply(ctx_.bq(), scratch_.tmp, x, m, rstd, w(wi), w(bi), N, ctx_.dims.Cx);
    op.cast_f32_to_bf16(ctx_.bq(), out16, scratch_.tmp, N * ctx_.dims.Cx);
  }
  if (shard_ > 1) {
    const comm::Communicator& gy = ctx_.g().y();
    const int64_t n = N * ctx_.dims.Cx;
    const int layer = ctx_.prof ? ctx_.prof->layer : -2;
    if (out16)
      ctx_.q().run(gy.iallgather(out16, out16 - off, size_t(n), ctx_.q().ready()), gy, "allgather",
                   "norm out", layer, n * shard_ * 2);
    else
      ctx_.q().run(gy.iallgather(out, out - off, size_t(n), ctx_.q().ready()), gy, "allgather",
                   "norm out", layer, n * shard_ * int64_t(sizeof(float)));
  }
}

// dx += norm backward; dw, db accumulate. Row sums of dn and dn*n are all-reduced over X.
void ParallelOps::norm_bwd(float* dx, const float* dout, const float* x, const float* mean,
                           const float* rstd, int wi, int bi, int64_t N_all) {
  const int64_t C = n_embd_;
  const int64_t N = stream_rows(N_all);
  double* st = stats_.data();
  ScopedPhase sp(ctx_.prof, Phase::Norm);
  const backend::OpTable& op = ctx_.ops();
  const float* m = norm_ == NormKind::LayerNorm ? mean : nullptr;
  const float* wv = w(wi);
  op.norm_backward_partials(ctx_.bq(), st, dout, x, m, rstd, wv, N, ctx_.dims.Cx);
  ctx_.sum_over(ctx_.g().x(), st, 2 * N, "norm grad");
  op.norm_backward_apply(ctx_.bq(), dx, dout, x, m, rstd, wv, st, N, ctx_.dims.Cx, C);
  if (shard_ == 1) {
    op.norm_param_grads(ctx_.bq(), gw(wi), gw(bi), dout, x, m, rstd, N, ctx_.dims.Cx);
    return;
  }
  // Sequence sharding: the weight gradients of this rank's rows, summed over Y, then added to
  // the accumulators (the Y replicas of a norm weight keep identical gradients).
  const int64_t Cx = ctx_.dims.Cx;
  float* pw = norm_grads_.data();
  float* pb = gw(bi) ? pw + Cx : nullptr;
  ctx_.zero_dev(pw, 2 * Cx);
  op.norm_param_grads(ctx_.bq(), pw, pb, dout, x, m, rstd, N, Cx);
  ctx_.sum_over(ctx_.g().y(), pw, pb ? 2 * Cx : Cx, "norm weight grads");
  op.add(ctx_.bq(), gw(wi), pw, Cx);
  if (pb) op.add(ctx_.bq(), gw(bi), pb, Cx);
}

}  // namespace tetrad::parallel
