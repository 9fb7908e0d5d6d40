// ParallelTransformer: inference on the grid. Whole-vocabulary logits (each Y rank's slice
// all-gathered over Y) and incremental decoding with a key/value cache: the same blocks as
// training (parallel_block.cpp, layer_forward with pos0 >= 0), where each rank caches the keys
// and values of its own kv heads, the heads its attention computes. Tokens stay split over Z and
// D as in training (each (z, d) slot decodes its own sequences), the weights are gathered over Z
// layer by layer as in the forward. Not on a pipeline grid: a stage holds only its layers.
#include <algorithm>
#include <cstring>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/activation_layout.hpp"

namespace tetrad::parallel {

float* ParallelTransformer::cache_k(int l) {
  const int64_t per = int64_t(cache_b_) * max_len_ * dims_.nkvy * dims_.hd;  // one of k or v of a layer
  return kv_cache_.as<float>() + int64_t(2 * l) * per;
}

float* ParallelTransformer::cache_v(int l) { return cache_k(l) + int64_t(cache_b_) * max_len_ * dims_.nkvy * dims_.hd; }

void ParallelTransformer::start_cache(int B) {
  if (g_.shape.p() > 1)
    fail("decoding with a KV cache on a pipeline grid (Gp = ", g_.shape.p(),
         ") is not implemented; use a grid without a pipeline axis (x,y,z,d)");
  if (B <= 0 || B > local_batch_)
    fail("generation batch of ", B, " sequences on this rank; the model was set up for 1..",
         local_batch_);
  if (B != cache_b_ || kv_cache_.empty()) {
    cache_b_ = B;
    const size_t n = size_t(2) * size_t(cfg_.n_layer) * size_t(B) * size_t(max_len_) *
                     size_t(dims_.nkvy * dims_.hd);
    kv_cache_ = be_->alloc_array<float>(n);
  }
  cache_pos_ = 0;
}

const float* ParallelTransformer::decode(const int32_t* tokens, int B, int Tq) {
  if (cache_pos_ < 0 || B != cache_b_)
    fail("decode of ", B, " sequences: start_cache(", B, ") must come first");
  if (Tq <= 0 || cache_pos_ + Tq > max_len_)
    fail("decoding ", Tq, " tokens at position ", cache_pos_, " goes past the model's maximum of ",
         max_len_, " tokens");
  ScopedPhase sp(prof_, Phase::Other);
  const int pos0 = cache_pos_;
  const int64_t N = int64_t(B) * Tq;
  const int L = cfg_.n_layer;
  Acts& a = *a_;
  gather_->ensure_bf16_copy();
  set_layer(-1);
  gather_->issue(-1);
  if (L > 0 && ov_.prefetch_depth > 0) {
    gather_->issue(0);
    gather_->prefetch(0, +1, 0, L);
  }
  gather_->gather(-1);
  embedding_forward(tokens, N, Tq, pos0);
  const float* x = a.emb;
  for (int l = 0; l < L; ++l) {
    set_layer(l);
    gather_->gather(l);
    gather_->prefetch(l, +1, 0, L);
    layer_forward(l, x, B, Tq, pos0);
    x = a.layer[l].resid_out;
  }
  set_layer(-1);
  norm_fwd(a.lnf, a.lnf_mean, a.lnf_rstd, x, lnf_w_, lnf_b_, N, a.lnf16);
  // Output head on each sequence's last new row only (rows Tq*Cx apart, from row Tq-1): a
  // normal layer, partial over X.
  const int64_t last = int64_t(Tq - 1) * dims_.Cx;
  gemm(gemm_site_name(GemmSite::Head), false, true, B, dims_.Vy, dims_.Cx,
       act(a.lnf ? a.lnf + last : nullptr, a.lnf16 ? a.lnf16 + last : nullptr), int64_t(Tq) * dims_.Cx,
       weight_operand(head_), dims_.Cx, 0.0f, a.logits, dims_.Vy);
  sum_over(g_.x(), a.logits, int64_t(B) * dims_.Vy, gemm_site_name(GemmSite::Head));
  cache_pos_ += Tq;
  return whole_vocabulary(a.logits, B);
}

const float* ParallelTransformer::forward_logits(const int32_t* inputs, int B, int T) {
  ScopedPhase sp(prof_, Phase::Other);
  forward(inputs, B, T);
  return whole_vocabulary(a_->logits, int64_t(B) * T);
}

// Rank y holds columns [y*Vy, (y+1)*Vy) of every row: gathered over Y as [Gy][rows][Vy], then
// laid out row by row.
const float* ParallelTransformer::whole_vocabulary(const float* logits, int64_t rows) {
  const int gy = g_.y().size();
  const size_t slice = size_t(rows) * size_t(dims_.Vy);
  host_logits_.resize(slice * size_t(gy));
  if (gy == 1) {
    bq().copy_to_host(host_logits_.data(), logits, slice * sizeof(float));
    bq().synchronize();
    return host_logits_.data();
  }
  std::vector<float> mine(slice);
  bq().copy_to_host(mine.data(), logits, slice * sizeof(float));
  bq().synchronize();
  gathered_logits_.resize(slice * size_t(gy));
  {
    ScopedPhase comm_phase(prof_, Phase::Comm);
    g_.host().y().allgather(mine.data(), gathered_logits_.data(), slice);  // host vectors
  }
  const int64_t V = int64_t(gy) * dims_.Vy;
  for (int r = 0; r < gy; ++r)
    for (int64_t t = 0; t < rows; ++t)
      std::memcpy(host_logits_.data() + t * V + int64_t(r) * dims_.Vy,
                  gathered_logits_.data() + size_t(r) * slice + size_t(t) * size_t(dims_.Vy),
                  size_t(dims_.Vy) * sizeof(float));
  return host_logits_.data();
}

}  // namespace tetrad::parallel
