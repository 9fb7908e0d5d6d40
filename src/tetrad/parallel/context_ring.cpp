// The ring exchange of the context axis (ContextAttention::ring_forward / ring_backward,
// context_attention.hpp; Megatron-Core's "p2p" context parallelism on tetrad's zigzag chunks).
//
// What travels is what the other ranks need: the keys and values of a rank's two chunks, packed
// as rows of K|V (2 x n_kv_head x hd per token, the k and v columns of the q|k|v rows; the
// queries stay home), and in the backward their gradients dK|dV in the same layout. Step s of Gc
// holds rank src = (c - s) mod Gc's K|V block (step 0: this rank's own, packed from its q|k|v
// rows). Before attending to it the rank posts the receive of the next block from c - 1 and the
// send of this one to c + 1, so the transfer runs while the attention computes (the CommQueue's
// progress thread moves MPI during the kernels where it is enabled, a poll after them otherwise);
// the waits at the step's end are the exposed part.
//
// Forward: each pair (local query chunk j, chunk jj of the block) whose keys are not all after
// the queries (zigzag chunks are equal: a pair is fully visible, the diagonal, or invisible) is
// attended with the chunks' true positions (AttentionArgs q_offset, k_offset); the first result
// of a query chunk is written in place, later ones beside it and folded in by attention_merge.
// Backward: with the final out and lse, each visible pair's block backward gives that pair's dQ
// (added into dqkv) and its dK|dV (added into the block's gradient). The block's gradient follows
// the block: after its step the rank adds what the ranks before it sent (their queries' share)
// and passes the sum on; after Gc steps it reaches the block's owner, which writes it into the
// k|v columns of dqkv.
//
// Buffers (ContextAttention's constructor; bytes()): recv_ the two K|V blocks in flight (the own
// block packed into the second); full_ this step's block gradient and the one that came in (K|V
// wide); dtmp_ one pair's dQ (q|k|v rows) or, forward, partial outputs; dacc_ one pair's dK|dV
// or, forward, partial and merged lse where the caller keeps none. A pair's rows are one chunk of
// each sequence, written at the sequences' strides from the buffer's start, so dtmp_ and dacc_
// span (B - 1) T + Tc rows, not B T (with one sequence: half).
#include <chrono>
#include <string>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/context_attention.hpp"

