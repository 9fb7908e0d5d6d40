// ParallelOps (parallel_ops.hpp): LayerNorm / RMSNorm over a hidden size split across X, exact.
// Each rank sums its Cx = C/Gx columns per row, the row statistics are all-reduced over X (mean
// then variance for LayerNorm, mean square for RMSNorm; backward: Σ dn and Σ dn·n), then every
// rank normalises its own columns. Weight and bias gradients accumulate per column, in token order.
#include "tetrad/parallel/parallel_ops.hpp"

namespace tetrad::parallel {

using backend::RowStat;
using backend::StatFinish;

void ParallelOps::norm_fwd(float* out, float* mean, float* rstd, const float* x, int wi,
                           int bi, int64_t N, uint16_t* out16) {
  const int64_t C = n_embd_;
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
}

// dx += norm backward; dw, db accumulate. Row sums of dn and dn*n are all-reduced over X.
void ParallelOps::norm_bwd(float* dx, const float* dout, const float* x, const float* mean,
                           const float* rstd, int wi, int bi, int64_t N) {
  const int64_t C = n_embd_;
  double* st = stats_.data();
  ScopedPhase sp(ctx_.prof, Phase::Norm);
  const backend::OpTable& op = ctx_.ops();
  const float* m = norm_ == NormKind::LayerNorm ? mean : nullptr;
  const float* wv = w(wi);
  op.norm_backward_partials(ctx_.bq(), st, dout, x, m, rstd, wv, N, ctx_.dims.Cx);
  ctx_.sum_over(ctx_.g().x(), st, 2 * N, "norm grad");
  op.norm_backward_apply(ctx_.bq(), dx, dout, x, m, rstd, wv, st, N, ctx_.dims.Cx, C);
  op.norm_param_grads(ctx_.bq(), gw(wi), gw(bi), dout, x, m, rstd, N, ctx_.dims.Cx);
}

}  // namespace tetrad::parallel
