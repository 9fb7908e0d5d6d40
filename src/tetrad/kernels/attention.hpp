// Causal multi-head attention (grouped-query capable), tiled with an online softmax in forward and
// recomputation from the saved log-sum-exp in backward: no [T, T] matrix is ever materialised.
#pragma once
#include <cstdint>

namespace tetrad::kernels {

struct AttentionDims {
  int B;            // sequences
  int Tq;           // queries per sequence
  int Tk;           // keys per sequence; query i (0-based) sits at position (Tk - Tq + i) and attends keys 0..that position (causal)
  int n_head;       // query heads
  int n_kv_head;    // key/value heads; query head h uses kv head h / (n_head / n_kv_head) (grouped-query attention)
  int head_dim;
  int64_t q_stride, kv_stride, out_stride;           // elements between consecutive tokens (rows)
  int64_t q_batch_stride, kv_batch_stride, out_batch_stride;  // elements between sequences
};
// out[b, i, h*hd + d] = softmax_j( q_i·k_j / sqrt(hd) ) v_j. Head h of a row is the hd elements at h*hd.
// lse (may be nullptr): [B, n_head, Tq] contiguous, the log-sum-exp of the scaled scores of each query row (saved for backward).
template <typename T> void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionDims& d);
// Gradients of the loss w.r.t. q, k, v given dout. dq/dk/dv use the same strides as q/k/v and are OVERWRITTEN (not accumulated).
template <typename T> void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out, const T* lse, const AttentionDims& d);

}  // namespace tetrad::kernels
