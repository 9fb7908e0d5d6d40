#include "tetrad/train/device_memory.hpp"

#include <cstdio>

#include "tetrad/core/error.hpp"

namespace tetrad::train {

namespace {
std::string gib(double b) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.2f GiB", b / double(1ull << 30));
  return s;
}
}  // namespace

double backend_reserve_bytes(const planner::MemoryBreakdown& m) {
  // 32 MiB cuBLASLt workspace + scratch: at most a few column-sum partial blocks of the widest
  // weight gradient and the fused cross-entropy's row statistics; bounded by 1% of the
  // activations, at least 64 MiB (measured on the device by gpu-check.sh's peak memory line).
  const double scratch = std::max(64.0 * (1 << 20), 0.01 * m.activations);
  return 32.0 * (1 << 20) + scratch;
}

std::string device_memory_problem(const planner::MemoryBreakdown& m, double free_bytes,
                                  double total_bytes, const std::string& device) {
  const double reserve = backend_reserve_bytes(m);
  const double need = m.total() + reserve;
  if (need <= free_bytes) return "";
  return detail::concat(
      "this run does not fit on ", device, ": the memory formula needs ", gib(need),
      " per rank (weights ", gib(m.weights), ", gradients ", gib(m.grads), ", optimizer ",
      gib(m.optimizer), ", gathered shards ", gib(m.gathered), ", activations ",
      gib(m.activations), ", backend workspace ", gib(reserve), ") but ", gib(free_bytes),
      " of ", gib(total_bytes), " are free; use a smaller train.micro_batch, train.recompute = "
      "\"selective\" or \"full\", or more ranks over Z or P (parallel.grid; `tetrad plan` "
      "shows the memory of every grid)");
}

}  // namespace tetrad::train
