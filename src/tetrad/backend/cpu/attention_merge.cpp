// Merging partial attention results: see attention_merge.hpp for the contract.
#include "tetrad/backend/cpu/attention_merge.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tetrad/core/error.hpp"

namespace tetrad::kernels {

template <typename T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, const AttentionDims& d) {
  if (d.B < 0 || d.Tq < 0 || d.n_head <= 0 || d.head_dim <= 0)
    fail("attention_merge: need B, Tq >= 0 and n_head, head_dim > 0, got B=", d.B, " Tq=", d.Tq,
         " n_head=", d.n_head, " head_dim=", d.head_dim);
  if (d.out_stride < int64_t(d.n_head) * d.head_dim)
    fail("attention_merge: out_stride ", d.out_stride, " is shorter than a row of ", d.n_head,
         " heads of ", d.head_dim);
  const int64_t rows = int64_t(d.B) * d.Tq;
  const int hd = d.head_dim;
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / d.Tq, i = r % d.Tq;
    for (int h = 0; h < d.n_head; ++h) {
      const int64_t li = (b * d.n_head + h) * d.Tq + i;
      const double la = double(lse[li]), lb = double(lse_b[li]);
      if (lb == kNegInf) continue;  // nothing seen in block b: (out, lse) stay as they are
      T* o = out + b * d.out_batch_stride + i * d.out_stride + int64_t(h) * hd;
      const T* ob = out_b + b * d.out_batch_stride + i * d.out_stride + int64_t(h) * hd;
      if (la == kNegInf) {  // nothing seen before: block b's result as it is
        std::copy(ob, ob + hd, o);
        lse[li] = lse_b[li];
        continue;
      }
      const double m = std::max(la, lb);
      const double wa = std::exp(la - m), wb = std::exp(lb - m), s = wa + wb;
      const T fa = T(wa / s), fb = T(wb / s);
      for (int e = 0; e < hd; ++e) o[e] = fa * o[e] + fb * ob[e];
      lse[li] = T(m + std::log(s));
    }
  }
}

template void attention_merge<float>(float*, float*, const float*, const float*,
                                     const AttentionDims&);
template void attention_merge<double>(double*, double*, const double*, const double*,
                                      const AttentionDims&);

}  // namespace tetrad::kernels
