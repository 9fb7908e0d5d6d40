// Gradient collectives with bf16 on the wire and fp32 sums (ParallelOptions::grad_comm_bf16,
// train.grad_comm_precision = "bf16"; docs/precision.md, "bf16 gradient communication").
//
// Why this shape: MPI has no bf16 sum, and a user-defined MPI_Op over uint16 would round the
// partial sum back to bf16 at every hop of the library's algorithm (what NCCL does for bf16), so
// the error would grow with the group size and depend on the algorithm Open MPI picks for the
// message size. Instead each rank rounds its contribution to bf16 once (nearest even, the
// backend's cast), the pieces are exchanged as bf16 bit patterns (an all-to-all of uint16 made of
// point-to-point messages, which every transport has), and the receiver sums them in fp32 in
// group-rank order 0, 1, ...: one rounding per contribution, the same formula on every rank, so
// the result is deterministic (bitwise the same across runs and whatever the timing).
// Blocking: the caller's CommQueue sees an already complete operation (no overlap for these).
#pragma once
#include <cstdint>

#include "tetrad/backend/backend.hpp"
#include "tetrad/comm/communicator.hpp"

namespace tetrad::parallel {

// send holds c.size() blocks of n fp32 values; recv (n) = Σ over group ranks r, in rank order, of
// float(bf16(block c.rank() of rank r)), summed in fp32. A size-1 group copies (no rounding).
// Buffers are the backend's memory (be.ops() casts and adds them on be.queue()).
void reduce_scatter_sum_bf16(backend::Backend& be, const comm::Communicator& c, const float* send,
                             float* recv, int64_t n);

// inout (n) = Σ over the group of inout: reduce_scatter_sum_bf16 of inout zero-padded to
// c.size() equal pieces, then each fp32 piece sum rounded to bf16 once and all-gathered in bf16
// (so both halves move half the bytes; every rank ends with the same bits). A size-1 group: no-op.
void allreduce_sum_bf16(backend::Backend& be, const comm::Communicator& c, float* inout, int64_t n);

}  // namespace tetrad::parallel
