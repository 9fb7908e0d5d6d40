#include "tetrad/checkpoint/finite_weights.hpp"

#include <cmath>
#include <utility>
#include <vector>

#include "tetrad/core/error.hpp"

namespace tetrad {

void check_finite_weights(const std::string& source, const ParamSpec& spec, const float* data) {
  // The file's layout: a transposed Conv1D weight is [in, out] there, [out, in] here.
  const bool transposed = spec.hf_transposed && spec.shape.size() == 2;
  std::vector<int64_t> shape = spec.shape;
  if (transposed) std::swap(shape[0], shape[1]);
  const int64_t n = spec.numel;
  int64_t first = -1, first_here = -1, bad = 0;  // the first in the file's order; where it is here
  for (int64_t k = 0; k < n; ++k) {
    if (std::isfinite(data[k])) continue;
    ++bad;
    // Here [r, c] = k of [out, in]; in the file [c, r] of [in, out].
    const int64_t in_file =
        transposed ? (k % spec.shape[1]) * spec.shape[0] + k / spec.shape[1] : k;
    if (first < 0 || in_file < first) {
      first = in_file;
      first_here = k;
    }
  }
  if (first < 0) return;
  std::vector<int64_t> at(shape.size());
  int64_t rest = first;
  for (size_t d = shape.size(); d-- > 0;) {
    at[d] = shape[d] ? rest % shape[d] : 0;
    rest = shape[d] ? rest / shape[d] : 0;
  }
  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t d = 0; d < v.size(); ++d) s += (d ? ", " : "") + std::to_string(v[d]);
    return s;
  };
  fail(source, ": tensor ", spec.name, " (shape [", list(shape), "]) holds ", bad,
       " value(s) that are not finite, the first at [", list(at), "] (", data[first_here],
       "); training from it would give NaN from the first step. Use weights that are finite (the "
       "checkpoint before the weights went bad, or the original model)");
}

}  // namespace tetrad
