// The parameter gradients of one rank and their reductions (a part of ParallelTransformer). Per
// layer, as soon as its backward is done, the gradient blocks are reduce-scattered over Z (ZeRO 2:
// then over D into this rank's piece); the sparse embedding gradient goes over Z as touched rows;
// data-parallel buckets all-reduce final gradients during the last backward (dp_overlap) or in
// reduce(), which also sums the replicated tensors over Z x D and, with a pipeline, the top-level
// ones over P. With ZeRO it owns the optimizer's layout (each tensor's piece on this D rank).
//
// It owns the gradients, the layers' gradient blocks, the pending reduce-scatters, the buckets,
// the ZeRO pieces' staging and the step's bookkeeping (micro-batches done, layers final).
// Collective over the groups it reduces over; not thread-safe.
#pragma once
#include <cstdint>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/parallel/options.hpp"
#include "tetrad/parallel/sharding.hpp"
#include "tetrad/parallel/step_context.hpp"

namespace tetrad::parallel {

// Where the optimizer finds each tensor's part on this rank: parameters and gradients at
// param_offset / grad_offset of params() / grads(), its moments at state_offset of a buffer of
// optimizer_state_size(); numel elements (0 when this D rank's piece is empty).
struct OptimizerLayout {
  std::vector<int64_t> param_offsets, grad_offsets, state_offsets, sizes;
  int64_t state_size = 0;
};

// Whether this pipeline stage computes (and reports) tensor t: a layer's tensors on the stage that
// stores them; top-level tensors (every stage keeps a copy, their gradients summed over P) on
// stage 0.
inline bool stage_owns(const TensorShard& t, const GridCoord& c) {
  return t.spec->layer < 0 ? c.p() == 0 : t.stored;
}

class GradReducer {
 public:
  // opt: zero, grad_comm_bf16, reduce_scatter_chunk_bytes, sparse_embedding_grad are read;
  // overlap: the switches in effect (dp_overlap off with ZeRO or a pipeline). embedding, head:
  // the token table and the output head (the same tensor when tied). tokens: the most tokens of
  // one micro-batch on this rank (the sparse embedding gradient's rows).
  GradReducer(const StepContext& ctx, const ShardPlan& plan, const ParallelOptions& opt,
              const OverlapOptions& overlap, int n_layer, int embedding, int head, int64_t tokens);
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  float* grads() { return grads_.data(); }
  int64_t num_grads() const { return int64_t(grads_.size()); }
  const OptimizerLayout& layout() const { return zl_; }
  // ZeRO: tensor i's piece length (ceil(shard / Gd)), and Gd + 1 pieces of staging (D all-gathers
  // of pieces land at the front, this rank's piece behind them). Without ZeRO: its shard, none.
  int64_t piece(size_t i) const { return piece_[i]; }
  float* piece_staging() { return zero_tmp_.data(); }
  // Whether the embedding gradient goes over Z as touched rows (decided at construction).
  bool sparse_embedding() const { return sparse_embedding_; }

  // Where tensor i's gradient accumulates during the backward: its layer's block (staged: Z
  // shards it, or ZeRO 2 keeps a piece), else the gradient itself. Null for i < 0.
  float* accumulator(int i);