namespace tetrad::parallel {

namespace {
constexpr int kTagKv = 2801, kTagDkv = 2802;  // the C group's point-to-point messages
}  // namespace

bool ContextAttention::pair_visible(int j, int src, int jj) const {
  return ContextSplit{split_.ranks, src}.chunk_index(jj) <= split_.chunk_index(j);
}

bool ContextAttention::pair_needed(int j, int src, int jj, int B, int T, int layer) const {
  bool needed = true;
  const int32_t* starts = ctx_.docs.mask && skip_masked_pairs_ ? ctx_.docs.host : nullptr;
  if (starts) {
    // Within a chunk the starts do not decrease (documents.cpp checks it), so the chunk's first
    // query has the earliest document start: past the key chunk's end there, past it for all.
    const int Tc = split_.chunk_len(T);
    const int64_t k_end = int64_t(ContextSplit{split_.ranks, src}.chunk_index(jj) + 1) * Tc;
    needed = false;
    for (int b = 0; b < B && !needed; ++b)
      needed = starts[int64_t(b) * T + int64_t(j) * Tc] < k_end;
  }
  StepProfile* prof = ctx_.prof;
  if (prof) {
    ++prof->ring_pairs;
    if (!needed) {
      ++prof->ring_pairs_doc_skipped;
      if (prof->tracing()) {
        const auto now = std::chrono::steady_clock::now();
        prof->trace->add(0, event_name("attention", "ring pair skipped (document mask)", layer),
                         now, now,
                         "\"query_chunk\":" + std::to_string(split_.chunk_index(j)) +
                             ",\"key_chunk\":" +
                             std::to_string(ContextSplit{split_.ranks, src}.chunk_index(jj)));
      }
    }
  }
  return needed;
}

backend::AttentionArgs ContextAttention::pair_args(const backend::AttentionArgs& local, int j,
                                                   int src, int jj) const {
  backend::AttentionArgs a = local;  // q and output rows: the local q|k|v and output rows
  const int Tc = split_.chunk_len(local.Tq);
  a.Tq = a.Tk = Tc;
  a.q_offset = int64_t(split_.chunk_index(j)) * Tc;
  a.k_offset = int64_t(ContextSplit{split_.ranks, src}.chunk_index(jj)) * Tc;
  a.kv_stride = kv_width();  // keys and values: a packed K|V block
  a.kv_batch_stride = int64_t(local.Tq) * kv_width();
  // The document mask: the query chunk's rows of the starts (positions of the whole sequence, as
  // the offsets are); a pair whose keys all lie before the queries' documents gives lse = -inf
  // and merges as "nothing seen".
  if (a.doc_start) a.doc_start += int64_t(j) * Tc;
  return a;
}

void ContextAttention::ring_forward(const backend::AttentionArgs& local, float* out, float* lse,
                                    const float* qkv, int layer) {
  const LocalDims& d = ctx_.dims;
  const int B = local.B, T = local.Tq, Tc = split_.chunk_len(T), G = split_.ranks, c = split_.rank;
  const int64_t W = d.QKVy, KV = kv_width(), k0 = d.nhy * d.hd, v0 = d.nkvy * d.hd;
  const int64_t n = int64_t(B) * T * KV;  // one K|V block
  TETRAD_CHECK(local.q_stride == W && local.kv_stride == W, "ring: q|k|v rows of ", W);
  const int64_t lse_chunk = int64_t(B) * local.n_head * Tc, bytes = n * int64_t(sizeof(float));
  const comm::Communicator& cg = ctx_.g().c();
  CommQueue& cq = ctx_.q();
  const int next = (c + 1) % G, prev = (c + G - 1) % G;
  float* blocks[2] = {recv_.data(), recv_.data() + n};
  float* part_out = dtmp_.data();
  float* part_lse = dacc_.data();
  if (!lse) lse = dacc_.data() + 2 * lse_chunk;  // merging needs it even where nobody reads it
  ctx_.copy_rows_dev(blocks[1], KV, qkv + k0, W, KV, int64_t(B) * T);  // this rank's K|V
  const float* cur = blocks[1];
  bool have[2] = {false, false};
  for (int s = 0; s < G; ++s) {
    const int src = (c - s + G) % G;
    float* nxt = blocks[s % 2];  // its previous contents were sent last step (waited for)
    CommQueue::Ticket tr = 0, ts = 0;
    if (s + 1 < G) {
      tr = cq.start(cg.irecv(nxt, size_t(n), prev, kTagKv), cg, "recv", "K/V ring over C", layer,
                    bytes);
      ts = cq.start(cg.isend(cur, size_t(n), next, kTagKv, cq.ready()), cg, "send",
                    "K/V ring over C", layer, bytes);
    }
    for (int j = 0; j < 2; ++j)
      for (int jj = 0; jj < 2; ++jj) {
        if (!pair_visible(j, src, jj) || !pair_needed(j, src, jj, B, T, layer)) continue;
        const backend::AttentionArgs a = pair_args(local, j, src, jj);
        const float* q = qkv + int64_t(j) * Tc * W;
        const float* blk = cur + int64_t(jj) * Tc * KV;
        float* o = out + int64_t(j) * Tc * local.out_stride;
        float* l = lse + j * lse_chunk;
        {
          CommQueue::ProgressScope progress(cq);  // the transfers move during the kernels
          if (!have[j]) {
            ctx_.ops().attention_forward(ctx_.bq(), a, o, l, q, blk, blk + v0);
          } else {
            // The partial output at the sequences' strides from the buffer's start (one chunk
            // of each sequence: context_exchange_bytes sizes it so).
            float* po = part_out;
            float* pl = part_lse + j * lse_chunk;
            ctx_.ops().attention_forward(ctx_.bq(), a, po, pl, q, blk, blk + v0);
            ctx_.ops().attention_merge(ctx_.bq(), a, o, l, po, pl);
          }
        }
        have[j] = true;
        cq.poll();  // (without the progress thread: MPI moves here)
      }
    cq.wait(ts);
    cq.wait(tr);
    cur = nxt;
  }
}

void ContextAttention::ring_backward(const backend::AttentionArgs& local, float* dqkv,
                                     const float* dout, const float* qkv, const float* out,
                                     const float* lse, int layer) {
  const LocalDims& d = ctx_.dims;
  const int B = local.B, T = local.Tq, Tc = split_.chunk_len(T), G = split_.ranks, c = split_.rank;
  const int64_t W = d.QKVy, KV = kv_width(), k0 = d.nhy * d.hd, v0 = d.nkvy * d.hd;
  const int64_t n = int64_t(B) * T * KV;  // one K|V block (or its gradient)
  TETRAD_CHECK(local.q_stride == W && local.kv_stride == W, "ring: q|k|v rows of ", W);
  TETRAD_CHECK(lse != nullptr, "ring backward needs the forward's lse");
  const int64_t lse_chunk = int64_t(B) * local.n_head * Tc, bytes = n * int64_t(sizeof(float));
  const comm::Communicator& cg = ctx_.g().c();
  CommQueue& cq = ctx_.q();
  const int next = (c + 1) % G, prev = (c + G - 1) % G;
  float* blocks[2] = {recv_.data(), recv_.data() + n};
  float* dkv_mine = full_.data();    // the block's gradient: this rank's queries' share, then sum
  float* dkv_in = full_.data() + n;  // what the ranks before sent for the block
  // One pair's dQ (q columns of q|k|v rows) and dK|dV (K|V rows), each written at the
  // sequences' strides from its buffer's start: sequence b's chunk rows at b T (the buffers span
  // (B - 1) T + Tc rows, context_exchange_bytes).
  float* gq = dtmp_.data();
  float* gkv = dacc_.data();
  // Rows of chunk j of every sequence (rows of `width`): f(at in the whole rows, at in a pair
  // buffer, length), Tc rows at a time.
  auto rows = [&](int j, int64_t width, auto&& f) {
    for (int b = 0; b < B; ++b)
      f((int64_t(b) * T + int64_t(j) * Tc) * width, int64_t(b) * T * width, int64_t(Tc) * width);
  };
  ctx_.zero_dev(dqkv, int64_t(B) * T * W);
  ctx_.copy_rows_dev(blocks[1], KV, qkv + k0, W, KV, int64_t(B) * T);  // this rank's K|V
  const float* cur = blocks[1];
  CommQueue::Ticket t_out = 0;  // the last block gradient sent on
  for (int s = 0; s < G; ++s) {
    const int src = (c - s + G) % G;
    float* nxt = blocks[s % 2];
    CommQueue::Ticket tr = 0, ts = 0, t_in = 0;
    // Every receive of the step is posted before this rank blocks on anything: the sends the
    // other ranks wait for are always matched (no cycle of waits round the ring).
    if (s + 1 < G) {
      tr = cq.start(cg.irecv(nxt, size_t(n), prev, kTagKv), cg, "recv", "K/V ring over C", layer,
                    bytes);
      ts = cq.start(cg.isend(cur, size_t(n), next, kTagKv, cq.ready()), cg, "send",
                    "K/V ring over C", layer, bytes);
    }
    if (s > 0)
      t_in = cq.start(cg.irecv(dkv_in, size_t(n), prev, kTagDkv), cg, "recv",
                      "dK/dV ring over C", layer, bytes);
    cq.wait(t_out);  // dkv_mine is written again below
    ctx_.zero_dev(dkv_mine, n);
    for (int j = 0; j < 2; ++j)
      for (int jj = 0; jj < 2; ++jj) {
        if (!pair_visible(j, src, jj) || !pair_needed(j, src, jj, B, T, layer)) continue;
        const backend::AttentionArgs a = pair_args(local, j, src, jj);
        const int64_t qo = int64_t(j) * Tc, ko = int64_t(jj) * Tc * KV;
        rows(j, W, [&](int64_t, int64_t p, int64_t len) { ctx_.zero_dev(gq + p, len); });
        rows(jj, KV, [&](int64_t, int64_t p, int64_t len) { ctx_.zero_dev(gkv + p, len); });
        {
          CommQueue::ProgressScope progress(cq);  // the transfers move during the kernel
          ctx_.ops().attention_backward(ctx_.bq(), a, gq, gkv, gkv + v0,
                                        dout + qo * local.out_stride, qkv + qo * W, cur + ko,
                                        cur + ko + v0, out + qo * local.out_stride,
                                        lse + j * lse_chunk);
        }
        rows(j, W, [&](int64_t at, int64_t p, int64_t len) {
          ctx_.ops().add(ctx_.bq(), dqkv + at, gq + p, len);
        });
        rows(jj, KV, [&](int64_t at, int64_t p, int64_t len) {
          ctx_.ops().add(ctx_.bq(), dkv_mine + at, gkv + p, len);
        });
        cq.poll();  // (without the progress thread: MPI moves here)
      }
    if (s > 0) {
      cq.wait(t_in);
      ctx_.ops().add(ctx_.bq(), dkv_mine, dkv_in, n);
    }
    t_out = cq.start(cg.isend(dkv_mine, size_t(n), next, kTagDkv, cq.ready()), cg, "send",
                     "dK/dV ring over C", layer, bytes);
    cq.wait(ts);
    cq.wait(tr);
    cur = nxt;
  }
  // This rank's own block, back from the last rank that attended to it: every query's share,
  // into the k|v columns of dqkv (zero until now: only dQ was added).
  const CommQueue::Ticket t_own = cq.start(cg.irecv(dkv_in, size_t(n), prev, kTagDkv), cg, "recv",
                                           "dK/dV ring over C", layer, bytes);
  cq.wait(t_out);
  cq.wait(t_own);
  ctx_.copy_rows_dev(dqkv + k0, W, static_cast<const float*>(dkv_in), KV, KV, int64_t(B) * T);
}

}  // namespace tetrad::parallel
