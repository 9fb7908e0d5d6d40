// Does a run fit on its device? The planner's memory formula (planner::memory_per_rank: weights,
// gradients, optimizer state, gathered Z shards, activations) plus what the backend keeps for
// itself, against the device's free memory, checked before the first step: a run that does not
// fit says so with the formula's numbers instead of failing inside a step (docs/gpu.md,
// "Device memory"). Pure arithmetic, tested on every build.
#pragma once
#include <cstddef>
#include <string>

#include "tetrad/planner/planner.hpp"

namespace tetrad::train {

// What the CUDA backend holds besides the formula's buffers: cuBLASLt's workspace (32 MiB), the
// reduction scratch (grows to the largest weight-gradient column sum of the first step), the
// CUDA context's own reserve is outside cudaMemGetInfo's "free" already.
double backend_reserve_bytes(const planner::MemoryBreakdown& m);

// "" when formula + reserve <= free_bytes; otherwise the message to stop with, naming the
// device, each term of the formula in GiB, the reserve, the free and total memory, and what to
// change (a smaller train.micro_batch, train.recompute, more ranks over Z / P).
std::string device_memory_problem(const planner::MemoryBreakdown& m, double free_bytes,
                                  double total_bytes, const std::string& device);

}  // namespace tetrad::train
