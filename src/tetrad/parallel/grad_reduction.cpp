// The gradient reducer (grad_reduction.hpp): the parameter gradients, their reductions over Z,
// D and P, the ZeRO pieces, the step's bookkeeping and the gradient norm.
#include "tetrad/parallel/grad_reduction.hpp"

#include <algorithm>
#include <cstring>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/bf16_grad_comm.hpp"
#include "tetrad/parallel/weight_gather.hpp"

namespace tetrad::parallel {

GradReducer::GradReducer(const StepContext& ctx, const ShardPlan& plan, const ParallelOptions& opt,
                         const OverlapOptions& overlap, int n_layer, int embedding, int head,
                         int64_t tokens)
    : ctx_(ctx), plan_(plan), zero_(opt.zero), comm_bf16_(opt.grad_comm_bf16),
      rs_chunk_bytes_(opt.reduce_scatter_chunk_bytes), ov_(overlap), n_layer_(n_layer),
      embedding_(embedding), head_(head) {
  backend::Backend& be = *ctx_.be;
  const GridShape& G = ctx_.shape();
  // ZeRO pieces: each tensor's local shard cut into Gd pieces of ceil(n / Gd), piece d on rank d
  // (with a context axis Gd is the replicas' count Gc x Gd, d this rank's place among them).
  // An expert tensor's pieces are over its expert-data group (ProcessGroups::replicas_for).
  const int Gd = ctx_.g().replica_count();
  int64_t piece_max = 0;
  for (const auto& t : plan_.tensors) {
    const int64_t n = t.shard_numel;
    const comm::Communicator& reps = ctx_.g().replicas_for(t.expert);
    const int Gt = reps.size(), dc = reps.rank();
    if (zero_ == 0) {
      piece_.push_back(n);
      zl_.param_offsets.push_back(t.offset);
      zl_.grad_offsets.push_back(t.offset);
      zl_.state_offsets.push_back(t.offset);
      zl_.sizes.push_back(n);
      continue;
    }
    const int64_t q = (n + Gt - 1) / Gt, lo = std::min(n, q * dc), hi = std::min(n, lo + q);
    piece_.push_back(q);
    piece_max = std::max(piece_max, q);
    zl_.param_offsets.push_back(t.offset + lo);
    zl_.grad_offsets.push_back(zero_ == 2 ? zl_.state_size : t.offset + lo);
    zl_.state_offsets.push_back(zl_.state_size);
    zl_.sizes.push_back(hi - lo);
    zl_.state_size += q;
  }
  if (zero_ == 0) zl_.state_size = plan_.local_total;
  else zero_tmp_ = backend::DeviceArray<float>(be, size_t(Gd + 1) * piece_max);
  grads_ = backend::DeviceArray<float>(be, zero_ == 2 ? zl_.state_size : plan_.local_total);

  // Gradient blocks: when Z shards weights (Gz = 1 accumulates in place), or when ZeRO 2 keeps
  // only a piece of each gradient.
  if (G.z() > 1 || zero_ == 2) {
    const BlockExtents e = block_extents(plan_, G.z());
    // each shard lands at its own offset
    if (G.z() > 1) scatter_tmp_ = backend::DeviceArray<float>(be, plan_.local_total);
    gblock_[0] = backend::DeviceArray<float>(be, e.layer);
    gblock_[1] = backend::DeviceArray<float>(be, e.layer);
    gblock_top_ = backend::DeviceArray<float>(be, e.top);
  }
  if (opt.sparse_embedding_grad && G.z() > 1 && G.p() == 1 && zero_ != 2) {
    // Rows plus ids against the dense block: worth it when the Z group's tokens are fewer than
    // this rank's vocabulary rows.
    const int64_t rows = int64_t(G.z()) * tokens, Cx = ctx_.dims.Cx;
    sparse_embedding_ = rows * (Cx + 1) < ctx_.dims.Vy * Cx;
    if (sparse_embedding_) {
      emb_rows_ = backend::DeviceArray<float>(be, size_t(rows * Cx));
      emb_ids_ = backend::DeviceArray<int32_t>(be, size_t(rows));
    }
  }
  rs_remaining_.assign(size_t(n_layer_) + 1, 0);
  final_sharded_.assign(size_t(n_layer_) + 1, 0);
  final_repl_.assign(size_t(n_layer_) + 1, 0);
  build_buckets();
  scalar_ = be.alloc_array<double>(1);
}

int64_t GradReducer::bytes() const {
  const size_t n = grads_.size() + gblock_[0].size() + gblock_[1].size() + gblock_top_.size() +
                   scatter_tmp_.size() + zero_tmp_.size() + bucket_buf_.size() + emb_rows_.size() +
                   emb_ids_.size();
  return int64_t(n * sizeof(float));
}

bool GradReducer::staged(const TensorShard& t) const {
  return zero_ == 2 || (t.z_sharded && ctx_.shape().z() > 1);
}

float* GradReducer::block_buffer(int layer) {
  return layer < 0 ? gblock_top_.data() : gblock_[layer & 1].data();
}

float* GradReducer::accumulator(int i) {
  if (i < 0) return nullptr;
  const TensorShard& t = plan_.tensors[size_t(i)];
  if (!staged(t)) return grads_.data() + t.offset;
  return block_buffer(t.spec->layer) + t.block_offset;
}

void GradReducer::zero() {
  ctx_.zero_dev(grads_.data(), int64_t(grads_.size()));
  reset_step_state();
}

void GradReducer::zero_layer_blocks(int layer) {
  if (ctx_.shape().z() == 1 && zero_ != 2) return;
  // The buffer's previous reduce-scatters (layer + 2, or last micro-batch's) read it: finish them.
  for (auto t : rs_tickets_[layer < 0 ? 2 : layer & 1]) ctx_.q().wait(t);
  float* buf = block_buffer(layer);
  for (const auto& t : plan_.tensors)
    if (t.spec->layer == layer && staged(t)) {
      const int64_t n = t.z_sharded ? t.shard_numel * ctx_.shape().z() : t.block_numel;
      ctx_.zero_dev(buf + t.block_offset, n);
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
void GradReducer::reduce_scatter_d(size_t i, const float* shard, float* piece) {
  const comm::Communicator& replicas = ctx_.g().replicas_for(plan_.tensors[i].expert);
  const int64_t n = plan_.tensors[i].shard_numel, q = piece_[i], Gd = replicas.size();
  if (Gd == 1) {
    ctx_.copy_dev(piece, shard, n);
    return;
  }
  const int64_t chunk =
      std::max<int64_t>(1, rs_chunk_bytes_ / (int64_t(sizeof(float)) * Gd));
  float* packed = zero_tmp_.data();
  for (int64_t a = 0; a < q; a += chunk) {
    const int64_t len = std::min(chunk, q - a);
    for (int64_t d = 0; d < Gd; ++d) {
      // Elements [d q + a, d q + a + len) of the shard zero-padded to Gd q.
      const int64_t first = d * q + a;
      const int64_t have = std::clamp<int64_t>(n - first, 0, len);
      if (have > 0) ctx_.copy_dev(packed + d * len, shard + first, have);
      ctx_.zero_dev(packed + d * len + have, len - have);
    }
    if (comm_bf16_)
      reduce_scatter_sum_bf16(*ctx_.be, replicas, packed, piece + a, len);
    else
      ctx_.q().run(replicas.ireduce_scatter_sum(packed, piece + a, size_t(len), ctx_.q().ready()), replicas,
             "reduce_scatter", "dW pieces over D", plan_.tensors[i].spec->layer,
             len * Gd * int64_t(sizeof(float)));
  }
}

void GradReducer::scatter_layer(int layer) {
  const bool last = last_micro_batch();
  if (zero_ == 2) {
    // ZeRO 2, every micro-batch: each staged block summed over Z (reduce-scatter of the Z shards,
    // all-reduce of the replicated ones), then reduce-scattered over D; this rank keeps its piece.
    // Blocking (through the queue): the pieces accumulate right away.
    float* buf = block_buffer(layer);
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const TensorShard& t = plan_.tensors[i];
      if (t.spec->layer != layer || !staged(t)) continue;
      float* block = buf + t.block_offset;
      const float* shard = block;
      if (t.z_sharded && ctx_.shape().z() > 1) {
        float* land = scatter_tmp_.data() + t.offset;
        if (comm_bf16_)
          reduce_scatter_sum_bf16(*ctx_.be, ctx_.g().z(), block, land, t.shard_numel);
        else
          ctx_.q().run(ctx_.g().z().ireduce_scatter_sum(block, land, size_t(t.shard_numel), ctx_.q().ready()), ctx_.g().z(),
                 "reduce_scatter", "dW", layer, t.shard_numel * ctx_.shape().z() * int64_t(sizeof(float)));
        shard = land;
      } else if (!t.z_sharded && ctx_.shape().z() > 1) {
        ctx_.sum_over(ctx_.g().z(), block, t.block_numel, "replicated grads");  // replicated over Z: sum first
      }
      float* piece = zero_tmp_.data() + piece_[i] * ctx_.g().replicas_for(t.expert).size();
      reduce_scatter_d(i, shard, piece);
      ctx_.ops().add(ctx_.bq(), grads_.data() + zl_.grad_offsets[i], piece, zl_.sizes[i]);
    }
    if (last_micro_batch()) layer_final(layer, true);
    return;
  }
  if (ctx_.shape().z() == 1) {
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
CommQueue::Ticket GradReducer::start_grad_reduce_scatter(const TensorShard& t, bool last) {
  const int layer = t.spec->layer;
  const float* block = block_buffer(layer) + t.block_offset;
  float* land = scatter_tmp_.data() + t.offset;
  float* gp = grads_.data() + t.offset;
  const int64_t n = t.shard_numel;
  int& remaining = rs_remaining_[size_t(layer + 1)];
  auto done = [this, land, gp, n, layer, last, &remaining] {
    ctx_.ops().add(ctx_.bq(), gp, land, n);
    if (--remaining == 0 && last) layer_final(layer, true);
  };
  if (comm_bf16_) {  // blocking: done() runs at once, nothing to wait for later
    reduce_scatter_sum_bf16(*ctx_.be, ctx_.g().z(), block, land, n);
    return ctx_.q().start(comm::Request(), ctx_.g().z(), "reduce_scatter", "dW bf16", layer,
                    n * ctx_.shape().z() * int64_t(sizeof(uint16_t)), done);
  }
  const auto ticket = ctx_.q().start(ctx_.g().z().ireduce_scatter_sum(block, land, size_t(n), ctx_.q().ready()), ctx_.g().z(),
                               "reduce_scatter", "dW", layer,
                               n * ctx_.shape().z() * int64_t(sizeof(float)), done);
  if (ov_.reduce_scatter) rs_tickets_[layer < 0 ? 2 : layer & 1].push_back(ticket);
  else ctx_.q().wait(ticket);
  return ticket;
}

// The sparse embedding gradient's top-level reduce-scatters over Z, in two parts: the head tensor
// right after the head's backward (tied: the embedding's dense part, which nothing adds to
// afterwards), the other Z-sharded top tensors but the embedding after the embedding's backward.
// The embedding's rows (accumulate_embedding_rows) count as one more completion of the top.
void GradReducer::scatter_top(bool head_part) {
  auto scattered = [&](int i) {  // an untied embedding has no dense part to reduce
    const TensorShard& t = plan_.tensors[size_t(i)];
    return t.spec->layer < 0 && t.z_sharded && (i == head_ || i != embedding_);
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
void GradReducer::accumulate_embedding_rows(const float* dresid, int64_t N) {
  const int64_t Z = ctx_.shape().z(), rows = Z * N;
  ctx_.q().run(ctx_.g().z().iallgather(dresid, emb_rows_.data(), size_t(N * ctx_.dims.Cx), ctx_.q().ready()), ctx_.g().z(), "allgather",
         "embedding rows", -1, rows * ctx_.dims.Cx * int64_t(sizeof(float)));
  ctx_.q().wait(emb_ids_ticket_);
  if (head_ == embedding_) ctx_.q().wait(head_rs_ticket_);
  const TensorShard& t = plan_.tensors[size_t(embedding_)];
  const int64_t s0 = int64_t(ctx_.g().z().rank()) * t.shard_numel, s1 = s0 + t.shard_numel;
  float* gp = grads_.data() + t.offset;
  const int64_t v0 = ctx_.dims.Vy * ctx_.g().coord.y();
  {
    ScopedPhase sp(ctx_.prof, Phase::Embedding, "rows");
    ctx_.ops().embedding_scatter_add(ctx_.bq(), gp, s0, s1, emb_rows_.data(), emb_ids_.data(), v0, ctx_.dims.Vy,
                                rows, ctx_.dims.Cx);
  }
  if (--rs_remaining_[0] == 0 && last_micro_batch()) layer_final(-1, true);
}

// Buckets in the order their gradients become final: layers from the last to the first, then the
// embedding/head tensors; within each, one open bucket per group, closed once it reaches
// dp_bucket_mb (0: every tensor alone).
void GradReducer::build_buckets() {
  buckets_.clear();
  if (zero_ >= 1) {  // ZeRO: reduce() reduce-scatters over D instead of buckets
    bucket_buf_ = backend::DeviceArray<float>(*ctx_.be, 1);
    return;
  }
  const int64_t cap = int64_t(ov_.dp_bucket_mb * 1048576.0 / sizeof(float));
  // [0]: replicated over zd, [1]: Z shards over d, [2]: expert shards over their expert-data
  // group (E > 1)
  Bucket open[3];
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
  for (int l = n_layer_ - 1; l >= -1; --l) {
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const TensorShard& t = plan_.tensors[i];
      if (t.spec->layer != l || !t.stored) continue;
      const comm::Communicator& grp = t.expert      ? ctx_.g().expert_replicas()
                                      : t.z_sharded ? ctx_.g().replicas()
                                                    : ctx_.g().tokens();
      if (grp.size() == 1) continue;
      const int kind = t.expert ? 2 : t.z_sharded ? 1 : 0;
      Bucket& b = open[kind];
      b.group = &grp;
      b.sharded = t.z_sharded;
      b.kind = kind;
      b.tensors.push_back(int(i));
      if (b.layers.empty() || b.layers.back() != l) b.layers.push_back(l);
      b.numel += t.shard_numel;
      if (b.numel >= cap) close(b);
    }
  }
  close(open[2]);
  close(open[1]);
  close(open[0]);
  bucket_buf_ = backend::DeviceArray<float>(*ctx_.be, size_t(std::max<int64_t>(staged, 1)));
}

void GradReducer::start_bucket(Bucket& b) {
  b.started = true;
  const char* what = b.sharded ? "dW shards" : "replicated grads";
  const int layer = b.layers.front();
  if (b.offset < 0) {
    const TensorShard& t = plan_.tensors[size_t(b.tensors[0])];
    if (comm_bf16_) {  // blocking (bf16_grad_comm.hpp)
      allreduce_sum_bf16(*ctx_.be, *b.group, grads_.data() + t.offset, t.shard_numel);
      b.ticket = ctx_.q().start(comm::Request(), *b.group, "allreduce", what, layer,
                          t.shard_numel * int64_t(sizeof(uint16_t)));
      return;
    }
    b.ticket = ctx_.q().start(b.group->iallreduce_sum(grads_.data() + t.offset, size_t(t.shard_numel), ctx_.q().ready()),
                        *b.group, "allreduce", what, layer, t.shard_numel * int64_t(sizeof(float)));
    return;
  }
  float* stage = bucket_buf_.data() + b.offset;
  int64_t o = 0;
  for (int i : b.tensors) {
    const TensorShard& t = plan_.tensors[size_t(i)];
    ctx_.copy_dev(stage + o, grads_.data() + t.offset, t.shard_numel);
    o += t.shard_numel;
  }
  Bucket* bp = &b;
  comm::Request request;  // bf16: already complete (blocking, bf16_grad_comm.hpp)
  if (comm_bf16_)
    allreduce_sum_bf16(*ctx_.be, *b.group, stage, b.numel);
  else
    request = b.group->iallreduce_sum(stage, size_t(b.numel), ctx_.q().ready());
  const int64_t bytes = b.numel * int64_t(comm_bf16_ ? sizeof(uint16_t) : sizeof(float));
  b.ticket = ctx_.q().start(std::move(request), *b.group, "allreduce", what, layer, bytes, [this, bp, stage] {
                        int64_t off = 0;
                        for (int i : bp->tensors) {
                          const TensorShard& t = plan_.tensors[size_t(i)];
                          ctx_.copy_dev(grads_.data() + t.offset, stage + off, t.shard_numel);
                          off += t.shard_numel;
                        }
                      });
}

void GradReducer::layer_final(int layer, bool sharded) {
  (sharded ? final_sharded_ : final_repl_)[size_t(layer + 1)] = 1;
  if (ov_.dp_overlap) start_ready_buckets();
}

// Each group's buckets strictly in list order, so every rank starts them in the same order
// (the groups are independent communicators).
void GradReducer::start_ready_buckets() {
  for (int kind = 0; kind < 3; ++kind) {
    size_t& i = next_bucket_[kind];
    for (; i < buckets_.size(); ++i) {
      Bucket& b = buckets_[i];
      if (b.kind != kind) continue;
      const auto& fin = b.sharded ? final_sharded_ : final_repl_;
      bool ready = true;
      for (int l : b.layers) ready = ready && fin[size_t(l + 1)];
      if (!ready) break;
      start_bucket(b);
    }
  }
}

void GradReducer::reset_step_state() {
  next_bucket_[0] = next_bucket_[1] = next_bucket_[2] = 0;
  for (auto& b : buckets_) b.started = false, b.ticket = 0;
  std::fill(final_sharded_.begin(), final_sharded_.end(), 0);
  std::fill(final_repl_.begin(), final_repl_.end(), 0);
  expected_micro_ = micro_done_ = 0;
}

void GradReducer::reduce() {
  ScopedPhase sp(ctx_.prof, Phase::Other);
  ctx_.q().wait_all();  // reduce-scatters still running; buckets already started
  if (ctx_.shape().p() > 1) {
    // Embedding (first stage) and head (last stage; the same tensor when tied), final norm,
    // positions: summed over the stages, so every stage's copy takes the same update. (ZeRO 2:
    // the pieces, already reduced over Z and D.) No bucket has started (dp_overlap is off with
    // Gp > 1), so the data-parallel sums below see the stage sums.
    for (size_t i = 0; i < plan_.tensors.size(); ++i)
      if (plan_.tensors[i].spec->layer < 0) {
        const bool piece = zero_ == 2;
        float* gp = grads_.data() + (piece ? zl_.grad_offsets[i] : plan_.tensors[i].offset);
        const int64_t n = piece ? zl_.sizes[i] : plan_.tensors[i].shard_numel;
        if (n > 0) ctx_.sum_over(ctx_.g().p(), gp, n, "top-level grads over P");
      }
  }
  if (zero_ == 2) {  // every layer was reduced (over Z and D) right after its backward
    reset_step_state();
    return;
  }
  if (zero_ == 1) {
    // Replicated tensors first over Z; then every shard reduce-scattered over D into its piece.
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const TensorShard& t = plan_.tensors[i];
      if (!t.stored) continue;  // another pipeline stage's layer
      float* gp = grads_.data() + t.offset;
      if (!t.z_sharded && ctx_.shape().z() > 1) ctx_.sum_over(ctx_.g().z(), gp, t.shard_numel, "replicated grads");
      const int reps = ctx_.g().replicas_for(t.expert).size();
      if (reps == 1) continue;
      float* piece = zero_tmp_.data() + piece_[i] * reps;
      reduce_scatter_d(i, gp, piece);
      ctx_.copy_dev(grads_.data() + zl_.grad_offsets[i], piece, zl_.sizes[i]);
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
    if (!ov_.dp_overlap) ctx_.q().wait(b.ticket);
  }
  ctx_.q().wait_all();
  reset_step_state();
}

double GradReducer::sum_squares() {
  // Each element is counted by one rank: its owner on every axis it is replicated over (with
  // ZeRO each D rank holds a different piece, so D is no longer such an axis).
  const GridCoord& c = ctx_.g().coord;
  double local = 0;
  double* part = scalar_.as<double>();
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const TensorShard& t = plan_.tensors[i];
    bool owner = (zero_ > 0 || t.first_replica) && stage_owns(t, c);
    if (!t.z_sharded) owner = owner && c.z() == 0;
    if (t.layout == ShardLayout::ColsX) owner = owner && c.y() == 0;
    if (t.layout == ShardLayout::RowsY) owner = owner && c.x() == 0;
    if (t.layout == ShardLayout::Replicated) owner = owner && c.x() == 0 && c.y() == 0;
    if (!owner) continue;
    ctx_.ops().sum_squares(ctx_.bq(), part, grads_.data() + zl_.grad_offsets[i], zl_.sizes[i]);
    local += read_scalar(part);
  }
  // `local` is a host double: over the host groups (MPI even where the model's groups are NCCL's).
  if (ctx_.g().world.size() > 1) ctx_.g().host().world.allreduce_sum(&local, 1);
  return local;
}

double GradReducer::read_scalar(const double* dev) {
  double v = 0;
  ctx_.bq().copy_to_host(&v, dev, sizeof v);
  ctx_.bq().synchronize();
  return v;
}

void GradReducer::start_embedding_ids(const int32_t* ids, int64_t N) {
  const comm::Communicator& z = ctx_.g().z();
  emb_ids_ticket_ = ctx_.q().start(z.iallgather(ids, emb_ids_.data(), size_t(N), ctx_.q().ready()),
                                   z, "allgather", "embedding ids", -1,
                                   N * ctx_.shape().z() * int64_t(sizeof(int32_t)));
}

}  // namespace tetrad::parallel
