// ParallelTransformer: what the pipeline (Gp > 1, pipeline.hpp) needs from the model. Which stage
// owns a layer or tensor, where a chunk's input and output live, and the stash / restore of a
// chunk's activations so several micro-batches can be in flight on one activation buffer.
#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>
#include <cstring>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/activation_layout.hpp"
#include "tetrad/parallel/block.hpp"
#include "tetrad/parallel/parallel_ops.hpp"

namespace tetrad::parallel {

int ParallelTransformer::layer_stage(int l) const {
  if (ctx_.shape().p() == 1) return 0;
  return split_.stage_of(l, ctx_.shape().p());
}

float* ParallelTransformer::chunk_input(int l0) {
  return l0 == 0 ? a_->emb : a_->layer[l0 - 1].resid_out;
}
int64_t ParallelTransformer::hidden_floats(int B, int T) const {
  return ops_->stream_rows(int64_t(B) * T) * ctx_.dims.Cx;
}

const float* ParallelTransformer::chunk_output(int l1) const {
  return l1 == 0 ? a_->emb : a_->layer[l1 - 1].resid_out;
}
const float* ParallelTransformer::input_grad() const { return a_->dresid; }

// What a chunk's backward reads from its forward: its layers' kept activations from its input
// (layer l0 - 1's output slot) on, with the embedding its output (layer 0's input), with the head
// the final norm, its statistics, the logits (the loss gradient once chunk_loss ran) and the
// losses. Not the recompute scratch (restore() marks it empty: the backward recomputes its first
// layer again) nor the backward's own buffers (dresid ... the bf16 gradient copies), which hold
// nothing between micro-batches. Activation regions are contiguous per layer in layer order, and
// each end's top-level tensors are one range (the spec list, activation_layout.hpp).
std::vector<std::pair<float*, size_t>> ParallelTransformer::chunk_regions(int l0, int l1, bool embed,
                                                                          bool head) {
  std::vector<std::pair<float*, size_t>> r;
  const Acts& a = *a_;
  float* from = a.layer_begin[size_t(std::max(0, l0 - 1))];
  r.push_back({from, size_t(a.layer_begin[size_t(l1)] - from)});
  if (embed) r.push_back({a.embedding_end.begin, size_t(a.embedding_end.floats)});
  if (head) r.push_back({a.head_end.begin, size_t(a.head_end.floats)});
  return r;
}

std::vector<float> ParallelTransformer::stash(int l0, int l1, bool embed, bool head) {
  // Sized once: growing by insert() would hold up to twice the stash (and briefly the old
  // and the new storage) per micro-batch in flight.
  const auto regions = chunk_regions(l0, l1, embed, head);
  size_t total = 1;
  for (const auto& r : regions) total += r.second;
  std::vector<float> out(total);
  size_t at = 0;
  for (auto [p, n] : regions) {
    if (n) ctx_.bq().copy_to_host(out.data() + at, p, n * sizeof(float));
    at += n;
  }
  ctx_.bq().synchronize();
  out.back() = float(block_->scratch_layer());  // exact for any layer index
  return out;
}

int64_t ParallelTransformer::stash_numel(int l0, int l1, bool embed, bool head) {
  int64_t n = 1;  // the scratch layer index stash() appends
  for (const auto& region : chunk_regions(l0, l1, embed, head)) n += int64_t(region.second);
  return n;
}

void ParallelTransformer::restore(int l0, int l1, bool embed, bool head, const std::vector<float>& s) {
  size_t at = 0;
  for (auto [p, n] : chunk_regions(l0, l1, embed, head)) {
    TETRAD_CHECK(at + n < s.size(), "activation stash of the wrong chunk");
    if (n) ctx_.bq().copy_to_device(p, s.data() + at, n * sizeof(float));
    at += n;
  }
  TETRAD_CHECK(at + 1 == s.size(), "activation stash of the wrong chunk");
  ctx_.bq().synchronize();  // the stash may be freed when the caller returns
  // The recompute scratch is not stashed: other micro-batches used it since (s.back() is the
  // layer it held then, kept in the format only).
  block_->scratch_lost();
}

}  // namespace tetrad::parallel
