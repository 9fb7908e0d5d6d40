// ParallelTransformer: the step around the forward and backward, between its parts. zero_grads /
// begin_step (the gradient reducer's bookkeeping, the weight gatherer's copies kept or dropped),
// reduce_gradients and the gradient norm (the reducer's); apply_update runs the optimizer over
// the local parameters, starting the next step's first Z all-gathers (the weight gatherer's)
// while the rest is updated; with ZeRO the updated pieces are all-gathered over D
// (gather_updated_params).
#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/weight_gather.hpp"

namespace tetrad::parallel {

void ParallelTransformer::zero_grads() {
  if (gather_->take_next_step()) {
    // Only apply_update()'s gathers can be pending (reduce_gradients() finished every
    // reduction before the optimizer ran); they write gathered slots, not gradients, and hold
    // the current parameters, so they stay.
    reduce_->zero();
    return;
  }
  ctx_.q().wait_all();  // pending reduce-scatters would add into the zeroed gradients
  reduce_->zero();
  gather_->invalidate();
}

void ParallelTransformer::begin_step(int micro_batches) {
  if (micro_batches <= 0) fail("begin_step: micro-batches must be positive, got ", micro_batches);
  zero_grads();
  // Only forward_backward counts micro-batches; the pipeline's chunks (Gp > 1) do not, and
  // dp_overlap is off there and with ZeRO (see the constructor).
  reduce_->expect(micro_batches);
}

void ParallelTransformer::reduce_gradients() { reduce_->reduce(); }

double ParallelTransformer::grad_sum_squares() { return reduce_->sum_squares(); }

void ParallelTransformer::apply_update(
    const std::function<void(float* params, int64_t lo, int64_t hi)>& update) {
  // An optimizer that writes only the fp32 parameters: each updated interval is cast into the
  // bf16 copy right after (the bits the fused pass would write).
  apply_update([&](float* p, uint16_t* p16, int64_t lo, int64_t hi) {
    update(p, lo, hi);
    if (p16 && hi > lo) ctx_.ops().cast_f32_to_bf16(ctx_.bq(), p16 + lo, p + lo, hi - lo);
  });
}

void ParallelTransformer::apply_update(
    const std::function<void(float* params, uint16_t* params16, int64_t lo, int64_t hi)>& update16) {
  // All of it is the optimizer step on the breakdown, except the MPI calls that issue and poll
  // the gathers (communication; the gathers' own time runs behind the update).
  ScopedPhase phase(ctx_.prof, Phase::Optimizer, "update");
  float* p = params();  // the parameters change: gathered copies are dropped
  uint16_t* p16 = gather_->bf16_copy();
  // Every interval is updated through update16, which writes its bf16 copy too: the gathers
  // issued below read only intervals already updated, and at the end all of it is current.
  gather_->bf16_copy_written();
  auto update = [&](float* params, int64_t lo, int64_t hi) { update16(params, p16, lo, hi); };
  const int64_t n = plan_.local_total;
  const bool across = ov_.prefetch_across_steps && ov_.prefetch_depth > 0 && ctx_.g().shape.z() > 1 &&
                      ctx_.g().shape.p() == 1;
  if (!across || opt_.zero >= 1) {
    // ZeRO: the gathers need the pieces every D replica updated, so they wait for
    // gather_updated_params(); they still overlap the trainer's work until the next forward.
    update(p, 0, n);
    gather_updated_params();
    if (across) {
      ScopedPhase issue(ctx_.prof, Phase::Comm, "issue next step's gathers");
      gather_->issue_next_step();
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
    ScopedPhase issue(ctx_.prof, Phase::Comm, "issue next step's gathers");
    gather_->issue_next_step();
  }
  // The rest in slices, so the gathers move: by the progress thread while a slice computes, or
  // by a poll after each (about 4 MB of parameters, ~1 ms).
  constexpr int64_t kSlice = int64_t(1) << 20;
  auto rest = [&](int64_t lo, int64_t hi) {
    for (int64_t a = lo; a < hi; a += kSlice) {
      {
        CommQueue::ProgressScope progress(ctx_.q());
        update(p, a, std::min(hi, a + kSlice));
      }
      ScopedPhase poll(ctx_.prof, Phase::Comm, "poll");
      ctx_.q().poll();
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
  if (opt_.zero == 0 || ctx_.g().replica_count() == 1) return;
  // The parameters change: gathered copies are stale, and the bf16 copy holds only this rank's
  // pieces updated: remade before the next forward (gathering the bf16 pieces over D as well
  // would halve that traffic; not done).
  gather_->parameters_changed();
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const TensorShard& t = plan_.tensors[i];
    if (!t.stored) continue;  // another pipeline stage's layer
    const int64_t q = reduce_->piece(i);
    float* pieces = reduce_->piece_staging();
    // D (with C: C x D; an expert tensor's expert-data group)
    const comm::Communicator& replicas = ctx_.g().replicas_for(t.expert);
    float* mine = pieces + q * replicas.size();
    ctx_.zero_dev(mine, q);
    ctx_.copy_dev(mine, params_.data() + optimizer_layout().param_offsets[i], optimizer_layout().sizes[i]);
    ctx_.q().run(replicas.iallgather(mine, pieces, size_t(q), ctx_.q().ready()), replicas, "allgather", "updated pieces over D",
           t.spec->layer, q * replicas.size() * int64_t(sizeof(float)));
    ctx_.copy_dev(params_.data() + t.offset, pieces, t.shard_numel);
  }
}

}  // namespace tetrad::parallel
