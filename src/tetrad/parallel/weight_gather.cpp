// The weight gatherer (weight_gather.hpp): the Z all-gathers of the weights into slots,
// prefetched and reused, and the bf16 weight copy.
#include "tetrad/parallel/weight_gather.hpp"

#include <algorithm>

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

BlockExtents block_extents(const ShardPlan& plan, int Gz) {
  BlockExtents e;
  for (const auto& t : plan.tensors) {
    const int64_t end = t.block_offset + (t.z_sharded ? t.shard_numel * Gz : t.block_numel);
    int64_t& m = t.spec->layer < 0 ? e.top : e.layer;
    m = std::max(m, end);
  }
  return e;
}

WeightGatherer::WeightGatherer(const StepContext& ctx, const ShardPlan& plan, const float* params,
                               std::vector<char> gemm_weight, int embedding, int n_layer,
                               const OverlapOptions& overlap, bool bf16_copy)
    : ctx_(ctx), plan_(plan), params_(params), gemm_weight_(std::move(gemm_weight)),
      embedding_(embedding), n_layer_(n_layer), ov_(overlap), bf16_(bf16_copy) {
  backend::Backend& be = *ctx_.be;
  if (bf16_) params16_ = be.alloc_array<uint16_t>(size_t(plan_.local_total));
  // Slots only when Z shards weights (Gz = 1 computes in place).
  if (ctx_.shape().z() == 1) return;
  const BlockExtents e = block_extents(plan_, ctx_.shape().z());
  // Slots for gathered layers: the one in use plus prefetch_depth ahead, or all of them.
  const int nslots = std::max(1, ov_.cache_gathered_weights
                                     ? n_layer_
                                     : std::min(ov_.prefetch_depth + 1, n_layer_));
  for (int s = 0; s < nslots; ++s) slots_.emplace_back(be, size_t(e.layer));
  if (bf16_)
    for (int s = 0; s < nslots; ++s) slots16_.push_back(be.alloc_array<uint16_t>(size_t(e.layer)));
  slot_layer_.assign(size_t(nslots), -2);
  slot_tickets_.resize(size_t(nslots));
  top_ = backend::DeviceArray<float>(be, e.top);
  if (bf16_) top16_ = be.alloc_array<uint16_t>(size_t(e.top));
}

void WeightGatherer::issue(int layer) {
  const int Gz = ctx_.shape().z();
  if (Gz == 1) return;
  ensure_bf16_copy();  // the bf16 gathers read the copy
  CommQueue& q = ctx_.q();
  std::vector<CommQueue::Ticket>* tickets;
  float* buf;
  uint16_t* buf16 = nullptr;
  if (layer < 0) {
    if (top_valid_) return;
    top_valid_ = true;
    tickets = &top_tickets_;
    buf = top_.data();
    if (bf16_) buf16 = top16_.as<uint16_t>();
  } else {
    const int s = slot_of(layer);
    if (slot_layer_[size_t(s)] == layer) return;
    // The slot's previous layer is no longer in use (the schedule only prefetches into slots of
    // layers already done), but its gather may in principle still be pending.
    for (auto t : slot_tickets_[size_t(s)]) q.wait(t);
    slot_layer_[size_t(s)] = layer;
    tickets = &slot_tickets_[size_t(s)];
    buf = slots_[size_t(s)].data();
    if (bf16_) buf16 = slots16_[size_t(s)].as<uint16_t>();
  }
  tickets->clear();
  const comm::Communicator& z = ctx_.g().z();
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const TensorShard& t = plan_.tensors[i];
    if (t.spec->layer != layer || !t.z_sharded) continue;
    // With the bf16 weight copy a GEMM weight is gathered in bf16 only (half the bytes; the same
    // bits as rounding the gathered fp32 block), except the embedding table, whose lookup reads
    // fp32 (tied to the head: gathered in both).
    const bool in16 = bf16_ && gemm_weight_[i];
    if (in16)
      tickets->push_back(q.start(
          z.iallgather(params16_.as<uint16_t>() + t.offset, buf16 + t.block_offset,
                       size_t(t.shard_numel), q.ready()),
          z, "allgather", "W bf16", layer, t.shard_numel * Gz * int64_t(sizeof(uint16_t))));
    if (!in16 || int(i) == embedding_)
      tickets->push_back(q.start(
          z.iallgather(params_ + t.offset, buf + t.block_offset, size_t(t.shard_numel), q.ready()),
          z, "allgather", "W", layer, t.shard_numel * Gz * int64_t(sizeof(float))));
  }
}

void WeightGatherer::gather(int layer) {
  if (ctx_.shape().z() == 1) return;
  issue(layer);
  for (auto t : layer < 0 ? top_tickets_ : slot_tickets_[size_t(slot_of(layer))]) ctx_.q().wait(t);
}

void WeightGatherer::prefetch(int layer, int direction, int lo, int hi) {
  if (ctx_.shape().z() == 1) return;
  for (int k = 1; k <= ov_.prefetch_depth; ++k) {
    const int j = layer + direction * k;
    if (j >= lo && j < hi) issue(j);
  }
}

void WeightGatherer::invalidate() {
  next_step_issued_ = false;
  if (ctx_.shape().z() == 1) return;
  if (ctx_.q().pending()) ctx_.q().wait_all();  // nothing may still write into the slots
  top_valid_ = false;
  std::fill(slot_layer_.begin(), slot_layer_.end(), -2);
}

void WeightGatherer::issue_first() {
  issue(-1);
  issue(0);
  prefetch(0, +1, 0, n_layer_);
}

void WeightGatherer::issue_next_step() {
  issue_first();
  next_step_issued_ = true;
}

bool WeightGatherer::take_next_step() {
  const bool was = next_step_issued_;
  next_step_issued_ = false;
  return was;
}

void WeightGatherer::ensure_bf16_copy() {
  if (!bf16_ || bf16_valid_) return;
  // Whatever the gathered bf16 slots hold came from the stale copy.
  invalidate();
  ctx_.ops().cast_f32_to_bf16(ctx_.bq(), params16_.as<uint16_t>(), params_, plan_.local_total);
  bf16_valid_ = true;
}

const float* WeightGatherer::weight(int i) const {
  if (i < 0) return nullptr;
  const TensorShard& t = plan_.tensors[size_t(i)];
  if (!t.z_sharded || ctx_.shape().z() == 1) return params_ + t.offset;
  if (t.spec->layer < 0) return top_.data() + t.block_offset;
  return slots_[size_t(slot_of(t.spec->layer))].data() + t.block_offset;
}

const uint16_t* WeightGatherer::weight16(int i) const {
  const TensorShard& t = plan_.tensors[size_t(i)];
  TETRAD_CHECK(bf16_ && i >= 0 && gemm_weight_[size_t(i)], "w16: no bf16 copy of tensor ", i);
  if (!t.z_sharded || ctx_.shape().z() == 1) return params16_.as<uint16_t>() + t.offset;
  if (t.spec->layer < 0) return top16_.as<uint16_t>() + t.block_offset;
  return slots16_[size_t(slot_of(t.spec->layer))].as<uint16_t>() + t.block_offset;
}

int64_t WeightGatherer::bytes() const {
  size_t floats = top_.size();
  for (const auto& b : slots_) floats += b.size();
  size_t bf16_bytes = params16_.bytes() + top16_.bytes();
  for (const auto& b : slots16_) bf16_bytes += b.bytes();
  return int64_t(floats * sizeof(float) + bf16_bytes);
}

}  // namespace tetrad::parallel
