// ParallelTransformer: the parameter gradients' reductions. Per layer, as soon as its backward is
// done, the gradient blocks are reduce-scattered over Z (ZeRO 2: then over D into this rank's
// piece); the sparse embedding gradient goes over Z as touched rows; data-parallel buckets
// all-reduce final gradients during the last backward (dp_overlap) or in reduce_gradients(),
// which also sums the replicated tensors over Z x D and, with a pipeline, the top-level ones
// over P. Plus the step's bookkeeping (zero_grads, begin_step) and the gradient norm.
#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>
#include <cstring>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/bf16_grad_comm.hpp"
#include "tetrad/parallel/activation_layout.hpp"

namespace tetrad::parallel {


void ParallelTransformer::zero_grads() {
  if (gather_->take_next_step()) {
    // Only apply_update()'s gathers can be pending (reduce_gradients() finished every
    // reduction before the optimizer ran); they write gathered slots, not gradients, and hold
    // the current parameters, so they stay.
    zero_dev(grads_.data(), int64_t(grads_.size()));
    reset_step_state();
    return;
  }
  q_.wait_all();  // pending reduce-scatters would add into the zeroed gradients
  zero_dev(grads_.data(), int64_t(grads_.size()));
  reset_step_state();
  gather_->invalidate();
}

void ParallelTransformer::begin_step(int micro_batches) {
  if (micro_batches <= 0) fail("begin_step: micro-batches must be positive, got ", micro_batches);
  zero_grads();
  // Only forward_backward counts micro-batches; the pipeline's chunks (Gp > 1) do not, and
  // dp_overlap is off there and with ZeRO (see the constructor).
  expected_micro_ = ov_.dp_overlap ? micro_batches : 0;
}

void ParallelTransformer::zero_layer_grad_blocks(int layer) {
  if (g_.shape.z() == 1 && opt_.zero != 2) return;
  // The buffer's previous reduce-scatters (layer + 2, or last micro-batch's) read it: finish them.
  for (auto t : rs_tickets_[layer < 0 ? 2 : layer & 1]) q_.wait(t);
  float* buf = layer < 0 ? gblock_top_.data() : gblock_[layer & 1].data();
  for (const auto& t : plan_.tensors)
    if (t.spec->layer == layer && staged(t)) {
      const int64_t n = t.z_sharded ? t.shard_numel * g_.shape.z() : t.block_numel;
      zero_dev(buf + t.block_offset, n);
    }
}

// piece[piece_[i]] = this D rank's piece of Σ_D shard (the shard zero-padded to Gd pieces).
//
// In chunks of at most ParallelOptions::reduce_scatter_chunk_bytes per call: Open MPI's
// non-blocking reduce-scatter (coll/libnbc, which every collective here goes through) allocates
// a temporary of twice the whole message for each call, 32 MiB for the 16 MiB embedding
// gradient of the small configuration, the largest part of the memory benchmark's excess over
// the formula (found with heaptrack, docs/parallel.md "Memory per rank"). Chunk [a, a + len) of
// every piece is packed into the front of zero_tmp_ (the piece itself lies behind the Gd q
// padded elements) and reduce-scattered on its own. Every element is still summed over the same
// D ranks by the same algorithm, so the result does not depend on the chunking; every D rank
// makes the same calls (q and Gd are the same there).
void ParallelTransformer::reduce_scatter_d(size_t i, const float* shard, float* piece) {
  const int64_t n = plan_.tensors[i].shard_numel, q = piece_[i], Gd = g_.shape.d();
  if (Gd == 1) {
    copy_dev(piece, shard, n);
    return;
  }
  const int64_t chunk =
      std::max<int64_t>(1, opt_.reduce_scatter_chunk_bytes / (int64_t(sizeof(float)) * Gd));
  float* packed = zero_tmp_.data();
  for (int64_t a = 0; a < q; a += chunk) {
    const int64_t len = std::min(chunk, q - a);
    for (int64_t d = 0; d < Gd; ++d) {
      // Elements [d q + a, d q + a + len) of the shard zero-padded to Gd q.
      const int64_t first = d * q + a;
      const int64_t have = std::clamp<int64_t>(n - first, 0, len);
      if (have > 0) copy_dev(packed + d * len, shard + first, have);
      zero_dev(packed + d * len + have, len - have);
    }
    if (opt_.grad_comm_bf16)
      reduce_scatter_sum_bf16(*be_, g_.d(), packed, piece + a, len);
    else
      q_.run(g_.d().ireduce_scatter_sum(packed, piece + a, size_t(len), q_.ready()), g_.d(),
             "reduce_scatter", "dW pieces over D", plan_.tensors[i].spec->layer,
             len * Gd * int64_t(sizeof(float)));
  }
}

void ParallelTransformer::scatter_layer_grads(int layer) {
  const bool last = last_micro_batch();
  if (opt_.zero == 2) {
    // ZeRO 2, every micro-batch: each staged block summed over Z (reduce-scatter of the Z shards,
    // all-reduce of the replicated ones), then reduce-scattered over D; this rank keeps its piece.
    // Blocking (through the queue): the pieces accumulate right away.
    float* buf = layer < 0 ? gblock_top_.data() : gblock_[layer & 1].data();
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const TensorShard& t = plan_.tensors[i];
      if (t.spec->layer != layer || !staged(t)) continue;
      float* block = buf + t.block_offset;
      const float* shard = block;
      if (t.z_sharded && g_.shape.z() > 1) {
        float* land = scatter_tmp_.data() + t.offset;
        if (opt_.grad_comm_bf16)
          reduce_scatter_sum_bf16(*be_, g_.z(), block, land, t.shard_numel);
        else
          q_.run(g_.z().ireduce_scatter_sum(block, land, size_t(t.shard_numel), q_.ready()), g_.z(),
                 "reduce_scatter", "dW", layer, t.shard_numel * g_.shape.z() * int64_t(sizeof(float)));
        shard = land;
      } else if (!t.z_sharded && g_.shape.z() > 1) {
        sum_over(g_.z(), block, t.block_numel, "replicated grads");  // replicated over Z: sum first
      }
      float* piece = zero_tmp_.data() + piece_[i] * g_.shape.d();
      reduce_scatter_d(i, shard, piece);
      ops().add(bq(), grads_.data() + zl_.grad_offsets[i], piece, zl_.sizes[i]);
    }
    if (last_micro_batch()) layer_final(layer, true);
    return;
  }
  if (g_.shape.z() == 1) {
    if (last) layer_final(layer, true);
    return;
  }
  rs_tickets_[layer < 0 ? 2 : layer & 1].clear();
  int& remaining = rs_remaining_[size_t(layer + 1)];
  remaining = 0;
  for (const auto& t : plan_.tensors)
    if (t.spec->layer == layer && t.z_sharded) ++remaining;
  for (const auto& t : plan_.tensors)
    if (t.spec->layer == layer && t.z_sharded) start_grad_reduce_scatter(t, last);
}

