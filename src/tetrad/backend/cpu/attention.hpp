// Causal scaled-dot-product attention with grouped-query heads (flash-attention style), forward and
// backward, on the CPU, for float and double.
//
// Query offset: the overloads taking q_offset put query i at key position q_offset + i, any
// sign: 0 for queries at the start of a longer key block, past Tk - 1 for a query block after its
// whole key block, negative for queries before (part of) it, as key blocks of context
// parallelism are; keys after that position are masked. A query that sees no key (position < 0)
// gets out = 0 and lse = -inf. Those without put the queries at the key block's end
// (q_offset = Tk - Tq, the training case). Merging partial results: attention_merge.hpp.
//
// Document mask: AttentionDims::doc_start (null: none) gives each query row the position of its
// document's first token; the query attends keys doc_start - doc_shift .. its own position only
// (block-diagonal causal, as AttentionArgs::doc_start in backend/ops.hpp). Any values work (a row
// that sees no key gets out = 0, lse = -inf); key blocks wholly before a query block's documents
// are skipped.
//
// What this does not do: non-causal or other custom masks, dropout, sliding windows, ALiBi, bf16. Decode
// (Tq much smaller than Tk, e.g. 1 with a KV cache) is correct but uses the training tiles: a query
// block shorter than the vector width still costs a full vector, and GQA heads sharing a kv head
// are not stacked (Tq=1, Tk=1024, 12 heads, hd=64: 0.67 ms on 2 AVX2 cores, ~9 GB/s of k/v).
//
// Memory: never materialises a [T, T] matrix. Work memory: per thread O(block^2 + T * head_dim),
// plus per call a packed copy of k and v (forward, when Tq >= 16) and, in the backward when
// B * n_kv_head < 8, one dq-sized buffer per key chunk (allocated per call). The per-thread and
// packed-copy buffers are thread_local arenas kept between calls (they grow to the largest call,
// never shrink).
// Threads: OpenMP, the calling thread's team. Safe to call from several threads at once.
// Determinism: every output element is computed by one thread in an order fixed by the shapes,
// so results are bit-identical between runs and for any thread count (for a given code path).
#pragma once
#include <cstdint>

namespace tetrad::kernels {

struct AttentionDims {
  int B;          // sequences
  int Tq;         // queries per sequence
  int Tk;         // keys per sequence; query i sits at position q_offset + i (Tk - Tq + i when
                  // no q_offset is given: then Tk >= Tq) and attends keys 0..that position.
  int n_head;     // query heads
  int n_kv_head;  // key/value heads; query head h uses kv head h / (n_head / n_kv_head)
  int head_dim;
  int64_t q_stride, kv_stride, out_stride;                    // elements between consecutive rows
  int64_t q_batch_stride, kv_batch_stride, out_batch_stride;  // elements between sequences
  // Document mask (optional): query i of sequence b attends only keys at or after
  // doc_start[b * doc_batch_stride + i] - doc_shift (key positions count from key 0 of the block).
  const int32_t* doc_start = nullptr;
  int64_t doc_batch_stride = 0, doc_shift = 0;
  int chunk_B = 0;  // the sequence count the backward's chunking is chosen for (0: B)
};

// out[b, i, h*hd + d] = sum_j softmax_j(q_i . k_j / sqrt(hd)) v_j[d]; rows of q/k/v/out are
// (b * batch_stride + t * stride), head h of a row is the hd elements at h*hd.
// lse (may be nullptr): [B, n_head, Tq] contiguous, log-sum-exp of each query row's scaled scores.
// out must not overlap q, k, v.
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionDims& d);

// Gradients w.r.t. q, k, v given dout (same layout as out). dq/dk/dv use the strides of q/k/v and
// are OVERWRITTEN (may all point into one fused dqkv buffer). out and lse come from the forward.
// Work is split over (sequence, kv head) and, when those are fewer than 8, over interleaved key
// blocks of each: dk/dv rows of GQA heads are summed inside one task, never across threads.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const AttentionDims& d);

// Query i at key position q_offset + i (any sign; Tk >= 1 when Tq >= 1).
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionDims& d,
                       int64_t q_offset);
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const AttentionDims& d, int64_t q_offset);

// Code paths. attention_forward/backward take the widest one the CPU supports; tests and
// benchmarks may ask for a specific one (it must be supported: attention_path_supported).
enum class AttentionPath { kPortable, kAvx2, kAvx512 };
const char* attention_path_name(AttentionPath p);
bool attention_path_supported(AttentionPath p);
AttentionPath attention_default_path();

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionDims& d,
                       AttentionPath path);
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const AttentionDims& d, AttentionPath path);
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionDims& d,
                       int64_t q_offset, AttentionPath path);
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const AttentionDims& d, int64_t q_offset,
                        AttentionPath path);

// FLOPs of the causal forward (QK^T and PV, multiply-add = 2) counted as in the brief:
// 4 * Tq * Tk * hd * n_head * B / 2 for Tq == Tk; the backward is 2.5x this.
double attention_forward_flops(const AttentionDims& d);
double attention_forward_flops(const AttentionDims& d, int64_t q_offset);  // pairs q_offset sees

}  // namespace tetrad::kernels
