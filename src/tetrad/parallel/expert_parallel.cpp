// The expert-parallel exchange of a mixture-of-experts block (expert_parallel.hpp).
#include "tetrad/parallel/expert_parallel.hpp"

#include <algorithm>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/expert_mlp.hpp"

namespace tetrad::parallel {

ExpertParallel::ExpertParallel(const StepContext& ctx, const ModelConfig& cfg, bool act16,
                               bool grad16)
    : ctx_(ctx), C_(ctx.dims.Cx), F_(ctx.dims.Fy), El_(cfg.n_experts / ctx.shape().e()),
      Ge_(ctx.shape().e()), act16_(act16), grad16_(grad16) {
  TETRAD_CHECK(Ge_ > 1 && cfg.n_experts % Ge_ == 0 && ctx.g().experts().size() == Ge_,
               "expert parallelism: E = ", Ge_, " does not fit ", cfg.n_experts,
               " experts or the expert group");
}

int64_t ExpertParallel::max_rows(const ModelConfig& cfg, const GridShape& shape, int64_t tokens) {
  const int64_t E = shape.e(), El = cfg.n_experts / E, k = cfg.experts_per_token;
  const int64_t dropless = E * tokens * std::min(k, El);
  const int64_t total = tokens * shape.size(token_share_axes());
  return std::min(dropless, El * expert_capacity(cfg, total));
}

int64_t ExpertParallel::scratch_bytes(const LocalDims& dims, int64_t rows) {
  return rows * (3 * int64_t(dims.Cx) + 6 * int64_t(dims.Fy)) * int64_t(sizeof(float));
}

void ExpertParallel::plan(int layer, const MoeRouting& r) {
  const size_t G = size_t(Ge_), El = size_t(El_);
  TETRAD_CHECK(r.rows.size() == G * El, "expert parallelism: a routing of ", r.rows.size(),
               " experts, expected ", G * El);
  // This rank's rows per expert, in expert order: block j is rank j's experts'. Each rank
  // learns how many rows every other rank sends each of its experts.
  send_cnt_.assign(r.rows.begin(), r.rows.end());
  recv_cnt_.assign(G * El, 0);
  std::vector<size_t> n(G, El), d(G);
  for (size_t j = 0; j < G; ++j) d[j] = j * El;
  const comm::Communicator& host = ctx_.g().host().experts();
  ctx_.q().run(host.ialltoallv(send_cnt_.data(), n, d, recv_cnt_.data(), n, d), host, "alltoallv",
               "expert counts", layer, int64_t(G * El * sizeof(int64_t)));
  sc_.assign(G, 0), sd_.assign(G, 0), rc_.assign(G, 0), rd_.assign(G, 0);
  lrows_.assign(El, 0);
  int64_t received = 0;
  for (size_t j = 0; j < G; ++j) {
    int64_t to = 0, from = 0;
    for (size_t e = 0; e < El; ++e) {
      to += send_cnt_[j * El + e];
      from += recv_cnt_[j * El + e];
      lrows_[e] += recv_cnt_[j * El + e];
    }
    sc_[j] = size_t(to * C_);
    sd_[j] = size_t(r.first[j * El] * C_);
    rc_[j] = size_t(from * C_);
    rd_[j] = size_t(received * C_);
    received += from;
  }
  R_ = received;
  lfirst_.assign(El, 0);
  for (size_t e = 1; e < El; ++e) lfirst_[e] = lfirst_[e - 1] + lrows_[e - 1];
  if (R_ > cap_) {  // the largest exchange so far: the scratch grows (never shrinks)
    ctx_.bq().synchronize();  // nothing may still use the old scratch
    cap_ = R_;
    auto make = [&](int64_t width) {
      return backend::DeviceArray<float>(*ctx_.be, size_t(cap_ * width));
    };
    stage_ = make(C_), in_ = make(C_), out_ = make(C_);
    gu_ = make(2 * F_), dgu_ = make(2 * F_);
    act_ = make(F_), dact_ = make(F_);
  }
}

void ExpertParallel::alltoallv(int layer, const float* send, const std::vector<size_t>& sc,
                               const std::vector<size_t>& sd, float* recv,
                               const std::vector<size_t>& rc, const std::vector<size_t>& rd,
                               const char* what) {
  const comm::Communicator& g = ctx_.g().experts();
  int64_t bytes = 0;
  for (size_t n : sc) bytes += int64_t(n * sizeof(float));
  ctx_.q().run(g.ialltoallv(send, sc, sd, recv, rc, rd, ctx_.q().ready()), g, "alltoallv", what,
               layer, bytes);
}

// The received rows come source by source, each source's in expert order; the experts' GEMMs
// want each expert's rows together (source by source within it).
void ExpertParallel::reorder(const float* from, float* to, bool to_expert_major) {
  const size_t G = size_t(Ge_), El = size_t(El_);
  std::vector<int64_t> next(lfirst_);
  int64_t sm = 0;  // row in the source-major layout
  for (size_t s = 0; s < G; ++s)
    for (size_t e = 0; e < El; ++e) {
      const int64_t n = recv_cnt_[s * El + e], em = next[e];
      next[e] += n;
      if (to_expert_major) ctx_.copy_dev(to + em * C_, from + sm * C_, n * C_);
      else ctx_.copy_dev(to + sm * C_, from + em * C_, n * C_);
      sm += n;
    }
}

void ExpertParallel::dispatch(int layer, const float* rows, float* em, const char* what) {
  alltoallv(layer, rows, sc_, sd_, stage_.data(), rc_, rd_, what);
  reorder(stage_.data(), em, true);
}

void ExpertParallel::combine(int layer, const float* em, float* rows, const char* what) {
  reorder(em, stage_.data(), false);
  alltoallv(layer, stage_.data(), rc_, rd_, rows, sc_, sd_, what);
}

void ExpertParallel::forward(int layer, const MoeRouting& r, const float* rows,
                             const ExpertGemms& w, float* out) {
  plan(layer, r);
  dispatch(layer, rows, in_.data(), "expert dispatch");
  const ExpertRows x{lrows_, lfirst_, R_};
  experts_forward(ctx_, C_, F_, x, in_.data(), w, gu_.data(), act(), out_.data());
  combine(layer, out_.data(), out, "expert combine");
}

void ExpertParallel::backward(int layer, const MoeRouting& r, const float* rows, float* drows,
                              const ExpertGemms& w, float* gw13, float* gw2) {
  plan(layer, r);
  // The forward's dispatch and the experts' gate|up and SwiGLU again (not kept: see the header).
  dispatch(layer, rows, in_.data(), "expert dispatch (recomputed)");
  const ExpertRows x{lrows_, lfirst_, R_};
  experts_forward(ctx_, C_, F_, x, in_.data(), w, gu_.data(), act(), nullptr);
  dispatch(layer, drows, out_.data(), "expert dispatch of gradients");
  // The staging rows [R, C] fp32 (free until the combine) hold the two bf16 copies of [R, C].
  ExpertGrad16 g16;
  if (grad16_) {
    uint16_t* s16 = reinterpret_cast<uint16_t*>(stage_.data());
    g16 = {s16, s16 + R_ * C_};
  }
  experts_backward(ctx_, C_, F_, x, in_.data(), gu_.data(), act(), out_.data(), w, gw13, gw2,
                   dact_.data(), dgu_.data(), out_.data(), g16);
  combine(layer, out_.data(), drows, "expert combine of gradients");
}

}  // namespace tetrad::parallel