// The reduce-scatter over Z of one tensor's gradient block (the layer's staging buffer); on
// completion this rank's shard is added into the gradients, and the layer is final once its last
// one (rs_remaining_) is in, on the step's last micro-batch. Waited for at once without
// OverlapOptions::reduce_scatter.
CommQueue::Ticket ParallelTransformer::start_grad_reduce_scatter(const TensorShard& t, bool last) {
  const int layer = t.spec->layer;
  const float* block = (layer < 0 ? gblock_top_.data() : gblock_[layer & 1].data()) + t.block_offset;
  float* land = scatter_tmp_.data() + t.offset;
  float* gp = grads_.data() + t.offset;
  const int64_t n = t.shard_numel;
  int& remaining = rs_remaining_[size_t(layer + 1)];
  auto done = [this, land, gp, n, layer, last, &remaining] {
    ops().add(bq(), gp, land, n);
    if (--remaining == 0 && last) layer_final(layer, true);
  };
  if (opt_.grad_comm_bf16) {  // blocking: done() runs at once, nothing to wait for later
    reduce_scatter_sum_bf16(*be_, g_.z(), block, land, n);
    return q_.start(comm::Request(), g_.z(), "reduce_scatter", "dW bf16", layer,
                    n * g_.shape.z() * int64_t(sizeof(uint16_t)), done);
  }
  const auto ticket = q_.start(g_.z().ireduce_scatter_sum(block, land, size_t(n), q_.ready()), g_.z(),
                               "reduce_scatter", "dW", layer,
                               n * g_.shape.z() * int64_t(sizeof(float)), done);
  if (ov_.reduce_scatter) rs_tickets_[layer < 0 ? 2 : layer & 1].push_back(ticket);
  else q_.wait(ticket);
  return ticket;
}

