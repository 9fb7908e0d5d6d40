// MoeBlock (moe_block.hpp): the mixture of experts in place of the dense block's MLP.
#include "tetrad/parallel/moe_block.hpp"

#include <cmath>

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

MoeBlock::MoeBlock(const BlockParts& p) : DenseBlock(p), cfg_(p.config) {
  experts_.resize(size_t(p.config.n_layer));
  for (size_t i = 0; i < p.table.specs.size(); ++i) {
    const ParamSpec& s = p.table.specs[i];
    if (s.layer < 0) continue;
    Experts& x = experts_[size_t(s.layer)];
    switch (s.role) {
      case TensorRole::Router: x.router = int(i); break;
      case TensorRole::ExpertGateUp: x.gate_up = int(i); break;
      case TensorRole::ExpertDown: x.down = int(i); break;
      case TensorRole::SharedGate: x.shared_gu = int(i); break;  // with SharedUp after it
      case TensorRole::SharedDown: x.shared_down = int(i); break;
      case TensorRole::SharedExpertGate: x.shared_gate = int(i); break;
      case TensorRole::ExpertBias: x.bias = int(i); break;
      default: break;  // the dense block's (it bound them and refused any it has no place for)
    }
  }
  for (size_t l = 0; l < experts_.size(); ++l) {
    const Experts& x = experts_[l];
    if (x.router < 0 || x.gate_up < 0 || x.down < 0)
      fail("mixture of experts: layer ", l, " lacks its router, experts' gate|up or experts' down "
           "tensor in the parameter table");
    if ((x.shared_gu >= 0) != (cfg_.shared_expert_ffn > 0) ||
        (x.shared_down >= 0) != (x.shared_gu >= 0) || (x.shared_gate >= 0) != (x.shared_gu >= 0))
      fail("mixture of experts: layer ", l, "'s shared expert tensors do not match "
           "model.shared_expert_ffn = ", cfg_.shared_expert_ffn);
    if ((x.bias >= 0) != cfg_.moe_expert_bias())
      fail("mixture of experts: layer ", l, "'s expert bias tensor does not match "
           "model.moe_balance = \"", cfg_.moe_balance, "\"");
  }
}

void MoeBlock::route(int l, int64_t N) {
  const int64_t E = cfg_.n_experts, k = cfg_.experts_per_token;
  backend::Queue& q = ctx_.bq();
  logits_host_.resize(size_t(N * E));
  q.copy_to_host(logits_host_.data(), a_.layer[size_t(l)].router_logits,
                 logits_host_.size() * sizeof(float));
  const int bias = experts_[size_t(l)].bias;
  if (bias >= 0) {
    bias_host_.resize(static_cast<size_t>(E));
    q.copy_to_host(bias_host_.data(), ops_.w(bias), bias_host_.size() * sizeof(float));
  }
  q.synchronize();
  route_tokens(logits_host_.data(), N, cfg_, routing_, bias >= 0 ? bias_host_.data() : nullptr);
  if (slots_.size() < size_t(N * k)) {  // the first micro-batch of this size
    slots_ = backend::DeviceArray<int32_t>(*ctx_.be, size_t(N * k));
    weights_ = backend::DeviceArray<float>(*ctx_.be, size_t(N * k));
    dw_ = backend::DeviceArray<float>(*ctx_.be, size_t(N * k));
    dlogits_ = backend::DeviceArray<float>(*ctx_.be, size_t(N * E));
  }
  q.copy_to_device(slots_.data(), routing_.slots.data(), size_t(N * k) * sizeof(int32_t));
  q.copy_to_device(weights_.data(), routing_.weight.data(), size_t(N * k) * sizeof(float));
}

