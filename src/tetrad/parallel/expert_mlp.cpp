// The experts' SwiGLU MLPs as grouped GEMMs (expert_mlp.hpp).
#include "tetrad/parallel/expert_mlp.hpp"

namespace tetrad::parallel {

namespace {
// The sum of a partial product over a tensor axis (X or Y; nothing on one rank). Every rank of
// the group holds the same rows (the routing is the same on the X and Y ranks), so n agrees.
void sum_rows(const StepContext& ctx, const comm::Communicator& axis, float* p, int64_t n,
              const char* what) {
  if (n > 0) ctx.sum_over(axis, p, n, what);
}
}  // namespace

void grouped_gemm_f32(const StepContext& ctx, const char* what, bool ta, bool tb,
                      const std::vector<int64_t>& M, const std::vector<int64_t>& N,
                      const std::vector<int64_t>& K, const std::vector<const void*>& A,
                      int64_t lda, const std::vector<const void*>& B, int64_t ldb, float beta,
                      const std::vector<float*>& Cp, int64_t ldc) {
  CommQueue::ProgressScope progress(ctx.q());
  ScopedPhase sp(ctx.prof, Phase::Gemm, what);
  backend::GroupedGemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.groups = int64_t(M.size());
  g.M = M.data();
  g.N = N.data();
  g.K = K.data();
  g.beta = beta;
  g.A = A.data();
  g.lda = lda;
  g.B = B.data();
  g.ldb = ldb;
  g.C = Cp.data();
  g.ldc = ldc;
  g.precision = backend::Precision::FP32;
  ctx.ops().grouped_gemm(ctx.bq(), g);
}

void experts_forward(const StepContext& ctx, int64_t C, int64_t F, const ExpertRows& x,
                     const float* in, const float* w13, const float* w2, float* gu, float* act,
                     float* out) {
  const size_t E = x.rows.size();
  std::vector<int64_t> cols2F(E, 2 * F), colsC(E, C), colsF(E, F);
  std::vector<const void*> pin(E), wgu(E), pact(E), wd(E);
  std::vector<float*> pgu(E), pout(E);
  for (size_t e = 0; e < E; ++e) {
    const int64_t o = x.first[e], ei = int64_t(e);
    pin[e] = in + o * C;
    wgu[e] = w13 + ei * 2 * F * C;
    pgu[e] = gu + o * 2 * F;
    pact[e] = act + o * F;
    wd[e] = w2 + ei * C * F;
    pout[e] = out + o * C;
  }
  grouped_gemm_f32(ctx, "experts gate|up", false, true, x.rows, cols2F, colsC, pin, C, wgu, C,
                   0.0f, pgu, 2 * F);
  sum_rows(ctx, ctx.g().x(), gu, x.kept * 2 * F, "experts gate|up");
  {
    ScopedPhase sp(ctx.prof, Phase::Activation);
    ctx.ops().swiglu_forward(ctx.bq(), act, gu, x.kept, F);
  }
  if (out) {
    grouped_gemm_f32(ctx, "experts down", false, true, x.rows, colsC, colsF, pact, F, wd, F, 0.0f,
                     pout, C);
    sum_rows(ctx, ctx.g().y(), out, x.kept * C, "experts down");
  }
  ctx.q().poll();
}

void experts_backward(const StepContext& ctx, int64_t C, int64_t F, const ExpertRows& x,
                      const float* in, const float* gu, const float* act, const float* dout,
                      const float* w13, const float* w2, float* gw13, float* gw2, float* dact,
                      float* dgu, float* din) {
  const size_t E = x.rows.size();
  std::vector<int64_t> nC(E, C), nF(E, F), n2F(E, 2 * F);
  std::vector<const void*> pdout(E), wd(E), pact(E), pdgu(E), wgu(E), pin(E);
  std::vector<float*> pdact(E), gwd(E), gwgu(E), pdin(E);
  for (size_t e = 0; e < E; ++e) {
    const int64_t o = x.first[e], ei = int64_t(e);
    pdout[e] = dout + o * C;
    pdin[e] = din + o * C;
    wd[e] = w2 + ei * C * F;
    gwd[e] = gw2 + ei * C * F;
    pact[e] = act + o * F;
    pdact[e] = dact + o * F;
    pdgu[e] = dgu + o * 2 * F;
    wgu[e] = w13 + ei * 2 * F * C;
    gwgu[e] = gw13 + ei * 2 * F * C;
    pin[e] = in + o * C;
  }
  // down: dact = dout · W2 [rows, F]; dW2 += doutᵀ · act [C, F].
  grouped_gemm_f32(ctx, "experts down dx", false, false, x.rows, nF, nC, pdout, C, wd, F, 0.0f,
                   pdact, F);
  sum_rows(ctx, ctx.g().x(), dact, x.kept * F, "experts down dx");
  grouped_gemm_f32(ctx, "experts down dw", true, false, nC, nF, x.rows, pdout, C, pact, F, 1.0f,
                   gwd, F);
  {
    ScopedPhase sp(ctx.prof, Phase::Activation);
    ctx.ops().swiglu_backward(ctx.bq(), dgu, dact, gu, x.kept, F);
  }
  // gate|up: din = dgu · W13 [rows, C] (over dout, no longer needed, where din is dout);
  // dW13 += dguᵀ · in [2F, C].
  grouped_gemm_f32(ctx, "experts gate|up dx", false, false, x.rows, nC, n2F, pdgu, 2 * F, wgu, C,
                   0.0f, pdin, C);
  sum_rows(ctx, ctx.g().y(), din, x.kept * C, "experts gate|up dx");
  grouped_gemm_f32(ctx, "experts gate|up dw", true, false, n2F, nC, x.rows, pdgu, 2 * F, pin, C,
                   1.0f, gwgu, C);
  ctx.q().poll();
}

}  // namespace tetrad::parallel
