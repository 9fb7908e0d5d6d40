// ParallelTransformer: LayerNorm / RMSNorm over a hidden size split across X, exact. Each rank
// sums its Cx = C/Gx columns per row, the row statistics are all-reduced over X (mean then
// variance for LayerNorm, mean square for RMSNorm; backward: Σ dn and Σ dn·n), then every rank
// normalises its own columns. Weight and bias gradients accumulate per column, in token order.
#include "tetrad/parallel/parallel_transformer.hpp"

#include "tetrad/parallel/activation_layout.hpp"

namespace tetrad::parallel {

using backend::RowStat;
using backend::StatFinish;

void ParallelTransformer::norm_fwd(float* out, float* mean, float* rstd, const float* x, int wi,
                                   int bi, int64_t N, uint16_t* out16) {
  const int64_t C = cfg_.n_embd;
  const float eps = cfg_.norm_eps;
  double* st = stats_.data();
  ScopedPhase sp(prof_, Phase::Norm);
  const backend::OpTable& op = ops();
  if (norm_ == NormKind::LayerNorm) {
    op.norm_row_stats(bq(), RowStat::Sum, st, 1, x, nullptr, N, dims_.Cx);
    sum_over(g_.x(), st, N, "norm mean");
    op.norm_finish_stats(bq(), StatFinish::Mean, mean, st, N, C, eps);
    op.norm_row_stats(bq(), RowStat::CenteredSquares, st, 1, x, mean, N, dims_.Cx);
    sum_over(g_.x(), st, N, "norm var");
  } else {
    op.norm_row_stats(bq(), RowStat::Squares, st, 1, x, nullptr, N, dims_.Cx);
    sum_over(g_.x(), st, N, "norm ms");
  }
  op.norm_finish_stats(bq(), StatFinish::Rstd, rstd, st, N, C, eps);
  const float* m = norm_ == NormKind::LayerNorm ? mean : nullptr;
  if (!out16) {
    op.norm_apply(bq(), out, x, m, rstd, w(wi), w(bi), N, dims_.Cx);
  } else if (op.norm_apply_bf16) {  // bf16 only: the output feeds GEMMs only
    op.norm_apply_bf16(bq(), out16, x, m, rstd, w(wi), w(bi), N, dims_.Cx);
  } else {  // a backend without the fused form: fp32 into the free tmp, then a cast
    op.norm_apply(bq(), a_->tmp, x, m, rstd, w(wi), w(bi), N, dims_.Cx);
    op.cast_f32_to_bf16(bq(), out16, a_->tmp, N * dims_.Cx);
  }
}

// dx += norm backward; dw, db accumulate. Row sums of dn and dn*n are all-reduced over X.
void ParallelTransformer::norm_bwd(float* dx, const float* dout, const float* x, const float* mean,
                                   const float* rstd, int wi, int bi, int64_t N) {
  const int64_t C = cfg_.n_embd;
  double* st = stats_.data();
  ScopedPhase sp(prof_, Phase::Norm);
  const backend::OpTable& op = ops();
  const float* m = norm_ == NormKind::LayerNorm ? mean : nullptr;
  const float* wv = w(wi);
  op.norm_backward_partials(bq(), st, dout, x, m, rstd, wv, N, dims_.Cx);
  sum_over(g_.x(), st, 2 * N, "norm grad");
  op.norm_backward_apply(bq(), dx, dout, x, m, rstd, wv, st, N, dims_.Cx, C);
  op.norm_param_grads(bq(), gw(wi), gw(bi), dout, x, m, rstd, N, dims_.Cx);
}

}  // namespace tetrad::parallel