void MoeBlock::expert_gemms(const char* what, bool ta, bool tb, const std::vector<int64_t>& M,
                            const std::vector<int64_t>& Nn, const std::vector<int64_t>& K,
                            const std::vector<const void*>& A, int64_t lda,
                            const std::vector<const void*>& B, int64_t ldb, float beta,
                            const std::vector<float*>& C, int64_t ldc) {
  CommQueue::ProgressScope progress(ctx_.q());
  ScopedPhase sp(ctx_.prof, Phase::Gemm, what);
  backend::GroupedGemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.groups = int64_t(M.size());
  g.M = M.data();
  g.N = Nn.data();
  g.K = K.data();
  g.beta = beta;
  g.A = A.data();
  g.lda = lda;
  g.B = B.data();
  g.ldb = ldb;
  g.C = C.data();
  g.ldc = ldc;
  g.precision = backend::Precision::FP32;
  ctx_.ops().grouped_gemm(ctx_.bq(), g);
}

// resid_out = resid_mid + Σ_j w_j expert_j(ln2) over each token's kept choices.
void MoeBlock::mlp_forward(int l, int64_t N) {
  const Experts& X = experts_[size_t(l)];
  const auto& A = a_.layer[size_t(l)];
  const int64_t C = cfg_.n_embd, F = cfg_.ffn, E = cfg_.n_experts, k = cfg_.experts_per_token;
  const backend::OpTable& op = ctx_.ops();
  backend::Queue& q = ctx_.bq();
  // The router in fp32: logits [N, E] = ln2 · Wrᵀ.
  ops_.gemm("router", false, true, N, E, C, f32(A.ln2), C, f32(ops_.w(X.router)), C, 0.0f,
            A.router_logits, E);
  route(l, N);
  if (!recomputing_) {
    stats_.add(routing_);
    stats_.add_load(l, cfg_.n_layer, routing_);
  }
  const MoeRouting& r = routing_;
  {
    ScopedPhase sp(ctx_.prof, Phase::Other, "dispatch");
    op.moe_permute(q, A.moe_in, A.ln2, slots_.data(), N, k, C);
  }
  const float* w13 = ops_.w(X.gate_up);
  const float* w2 = ops_.w(X.down);
  std::vector<int64_t> rows(r.rows), cols2F(static_cast<size_t>(E), 2 * F), colsC(static_cast<size_t>(E), C),
      colsF(static_cast<size_t>(E), F);
  std::vector<const void*> in(static_cast<size_t>(E)), wgu(static_cast<size_t>(E)), act(static_cast<size_t>(E)), wd(static_cast<size_t>(E));
  std::vector<float*> gu(static_cast<size_t>(E)), out(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = r.first[size_t(e)];
    in[size_t(e)] = A.moe_in + o * C;
    wgu[size_t(e)] = w13 + e * 2 * F * C;
    gu[size_t(e)] = A.moe_gu + o * 2 * F;
    act[size_t(e)] = A.moe_act + o * F;
    wd[size_t(e)] = w2 + e * C * F;
    out[size_t(e)] = A.moe_out + o * C;
  }
  expert_gemms("experts gate|up", false, true, rows, cols2F, colsC, in, C, wgu, C, 0.0f, gu, 2 * F);
  {
    ScopedPhase sp(ctx_.prof, Phase::Activation);
    op.swiglu_forward(q, A.moe_act, A.moe_gu, r.kept, F);
  }
  expert_gemms("experts down", false, true, rows, colsC, colsF, act, F, wd, F, 0.0f, out, C);
  ctx_.q().poll();
  {
    ScopedPhase sp(ctx_.prof, Phase::Residual, "combine");
    op.moe_unpermute(q, A.resid_out, A.moe_out, weights_.data(), slots_.data(), N, k, C);
    op.add(q, A.resid_out, A.resid_mid, N * C);
  }
  if (X.shared_gu >= 0) shared_forward(l, N);
}

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
  const int64_t C = cfg_.n_embd, Fs = cfg_.shared_expert_ffn;
  const backend::OpTable& op = ctx_.ops();
  backend::Queue& q = ctx_.bq();
  ops_.gemm("shared expert gate|up", false, true, N, 2 * Fs, C, f32(A.ln2), C,
            f32(ops_.w(X.shared_gu)), C, 0.0f, A.shared_gu, 2 * Fs);
  {
    ScopedPhase sp(ctx_.prof, Phase::Activation);
    op.swiglu_forward(q, A.shared_act, A.shared_gu, N, Fs);
  }
  ops_.gemm("shared expert down", false, true, N, C, Fs, f32(A.shared_act), Fs,
            f32(ops_.w(X.shared_down)), Fs, 0.0f, A.shared_out, C);
  ops_.gemm("shared expert gate", false, true, N, 1, C, f32(A.ln2), C, f32(ops_.w(X.shared_gate)),
            C, 0.0f, A.shared_glogit, 1);
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
  const int64_t C = cfg_.n_embd, Fs = cfg_.shared_expert_ffn;
  const backend::OpTable& op = ctx_.ops();
  backend::Queue& q = ctx_.bq();
  shared_gate(l, N);  // the forward's sigmoid again, from the stored logits
  {
    ScopedPhase sp(ctx_.prof, Phase::Residual, "shared expert");
    op.moe_unpermute_backward(q, a.dmoe_rows, dsgate_.data(), a.dresid, A.shared_out,
                              sgate_.data(), ident_.data(), N, 1, C);
  }
  // down: dact = dout · Wd [N, Fs]; dWd += doutᵀ · act [C, Fs].
  ops_.gemm("shared expert down dx", false, false, N, Fs, C, f32(a.dmoe_rows), C,
            f32(ops_.w(X.shared_down)), Fs, 0.0f, a.dshared_act, Fs);
  ops_.gemm("shared expert down dw", true, false, C, Fs, N, f32(a.dmoe_rows), C,
            f32(A.shared_act), Fs, 1.0f, ops_.gw(X.shared_down), Fs);
  {
    ScopedPhase sp(ctx_.prof, Phase::Activation);
    op.swiglu_backward(q, a.dshared_gu, a.dshared_act, A.shared_gu, N, Fs);
  }
  // gate|up: dln += dgu · Wgu; dWgu += dguᵀ · ln2.
  ops_.gemm("shared expert gate|up dx", false, false, N, C, 2 * Fs, f32(a.dshared_gu), 2 * Fs,
            f32(ops_.w(X.shared_gu)), C, 1.0f, a.dln, C);
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

