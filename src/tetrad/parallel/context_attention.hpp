// Attention over a sequence split on the context axis C (context_split.hpp), by all-gathered keys
// and values (TorchTitan's method; docs/parallel.md, "Context parallelism"). A part of the dense
// block: it runs in place of the one attention call when Gc > 1.
//
// Forward: every C rank's keys and values of the micro-batch (after RoPE, at their true
// positions), packed as K|V rows (2 x n_kv_head x hd per token of this rank's heads: the queries
// stay home), are all-gathered over C and laid out in sequence order; each of this rank's two
// query chunks (chunk i of the 2 Gc) attends the keys 0 .. (i+1) Tc - 1 with its true query
// offset i Tc, so the mask is the whole sequence's causal mask. Backward: the keys and values
// are gathered again (they are not kept between the passes: memory is what context parallelism
// is for), each chunk's backward writes its dQ in place and its dK|dV over the keys it saw; the
// dK|dV of the whole sequence are summed over both chunks and reduce-scattered over C back to
// the ranks that own those keys, and written into the k|v columns of their q|k|v gradient.
// The log-sum-exp of this rank's queries is laid out chunk by chunk: [2][B][heads][Tc].
//
// Scratch: four buffers of Gc K|V blocks of B x T tokens (the received rows, the sequence-ordered
// keys and values, and two for their gradients), allocated only when Gc > 1 (bytes()); with the
// ring (which moves the same packed K|V rows), four K|V blocks of B x T tokens, one pair's dQ in
// q|k|v rows and one pair's dK|dV (or the forward's lse, if larger) over the rows one chunk of
// every sequence spans, (B - 1) T + T / 2, whatever Gc is (context_exchange_bytes).
// Collective over the C group; not thread-safe.
#pragma once
#include <algorithm>
#include <cstdint>

#include "tetrad/backend/backend.hpp"
#include "tetrad/parallel/context_split.hpp"
#include "tetrad/parallel/options.hpp"
#include "tetrad/parallel/step_context.hpp"

namespace tetrad::parallel {

class ContextAttention {
 public:
  // local_batch sequences of local_len tokens on this rank (the most a micro-batch holds);
  // comm: all-gathered keys and values or the ring (context_ring.cpp), which works in the same
  // four buffers, sized for it (two K|V blocks, two block gradients, one pair's dQ and one pair's
  // dK|dV, whatever Gc is).
  // skip_masked_pairs: the ring skips the pairs the document mask hides wholly (pair_needed).
  ContextAttention(const StepContext& ctx, int local_batch, int local_len,
                   ContextComm comm = ContextComm::AllGather, bool skip_masked_pairs = true);
  bool active() const { return split_.active(); }
  const ContextSplit& split() const { return split_; }
  // Bytes of the scratch (0 with Gc = 1): the memory formula's context term, the one formula
  // the constructor allocates by (context_exchange_bytes, context_split.hpp).
  static int64_t bytes(const LocalDims& d, const GridShape& g, int local_batch, int local_len,
                       ContextComm comm = ContextComm::AllGather) {
    return context_exchange_bytes(d, g, local_batch, local_len, comm);
  }
  int64_t bytes() const {
    return int64_t((recv_.size() + full_.size() + dtmp_.size() + dacc_.size()) * sizeof(float));
  }

  // `local`: the attention of this rank's heads over B sequences of T local tokens (Tq = Tk = T,
  // strides of the q|k|v and output rows). out [B*T, Ay], lse chunk by chunk (may be null).
  void forward(const backend::AttentionArgs& local, float* out, float* lse, const float* qkv,
               int layer);
  // dqkv [B*T, QKVy] OVERWRITTEN: dQ of this rank's queries and dK/dV of its keys summed over
  // every C rank's queries.
  void backward(const backend::AttentionArgs& local, float* dqkv, const float* dout,
                const float* qkv, const float* out, const float* lse, int layer);

 private:
  // full_ = the q|k|v rows of the whole sequences in sequence order, [B][Gc T][QKVy].
  void gather(const float* qkv, int B, int T, int layer);
  // The arguments of local chunk j: its queries at their offset, the keys up to its end.
  backend::AttentionArgs chunk_args(const backend::AttentionArgs& local, int j) const;

  // The ring (context_ring.cpp). Step s holds rank (c - s) mod Gc's q|k|v block; the next
  // block's transfer runs while this one's attention computes. Forward: each pair (local query
  // chunk, block chunk) that is not wholly after the queries is attended with the chunks' true
  // offsets and merged into out/lse by their log-sum-exp. Backward: with the final out and lse,
  // each pair's dQ is added in place and its dK/dV into the block's gradient, which follows the
  // block round the ring (Gc sends) and arrives back at its owner.
  void ring_forward(const backend::AttentionArgs& local, float* out, float* lse,
                    const float* qkv, int layer);
  void ring_backward(const backend::AttentionArgs& local, float* dqkv, const float* dout,
                     const float* qkv, const float* out, const float* lse, int layer);
  // Attention arguments of the pair (local query chunk j, chunk jj of rank src's block).
  backend::AttentionArgs pair_args(const backend::AttentionArgs& local, int j, int src,
                                   int jj) const;
  // Whether query chunk j sees any key of chunk jj of rank src's block.
  bool pair_visible(int j, int src, int jj) const;
  // Whether the pair (causally visible) must be attended: false where the micro-batch's document
  // mask hides every key of the block chunk from every query of chunk j in every sequence (each
  // query's document begins after the chunk's last key). Such a pair adds nothing (lse -inf,
  // merged as "nothing seen"; zero dQ and dK|dV), so skipping it leaves every bit as it was.
  // Counted (and, tracing, marked on the timeline) in the step's profile.
  bool pair_needed(int j, int src, int jj, int B, int T, int layer) const;
  // Width of a packed K|V row (the ring's blocks): 2 x n_kv_head x hd of this rank's heads.
  int64_t kv_width() const { return 2 * ctx_.dims.nkvy * ctx_.dims.hd; }

  const StepContext& ctx_;
  ContextSplit split_;
  ContextComm comm_;
  bool skip_masked_pairs_ = true;
  backend::DeviceArray<float> recv_, full_, dtmp_, dacc_;
};

}  // namespace tetrad::parallel