// The sparse embedding gradient's top-level reduce-scatters over Z, in two parts: the head tensor
// right after the head's backward (tied: the embedding's dense part, which nothing adds to
// afterwards), the other Z-sharded top tensors but the embedding after the embedding's backward.
// The embedding's rows (accumulate_embedding_rows) count as one more completion of the top.
void ParallelTransformer::scatter_top_grads(bool head_part) {
  auto scattered = [&](int i) {  // an untied embedding has no dense part to reduce
    const TensorShard& t = plan_.tensors[size_t(i)];
    return t.spec->layer < 0 && t.z_sharded && (i == head_ || i != wte_);
  };
  if (head_part) {
    rs_tickets_[2].clear();
    int& remaining = rs_remaining_[0];
    remaining = 1;  // the rows
    for (int i = 0; i < int(plan_.tensors.size()); ++i) remaining += scattered(i);
  }
  for (int i = 0; i < int(plan_.tensors.size()); ++i) {
    if (!scattered(i) || (i == head_) != head_part) continue;
    const auto ticket = start_grad_reduce_scatter(plan_.tensors[size_t(i)], last_micro_batch());
    if (i == head_) head_rs_ticket_ = ticket;
  }
}

// This rank's shard of the token embedding's gradient += every Z rank's embedding-output
// gradient rows at their tokens, in Z-rank then token order (after the head's dense part, so
// the additions have one order whatever the overlap does).
void ParallelTransformer::accumulate_embedding_rows(int64_t N) {
  const int64_t Z = g_.shape.z(), rows = Z * N;
  q_.run(g_.z().iallgather(a_->dresid, emb_rows_.data(), size_t(N * Cx_), q_.ready()), g_.z(), "allgather",
         "embedding rows", -1, rows * Cx_ * int64_t(sizeof(float)));
  q_.wait(emb_ids_ticket_);
  if (head_ == wte_) q_.wait(head_rs_ticket_);
  const TensorShard& t = plan_.tensors[size_t(wte_)];
  const int64_t s0 = int64_t(g_.z().rank()) * t.shard_numel, s1 = s0 + t.shard_numel;
  float* gp = grads_.data() + t.offset;
  const int64_t v0 = Vy_ * g_.coord.y();
  {
    ScopedPhase sp(prof_, Phase::Embedding, "rows");
    ops().embedding_scatter_add(bq(), gp, s0, s1, emb_rows_.data(), emb_ids_.data(), v0, Vy_,
                                rows, Cx_);
  }
  if (--rs_remaining_[0] == 0 && last_micro_batch()) layer_final(-1, true);
}

