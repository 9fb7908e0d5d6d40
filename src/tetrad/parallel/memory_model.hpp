// What a ParallelTransformer allocates on one rank, by buffer, as pure arithmetic of its settings
// (no MPI, no allocation): the model sizes its activation buffer with activation_sizes()
// (activation_layout.hpp), and
// model_memory() gives the bytes of every buffer state_bytes() and activation_bytes() count, plus
// the pipeline's activation stashes (PipelineDriver::stash_peak_bytes). The planner's memory
// formula (planner::memory_per_rank), the trainer's memory fit check and `tetrad bench`'s memory
// line all call model_memory, so there is one formula, and the tests hold it equal to what the
// model itself reports on every grid they build (docs/planner.md, "Memory per rank").
#pragma once
#include <cstdint>
#include <vector>

#include "tetrad/model/model_config.hpp"
#include "tetrad/parallel/activation_layout.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/layer_split.hpp"
#include "tetrad/parallel/options.hpp"
#include "tetrad/parallel/pipeline_schedule.hpp"

namespace tetrad::parallel {

// Bytes one rank holds, by buffer (ParallelTransformer's members, as its constructor sizes them).
struct ModelMemory {
  int64_t params = 0;         // fp32 parameters (master weights in bf16): the local shard
  int64_t params16 = 0;       // the bf16 weight copy the GEMMs read (bf16 with bf16_weight_copy)
  int64_t grads = 0;          // fp32 gradients (ZeRO 2: this D rank's pieces)
  int64_t optimizer = 0;      // Adam's two fp32 moments (ZeRO >= 1: the pieces)
  int64_t gathered = 0;       // Z > 1: the gathered-layer slots and the top-level block, fp32
                              // and (bf16 weight copy) bf16
  int64_t staging = 0;        // gradient blocks and the reduce-scatter landing buffer (Z > 1 or
                              // ZeRO 2), ZeRO's piece staging, data-parallel buckets, the sparse
                              // embedding gradient's rows and ids
  int64_t activations = 0;    // ParallelTransformer::activation_bytes()
  int64_t pipeline = 0;       // Gp > 1: PipelineDriver::stash_peak_bytes (micro-batches in flight)
  int64_t context = 0;        // Gc > 1: the exchange's buffers (ParallelTransformer::context_bytes,
                              // ContextAttention::bytes: parallel.cp_comm's layout)
  int64_t expert_exchange = 0;  // E > 1: the expert exchange's scratch for the most rows a rank
                                // can receive (ExpertParallel::max_rows: dropless, every token
                                // of the expert group to this rank's experts), what it grows to
  // ParallelTransformer::state_bytes()
  int64_t state() const { return params + params16 + grads + optimizer + gathered + staging; }
  // What the activations take: the buffer, the pipeline's stash, the context and expert exchanges.
  int64_t activation_total() const { return activations + pipeline + context + expert_exchange; }
  int64_t total() const { return state() + activation_total(); }
};

// The rank at `coord` of a ParallelTransformer(cfg, groups of `shape`, local_batch, max_len,
// options) running `micro_batches` per step under `schedule` (the pipeline stash; Gp > 1 only).
// options.device is not read: the CPU and CUDA backends allocate the same buffers. Throws the
// model's Error where the grid does not divide the model or the layer split is impossible.
ModelMemory model_memory(const ModelConfig& cfg, const GridShape& shape, const GridCoord& coord,
                         int local_batch, int max_len, const ParallelOptions& options,
                         PipelineSchedule schedule = PipelineSchedule::OneFOneB,
                         int micro_batches = 1);

}  // namespace tetrad::parallel
