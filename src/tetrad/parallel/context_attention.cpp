// ContextAttention (context_attention.hpp): attention over all-gathered keys and values on the
// context axis, forward and backward.
#include "tetrad/parallel/context_attention.hpp"

namespace tetrad::parallel {

ContextAttention::ContextAttention(const StepContext& ctx, int local_batch, int local_len,
                                   ContextComm comm, bool skip_masked_pairs)
    : ctx_(ctx), split_(ContextSplit::of(ctx.shape(), ctx.g().coord)), comm_(comm),
      skip_masked_pairs_(skip_masked_pairs) {
  if (!split_.active()) return;
  const size_t tokens = size_t(local_batch) * size_t(local_len);
  if (comm == ContextComm::Ring) {
    // Two K|V blocks in flight (recv_), two block gradients (full_), one pair's dQ in q|k|v rows
    // (dtmp_; forward: partial outputs), one pair's dK|dV (dacc_; forward: two chunks' partial
    // lse and the merged lse where the caller keeps none). A pair covers one chunk of each
    // sequence: written at the sequences' strides from the buffer's start, its rows span
    // (B - 1) T + T / 2 rows (context_exchange_bytes).
    const size_t kv = tokens * size_t(kv_width());
    const size_t pair_rows = size_t(local_batch - 1) * size_t(local_len) + size_t(local_len / 2);
    recv_ = backend::DeviceArray<float>(*ctx_.be, 2 * kv);
    full_ = backend::DeviceArray<float>(*ctx_.be, 2 * kv);
    dtmp_ = backend::DeviceArray<float>(*ctx_.be, pair_rows * size_t(ctx_.dims.QKVy));
    dacc_ = backend::DeviceArray<float>(*ctx_.be, std::max(pair_rows * size_t(kv_width()),
                                                           2 * tokens * size_t(ctx_.dims.nhy)));
    TETRAD_CHECK(bytes() == bytes(ctx_.dims, ctx_.shape(), local_batch, local_len, comm),
                 "ring buffers differ from context_exchange_bytes");
    return;
  }
  const size_t n = tokens * size_t(kv_width()) * size_t(split_.ranks);  // Gc K|V blocks each
  recv_ = backend::DeviceArray<float>(*ctx_.be, n);
  full_ = backend::DeviceArray<float>(*ctx_.be, n);
  dtmp_ = backend::DeviceArray<float>(*ctx_.be, n);
  dacc_ = backend::DeviceArray<float>(*ctx_.be, n);
  TETRAD_CHECK(bytes() == bytes(ctx_.dims, ctx_.shape(), local_batch, local_len, comm),
               "all-gather buffers differ from context_exchange_bytes");
}

void ContextAttention::gather(const float* qkv, int B, int T, int layer) {
  const int64_t KV = kv_width(), n = int64_t(B) * T * KV, Tc = split_.chunk_len(T);
  const int64_t Tf = int64_t(T) * split_.ranks;
  const comm::Communicator& c = ctx_.g().c();
  // This rank's K|V rows packed (dtmp_ is free until the backward's gradients), all-gathered.
  ctx_.copy_rows_dev(dtmp_.data(), KV, qkv + ctx_.dims.nhy * ctx_.dims.hd, ctx_.dims.QKVy, KV,
                     int64_t(B) * T);
  ctx_.q().run(c.iallgather(dtmp_.data(), recv_.data(), size_t(n), ctx_.q().ready()), c,
               "allgather", "keys/values over C", layer, n * split_.ranks * int64_t(sizeof(float)));
  // recv_ [rank r][b][local chunk j][Tc][KV] -> full_ [b][chunk of (r, j)][Tc][KV].
  for (int r = 0; r < split_.ranks; ++r) {
    const ContextSplit other{split_.ranks, r};
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < 2; ++j)
        ctx_.copy_dev(full_.data() + (b * Tf + other.chunk_index(j) * Tc) * KV,
                      recv_.data() + ((int64_t(r) * B + b) * T + j * Tc) * KV, Tc * KV);
  }
}

