// ParallelTransformer: inference on the grid. Whole-vocabulary logits (each Y rank's slice
// all-gathered over Y: vocab_parallel.hpp), greedy next tokens, and incremental decoding with a
// key/value cache: the same blocks as training (block.hpp, forward with a CachedKv), where each
// rank caches the keys and values of its own kv heads, the heads its attention computes. Tokens
// stay split over Z and D as in training (each (z, d) slot decodes its own sequences), the
// weights are gathered over Z layer by layer as in the forward. Not on a pipeline grid: a stage
// holds only its layers.
#include <algorithm>
#include <cstring>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/activation_layout.hpp"
#include "tetrad/parallel/block.hpp"
#include "tetrad/parallel/parallel_ops.hpp"
#include "tetrad/parallel/vocab_parallel.hpp"

namespace tetrad::parallel {

float* ParallelTransformer::cache_k(int l) {
  // One of k or v of a layer.
  const int64_t per = int64_t(cache_b_) * max_len_ * ctx_.dims.nkvy * ctx_.dims.hd;
  return kv_cache_.as<float>() + int64_t(2 * l) * per;
}

float* ParallelTransformer::cache_v(int l) {
  return cache_k(l) + int64_t(cache_b_) * max_len_ * ctx_.dims.nkvy * ctx_.dims.hd;
}

void ParallelTransformer::start_cache(int B) {
  if (ctx_.shape().p() > 1)
    fail("decoding with a KV cache on a pipeline grid (Gp = ", ctx_.shape().p(),
         ") is not implemented; use a grid without a pipeline axis (x,y,z,d)");
  if (ops_->sequence_sharded())
    fail("decoding with a KV cache under parallel.sequence_shard (Gy = ", ctx_.shape().y(),
         ") is not implemented; build the model with parallel.sequence_shard = false");
  if (ctx_.shape().c() > 1)
    fail("decoding with a KV cache on a context-parallel grid (c=", ctx_.shape().c(),
         ") is not implemented; use a grid without the context axis (e.g. --grid d=",
         ctx_.shape().size(), ")");
  if (B <= 0 || B > local_batch_)
    fail("generation batch of ", B, " sequences on this rank; the model was set up for 1..",
         local_batch_);
  if (B != cache_b_ || kv_cache_.empty()) {
    cache_b_ = B;
    const size_t n = size_t(2) * size_t(cfg_.n_layer) * size_t(B) * size_t(max_len_) *
                     size_t(ctx_.dims.nkvy * ctx_.dims.hd);
    kv_cache_ = ctx_.be->alloc_array<float>(n);
  }
  cache_pos_ = 0;
}

const float* ParallelTransformer::decode(const int32_t* tokens, int B, int Tq) {
  if (cache_pos_ < 0 || B != cache_b_)
    fail("decode of ", B, " sequences: start_cache(", B, ") must come first");
  if (Tq <= 0 || cache_pos_ + Tq > max_len_)
    fail("decoding ", Tq, " tokens at position ", cache_pos_, " goes past the model's maximum of ",
         max_len_, " tokens");
  ScopedPhase sp(ctx_.prof, Phase::Other);
  const int pos0 = cache_pos_;
  const int64_t N = int64_t(B) * Tq;
  const int L = cfg_.n_layer;
  Acts& a = *a_;
  gather_->ensure_bf16_copy();
  ctx_.docs = MicroBatchDocuments{};  // the cache holds one document per sequence
  set_layer(-1);
  gather_->issue(-1);
  if (L > 0 && ov_.prefetch_depth > 0) {
    gather_->issue(0);
    gather_->prefetch(0, +1, 0, L);
  }
  gather_->gather(-1);
  vocab_->embedding_forward(tokens, N, Tq, pos0);
  const float* x = a.emb;
  for (int l = 0; l < L; ++l) {
    set_layer(l);
    gather_->gather(l);
    gather_->prefetch(l, +1, 0, L);
    const CachedKv kv{cache_k(l), cache_v(l), pos0};
    block_->forward(l, x, B, Tq, &kv);
    x = a.layer[l].resid_out;
  }
  set_layer(-1);
  ops_->norm_fwd(a.lnf, a.lnf_mean, a.lnf_rstd, x, lnf_w_, lnf_b_, N, a.lnf16);
  const float* logits = vocab_->last_row_logits(B, Tq);
  cache_pos_ += Tq;
  return logits;
}

const float* ParallelTransformer::forward_logits(const int32_t* inputs, int B, int T) {
  ScopedPhase sp(ctx_.prof, Phase::Other);
  forward(inputs, B, T, true);
  return vocab_->whole_vocabulary(int64_t(B) * T);
}

std::vector<int32_t> ParallelTransformer::greedy_next_tokens(const int32_t* inputs, int B, int T) {
  if (ctx_.shape().c() > 1)
    fail("greedy decoding on a context-parallel grid (c=", ctx_.shape().c(),
         ") is not implemented; use a grid without the context axis");
  forward(inputs, B, T, true);
  return vocab_->greedy_last(B, T);
}

}  // namespace tetrad::parallel
