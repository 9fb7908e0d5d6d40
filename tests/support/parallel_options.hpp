// ParallelOptions for tests that vary the recomputation mode, the ZeRO stage or the virtual
// pipeline stages. Header only.
#pragma once

#include "tetrad/parallel/options.hpp"

namespace tetrad_test {

// The recomputation mode, the ZeRO stage and the virtual pipeline stages given, the rest default.
// Assigned: a braced {recompute, zero} leaves the members that have no initialiser
// (attention_precision, gemm_layout_plan) to -Wmissing-field-initializers.
inline tetrad::parallel::ParallelOptions parallel_options(tetrad::parallel::Recompute recompute,
                                                          int zero = 0, int virtual_stages = 1) {
  tetrad::parallel::ParallelOptions po;
  po.recompute = recompute;
  po.zero = zero;
  po.virtual_stages = virtual_stages;
  return po;
}

}  // namespace tetrad_test
