// ParallelTransformer: the Z all-gathers of the weights. A layer's shards are gathered into a slot
// before its compute (issued prefetch_depth layers ahead, reused while the parameters do not
// change), the next step's first gathers start during the optimizer update (apply_update), and
// with ZeRO the updated pieces are all-gathered over D (gather_updated_params).
#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>
#include <cstring>

namespace tetrad::parallel {

void ParallelTransformer::issue_gather(int layer) {
  if (g_.shape.z() == 1) return;
  ensure_params16();  // the bf16 gathers read the copy
  std::vector<CommQueue::Ticket>* tickets;
  float* buf;
  uint16_t* buf16 = nullptr;
  if (layer < 0) {
    if (top_valid_) return;
    top_valid_ = true;
    tickets = &top_tickets_;
    buf = gathered_top_.data();
    if (bf16_weights_) buf16 = gathered16_top_.as<uint16_t>();
  } else {
    const int s = slot_of(layer);
    if (slot_layer_[size_t(s)] == layer) return;
    // The slot's previous layer is no longer in use (the schedule only prefetches into slots of
    // layers already done), but its gather may in principle still be pending.
    for (auto t : slot_tickets_[size_t(s)]) q_.wait(t);
    slot_layer_[size_t(s)] = layer;
    tickets = &slot_tickets_[size_t(s)];
    buf = gathered_[size_t(s)].data();
    if (bf16_weights_) buf16 = gathered16_[size_t(s)].as<uint16_t>();
  }
  tickets->clear();
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const TensorShard& t = plan_.tensors[i];
    if (t.spec->layer != layer || !t.z_sharded) continue;
    // With the bf16 weight copy a GEMM weight is gathered in bf16 only (half the bytes; the same
    // bits as rounding the gathered fp32 block), except the embedding table, whose lookup reads
    // fp32 (tied to the head: gathered in both).
    const bool in16 = bf16_weights_ && gemm_weight(int(i));
    if (in16)
      tickets->push_back(q_.start(
          g_.z().iallgather(params16_.as<uint16_t>() + t.offset, buf16 + t.block_offset,
                          size_t(t.shard_numel), q_.ready()),
          g_.z(), "allgather", "W bf16", layer, t.shard_numel * g_.shape.z() * int64_t(sizeof(uint16_t))));
    if (!in16 || int(i) == wte_)
      tickets->push_back(q_.start(
          g_.z().iallgather(params_.data() + t.offset, buf + t.block_offset, size_t(t.shard_numel), q_.ready()),
          g_.z(), "allgather", "W", layer, t.shard_numel * g_.shape.z() * int64_t(sizeof(float))));
  }
}

void ParallelTransformer::gather_layer(int layer) {
  if (g_.shape.z() == 1) return;
  issue_gather(layer);
  for (auto t : layer < 0 ? top_tickets_ : slot_tickets_[size_t(slot_of(layer))]) q_.wait(t);
}

void ParallelTransformer::prefetch(int layer, int direction, int lo, int hi) {
  if (g_.shape.z() == 1) return;
  for (int k = 1; k <= ov_.prefetch_depth; ++k) {
    const int j = layer + direction * k;
    if (j >= lo && j < hi) issue_gather(j);
  }
}

void ParallelTransformer::invalidate_gathered() {
  prefetched_next_ = false;
  if (g_.shape.z() == 1) return;
  if (q_.pending()) q_.wait_all();  // nothing may still write into the slots
  top_valid_ = false;
  std::fill(slot_layer_.begin(), slot_layer_.end(), -2);
}

void ParallelTransformer::issue_first_gathers() {
  issue_gather(-1);
  issue_gather(0);
  prefetch(0, +1, 0, cfg_.n_layer);
}

void ParallelTransformer::apply_update(
    const std::function<void(float* params, int64_t lo, int64_t hi)>& update) {
  // An optimizer that writes only the fp32 parameters: each updated interval is cast into the
  // bf16 copy right after (the bits the fused pass would write).
  apply_update([&](float* p, uint16_t* p16, int64_t lo, int64_t hi) {
    update(p, lo, hi);
    if (p16 && hi > lo) ops().cast_f32_to_bf16(bq(), p16 + lo, p + lo, hi - lo);
  });
}

