// MoeBlock (moe_block.hpp): the mixture of experts in place of the dense block's MLP.
#include "tetrad/parallel/moe_block.hpp"

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/expert_mlp.hpp"

namespace tetrad::parallel {

MoeBlock::MoeBlock(const BlockParts& p)
    : DenseBlock(p), cfg_(p.config), grad16_(p.bf16_weight_grad_nn) {
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
  if (cfg_.shared_expert_ffn > 0 && p.ops.precision() == backend::Precision::BF16)
    fail("mixture of experts: the shared expert (model.shared_expert_ffn = ", cfg_.shared_expert_ffn,
         ") in bf16 is not implemented; train it with train.precision = \"fp32\"");
  if (p.ctx.shape().e() > 1)
    ep_ = std::make_unique<ExpertParallel>(p.ctx, p.config, p.ops.bf16_activations(), grad16_);
}

ExpertGemms MoeBlock::expert_gemms(const Experts& X) const {
  return {ops_.weight_operand(X.gate_up), ops_.weight_operand(X.down), ops_.precision()};
}

ExpertAct MoeBlock::expert_act(const LayerActs& A) const {
  // With bf16 activations the SwiGLU is kept in bf16 only; dmoe_act (a work buffer, free in the
  // forward and before the backward writes it) is the fp32 scratch of a backend without the
  // bf16 producer.
  if (A.moe_act16) return {a_.dmoe_act, A.moe_act16};
  return {A.moe_act, nullptr};
}

void MoeBlock::route(int l, int64_t N) {
  const int64_t E = cfg_.n_experts, k = cfg_.experts_per_token;
  backend::Queue& q = ctx_.bq();
  logits_host_.resize(size_t(N * E));
  q.copy_to_host(logits_host_.data(), a_.layer[size_t(l)].router_logits,
                 logits_host_.size() * sizeof(float));
  const int bias = experts_[size_t(l)].bias;
  if (bias >= 0) {  // whole on every rank (replicated), the same copy everywhere
    bias_host_.resize(static_cast<size_t>(E));
    q.copy_to_host(bias_host_.data(), ops_.w(bias), bias_host_.size() * sizeof(float));
  }
  q.synchronize();
  route_local(logits_host_.data(), N, cfg_, routing_, bias >= 0 ? bias_host_.data() : nullptr);
  // The micro-batch's other tokens are on the token group's ranks: every rank's share of the
  // counts and sums (host values: over the host groups), so the losses, their gradients, the
  // capacity and the statistics are the whole micro-batch's, as on one rank.
  const comm::Communicator& tokens = ctx_.g().host().tokens();
  const int64_t w = routing_share_size(E);
  shares_.resize(size_t(w) * size_t(tokens.size()));
  routing_share(routing_, shares_.data() + w * tokens.rank());
  if (tokens.size() > 1) {
    const double* mine = shares_.data() + w * tokens.rank();
    ctx_.q().run(tokens.iallgather(mine, shares_.data(), size_t(w)), tokens, "allgather",
                 "routing counts", l, w * tokens.size() * int64_t(sizeof(double)));
  }
  finish_routing(cfg_, shares_.data(), tokens.size(), tokens.rank(), routing_);
  if (slots_.size() < size_t(N * k)) {  // the first micro-batch of this size
    slots_ = backend::DeviceArray<int32_t>(*ctx_.be, size_t(N * k));
    weights_ = backend::DeviceArray<float>(*ctx_.be, size_t(N * k));
    dw_ = backend::DeviceArray<float>(*ctx_.be, size_t(N * k));
    dlogits_ = backend::DeviceArray<float>(*ctx_.be, size_t(N * E));
  }
  q.copy_to_device(slots_.data(), routing_.slots.data(), size_t(N * k) * sizeof(int32_t));
  q.copy_to_device(weights_.data(), routing_.weight.data(), size_t(N * k) * sizeof(float));
}

// resid_out = resid_mid + Σ_j w_j expert_j(ln2) over each token's kept choices.
void MoeBlock::mlp_forward(int l, int64_t N) {
  const Experts& X = experts_[size_t(l)];
  const auto& A = a_.layer[size_t(l)];
  // This rank's widths: the hidden columns Cx (X) and each expert's Fy (Y).
  const int64_t C = ctx_.dims.Cx, F = ctx_.dims.Fy, E = cfg_.n_experts, k = cfg_.experts_per_token;
  const backend::OpTable& op = ctx_.ops();
  backend::Queue& q = ctx_.bq();
  // The router in fp32 in every precision (ln2 is kept in fp32 for it, and the router's weight
  // has no bf16 copy): logits [N, E] = ln2 · Wrᵀ, whole on every rank (ln2's X slice against
  // the router's X columns, summed over X: the routing sees the full hidden vector).
  ops_.gemm_f32("router", false, true, N, E, C, A.ln2, C, ops_.w(X.router), C, 0.0f,
                A.router_logits, E);
  ctx_.sum_over(ctx_.g().x(), A.router_logits, N * E, "router logits");
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
  const ExpertGemms w = expert_gemms(X);  // this rank's experts (E > 1: n_experts / E of them)
  if (ep_)
    ep_->forward(l, r, A.moe_in, w, A.moe_out);
  else
    experts_forward(ctx_, C, F, {r.rows, r.first, r.kept}, A.moe_in, w, A.moe_gu,
                    expert_act(A), A.moe_out);
  {
    ScopedPhase sp(ctx_.prof, Phase::Residual, "combine");
    op.moe_unpermute(q, A.resid_out, A.moe_out, weights_.data(), slots_.data(), N, k, C);
    op.add(q, A.resid_out, A.resid_mid, N * C);
  }
  if (X.shared_gu >= 0) shared_forward(l, N);
}

// From dresid (= the gradient of the combined output) to dln (the gradient of ln2): the
// combine, each expert's MLP, the dispatch, and the router with its losses.
void MoeBlock::mlp_backward(int l, int64_t N) {
  const Experts& X = experts_[size_t(l)];
  const ParallelActivations& a = a_;
  const auto& A = a.layer[size_t(l)];
  const int64_t C = ctx_.dims.Cx, F = ctx_.dims.Fy, E = cfg_.n_experts, k = cfg_.experts_per_token;
  const backend::OpTable& op = ctx_.ops();
  backend::Queue& q = ctx_.bq();
  route(l, N);  // the forward's plan again, from the stored logits
  const MoeRouting& r = routing_;
  {
    ScopedPhase sp(ctx_.prof, Phase::Residual, "combine");
    op.moe_unpermute_backward(q, a.dmoe_rows, dw_.data(), a.dresid, A.moe_out, weights_.data(),
                              slots_.data(), N, k, C);
  }
  // The combine weights' gradient dy · expert_out: partial over the X slices of the hidden size.
  ctx_.sum_over(ctx_.g().x(), dw_.data(), N * k, "combine weights' gradient");
  const ExpertGemms w = expert_gemms(X);
  float* gw13 = ops_.gw(X.gate_up);
  float* gw2 = ops_.gw(X.down);
  if (ep_) {
    ep_->backward(l, r, A.moe_in, a.dmoe_rows, w, gw13, gw2);
  } else {
    // The bf16 gradient copies in the linear layers' (free here; sized for N k rows of Cx).
    ExpertGrad16 g16;
    if (grad16_) {
      TETRAD_CHECK(a.dout16_floats * 2 >= r.kept * C, "experts' bf16 gradient copies: ",
                   a.dout16_floats * 2, " elements for ", r.kept, " rows of ", C);
      g16 = {a.dout16, a.dout16_t};
    }
    experts_backward(ctx_, C, F, {r.rows, r.first, r.kept}, A.moe_in, A.moe_gu, expert_act(A),
                     a.dmoe_rows, w, gw13, gw2, a.dmoe_act, a.dmoe_gu, a.dmoe_rows, g16);
  }
  // The router: dlogits from the combine weights' gradient and the router losses (host), then
  // dln = dlogits · Wr, dWr += dlogitsᵀ · ln2; the dispatch's adjoint adds the rows' gradient.
  dw_host_.resize(size_t(N * k));
  q.copy_to_host(dw_host_.data(), dw_.data(), dw_host_.size() * sizeof(float));
  q.synchronize();
  const double per_layer = double(grad_scale_) * double(r.total_N) / double(cfg_.n_layer);
  const double aux_scale =
      cfg_.moe_aux_loss() ? per_layer * double(cfg_.router_aux_loss_coef) : 0.0;
  const double z_scale = per_layer * double(cfg_.router_z_loss_coef);
  dlogits_host_.resize(size_t(N * E));
  router_backward(r, dw_host_.data(), cfg_.moe_renormalize(), aux_scale, z_scale,
                  dlogits_host_.data());
  q.copy_to_device(dlogits_.data(), dlogits_host_.data(), dlogits_host_.size() * sizeof(float));
  ops_.gemm_f32("router dx", false, false, N, C, E, dlogits_.data(), E, ops_.w(X.router), C, 0.0f,
                a.dln, C);
  ops_.gemm_f32("router dw", true, false, E, C, N, dlogits_.data(), E, A.ln2, C, 1.0f,
                ops_.gw(X.router), C);
  {
    ScopedPhase sp(ctx_.prof, Phase::Other, "dispatch");
    op.moe_permute_backward(q, a.dln, a.dmoe_rows, slots_.data(), N, k, C);
  }
  if (X.shared_gu >= 0) shared_backward(l, N);
}

}  // namespace tetrad::parallel