backend::AttentionArgs ContextAttention::chunk_args(const backend::AttentionArgs& local,
                                                    int j) const {
  backend::AttentionArgs a = local;
  const int Tc = split_.chunk_len(local.Tq), i = split_.chunk_index(j);
  a.Tq = Tc;
  a.Tk = (i + 1) * Tc;
  a.q_offset = int64_t(i) * Tc;
  a.kv_stride = kv_width();  // the gathered keys and values: packed K|V rows
  a.kv_batch_stride = int64_t(local.Tq) * split_.ranks * kv_width();
  if (a.doc_start) a.doc_start += int64_t(j) * Tc;  // the chunk's rows (positions of the sequence)
  return a;
}

void ContextAttention::forward(const backend::AttentionArgs& local, float* out, float* lse,
                               const float* qkv, int layer) {
  const LocalDims& d = ctx_.dims;
  if (comm_ == ContextComm::Ring) return ring_forward(local, out, lse, qkv, layer);
  const int B = local.B, T = local.Tq, Tc = split_.chunk_len(T);
  gather(qkv, B, T, layer);
  const float* k = full_.data();
  const float* v = full_.data() + d.nkvy * d.hd;
  for (int j = 0; j < 2; ++j)
    ctx_.ops().attention_forward(ctx_.bq(), chunk_args(local, j), out + int64_t(j) * Tc * local.out_stride,
                                 lse ? lse + int64_t(j) * B * local.n_head * Tc : nullptr,
                                 qkv + int64_t(j) * Tc * local.q_stride, k, v);
}

void ContextAttention::backward(const backend::AttentionArgs& local, float* dqkv,
                                const float* dout, const float* qkv, const float* out,
                                const float* lse, int layer) {
  const LocalDims& d = ctx_.dims;
  if (comm_ == ContextComm::Ring) return ring_backward(local, dqkv, dout, qkv, out, lse, layer);
  const int B = local.B, T = local.Tq, Tc = split_.chunk_len(T);
  const int64_t W = d.QKVy, KV = kv_width(), k0 = d.nhy * d.hd, v0 = d.nkvy * d.hd;
  const int64_t n = int64_t(B) * T * KV;  // this rank's K|V rows
  gather(qkv, B, T, layer);
  // dQ in place (the k|v columns zero until the owners' sums are written below); each chunk's
  // dK|dV over the keys it saw: the later chunk (more keys) straight into the sum, the earlier
  // one beside it and added. Rows and columns an op does not write stay zero.
  ctx_.zero_dev(dqkv, int64_t(B) * T * W);
  ctx_.zero_dev(dacc_.data(), n * split_.ranks);
  for (int j : {1, 0}) {
    float* dkv = j == 1 ? dacc_.data() : dtmp_.data();
    if (j == 0) ctx_.zero_dev(dtmp_.data(), n * split_.ranks);
    const int64_t qo = int64_t(j) * Tc;
    ctx_.ops().attention_backward(ctx_.bq(), chunk_args(local, j), dqkv + qo * local.q_stride,
                                  dkv, dkv + v0, dout + qo * local.out_stride,
                                  qkv + qo * local.q_stride, full_.data(), full_.data() + v0,
                                  out + qo * local.out_stride, lse + qo * B * local.n_head);
    if (j == 0) ctx_.ops().add(ctx_.bq(), dacc_.data(), dtmp_.data(), n * split_.ranks);
  }
  // dacc_ [b][chunk][Tc][KV] -> recv_ [owner r][b][local chunk j][Tc][KV], summed over C into
  // dtmp_ [b][j][Tc][KV]: this rank's keys' gradients from every rank's queries.
  const int64_t Tf = int64_t(T) * split_.ranks;
  for (int r = 0; r < split_.ranks; ++r) {
    const ContextSplit other{split_.ranks, r};
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < 2; ++j)
        ctx_.copy_dev(recv_.data() + ((int64_t(r) * B + b) * T + j * Tc) * KV,
                      dacc_.data() + (b * Tf + other.chunk_index(j) * Tc) * KV, Tc * KV);
  }
  const comm::Communicator& c = ctx_.g().c();
  ctx_.q().run(c.ireduce_scatter_sum(recv_.data(), dtmp_.data(), size_t(n), ctx_.q().ready()), c,
               "reduce_scatter", "dK/dV over C", layer, n * split_.ranks * int64_t(sizeof(float)));
  ctx_.copy_rows_dev(dqkv + k0, W, static_cast<const float*>(dtmp_.data()), KV, KV,
                     int64_t(B) * T);
}

}  // namespace tetrad::parallel