// Buckets in the order their gradients become final: layers from the last to the first, then the
// embedding/head tensors; within each, one open bucket per group, closed once it reaches
// dp_bucket_mb (0: every tensor alone).
void ParallelTransformer::build_buckets() {
  buckets_.clear();
  if (opt_.zero >= 1) {  // ZeRO: reduce_gradients() reduce-scatters over D instead of buckets
    bucket_buf_ = backend::DeviceArray<float>(*be_, 1);
    return;
  }
  const int64_t cap = int64_t(ov_.dp_bucket_mb * 1048576.0 / sizeof(float));
  Bucket open[2];  // [0]: replicated over zd, [1]: Z shards over d
  int64_t staged = 0;
  auto close = [&](Bucket& b) {
    if (b.tensors.empty()) return;
    if (b.tensors.size() > 1) {
      b.offset = staged;
      staged += b.numel;
    } else {
      b.offset = -1;  // in place
    }
    buckets_.push_back(std::move(b));
    b = Bucket{};
  };
  for (int l = cfg_.n_layer - 1; l >= -1; --l) {
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const TensorShard& t = plan_.tensors[i];
      if (t.spec->layer != l || !t.stored) continue;
      const comm::Communicator& grp = t.z_sharded ? g_.d() : g_.tokens();
      if (grp.size() == 1) continue;
      Bucket& b = open[t.z_sharded ? 1 : 0];
      b.group = &grp;
      b.sharded = t.z_sharded;
      b.tensors.push_back(int(i));
      if (b.layers.empty() || b.layers.back() != l) b.layers.push_back(l);
      b.numel += t.shard_numel;
      if (b.numel >= cap) close(b);
    }
  }
  close(open[1]);
  close(open[0]);
  bucket_buf_ = backend::DeviceArray<float>(*be_, size_t(std::max<int64_t>(staged, 1)));
}

void ParallelTransformer::start_bucket(Bucket& b) {
  b.started = true;
  const char* what = b.sharded ? "dW shards" : "replicated grads";
  const int layer = b.layers.front();
  if (b.offset < 0) {
    const TensorShard& t = plan_.tensors[size_t(b.tensors[0])];
    if (opt_.grad_comm_bf16) {  // blocking (bf16_grad_comm.hpp)
      allreduce_sum_bf16(*be_, *b.group, grads_.data() + t.offset, t.shard_numel);
      b.ticket = q_.start(comm::Request(), *b.group, "allreduce", what, layer,
                          t.shard_numel * int64_t(sizeof(uint16_t)));
      return;
    }
    b.ticket = q_.start(b.group->iallreduce_sum(grads_.data() + t.offset, size_t(t.shard_numel), q_.ready()),
                        *b.group, "allreduce", what, layer, t.shard_numel * int64_t(sizeof(float)));
    return;
  }
  float* stage = bucket_buf_.data() + b.offset;
  int64_t o = 0;
  for (int i : b.tensors) {
    const TensorShard& t = plan_.tensors[size_t(i)];
    copy_dev(stage + o, grads_.data() + t.offset, t.shard_numel);
    o += t.shard_numel;
  }
  Bucket* bp = &b;
  comm::Request request;  // bf16: already complete (blocking, bf16_grad_comm.hpp)
  if (opt_.grad_comm_bf16)
    allreduce_sum_bf16(*be_, *b.group, stage, b.numel);
  else
    request = b.group->iallreduce_sum(stage, size_t(b.numel), q_.ready());
  const int64_t bytes = b.numel * int64_t(opt_.grad_comm_bf16 ? sizeof(uint16_t) : sizeof(float));
  b.ticket = q_.start(std::move(request), *b.group, "allreduce", what, layer, bytes, [this, bp, stage] {
                        int64_t off = 0;
                        for (int i : bp->tensors) {
                          const TensorShard& t = plan_.tensors[size_t(i)];
                          copy_dev(grads_.data() + t.offset, stage + off, t.shard_numel);
                          off += t.shard_numel;
                        }
                      });
}

void ParallelTransformer::layer_final(int layer, bool sharded) {
  (sharded ? final_sharded_ : final_repl_)[size_t(layer + 1)] = 1;
  if (ov_.dp_overlap) start_ready_buckets();
}

// Each group's buckets strictly in list order, so every rank starts them in the same order
// (the two groups are independent communicators).
void ParallelTransformer::start_ready_buckets() {
  for (int kind = 0; kind < 2; ++kind) {
    size_t& i = next_bucket_[kind];
    for (; i < buckets_.size(); ++i) {
      Bucket& b = buckets_[i];
      if (int(b.sharded) != kind) continue;
      const auto& fin = b.sharded ? final_sharded_ : final_repl_;
      bool ready = true;
      for (int l : b.layers) ready = ready && fin[size_t(l + 1)];
      if (!ready) break;
      start_bucket(b);
    }
  }
}

