// ParallelOps (parallel_ops.hpp): the parallel linear layers, each forward collective paired with
// its adjoint (Megatron's column/row-parallel pairs, here on the X/Y blocks of 4d-parallelism.md;
// the hidden state is [N, C/Gx], replicated over Y). Each site's kind and widths are declared
// once (linear_layers.hpp, kLinears); the functions below take a site and read its shape there:
//   normal layer      W block [n_out/Gy, k_in/Gx]: input split over X, output split over Y.
//                     forward  partial GEMM, all-reduce over X (normal_fwd, gemm_allreduce)
//                     backward dIn = all-reduce over Y of dOut · W (linear_bwd)
//   transposed layer  W block [C/Gx, k_in/Gy]: input split over Y, output split over X.
//                     forward  partial GEMM, all-reduce over Y (+ residual: transposed_fwd)
//                     backward dIn = all-reduce over X of dOut · W (linear_bwd)
// The identity halves of the pairs (a normal layer's input replicated over Y, its output's
// gradient replicated over X) need no message. Weight gradients dW += dOutᵀ · in stay local
// (each rank owns its block; grad_reduction.cpp reduces them over Z and D).
#include "tetrad/parallel/parallel_ops.hpp"

#include <algorithm>
#include <vector>

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

ParallelOps::ParallelOps(const StepContext& ctx, const WeightGatherer& weights, GradReducer& grads,
                         const GemmLayoutPlan& layouts, const OverlapOptions& overlap,
                         backend::Precision precision, bool bf16_activations, NormKind norm,
                         int64_t n_embd, float norm_eps, Scratch scratch, int64_t tokens,
                         bool sequence_shard)
    : ctx_(ctx), weights_(weights), grads_(grads), layouts_(layouts),
      forward_chunks_(overlap.forward_chunks), backward_allreduce_(overlap.backward_allreduce),
      precision_(precision), bf16_acts_(bf16_activations), norm_(norm), n_embd_(n_embd),
      eps_(norm_eps), scratch_(scratch), stats_(*ctx.be, size_t(tokens) * 2) {
  if (sequence_shard && ctx.shape().y() > 1) {
    TETRAD_CHECK(scratch_.dfull, "sequence sharding without the dfull scratch");
    shard_ = ctx.shape().y();
    shard_index_ = ctx.g().coord.y();
    norm_grads_ = backend::DeviceArray<float>(*ctx.be, size_t(2 * ctx.dims.Cx));
  }
}

const float* ParallelOps::stream_grad(const float* d, int64_t N) {
  if (shard_ == 1) return d;
  const int64_t n = stream_rows(N) * ctx_.dims.Cx;
  float* full = scratch_.dfull;
  ctx_.copy_dev(full + n * shard_index_, d, n);
  const comm::Communicator& gy = ctx_.g().y();
  ctx_.q().run(gy.iallgather(full + n * shard_index_, full, size_t(n), ctx_.q().ready()), gy,
               "allgather", "stream grad", ctx_.prof ? ctx_.prof->layer : -2,
               n * shard_ * int64_t(sizeof(float)));
  return full;
}

Operand ParallelOps::weight_operand(int i) const {
  if (weights_.bf16()) return {weights_.weight16(i), backend::DType::BF16};
  return f32(w(i));
}

void ParallelOps::gemm(const char* what, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                       Operand A, int64_t lda, Operand B, int64_t ldb, float beta, float* C,
                       int64_t ldc, backend::GemmProduct product) const {
  gemm_in(precision_, what, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, product);
}

void ParallelOps::gemm_f32(const char* what, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                           const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                           float* C, int64_t ldc) const {
  gemm_in(backend::Precision::FP32, what, ta, tb, M, N, K, f32(A), lda, f32(B), ldb, beta, C, ldc,
          backend::GemmProduct::Default);
}

