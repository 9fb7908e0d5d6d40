// The weights as the model's compute reads them (a part of ParallelTransformer): with Z > 1 a
// layer's Z-sharded blocks are all-gathered into a slot before its compute (issued prefetch_depth
// layers ahead, reused while the parameters do not change), the top-level blocks (embedding,
// head, ...) into one slot of their own; with the bf16 weight copy (ParallelOptions::
// bf16_weight_copy) the GEMM weights are cast once per parameter change and gathered in bf16.
//
// It owns the slots, their pending all-gathers, which layer each holds, and the bf16 copy; the
// fp32 parameters are the model's. Whoever changes the parameters says so (parameters_changed,
// or bf16_copy_written after an optimizer pass that wrote both). Collective over Z where it
// gathers; not thread-safe.
#pragma once
#include <cstdint>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/parallel/sharding.hpp"
#include "tetrad/parallel/step_context.hpp"

namespace tetrad::parallel {

// The largest gathered (or gradient) block of one layer's tensors and of the top-level ones: a
// Z-sharded tensor's block is Gz shards, a replicated one's its block.
struct BlockExtents {
  int64_t layer = 0, top = 0;
};
BlockExtents block_extents(const ShardPlan& plan, int Gz);

class WeightGatherer {
 public:
  // params: the model's fp32 local shard (plan.local_total floats, device memory); gemm_weight[i]:
  // tensor i is read by GEMMs (gathered in bf16 only with the copy); embedding: the token table
  // (its lookup reads fp32, so with the copy it is gathered in both). bf16_copy: keep the copy.
  WeightGatherer(const StepContext& ctx, const ShardPlan& plan, const float* params,
                 std::vector<char> gemm_weight, int embedding, int n_layer,
                 const OverlapOptions& overlap, bool bf16_copy);
  WeightGatherer(const WeightGatherer&) = delete;
  WeightGatherer& operator=(const WeightGatherer&) = delete;

  // Start the all-gather of a layer's Z shards (-1: the top-level ones), unless its slot holds it.
  void issue(int layer);
  // ... and wait for it.
  void gather(int layer);
  // Issue the next prefetch_depth layers' gathers (in `direction`), within layers [lo, hi).
  void prefetch(int layer, int direction, int lo, int hi);
  // The gathers the next forward issues first: top-level tensors, layer 0, prefetch_depth ahead.
  void issue_first();
  // The same, during the optimizer step for the next step (apply_update): the next
  // take_next_step() keeps them instead of dropping the gathered copies.
  void issue_next_step();
  // Whether issue_next_step() ran since the last invalidation (and forget it).
  bool take_next_step();

  // The gathered copies are stale (waits for every pending collective first: none may still
  // write into a slot).
  void invalidate();
  // The fp32 parameters changed: gathered copies and the bf16 copy are stale.
  void parameters_changed() {
    invalidate();
    bf16_valid_ = false;
  }
  // Remakes the bf16 copy from the fp32 parameters where it is stale (before a forward/backward).
  void ensure_bf16_copy();
  // The bf16 copy (null without it), for an optimizer pass that writes it beside the parameters,
  // and the statement that the pass did (the copy is current again).
  uint16_t* bf16_copy() { return bf16_ ? params16_.as<uint16_t>() : nullptr; }
  void bf16_copy_written() { bf16_valid_ = bf16_; }
  bool bf16() const { return bf16_; }

  // Tensor i for compute: its gathered block, or the local shard (not Z-sharded, or Z = 1).
  const float* weight(int i) const;
  // Its bf16 copy (a GEMM weight, with the copy).
  const uint16_t* weight16(int i) const;
  // Bytes of the slots and the bf16 copy (ParallelTransformer::state_bytes).
  int64_t bytes() const;

 private:
  int slot_of(int layer) const { return layer % int(slots_.size()); }

  const StepContext& ctx_;
  const ShardPlan& plan_;
  const float* params_;
  std::vector<char> gemm_weight_;
  int embedding_, n_layer_;
  OverlapOptions ov_;
  bool bf16_ = false, bf16_valid_ = false;
  backend::DeviceBuffer params16_;  // laid out like the parameters (GEMM weights' elements used)
  // Slots of layer blocks (prefetch_depth + 1 of them, or one per layer with the cache), which
  // layer each holds (-2: none) and its pending all-gathers; the top-level slot, likewise.
  std::vector<backend::DeviceArray<float>> slots_;
  std::vector<backend::DeviceBuffer> slots16_;
  std::vector<int> slot_layer_;
  std::vector<std::vector<CommQueue::Ticket>> slot_tickets_;
  backend::DeviceArray<float> top_;
  backend::DeviceBuffer top16_;
  bool top_valid_ = false;
  std::vector<CommQueue::Ticket> top_tickets_;
  bool next_step_issued_ = false;
};

}  // namespace tetrad::parallel
