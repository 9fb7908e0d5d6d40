// The context-parallel split of a sequence (the grid's C axis; docs/parallel.md, "Context
// parallelism"): each sequence of the micro-batch is cut into 2 Gc chunks of equal length and
// context rank c holds chunks c and 2 Gc - 1 - c ("head-tail" or zigzag, as TorchTitan and
// Megatron-Core balance causal attention: every rank gets one early and one late chunk, so the
// same number of query-key pairs). A rank's tokens of one sequence are its two chunks one after
// the other, [chunk c | chunk 2 Gc - 1 - c]; with Gc = 1 the one "chunk" is the whole sequence.
//
// Pure arithmetic, no MPI: the loader's slicing, the positions (RoPE, learned), the attention
// over the gathered keys and the tests all read it. Failures: a sequence whose length does not
// divide into 2 Gc chunks throws tetrad::Error naming the numbers and the way out.
#pragma once
#include <cstdint>

#include <algorithm>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/local_dims.hpp"
#include "tetrad/parallel/options.hpp"

namespace tetrad::parallel {

struct ContextSplit {
  int ranks = 1;  // Gc
  int rank = 0;   // this rank's c

  static ContextSplit of(const GridShape& shape, const GridCoord& coord) {
    return {shape.c(), coord.c()};
  }
  bool active() const { return ranks > 1; }
  // Local chunks per sequence: 2 with Gc > 1, else 1 (the whole sequence).
  int local_chunks() const { return active() ? 2 : 1; }
  // The sequence's chunk that local chunk j (0 or 1) is: c, then 2 Gc - 1 - c.
  int chunk_index(int j) const { return j == 0 ? rank : 2 * ranks - 1 - rank; }
  // Tokens of one sequence on this rank, of a sequence of `seq` tokens (checked to divide).
  int local_len(int seq) const {
    check_divides(seq);
    return seq / ranks;
  }
  // The chunk length of a sequence whose local part is `local` tokens.
  int chunk_len(int local) const { return active() ? local / 2 : local; }
  // The position in the whole sequence of local chunk j's first token (local part of `local`).
  int64_t chunk_offset(int j, int local) const {
    return active() ? int64_t(chunk_index(j)) * chunk_len(local) : 0;
  }
  // The position in the whole sequence of local token t (local part of `local` tokens).
  int64_t position(int t, int local) const {
    if (!active()) return t;
    const int Tc = chunk_len(local);
    return chunk_offset(t / Tc, local) + t % Tc;
  }
  // The whole sequence's length from the local part's.
  int full_len(int local) const { return local * ranks; }

  // Refuses a sequence that does not cut into 2 Gc equal chunks.
  void check_divides(int seq) const {
    if (active() && seq % (2 * ranks) != 0)
      fail("context parallelism (grid c=", ranks, ") cuts each sequence into 2 x c = ",
           2 * ranks, " chunks, but the sequence length ", seq, " is not divisible by ",
           2 * ranks, " (set train.seq_len to a multiple of ", 2 * ranks,
           ", e.g. ", (seq / (2 * ranks) + 1) * 2 * ranks, ", or choose another c)");
  }

  // This rank's tokens of each of `B` sequences of `seq` tokens (rows of `stride` tokens in
  // `whole`, starting at `whole`): its chunks in local order, B x local_len(seq) tokens into
  // `mine`. With Gc = 1 a copy of the first seq tokens of each row.
  template <typename T>
  void take(const T* whole, int64_t stride, int B, int seq, T* mine) const {
    const int local = local_len(seq), Tc = chunk_len(local);
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < local_chunks(); ++j) {
        const T* src = whole + int64_t(b) * stride + chunk_offset(j, local);
        T* dst = mine + int64_t(b) * local + int64_t(j) * Tc;
        for (int t = 0; t < Tc; ++t) dst[t] = src[t];
      }
  }
};

// Bytes of the context exchange's buffers (ContextAttention, context_attention.hpp), 0 with
// Gc = 1: the one formula of the model's allocation (ContextAttention's constructor and
// bytes()), the memory formula's context term (parallel::model_memory) and the planner's
// (planner::context_gather_bytes). local_batch sequences of local_len tokens on this rank, fp32
// (in bf16 runs too). One K|V block: the rank's tokens x 2 n_kv_head hd of its heads.
//   allgather: four buffers of Gc K|V blocks (received, in sequence order, two gradients);
//   ring: four K|V blocks (two in flight, two block gradients), one pair's dQ in q|k|v rows and
//         one pair's dK|dV in K|V rows (forward: partial outputs; partial and merged lse where
//         larger), each over the rows one chunk of every sequence spans: (B - 1) T + T / 2.
inline int64_t context_exchange_bytes(const LocalDims& d, const GridShape& g, int64_t local_batch,
                                      int64_t local_len, ContextComm comm) {
  if (g.c() <= 1) return 0;
  const int64_t tokens = local_batch * local_len, f = sizeof(float);
  const int64_t KV = 2 * d.nkvy * d.hd;
  const int64_t kv = tokens * KV;  // one K|V block
  if (comm != ContextComm::Ring) return 4 * f * kv * g.c();
  const int64_t pair_rows = std::max<int64_t>(0, local_batch - 1) * local_len + local_len / 2;
  return f * (4 * kv + pair_rows * d.QKVy + std::max(pair_rows * KV, 2 * tokens * d.nhy));
}

}  // namespace tetrad::parallel
