// The experts' SwiGLU MLPs as grouped GEMMs (expert_mlp.hpp).
#include "tetrad/parallel/expert_mlp.hpp"

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

namespace {
using backend::DType;
constexpr DType kF32 = DType::F32;

// The SwiGLU output as the down GEMMs read it.
Operand act_operand(const ExpertAct& a) { return act(a.f32, a.b16); }

// The sum of a partial product over a tensor axis (X or Y; nothing on one rank). Every rank of
// the group holds the same rows (the routing is the same on the X and Y ranks), so n agrees.
void sum_rows(const StepContext& ctx, const comm::Communicator& axis, float* p, int64_t n,
              const char* what) {
  if (n > 0) ctx.sum_over(axis, p, n, what);
}
}  // namespace

void grouped_gemm(const StepContext& ctx, const char* what, backend::Precision precision, bool ta,
                  bool tb, const std::vector<int64_t>& M, const std::vector<int64_t>& N,
                  const std::vector<int64_t>& K, const std::vector<const void*>& A,
                  backend::DType a_type, int64_t lda, const std::vector<const void*>& B,
                  backend::DType b_type, int64_t ldb, float beta, const std::vector<float*>& Cp,
                  int64_t ldc) {
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
  g.precision = precision;
  g.a_type = a_type;
  g.b_type = b_type;
  ctx.ops().grouped_gemm(ctx.bq(), g);
}

void experts_forward(const StepContext& ctx, int64_t C, int64_t F, const ExpertRows& x,
                     const float* in, const ExpertGemms& w, float* gu, ExpertAct act, float* out) {
  const size_t E = x.rows.size();
  const size_t e16 = w.w13.type == DType::BF16 ? 2 : 4;  // bytes per weight element
  const Operand a = act_operand(act);
  const size_t a16 = a.type == DType::BF16 ? 2 : 4;
  std::vector<int64_t> cols2F(E, 2 * F), colsC(E, C), colsF(E, F);
  std::vector<const void*> pin(E), wgu(E), pact(E), wd(E);
  std::vector<float*> pgu(E), pout(E);
  for (size_t e = 0; e < E; ++e) {
    const int64_t o = x.first[e], ei = int64_t(e);
    pin[e] = in + o * C;
    wgu[e] = static_cast<const char*>(w.w13.p) + size_t(ei * 2 * F * C) * e16;
    pgu[e] = gu + o * 2 * F;
    pact[e] = static_cast<const char*>(a.p) + size_t(o * F) * a16;
    wd[e] = static_cast<const char*>(w.w2.p) + size_t(ei * C * F) * e16;
    pout[e] = out + o * C;
  }
  grouped_gemm(ctx, "experts gate|up", w.precision, false, true, x.rows, cols2F, colsC, pin, kF32,
               C, wgu, w.w13.type, C, 0.0f, pgu, 2 * F);
  sum_rows(ctx, ctx.g().x(), gu, x.kept * 2 * F, "experts gate|up");
  {
    ScopedPhase sp(ctx.prof, Phase::Activation);
    const backend::OpTable& op = ctx.ops();
    if (!act.b16) {
      op.swiglu_forward(ctx.bq(), act.f32, gu, x.kept, F);
    } else if (op.swiglu_forward_bf16) {
      op.swiglu_forward_bf16(ctx.bq(), act.b16, gu, x.kept, F);
    } else {  // fp32 into the scratch, then the cast (the same bits)
      TETRAD_CHECK(act.f32 != nullptr, "experts' SwiGLU in bf16 without fp32 scratch");
      op.swiglu_forward(ctx.bq(), act.f32, gu, x.kept, F);
      op.cast_f32_to_bf16(ctx.bq(), act.b16, act.f32, x.kept * F);
    }
  }
  if (out) {
    grouped_gemm(ctx, "experts down", w.precision, false, true, x.rows, colsC, colsF, pact, a.type,
                 F, wd, w.w2.type, F, 0.0f, pout, C);
    sum_rows(ctx, ctx.g().y(), out, x.kept * C, "experts down");
  }
  ctx.q().poll();
}