void ParallelOps::gemm_in(backend::Precision precision, const char* what, bool ta, bool tb,
                          int64_t M, int64_t N, int64_t K, Operand A, int64_t lda, Operand B,
                          int64_t ldb, float beta, float* C, int64_t ldc,
                          backend::GemmProduct product) const {
  CommQueue::ProgressScope progress(ctx_.q());  // pending collectives move during the GEMM
  ScopedPhase sp(ctx_.prof, Phase::Gemm, what, M, N, K);
  backend::GemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.M = M;
  g.N = N;
  g.K = K;
  g.A = A.p;
  g.a_type = A.type;
  g.lda = lda;
  g.B = B.p;
  g.b_type = B.type;
  g.ldb = ldb;
  g.beta = beta;
  g.C = C;
  g.ldc = ldc;
  g.precision = precision;
  g.product = product;
  ctx_.ops().gemm(ctx_.bq(), g);
}

// out[N, n_out] = in · Wᵀ, partial over `group` and all-reduced there. With forward_chunks > 1
// the rows go in chunks: chunk i's all-reduce runs while chunk i+1's GEMM computes.
void ParallelOps::gemm_allreduce(GemmSite site, float* out, Operand in, int wi,
                                 int64_t N) {
  const char* what = gemm_site_name(site);
  const LinearSpec& spec = linear_spec(site);
  const int64_t k_in = ctx_.dims.*spec.in, n_out = ctx_.dims.*spec.out;
  const comm::Communicator& group = ctx_.g().group(collectives(spec.kind).forward);
  const int64_t chunks = group.size() > 1 ? std::min<int64_t>(forward_chunks_, N) : 1;
  const backend::GemmProduct fwd = product_of(layouts_.at(site).fwd);
  if (chunks == 1) {
    gemm(what, false, true, N, n_out, k_in, in, k_in, weight_operand(wi), k_in, 0.0f, out, n_out,
         fwd);
    ctx_.sum_over(group, out, N * n_out, what);
    return;
  }
  std::vector<CommQueue::Ticket> tickets;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = N * c / chunks, r1 = N * (c + 1) / chunks;
    const Operand rows{static_cast<const char*>(in.p) + r0 * k_in * int64_t(backend::dtype_size(in.type)),
                       in.type};
    gemm(what, false, true, r1 - r0, n_out, k_in, rows, k_in, weight_operand(wi), k_in, 0.0f,
         out + r0 * n_out, n_out, fwd);
    tickets.push_back(ctx_.q().start(group.iallreduce_sum(out + r0 * n_out, size_t((r1 - r0) * n_out), ctx_.q().ready()),
                               group, "allreduce", what, ctx_.prof ? ctx_.prof->layer : -2,
                               (r1 - r0) * n_out * int64_t(sizeof(float))));
  }
  for (auto t : tickets) ctx_.q().wait(t);
}

// Normal layer: out[N, n_out] = in[N, Cx-like] · Wᵀ, partial over X -> all-reduce X, + bias.
void ParallelOps::normal_fwd(GemmSite site, float* out, Operand in, int wi, int bi,
                             int64_t N) {
  TETRAD_CHECK(linear_spec(site).kind == LinearKind::Normal, gemm_site_name(site), ": not normal");
  gemm_allreduce(site, out, in, wi, N);
  if (const float* b = w(bi)) ctx_.ops().bias_add(ctx_.bq(), out, b, N, ctx_.dims.*linear_spec(site).out);
  ctx_.q().poll();
}