void ParallelTransformer::apply_update(
    const std::function<void(float* params, uint16_t* params16, int64_t lo, int64_t hi)>& update16) {
  // All of it is the optimizer step on the breakdown, except the MPI calls that issue and poll
  // the gathers (communication; the gathers' own time runs behind the update).
  ScopedPhase phase(prof_, Phase::Optimizer, "update");
  float* p = params();  // the parameters change: gathered copies are dropped
  uint16_t* p16 = bf16_weights_ ? params16_.as<uint16_t>() : nullptr;
  // Every interval is updated through update16, which writes its bf16 copy too: the gathers
  // issued below read only intervals already updated, and at the end all of it is current.
  params16_valid_ = bf16_weights_;
  auto update = [&](float* params, int64_t lo, int64_t hi) { update16(params, p16, lo, hi); };
  const int64_t n = plan_.local_total;
  const bool across = ov_.prefetch_across_steps && ov_.prefetch_depth > 0 && g_.shape.z() > 1 &&
                      g_.shape.p() == 1;
  if (!across || opt_.zero >= 1) {
    // ZeRO: the gathers need the pieces every D replica updated, so they wait for
    // gather_updated_params(); they still overlap the trainer's work until the next forward.
    update(p, 0, n);
    gather_updated_params();
    if (across) {
      ScopedPhase issue(prof_, Phase::Comm, "issue next step's gathers");
      issue_first_gathers();
      prefetched_next_ = true;
    }
    return;
  }
  // The Z-sharded tensors of the top level and layers 0..prefetch_depth, as sorted, merged
  // intervals of the local buffer.
  std::vector<std::pair<int64_t, int64_t>> first;
  const int last_first = std::min(ov_.prefetch_depth, cfg_.n_layer - 1);
  for (const TensorShard& t : plan_.tensors)
    if (t.z_sharded && t.spec->layer <= last_first && t.shard_numel > 0)
      first.emplace_back(t.offset, t.offset + t.shard_numel);
  std::sort(first.begin(), first.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& iv : first)
    if (!merged.empty() && iv.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, iv.second);
    else
      merged.push_back(iv);
  for (const auto& [lo, hi] : merged) update(p, lo, hi);
  {
    ScopedPhase issue(prof_, Phase::Comm, "issue next step's gathers");
    issue_first_gathers();
  }
  prefetched_next_ = true;
  // The rest in slices, so the gathers move: by the progress thread while a slice computes, or
  // by a poll after each (about 4 MB of parameters, ~1 ms).
  constexpr int64_t kSlice = int64_t(1) << 20;
  auto rest = [&](int64_t lo, int64_t hi) {
    for (int64_t a = lo; a < hi; a += kSlice) {
      {
        CommQueue::ProgressScope progress(q_);
        update(p, a, std::min(hi, a + kSlice));
      }
      ScopedPhase poll(prof_, Phase::Comm, "poll");
      q_.poll();
    }
  };
  int64_t at = 0;
  for (const auto& [lo, hi] : merged) {
    rest(at, lo);
    at = hi;
  }
  rest(at, n);
}

void ParallelTransformer::gather_updated_params() {
  if (opt_.zero == 0 || g_.shape.d() == 1) return;
  invalidate_gathered();  // the parameters change: gathered copies are stale
  // The bf16 copy holds only this rank's pieces updated: remade before the next forward
  // (gathering the bf16 pieces over D as well would halve that traffic; not done).
  params16_valid_ = false;
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const TensorShard& t = plan_.tensors[i];
    if (!t.stored) continue;  // another pipeline stage's layer
    const int64_t q = piece_[i];
    float* pieces = zero_tmp_.data();
    float* mine = pieces + q * g_.shape.d();
    zero_dev(mine, q);
    copy_dev(mine, params_.data() + zl_.param_offsets[i], zl_.sizes[i]);
    q_.run(g_.d().iallgather(mine, pieces, size_t(q), q_.ready()), g_.d(), "allgather", "updated pieces over D",
           t.spec->layer, q * g_.shape.d() * int64_t(sizeof(float)));
    copy_dev(params_.data() + t.offset, pieces, t.shard_numel);
  }
}

}  // namespace tetrad::parallel
