// QkNorm (qk_norm.hpp): a block's q|k|v rows with each q and k head RMS-normalised between the
// projection and the rotary positions, forward and backward.
#include "tetrad/parallel/qk_norm.hpp"

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

QkNorm::QkNorm(const BlockParts& p)
    : ctx_(p.ctx), ops_(p.ops), a_(p.acts), norms_(size_t(p.config.n_layer)),
      eps_(p.config.norm_eps) {
  for (size_t i = 0; i < p.table.specs.size(); ++i) {
    const ParamSpec& s = p.table.specs[i];
    if (s.layer < 0) continue;
    if (s.role == TensorRole::QNorm) norms_[size_t(s.layer)].q = int(i);
    if (s.role == TensorRole::KNorm) norms_[size_t(s.layer)].k = int(i);
  }
  for (size_t l = 0; l < norms_.size(); ++l)
    if (norms_[l].q < 0 || norms_[l].k < 0)
      fail("layer ", l, " has no ", norms_[l].q < 0 ? "q" : "k",
           " norm: the q/k norm needs both (roles q norm, k norm)");
  dw_ = ctx_.be->alloc_array<float>(size_t(ctx_.dims.hd));
}

// q heads: the first nhy heads of each q|k|v row; k heads: the nkvy after them. Their saved
// inputs and statistics lie one after the other in qk_in and qk_rstd (q's first).
backend::HeadNormArgs QkNorm::args(int l, int64_t N, bool k, float* rows) const {
  const auto& A = a_.layer[size_t(l)];
  const LocalDims& d = ctx_.dims;
  backend::HeadNormArgs h;
  h.N = N;
  h.head_dim = d.hd;
  h.stride = d.QKVy;
  h.eps = eps_;
  h.n_heads = k ? d.nkvy : d.nhy;
  h.x = rows + (k ? d.nhy * d.hd : 0);
  h.w = ops_.w(k ? norms_[size_t(l)].k : norms_[size_t(l)].q);
  h.rstd = A.qk_rstd + (k ? N * d.nhy : 0);
  h.saved = A.qk_in + (k ? N * d.nhy * d.hd : 0);
  return h;
}

void QkNorm::forward(int l, int64_t N) {
  ScopedPhase sp(ctx_.prof, Phase::Norm);
  float* qkv = a_.layer[size_t(l)].qkv;
  for (bool k : {false, true}) ctx_.ops().head_norm_forward(ctx_.bq(), args(l, N, k, qkv));
}

// dqkv's q and k heads become the gradients of the norms' inputs; each weight's gradient is this
// rank's heads' share, summed over Y (the other heads' ranks) into the gradient block. (X ranks
// hold the same heads and compute the same share: no sum there.)
void QkNorm::backward(int l, int64_t N) {
  ScopedPhase sp(ctx_.prof, Phase::Norm);
  const comm::Communicator& y = ctx_.g().y();
  backend::Queue& q = ctx_.bq();
  const int64_t hd = ctx_.dims.hd;
  for (bool k : {false, true}) {
    backend::HeadNormArgs h = args(l, N, k, a_.dqkv);
    float* grad = ops_.gw(k ? norms_[size_t(l)].k : norms_[size_t(l)].q);
    if (y.size() == 1) {
      h.dw = grad;
      ctx_.ops().head_norm_backward(q, h);
      continue;
    }
    h.dw = dw_.as<float>();
    q.fill_zero(h.dw, size_t(hd) * sizeof(float));
    ctx_.ops().head_norm_backward(q, h);
    ctx_.sum_over(y, h.dw, hd, "q/k norm dw");
    ctx_.ops().add(q, grad, h.dw, hd);
  }
}

}  // namespace tetrad::parallel
