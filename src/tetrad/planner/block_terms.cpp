// A block's sizes and its GEMMs' seconds on one rank (planner.hpp: Sizes, block_gemm_times).
#include "tetrad/model/family.hpp"
#include "tetrad/planner/planner.hpp"

namespace tetrad::planner {

Sizes sizes(const ModelConfig& m, int ep) {
  Sizes s;
  if (m.moe()) s.experts = m.n_experts, s.topk = m.experts_per_token, s.ep = ep;
  s.H = m.n_embd;
  s.L = m.n_layer;
  s.F = m.ffn;
  s.V = m.vocab_size;
  s.S_max = m.max_seq;
  s.QKV = m.qkv_dim();
  s.KV = m.kv_dim();
  s.A = m.q_dim();
  const FamilyDesc& f = m.desc();
  s.norm_vectors = f.norm == NormKind::LayerNorm ? 2 : 1;
  s.biases = f.linear_biases;
  s.qkv_bias = f.qkv_bias;
  s.qk_norm_vectors = f.qk_norm ? 2.0 * m.head_dim() : 0.0;
  s.learned_positions = f.positions == Positions::Learned;
  s.FW = f.mlp_in_factor() * s.F;
  s.tied = m.tie_embeddings;
  if (m.moe()) s.Fs = m.shared_expert_ffn;
  return s;
}

GemmTimes block_gemm_times(const Sizes& s, const GridShape& g, double T, const Machine& mach, bool bf16) {
  const double pk = mach.peak(bf16);
  auto t = [&](double m, double n, double k, GemmOp op) {
    return 2 * m * n * k / (pk * mach.gemm_eff(m, n, k, bf16, op));
  };
  GemmTimes r;
  auto weight = [&](double k_in, double n_out, double rows, double count) {  // count GEMMs of `rows`
    r.fwd += count * t(rows, n_out, k_in, GemmOp::NT);
    r.din += count * t(rows, k_in, n_out, GemmOp::NN);
    r.dw += count * t(n_out, k_in, rows, GemmOp::TN);
  };
  weight(s.H / g.x(), s.QKV / g.y(), T, 1);  // q|k|v
  weight(s.A / g.y(), s.H / g.x(), T, 1);    // attention output (transposed)
  // A mixture of experts: the router, and the rank's n_e / E experts, each on the T k E / n_e rows
  // routed to it from the E ranks of its group (an even load; planner.hpp).
  const double ne = s.experts > 0 ? s.experts / s.ep : 1, rows = s.experts > 0 ? T * s.topk * s.ep / s.experts : T;
  if (s.experts > 0) weight(s.H, s.experts, T, 1);
  weight(s.H / g.x(), s.FW / g.y(), rows, ne);  // MLP up (+ gate)
  weight(s.F / g.y(), s.H / g.x(), rows, ne);   // MLP down (transposed)
  // E > 1: the backward recomputes the experts' gate|up on the received rows (the dispatch is
  // recomputed, not kept: parallel/expert_parallel.hpp).
  if (s.experts > 0 && s.ep > 1) r.din += ne * t(rows, s.FW / g.y(), s.H / g.x(), GemmOp::NT);
  // The shared expert (Qwen2-MoE's form): every token through a SwiGLU MLP of width Fs and a
  // one-row sigmoid gate, whole on the rank (the grid refuses it on X or Y).
  if (s.Fs > 0) {
    weight(s.H, 2 * s.Fs, T, 1);  // gate|up
    weight(s.Fs, s.H, T, 1);      // down
    weight(s.H, 1, T, 1);         // the sigmoid gate's logit
  }
  const double hk = s.H / g.x(), hn = s.V / g.y();
  r.head_fwd = t(T, hn, hk, GemmOp::NT);
  r.head_bwd = t(T, hk, hn, GemmOp::NN) + t(hn, hk, T, GemmOp::TN);
  return r;
}

}  // namespace tetrad::planner