// Normal layer, rows [r0, r0 + rows) of the output only: reduce-scatter of the partial rows.
void ParallelOps::normal_fwd_rows(GemmSite site, float* out, float* partial, Operand in, int wi,
                                  int bi, int64_t N, int64_t r0, int64_t rows) {
  const LinearSpec& spec = linear_spec(site);
  TETRAD_CHECK(spec.kind == LinearKind::Normal, gemm_site_name(site), ": not normal");
  const comm::Communicator& group = ctx_.g().group(collectives(spec.kind).forward);
  if (group.size() != 2 || forward_chunks_ > 1) return normal_fwd(site, out, in, wi, bi, N);
  TETRAD_CHECK(rows * group.size() == N && r0 == rows * group.rank(), gemm_site_name(site),
               ": rows [", r0, ", ", r0 + rows, ") are not this rank's share of ", N);
  const char* what = gemm_site_name(site);
  const int64_t k_in = ctx_.dims.*spec.in, n_out = ctx_.dims.*spec.out;
  gemm(what, false, true, N, n_out, k_in, in, k_in, weight_operand(wi), k_in, 0.0f, partial,
       n_out, product_of(layouts_.at(site).fwd));
  float* mine = out + r0 * n_out;
  ctx_.q().run(group.ireduce_scatter_sum(partial, mine, size_t(rows * n_out), ctx_.q().ready()),
               group, "reduce_scatter", what, ctx_.prof ? ctx_.prof->layer : -2,
               N * n_out * int64_t(sizeof(float)));
  if (const float* b = w(bi)) ctx_.ops().bias_add(ctx_.bq(), mine, b, rows, n_out);
  ctx_.q().poll();
}

// Transposed layer + residual: out[N, Cx] = resid + all-reduce_Y(in · Wᵀ) + bias.
void ParallelOps::transposed_fwd(GemmSite site, float* out, const float* resid,
                                 Operand in, int wi, int bi, int64_t N) {
  TETRAD_CHECK(linear_spec(site).kind == LinearKind::Transposed, gemm_site_name(site),
               ": not transposed");
  float* tmp = scratch_.tmp;
  if (shard_ > 1) {  // the sum over Y scattered by rows: this rank's rows land in out
    const LinearSpec& spec = linear_spec(site);
    const int64_t k_in = ctx_.dims.*spec.in, Cx = ctx_.dims.Cx, rows = stream_rows(N);
    TETRAD_CHECK(ctx_.dims.*spec.out == Cx && collectives(spec.kind).forward == Axis::Y);
    const char* what = gemm_site_name(site);
    gemm(what, false, true, N, Cx, k_in, in, k_in, weight_operand(wi), k_in, 0.0f, tmp, Cx,
         product_of(layouts_.at(site).fwd));
    const comm::Communicator& gy = ctx_.g().y();
    ctx_.q().run(gy.ireduce_scatter_sum(tmp, out, size_t(rows * Cx), ctx_.q().ready()), gy,
                 "reduce_scatter", what, ctx_.prof ? ctx_.prof->layer : -2,
                 N * Cx * int64_t(sizeof(float)));
    ScopedPhase sp(ctx_.prof, Phase::Residual);
    ctx_.ops().residual_add(ctx_.bq(), out, resid, out, w(bi), rows, Cx);
    return;
  }
  gemm_allreduce(site, tmp, in, wi, N);
  ScopedPhase sp(ctx_.prof, Phase::Residual);
  ctx_.ops().residual_add(ctx_.bq(), out, resid, tmp, w(bi), N, ctx_.dims.Cx);
}

// Bias gradient: Σ over tokens, parallel over columns (fixed order).
void ParallelOps::bias_bwd(float* db, const float* dout, int64_t width, int64_t N) {
  if (db) ctx_.ops().bias_grad(ctx_.bq(), db, dout, N, width);
}