namespace {
// The NN form of experts_backward (ExpertGrad16): dout and dgu rounded to bf16 once for the
// layer, as stored and transposed; the rows `in` once, into the plain copy's memory.
void experts_backward_nn(const StepContext& ctx, int64_t C, int64_t F, const ExpertRows& x,
                         const float* in, float* gu, Operand a, const float* dout,
                         const ExpertGemms& w, float* gw13, float* gw2, float* dact, float* dgu,
                         float* din, ExpertGrad16 g16) {
  constexpr DType kB16 = DType::BF16;
  const backend::OpTable& op = ctx.ops();
  const size_t E = x.rows.size();
  const int64_t R = x.kept;
  const size_t e16 = w.w13.type == DType::BF16 ? 2 : 4;
  const size_t a16 = a.type == DType::BF16 ? 2 : 4;
  uint16_t* d16 = g16.plain;        // dout [R, C], later in [R, C]
  uint16_t* d16t = g16.transposed;  // doutᵀ [C, R]
  uint16_t* gu16 = reinterpret_cast<uint16_t*>(gu);  // dgu [R, 2F] after the SwiGLU's backward
  uint16_t* gu16t = gu16 + R * 2 * F;                 // dguᵀ [2F, R]
  {
    ScopedPhase sp(ctx.prof, Phase::Gemm, "experts cast dY to bf16");
    op.cast_transpose_f32_to_bf16(ctx.bq(), d16, d16t, dout, R, C);
  }
  std::vector<int64_t> nC(E, C), nF(E, F), n2F(E, 2 * F);
  std::vector<const void*> pd(E), pdt(E), wd(E), pact(E), pg(E), pgt(E), wgu(E), pin(E);
  std::vector<float*> pdact(E), gwd(E), gwgu(E), pdin(E);
  for (size_t e = 0; e < E; ++e) {
    const int64_t o = x.first[e], ei = int64_t(e);
    pd[e] = d16 + o * C;
    pdt[e] = d16t + o;  // columns [o, o + rows) of doutᵀ: expert e's rows, leading dimension R
    pdin[e] = din + o * C;
    wd[e] = static_cast<const char*>(w.w2.p) + size_t(ei * C * F) * e16;
    gwd[e] = gw2 + ei * C * F;
    pact[e] = static_cast<const char*>(a.p) + size_t(o * F) * a16;
    pdact[e] = dact + o * F;
    pg[e] = gu16 + o * 2 * F;
    pgt[e] = gu16t + o;
    wgu[e] = static_cast<const char*>(w.w13.p) + size_t(ei * 2 * F * C) * e16;
    gwgu[e] = gw13 + ei * 2 * F * C;
    pin[e] = d16 + o * C;
  }
  // down: dact = dout · W2 [rows, F]; dW2 += (doutᵀ) · act [C, F], NN.
  grouped_gemm(ctx, "experts down dx", w.precision, false, false, x.rows, nF, nC, pd, kB16, C, wd,
               w.w2.type, F, 0.0f, pdact, F);
  sum_rows(ctx, ctx.g().x(), dact, R * F, "experts down dx");
  grouped_gemm(ctx, "experts down dw", w.precision, false, false, nC, nF, x.rows, pdt, kB16, R,
               pact, a.type, F, 1.0f, gwd, F);
  {
    ScopedPhase sp(ctx.prof, Phase::Activation);
    op.swiglu_backward(ctx.bq(), dgu, dact, gu, R, F);  // gu's last read
  }
  {
    ScopedPhase sp(ctx.prof, Phase::Gemm, "experts cast dY to bf16");
    op.cast_transpose_f32_to_bf16(ctx.bq(), gu16, gu16t, dgu, R, 2 * F);
    op.cast_f32_to_bf16(ctx.bq(), d16, in, R * C);  // dout's plain copy is read
  }
  // gate|up: din = dgu · W13 [rows, C] (over dout, no longer needed, where din is dout);
  // dW13 += (dguᵀ) · in [2F, C], NN.
  grouped_gemm(ctx, "experts gate|up dx", w.precision, false, false, x.rows, nC, n2F, pg, kB16,
               2 * F, wgu, w.w13.type, C, 0.0f, pdin, C);
  sum_rows(ctx, ctx.g().y(), din, R * C, "experts gate|up dx");
  grouped_gemm(ctx, "experts gate|up dw", w.precision, false, false, n2F, nC, x.rows, pgt, kB16, R,
               pin, kB16, C, 1.0f, gwgu, C);
  ctx.q().poll();
}
}  // namespace

