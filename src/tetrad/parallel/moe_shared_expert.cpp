// MoeBlock's shared expert (moe_block.hpp; Qwen2-MoE's form): a SwiGLU MLP every token goes
// through, scaled by sigmoid(ln2 · w_gate), added to the routed experts' output. Its weights are
// dense ones (reduced over every data rank); it runs on the rank's own tokens, also with E > 1.
// On the tensor axes it is the dense MLP's pair of parallel layers (linear_layers.hpp): gate|up
// normal (rows over Y, columns over X: partial sums over X), down transposed (over Y), the
// backward's input gradients over the adjoint axes; its gate [1, C] by columns over X like the
// router (the logit summed over X, the sigmoid the same on every rank).
#include "tetrad/parallel/moe_block.hpp"

#include <cmath>

namespace tetrad::parallel {

void MoeBlock::shared_gate(int l, int64_t N) {
  backend::Queue& q = ctx_.bq();
  sgate_host_.resize(size_t(N));
  q.copy_to_host(sgate_host_.data(), a_.layer[size_t(l)].shared_glogit, size_t(N) * sizeof(float));
  q.synchronize();
  for (float& g : sgate_host_) g = float(1.0 / (1.0 + std::exp(-double(g))));
  if (ident_.size() < size_t(N)) {  // the first micro-batch of this size
    std::vector<int32_t> id(static_cast<size_t>(N));
    for (int64_t t = 0; t < N; ++t) id[size_t(t)] = int32_t(t);
    ident_ = backend::DeviceArray<int32_t>(*ctx_.be, size_t(N));
    sgate_ = backend::DeviceArray<float>(*ctx_.be, size_t(N));
    dsgate_ = backend::DeviceArray<float>(*ctx_.be, size_t(N));
    q.copy_to_device(ident_.data(), id.data(), size_t(N) * sizeof(int32_t));
  }
  q.copy_to_device(sgate_.data(), sgate_host_.data(), size_t(N) * sizeof(float));
}

// resid_out += sigmoid(ln2 · w_gate) * down(SwiGLU(ln2 · gate|upᵀ)): the gated combine is the
// MoE combine op with one choice per token (row t, weight the sigmoid) into the dmoe_rows work
// buffer (free during a forward), then added.
void MoeBlock::shared_forward(int l, int64_t N) {
  const Experts& X = experts_[size_t(l)];
  const auto& A = a_.layer[size_t(l)];
  const int64_t C = ctx_.dims.Cx, Fs = ctx_.dims.sF;  // this rank's widths
  const comm::Communicator &gx = ctx_.g().x(), &gy = ctx_.g().y();
  const backend::OpTable& op = ctx_.ops();
  backend::Queue& q = ctx_.bq();
  ops_.gemm("shared expert gate|up", false, true, N, 2 * Fs, C, f32(A.ln2), C,
            f32(ops_.w(X.shared_gu)), C, 0.0f, A.shared_gu, 2 * Fs);
  ctx_.sum_over(gx, A.shared_gu, N * 2 * Fs, "shared expert gate|up");
  {
    ScopedPhase sp(ctx_.prof, Phase::Activation);
    op.swiglu_forward(q, A.shared_act, A.shared_gu, N, Fs);
  }
  ops_.gemm("shared expert down", false, true, N, C, Fs, f32(A.shared_act), Fs,
            f32(ops_.w(X.shared_down)), Fs, 0.0f, A.shared_out, C);
  ctx_.sum_over(gy, A.shared_out, N * C, "shared expert down");
  ops_.gemm("shared expert gate", false, true, N, 1, C, f32(A.ln2), C, f32(ops_.w(X.shared_gate)),
            C, 0.0f, A.shared_glogit, 1);
  ctx_.sum_over(gx, A.shared_glogit, N, "shared expert gate");
  shared_gate(l, N);
  ScopedPhase sp(ctx_.prof, Phase::Residual, "shared expert");
  op.moe_unpermute(q, a_.dmoe_rows, A.shared_out, sgate_.data(), ident_.data(), N, 1, C);
  op.add(q, A.resid_out, a_.dmoe_rows, N * C);
}

// From dresid (the gradient of resid_out): the gate's combine (d shared_out = s dy, ds = dy ·
// shared_out), the shared MLP, and the gate's logit (s (1 - s) ds); dln and the weights'
// gradients accumulate.
void MoeBlock::shared_backward(int l, int64_t N) {
  const Experts& X = experts_[size_t(l)];
  const ParallelActivations& a = a_;
  const auto& A = a.layer[size_t(l)];
  const int64_t C = ctx_.dims.Cx, Fs = ctx_.dims.sF;  // this rank's widths
  const comm::Communicator &gx = ctx_.g().x(), &gy = ctx_.g().y();
  const backend::OpTable& op = ctx_.ops();
  backend::Queue& q = ctx_.bq();
  shared_gate(l, N);  // the forward's sigmoid again, from the stored logits
  {
    ScopedPhase sp(ctx_.prof, Phase::Residual, "shared expert");
    op.moe_unpermute_backward(q, a.dmoe_rows, dsgate_.data(), a.dresid, A.shared_out,
                              sgate_.data(), ident_.data(), N, 1, C);
  }
  ctx_.sum_over(gx, dsgate_.data(), N, "shared expert gate's gradient");  // dy · out over C
  // down: dact = dout · Wd [N, Fs] (summed over X); dWd += doutᵀ · act [C, Fs].
  ops_.gemm("shared expert down dx", false, false, N, Fs, C, f32(a.dmoe_rows), C,
            f32(ops_.w(X.shared_down)), Fs, 0.0f, a.dshared_act, Fs);
  ctx_.sum_over(gx, a.dshared_act, N * Fs, "shared expert down dx");
  ops_.gemm("shared expert down dw", true, false, C, Fs, N, f32(a.dmoe_rows), C,
            f32(A.shared_act), Fs, 1.0f, ops_.gw(X.shared_down), Fs);
  {
    ScopedPhase sp(ctx_.prof, Phase::Activation);
    op.swiglu_backward(q, a.dshared_gu, a.dshared_act, A.shared_gu, N, Fs);
  }
  // gate|up: dln += dgu · Wgu (partial over Y: summed in dmoe_rows, free again, then added);
  // dWgu += dguᵀ · ln2.
  if (gy.size() == 1) {
    ops_.gemm("shared expert gate|up dx", false, false, N, C, 2 * Fs, f32(a.dshared_gu), 2 * Fs,
              f32(ops_.w(X.shared_gu)), C, 1.0f, a.dln, C);
  } else {
    ops_.gemm("shared expert gate|up dx", false, false, N, C, 2 * Fs, f32(a.dshared_gu), 2 * Fs,
              f32(ops_.w(X.shared_gu)), C, 0.0f, a.dmoe_rows, C);
    ctx_.sum_over(gy, a.dmoe_rows, N * C, "shared expert gate|up dx");
    op.add(q, a.dln, a.dmoe_rows, N * C);
  }
  ops_.gemm("shared expert gate|up dw", true, false, 2 * Fs, C, N, f32(a.dshared_gu), 2 * Fs,
            f32(A.ln2), C, 1.0f, ops_.gw(X.shared_gu), C);
  // The gate: dlogit = s (1 - s) ds (host), dln += dlogit · w_gate, dw_gate += dlogitᵀ · ln2.
  std::vector<float> ds(static_cast<size_t>(N));
  q.copy_to_host(ds.data(), dsgate_.data(), size_t(N) * sizeof(float));
  q.synchronize();
  for (int64_t t = 0; t < N; ++t) {
    const double s = sgate_host_[size_t(t)];
    ds[size_t(t)] = float(s * (1.0 - s) * double(ds[size_t(t)]));
  }
  q.copy_to_device(dsgate_.data(), ds.data(), size_t(N) * sizeof(float));
  ops_.gemm("shared expert gate dx", false, false, N, C, 1, f32(dsgate_.data()), 1,
            f32(ops_.w(X.shared_gate)), C, 1.0f, a.dln, C);
  ops_.gemm("shared expert gate dw", true, false, 1, C, N, f32(dsgate_.data()), 1, f32(A.ln2), C,
            1.0f, ops_.gw(X.shared_gate), C);
}

}  // namespace tetrad::parallel