// din[N, k_in] = all-reduce of dout · W over the adjoint's group (Y for a normal layer, X for a
// transposed one); dW[n_out, k_in] += doutᵀ · in; bias.
// With backward_allreduce the all-reduce runs while dW computes (driven by the progress thread,
// or by the polls after it). With bf16 activations dout is cast to bf16 once for both GEMMs, as
// stored (dY16) and/or transposed (dY16ᵀ), whichever the site's layout plan reads
// (gemm_layouts.hpp: dx NN reads dY16, TN dY16ᵀ; dw NN reads dY16ᵀ, TN dY16).
const float* ParallelOps::linear_bwd(GemmSite site, float* din, const float* dout,
                                     Operand in, int wi, int bi, int64_t N, bool dout16_ready) {
  const char* what = gemm_site_name(site);
  const LinearSpec& spec = linear_spec(site);
  const int64_t k_in = ctx_.dims.*spec.in, n_out = ctx_.dims.*spec.out;
  const comm::Communicator& group = ctx_.g().group(collectives(spec.kind).backward);
  const GemmSiteLayout& lay = layouts_.at(site);
  Operand dy = f32(dout), dyt{};  // dyt: doutᵀ [n_out, N] in bf16
  TETRAD_CHECK(!dout16_ready || bf16_acts_, "linear_bwd ", what, ": bf16 dY copies without bf16 activations");
  if (bf16_acts_) {
    const auto [d16, d16t] = dy16_copies(site);
    if (!dout16_ready) {
      ScopedPhase sp(ctx_.prof, Phase::Gemm, "cast dY to bf16");
      if (d16t)
        ctx_.ops().cast_transpose_f32_to_bf16(ctx_.bq(), d16, d16t, dout, N, n_out);
      else
        ctx_.ops().cast_f32_to_bf16(ctx_.bq(), d16, dout, N * n_out);
    }
    if (d16t) dyt = {d16t, backend::DType::BF16};
    if (d16) dy = {d16, backend::DType::BF16};
  }
  auto weight_grad = [&] {
    if (lay.dw.ta)
      gemm(what, true, false, n_out, k_in, N, dy, n_out, in, k_in, 1.0f, gw(wi), k_in,
           product_of(lay.dw));
    else
      gemm(what, false, false, n_out, k_in, N, dyt, N, in, k_in, 1.0f, gw(wi), k_in,
           product_of(lay.dw));
  };
  if (lay.dx.ta)
    gemm(what, true, false, N, k_in, n_out, dyt, N, weight_operand(wi), k_in, 0.0f, din, k_in,
         product_of(lay.dx));
  else
    gemm(what, false, false, N, k_in, n_out, dy, n_out, weight_operand(wi), k_in, 0.0f, din, k_in,
         product_of(lay.dx));
  // Sequence sharding: a normal layer's dIn (the stream's gradient, summed over Y) is
  // reduce-scattered by rows into dfull instead of all-reduced.
  const bool scatter = shard_ > 1 && collectives(spec.kind).backward == Axis::Y;
  auto start = [&] {
    const int layer = ctx_.prof ? ctx_.prof->layer : -2;
    const int64_t bytes = N * k_in * int64_t(sizeof(float));
    if (scatter)
      return ctx_.q().start(group.ireduce_scatter_sum(din, scratch_.dfull, size_t(stream_rows(N) * k_in),
                                                      ctx_.q().ready()),
                            group, "reduce_scatter", what, layer, bytes);
    return ctx_.q().start(group.iallreduce_sum(din, size_t(N * k_in), ctx_.q().ready()), group,
                          "allreduce", what, layer, bytes);
  };
  if (backward_allreduce_ && group.size() > 1) {
    const auto t = start();
    weight_grad();
    bias_bwd(gw(bi), dout, n_out, N);
    ctx_.q().wait(t);
    return scatter ? scratch_.dfull : din;
  }
  weight_grad();
  bias_bwd(gw(bi), dout, n_out, N);
  if (!scatter) {
    ctx_.sum_over(group, din, N * k_in, what);
    return din;
  }
  ctx_.q().wait(start());
  return scratch_.dfull;
}

std::pair<uint16_t*, uint16_t*> ParallelOps::dy16_copies(GemmSite site) const {
  const GemmSiteLayout& lay = layouts_.at(site);
  const bool plain = !lay.dx.ta || lay.dw.ta, transposed = lay.dx.ta || !lay.dw.ta;
  return {plain ? scratch_.dout16 : nullptr, transposed ? scratch_.dout16_t : nullptr};
}

}  // namespace tetrad::parallel