void experts_backward(const StepContext& ctx, int64_t C, int64_t F, const ExpertRows& x,
                      const float* in, float* gu, ExpertAct act, const float* dout,
                      const ExpertGemms& w, float* gw13, float* gw2, float* dact, float* dgu,
                      float* din, ExpertGrad16 g16) {
  const Operand a = act_operand(act);
  if (g16.plain && x.kept > 0) {
    TETRAD_CHECK(g16.transposed && w.precision == backend::Precision::BF16,
                 "experts' bf16 gradient copies need both copies and bf16 GEMMs");
    experts_backward_nn(ctx, C, F, x, in, gu, a, dout, w, gw13, gw2, dact, dgu, din, g16);
    return;
  }
  const size_t E = x.rows.size();
  const size_t e16 = w.w13.type == DType::BF16 ? 2 : 4;
  const size_t a16 = a.type == DType::BF16 ? 2 : 4;
  std::vector<int64_t> nC(E, C), nF(E, F), n2F(E, 2 * F);
  std::vector<const void*> pdout(E), wd(E), pact(E), pdgu(E), wgu(E), pin(E);
  std::vector<float*> pdact(E), gwd(E), gwgu(E), pdin(E);
  for (size_t e = 0; e < E; ++e) {
    const int64_t o = x.first[e], ei = int64_t(e);
    pdout[e] = dout + o * C;
    pdin[e] = din + o * C;
    wd[e] = static_cast<const char*>(w.w2.p) + size_t(ei * C * F) * e16;
    gwd[e] = gw2 + ei * C * F;
    pact[e] = static_cast<const char*>(a.p) + size_t(o * F) * a16;
    pdact[e] = dact + o * F;
    pdgu[e] = dgu + o * 2 * F;
    wgu[e] = static_cast<const char*>(w.w13.p) + size_t(ei * 2 * F * C) * e16;
    gwgu[e] = gw13 + ei * 2 * F * C;
    pin[e] = in + o * C;
  }
  // down: dact = dout · W2 [rows, F]; dW2 += doutᵀ · act [C, F].
  grouped_gemm(ctx, "experts down dx", w.precision, false, false, x.rows, nF, nC, pdout, kF32, C,
               wd, w.w2.type, F, 0.0f, pdact, F);
  sum_rows(ctx, ctx.g().x(), dact, x.kept * F, "experts down dx");
  grouped_gemm(ctx, "experts down dw", w.precision, true, false, nC, nF, x.rows, pdout, kF32, C,
               pact, a.type, F, 1.0f, gwd, F);
  {
    ScopedPhase sp(ctx.prof, Phase::Activation);
    ctx.ops().swiglu_backward(ctx.bq(), dgu, dact, gu, x.kept, F);
  }
  // gate|up: din = dgu · W13 [rows, C] (over dout, no longer needed, where din is dout);
  // dW13 += dguᵀ · in [2F, C].
  grouped_gemm(ctx, "experts gate|up dx", w.precision, false, false, x.rows, nC, n2F, pdgu, kF32,
               2 * F, wgu, w.w13.type, C, 0.0f, pdin, C);
  sum_rows(ctx, ctx.g().y(), din, x.kept * C, "experts gate|up dx");
  grouped_gemm(ctx, "experts gate|up dw", w.precision, true, false, n2F, nC, x.rows, pdgu, kF32,
               2 * F, pin, kF32, C, 1.0f, gwgu, C);
  ctx.q().poll();
}

}  // namespace tetrad::parallel