void ParallelTransformer::reset_step_state() {
  next_bucket_[0] = next_bucket_[1] = 0;
  for (auto& b : buckets_) b.started = false, b.ticket = 0;
  std::fill(final_sharded_.begin(), final_sharded_.end(), 0);
  std::fill(final_repl_.begin(), final_repl_.end(), 0);
  expected_micro_ = micro_done_ = 0;
}

void ParallelTransformer::reduce_gradients() {
  ScopedPhase sp(prof_, Phase::Other);
  q_.wait_all();  // reduce-scatters still running; buckets already started
  if (g_.shape.p() > 1) {
    // Embedding (first stage) and head (last stage; the same tensor when tied), final norm,
    // positions: summed over the stages, so every stage's copy takes the same update. (ZeRO 2:
    // the pieces, already reduced over Z and D.) No bucket has started (dp_overlap is off with
    // Gp > 1), so the data-parallel sums below see the stage sums.
    for (size_t i = 0; i < plan_.tensors.size(); ++i)
      if (plan_.tensors[i].spec->layer < 0) {
        const bool piece = opt_.zero == 2;
        float* gp = grads_.data() + (piece ? zl_.grad_offsets[i] : plan_.tensors[i].offset);
        const int64_t n = piece ? zl_.sizes[i] : plan_.tensors[i].shard_numel;
        if (n > 0) sum_over(g_.p(), gp, n, "top-level grads over P");
      }
  }
  if (opt_.zero == 2) {  // every layer was reduced (over Z and D) right after its backward
    reset_step_state();
    return;
  }
  if (opt_.zero == 1) {
    // Replicated tensors first over Z; then every shard reduce-scattered over D into its piece.
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const TensorShard& t = plan_.tensors[i];
      if (!t.stored) continue;  // another pipeline stage's layer
      float* gp = grads_.data() + t.offset;
      if (!t.z_sharded && g_.shape.z() > 1) sum_over(g_.z(), gp, t.shard_numel, "replicated grads");
      if (g_.shape.d() == 1) continue;
      float* piece = zero_tmp_.data() + piece_[i] * g_.shape.d();
      reduce_scatter_d(i, gp, piece);
      copy_dev(grads_.data() + zl_.grad_offsets[i], piece, zl_.sizes[i]);
    }
    reset_step_state();
    return;
  }
  // Z-sharded weights: each shard already summed over Z; sum over data replicas.
  // Replicated tensors: sum over every token-splitting axis (Z and D) at once. Buckets not yet
  // started go in list order (each group's started ones are a prefix of its list).
  for (auto& b : buckets_) {
    if (b.started) continue;
    start_bucket(b);
    if (!ov_.dp_overlap) q_.wait(b.ticket);
  }
  q_.wait_all();
  reset_step_state();
}

double ParallelTransformer::grad_sum_squares() {
  // Each element is counted by one rank: its owner on every axis it is replicated over (with
  // ZeRO each D rank holds a different piece, so D is no longer such an axis).
  const GridCoord& c = g_.coord;
  double local = 0;
  double* part = scalar_.as<double>();
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const TensorShard& t = plan_.tensors[i];
    bool owner = (opt_.zero > 0 || c.d() == 0) && owns(t);
    if (!t.z_sharded) owner = owner && c.z() == 0;
    if (t.layout == ShardLayout::ColsX) owner = owner && c.y() == 0;
    if (t.layout == ShardLayout::RowsY) owner = owner && c.x() == 0;
    if (!owner) continue;
    ops().sum_squares(bq(), part, grads_.data() + zl_.grad_offsets[i], zl_.sizes[i]);
    local += read_scalar(part);
  }
  // `local` is a host double: over the host groups (MPI even where the model's groups are NCCL's).
  if (g_.world.size() > 1) g_.host().world.allreduce_sum(&local, 1);
  return local;
}

}  // namespace tetrad::parallel
