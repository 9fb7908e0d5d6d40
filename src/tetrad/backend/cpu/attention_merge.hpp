// Merging partial attention results with their log-sum-exp (the op table's attention_merge,
// backend/ops.hpp): the attention of the same queries over two disjoint sets of keys, each given
// as (out, lse) by attention_forward, folded into the attention over their union.
//
// Per query row and head, with m = max(lse, lse_b) and s = e^(lse - m) + e^(lse_b - m):
//   out = (e^(lse - m) out + e^(lse_b - m) out_b) / s,   lse = m + log s.
// The row weights are computed in double and applied in fp32 (one multiply-add per element).
// A row whose lse_b is -inf (its queries saw none of those keys) keeps out and lse bit for bit;
// one whose lse is -inf takes out_b and lse_b as they are. Layouts as attention_forward's out and
// lse (attention.hpp): out rows b * out_batch_stride + t * out_stride + h * hd, lse [B, n_head,
// Tq] contiguous; out_b has out's layout, lse_b lse's. In place on out and lse.
// Threads: OpenMP over rows; every element is computed by one thread in a fixed order, so the
// result does not depend on the thread count.
#pragma once
#include "tetrad/backend/cpu/attention.hpp"

namespace tetrad::kernels {

template <typename T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, const AttentionDims& d);

}  // namespace tetrad::kernels