  // The step: zero() zeroes the gradients and the bookkeeping (no reduction may be pending);
  // expect(m): with dp_overlap, data-parallel buckets start during the last of m micro-batches
  // (forward_backward counts them; without expect, every bucket waits for reduce()).
  void zero();
  void expect(int micro_batches) { expected_micro_ = ov_.dp_overlap ? micro_batches : 0; }
  void micro_batch_done() { ++micro_done_; }
  bool last_micro_batch() const { return expected_micro_ > 0 && micro_done_ + 1 == expected_micro_; }
  // Before a layer's backward (-1: the top-level tensors): its blocks zeroed, once the previous
  // reduce-scatters out of them are done.
  void zero_layer_blocks(int layer);
  // After it: its blocks reduce-scattered over Z (ZeRO 2: and over D into the pieces).
  void scatter_layer(int layer);
  // The gradients of a layer are final for this step (sharded: the Z-sharded ones, after their
  // reduce-scatter; else the replicated ones): start the buckets that are now ready.
  void layer_final(int layer, bool sharded);
  // Sparse embedding gradient: the token ids of the Z group (device memory, N of this rank) are
  // all-gathered during the backward; the head's reduce-scatter (head_part) right after the
  // head's backward, the other top-level ones after the embedding's; then the rows (dresid, the
  // embedding output's gradient [N, Cx]) of every Z rank accumulate into this rank's shard.
  void start_embedding_ids(const int32_t* ids, int64_t N);
  void scatter_top(bool head_part);
  void accumulate_embedding_rows(const float* dresid, int64_t N);
  // After the step's last micro-batch: every remaining reduction, then the bookkeeping reset.
  void reduce();
  // Σ g² over the whole model (each element counted once, on every rank).
  double sum_squares();
  // Bytes of the gradients and every staging buffer (ParallelTransformer::state_bytes, without
  // the parameters and moments).
  int64_t bytes() const;

 private:
  // A data-parallel bucket: tensors reduced together over one group (d for Z shards, zd for
  // replicated tensors), in backward order; staged through bucket_buf_ when several.
  struct Bucket {
    const comm::Communicator* group = nullptr;
    std::vector<int> tensors;
    std::vector<int> layers;  // layers whose gradients must be final first
    bool sharded = false;
    int kind = 0;  // 0: replicated (zd), 1: Z shards (d), 2: expert shards (expert-data group)
    int64_t offset = 0, numel = 0;  // in bucket_buf_
    CommQueue::Ticket ticket = 0;
    bool started = false;
  };
  bool staged(const TensorShard& t) const;
  float* block_buffer(int layer);
  void reduce_scatter_d(size_t tensor, const float* shard, float* piece);
  CommQueue::Ticket start_grad_reduce_scatter(const TensorShard& t, bool last);
  void build_buckets();
  void start_bucket(Bucket& b);
  void start_ready_buckets();
  void reset_step_state();
  double read_scalar(const double* dev);

  const StepContext& ctx_;
  const ShardPlan& plan_;
  int zero_;
  bool comm_bf16_;
  int64_t rs_chunk_bytes_;
  OverlapOptions ov_;
  int n_layer_, embedding_, head_;
  OptimizerLayout zl_;
  std::vector<int64_t> piece_;  // ZeRO piece length of each tensor: ceil(shard_numel / Gd)
  // Device memory of the model's backend (backend::DeviceArray): the host reaches it only
  // through the queue's copies (docs/backend.md, "Device memory").
  backend::DeviceArray<float> zero_tmp_;  // Gd pieces: reduce-scatter input / all-gather output
  backend::DeviceArray<float> grads_;
  // Gradient blocks: two layer buffers (a layer's reduce-scatter may still read one while the
  // next layer fills the other), their pending reduce-scatters, the results' landing area.
  backend::DeviceArray<float> gblock_[2], gblock_top_, scatter_tmp_;
  std::vector<CommQueue::Ticket> rs_tickets_[3];  // [layer parity], [2]: top
  std::vector<int> rs_remaining_;  // per layer + 1: reduce-scatters still running
  // Sparse embedding gradient (ParallelOptions::sparse_embedding_grad, decided at construction).
  bool sparse_embedding_ = false;
  backend::DeviceArray<float> emb_rows_;  // Gz x N x Cx: every Z rank's embedding-output gradient rows
  backend::DeviceArray<int32_t> emb_ids_;  // Gz x N: their token ids
  CommQueue::Ticket emb_ids_ticket_ = 0, head_rs_ticket_ = 0;
  std::vector<Bucket> buckets_;
  backend::DeviceArray<float> bucket_buf_;
  size_t next_bucket_[3] = {0, 0, 0};  // per Bucket::kind: next to start
  std::vector<char> final_sharded_, final_repl_;  // per layer + 1, this step
  int expected_micro_ = 0, micro_done_ = 0;
  backend::DeviceBuffer scalar_;  // one double: a sum read back
};

}  // namespace tetrad::parallel