// From dresid (= the gradient of the combined output) to dln (the gradient of ln2): the
// combine, each expert's MLP, the dispatch, and the router with its losses.
void MoeBlock::mlp_backward(int l, int64_t N) {
  const Experts& X = experts_[size_t(l)];
  const ParallelActivations& a = a_;
  const auto& A = a.layer[size_t(l)];
  const int64_t C = cfg_.n_embd, F = cfg_.ffn, E = cfg_.n_experts, k = cfg_.experts_per_token;
  const backend::OpTable& op = ctx_.ops();
  backend::Queue& q = ctx_.bq();
  route(l, N);  // the forward's plan again, from the stored logits
  const MoeRouting& r = routing_;
  {
    ScopedPhase sp(ctx_.prof, Phase::Residual, "combine");
    op.moe_unpermute_backward(q, a.dmoe_rows, dw_.data(), a.dresid, A.moe_out, weights_.data(),
                              slots_.data(), N, k, C);
  }
  const float* w13 = ops_.w(X.gate_up);
  const float* w2 = ops_.w(X.down);
  float* gw13 = ops_.gw(X.gate_up);
  float* gw2 = ops_.gw(X.down);
  std::vector<int64_t> rows(r.rows), nC(static_cast<size_t>(E), C), nF(static_cast<size_t>(E), F), n2F(static_cast<size_t>(E), 2 * F);
  std::vector<const void*> drow(static_cast<size_t>(E)), wd(static_cast<size_t>(E)), act(static_cast<size_t>(E)), dgu_c(static_cast<size_t>(E)),
      wgu(static_cast<size_t>(E)), in(static_cast<size_t>(E));
  std::vector<float*> dact(static_cast<size_t>(E)), gwd(static_cast<size_t>(E)), dgu(static_cast<size_t>(E)), gwgu(static_cast<size_t>(E)),
      din(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = r.first[size_t(e)];
    drow[size_t(e)] = a.dmoe_rows + o * C;
    din[size_t(e)] = a.dmoe_rows + o * C;
    wd[size_t(e)] = w2 + e * C * F;
    gwd[size_t(e)] = gw2 + e * C * F;
    act[size_t(e)] = A.moe_act + o * F;
    dact[size_t(e)] = a.dmoe_act + o * F;
    dgu[size_t(e)] = a.dmoe_gu + o * 2 * F;
    dgu_c[size_t(e)] = a.dmoe_gu + o * 2 * F;
    wgu[size_t(e)] = w13 + e * 2 * F * C;
    gwgu[size_t(e)] = gw13 + e * 2 * F * C;
    in[size_t(e)] = A.moe_in + o * C;
  }
  // down: dact = dout · W2 [rows, F]; dW2 += doutᵀ · act [C, F].
  expert_gemms("experts down dx", false, false, rows, nF, nC, drow, C, wd, F, 0.0f, dact, F);
  expert_gemms("experts down dw", true, false, nC, nF, rows, drow, C, act, F, 1.0f, gwd, F);
  {
    ScopedPhase sp(ctx_.prof, Phase::Activation);
    op.swiglu_backward(q, a.dmoe_gu, a.dmoe_act, A.moe_gu, r.kept, F);
  }
  // gate|up: din = dgu · W13 [rows, C] (over the rows' gradient, no longer needed); dW13 +=
  // dguᵀ · in [2F, C].
  expert_gemms("experts gate|up dx", false, false, rows, nC, n2F, dgu_c, 2 * F, wgu, C, 0.0f, din, C);
  expert_gemms("experts gate|up dw", true, false, n2F, nC, rows, dgu_c, 2 * F, in, C, 1.0f, gwgu, C);
  ctx_.q().poll();
  // The router: dlogits from the combine weights' gradient and the router losses (host), then
  // dln = dlogits · Wr, dWr += dlogitsᵀ · ln2; the dispatch's adjoint adds the rows' gradient.
  dw_host_.resize(size_t(N * k));
  q.copy_to_host(dw_host_.data(), dw_.data(), dw_host_.size() * sizeof(float));
  q.synchronize();
  const double per_layer = double(grad_scale_) * double(N) / double(cfg_.n_layer);
  const double aux_scale = cfg_.moe_aux_loss() ? per_layer * double(cfg_.router_aux_loss_coef) : 0.0;
  const double z_scale = per_layer * double(cfg_.router_z_loss_coef);
  dlogits_host_.resize(size_t(N * E));
  router_backward(r, dw_host_.data(), cfg_.moe_renormalize(), aux_scale, z_scale,
                  dlogits_host_.data());
  q.copy_to_device(dlogits_.data(), dlogits_host_.data(), dlogits_host_.size() * sizeof(float));
  ops_.gemm("router dx", false, false, N, C, E, f32(dlogits_.data()), E, f32(ops_.w(X.router)), C,
            0.0f, a.dln, C);
  ops_.gemm("router dw", true, false, E, C, N, f32(dlogits_.data()), E, f32(A.ln2), C, 1.0f,
            ops_.gw(X.router), C);
  {
    ScopedPhase sp(ctx_.prof, Phase::Other, "dispatch");
    op.moe_permute_backward(q, a.dln, a.dmoe_rows, slots_.data(), N, k, C);
  }
  if (X.shared_gu >= 0) shared_backward(l, N);
}

}  // namespace tetrad::parallel
