// Does a run fit on its device? The planner's memory formula (planner::memory_per_rank: weights,
// gradients, optimizer state, gathered Z shards, activations) plus what the backend keeps for
// itself, against the memory the device has for this rank (Backend::memory_available, divided
// among the ranks that share it, or train.memory_limit_mib), checked on every rank before the
// model is allocated: a run that does not fit says so with the formula's numbers instead of
// failing inside a step (docs/gpu.md, "Device memory"). Pure arithmetic, tested on every build.
#pragma once
#include <cstddef>
#include <string>

#include "tetrad/planner/planner.hpp"

namespace tetrad {

// What the CUDA backend holds besides the formula's buffers: cuBLASLt's workspace (32 MiB), the
// reduction scratch (grows to the largest weight-gradient column sum of the first step), the
// CUDA context's own reserve is outside cudaMemGetInfo's "free" already.
double backend_reserve_bytes(const planner::MemoryBreakdown& m);

struct MemoryFit {
  planner::MemoryBreakdown formula;  // bytes per rank
  double workspace = 0;              // the backend's own (backend_reserve_bytes on a GPU; 0 on the CPU)
  double available = 0;              // bytes this rank may use; 0: unknown (not checked)
  std::string device;                // "cpu", "cuda:0 (NVIDIA H200)"
  std::string available_from;        // where `available` comes from, e.g. "MemAvailable / 2 ranks on the node"
  double need() const { return formula.total() + workspace; }
};

// What the run is, for the advice of the message.
struct FitContext {
  int rank = 0, world = 1;
  int micro_batch = 1;
  std::string recompute = "none";
  bool bf16 = false;
};

// The startup line: "memory: formula 12.3 MiB of 23456.0 MiB available on cpu (MemAvailable ...)"
// (or "... available unknown ..." where the device gives no figure).
std::string memory_fit_line(const MemoryFit& f);

// "" when need() <= available (or available is unknown); otherwise the message to stop with: the
// rank, the device, the formula's total and its largest items (every item after), what is
// available and where that figure comes from, and what to change.
std::string memory_fit_problem(const MemoryFit& f, const FitContext& c);

}  // namespace tetrad
