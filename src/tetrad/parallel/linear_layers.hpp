// The parallel linear layers, declared once (4d-parallelism.md; Megatron's column/row-parallel
// pairs, here on the X/Y blocks). A layer's kind names its forward collective and that
// collective's adjoint in the backward; each GEMM site is a layer of one kind between two of a
// rank's local widths, so the call sites name a site and nothing else of its shape:
//   normal      W block [n_out/Gy, k_in/Gx]: input split over X, output split over Y.
//               forward: partial GEMM all-reduced over X; backward: dIn all-reduced over Y.
//   transposed  W block [n_out/Gx, k_in/Gy]: input split over Y, output split over X.
//               forward: partial GEMM all-reduced over Y; backward: dIn all-reduced over X.
// The identity halves of the pairs (a normal layer's input replicated over Y, its output's
// gradient replicated over X) need no message.
#pragma once
#include <cstdint>

#include "tetrad/parallel/gemm_layouts.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/local_dims.hpp"

namespace tetrad::parallel {

enum class LinearKind : uint8_t { Normal, Transposed };

// The axis a layer's forward all-reduces its partial sums over, and its adjoint's (the
// backward's all-reduce of the input gradient).
struct CollectivePair {
  Axis forward, backward;
};
constexpr CollectivePair collectives(LinearKind k) {
  return k == LinearKind::Normal ? CollectivePair{Axis::X, Axis::Y}
                                 : CollectivePair{Axis::Y, Axis::X};
}

// A GEMM site as a linear layer: its kind, and its input and output widths on this rank.
struct LinearSpec {
  GemmSite site;
  LinearKind kind;
  int64_t LocalDims::*in;
  int64_t LocalDims::*out;
};
inline constexpr LinearSpec kLinears[kGemmSites] = {
    {GemmSite::Qkv, LinearKind::Normal, &LocalDims::Cx, &LocalDims::QKVy},
    {GemmSite::Proj, LinearKind::Transposed, &LocalDims::Ay, &LocalDims::Cx},
    {GemmSite::Fc, LinearKind::Normal, &LocalDims::Cx, &LocalDims::FWy},
    {GemmSite::FcProj, LinearKind::Transposed, &LocalDims::Fy, &LocalDims::Cx},
    {GemmSite::Head, LinearKind::Normal, &LocalDims::Cx, &LocalDims::Vy},
};
constexpr bool linears_in_site_order() {
  for (int i = 0; i < kGemmSites; ++i)
    if (kLinears[i].site != GemmSite(i)) return false;
  return true;
}
static_assert(linears_in_site_order(), "kLinears: one entry per GemmSite, in its order");

constexpr const LinearSpec& linear_spec(GemmSite s) { return kLinears[size_t(s)]; }

}  // namespace tetrad::parallel
