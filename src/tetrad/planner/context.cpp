// The context axis C (issue 28) in the planner: the keys' and values' exchange over C, by ring or
// by all-gather, and the grid as the parallel layer's functions see it (planner.hpp).
//
// A sequence of S tokens is cut into 2·Gc chunks, rank r holding chunks r and 2·Gc - 1 - r (the
// zigzag that balances causal work), so every rank holds T = S / Gc tokens of each of its
// sequences and does 1 / Gc of each sequence's causal attention; everything but the attention is
// per token and splits over C like over D. The attention needs every earlier chunk's keys and
// values:
//   ring        Gc - 1 steps; in each a rank sends its K|V block (T·2·kv/Gy elements) to the next
//               rank and receives the previous rank's while it computes the attention of the block
//               it has (Megatron-Core's ring; Liu et al., "Ring Attention", 2023); the backward
//               passes K|V and the dK|dV accumulators (twice the bytes). A step is hidden when it
//               takes no longer than the attention of one block: per pass
//               exposed = (Gc - 1) · max(0, step - attention / Gc).
//   all-gather  K|V all-gathered over C before the attention (Gc·T·2·kv/Gy elements out), dK|dV
//               reduce-scattered after the backward: nothing to hide behind, exposed
//               (TorchTitan's allgather rotation; Megatron-Core's "all_gather" cp_comm_type).
// With full recomputation the forward's exchange runs again in the backward.
#include "tetrad/planner/planner.hpp"

#include <algorithm>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/context_split.hpp"

namespace tetrad::planner {

CpComm parse_cp_comm(const std::string& s) {
  if (s == "auto") return CpComm::Auto;
  if (s == "ring") return CpComm::Ring;
  if (s == "all-gather" || s == "allgather") return CpComm::AllGather;
  fail("context exchange '", s, "': expected auto, ring or all-gather");
}

const char* name(CpComm c) {
  return c == CpComm::Ring ? "ring" : c == CpComm::AllGather ? "all-gather" : "auto";
}

void add_context_layer_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s,
                            double T, CpComm method) {
  if (g.c() <= 1) return;
  TETRAD_CHECK(method != CpComm::Auto, "add_context_layer_comm: choose ring or all-gather first");
  const double act_b = in.precision == Precision::BF16 ? 2 : 4;
  const double fwd_mult = in.recompute == Recompute::Full ? 2 : 1;
  const double block_b = T * 2 * s.KV / g.y() * act_b;  // this rank's keys and values
  const double steps = g.c() - 1;
  if (method == CpComm::Ring) {
    c.add("context ring K|V (fwd)", Axis::C, Op::SendRecv, block_b, steps * fwd_mult, kRingFwd, true);
    c.add("context ring K|V and dK|dV (bwd)", Axis::C, Op::SendRecv, 2 * block_b, steps, kRingBwd, true);
  } else {
    c.add("context all-gather of K|V", Axis::C, Op::AllGather, g.c() * block_b, fwd_mult, kExposed, true);
    c.add("context reduce-scatter of dK|dV", Axis::C, Op::ReduceScatter, g.c() * block_b, 1, kExposed, true);
  }
}

double ring_exposed(double ring_fwd, double ring_bwd, double attn_fwd_s, double attn_bwd_s, int c) {
  if (c <= 1) return 0;
  // ring_* are the pass's Gc - 1 steps together; each step beside one block's attention.
  const double steps = c - 1;
  auto pass = [&](double ring, double attn) {
    return steps * std::max(0.0, ring / steps - attn / c);
  };
  return pass(ring_fwd, attn_fwd_s) + pass(ring_bwd, attn_bwd_s);
}

double context_gather_bytes(const PlanInput& in, const GridShape& g, int64_t local_batch,
                            int64_t local_len) {
  // One formula with the trainer's (ContextAttention::bytes): fp32 K|V blocks in every precision.
  const auto comm = in.cp_comm == CpComm::Ring ? parallel::ContextComm::Ring
                                               : parallel::ContextComm::AllGather;
  return double(parallel::context_exchange_bytes(parallel::LocalDims::of(in.model, g), g,
                                                 local_batch, local_len, comm));
}

GridShape without_context(const GridShape& g, bool shard_over_context) {
  GridShape f = g;
  if (shard_over_context) f[Axis::Z] = g.z() * g.c();
  f[Axis::C] = 1;
  return f;
}

}  // namespace tetrad::planner
