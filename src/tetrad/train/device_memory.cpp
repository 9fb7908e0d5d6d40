#include "tetrad/train/device_memory.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "tetrad/core/error.hpp"

namespace tetrad {

namespace {
std::string mib(double b) {
  char s[48];
  std::snprintf(s, sizeof(s), "%.1f MiB", b / double(1 << 20));
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

std::string memory_fit_line(const MemoryFit& f) {
  return detail::concat("memory: formula ", mib(f.need()), " of ",
                        f.available > 0 ? mib(f.available) : std::string("an unknown amount"),
                        " available on ", f.device, " per rank (", f.available_from,
                        "; formula: weights ", mib(f.formula.weights), ", gradients ",
                        mib(f.formula.grads), ", optimizer ", mib(f.formula.optimizer),
                        ", gathered weights ", mib(f.formula.gathered), ", staging ",
                        mib(f.formula.staging), ", activations ", mib(f.formula.activations),
                        ", backend workspace ", mib(f.workspace), ")");
}

std::string memory_fit_problem(const MemoryFit& f, const FitContext& c) {
  if (!(f.available > 0) || f.need() <= f.available) return "";
  std::vector<std::pair<const char*, double>> items = {
      {"weights", f.formula.weights},     {"gradients", f.formula.grads},
      {"optimizer state", f.formula.optimizer}, {"gathered weights", f.formula.gathered},
      {"staging buffers", f.formula.staging},   {"activations", f.formula.activations},   {"backend workspace", f.workspace}};
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string largest;
  for (size_t i = 0; i < 3 && items[i].second > 0; ++i)
    largest += detail::concat(i ? ", " : "", items[i].first, " ", mib(items[i].second));
  std::string advice = detail::concat(
      "more ranks on the grid (parallel.grid: over Z or P, or D with parallel.zero = 1 or 2; "
      "`tetrad plan` shows the memory of every grid), a smaller train.micro_batch (now ",
      c.micro_batch, ")");
  if (c.recompute != "full")
    advice += detail::concat(", train.recompute = ", c.recompute == "none" ? "\"selective\" or " : "",
                             "\"full\" (now \"", c.recompute, "\")");
  if (!c.bf16) advice += ", train.precision = \"bf16\" (now fp32)";
  return detail::concat(
      "rank ", c.rank, " of ", c.world, ": this run does not fit in memory on ", f.device,
      ": the memory formula needs ", mib(f.need()), " per rank but ", mib(f.available),
      " are available (", f.available_from, "); largest items: ", largest, " (weights ",
      mib(f.formula.weights), ", gradients ", mib(f.formula.grads), ", optimizer state ",
      mib(f.formula.optimizer), ", gathered weights ", mib(f.formula.gathered), ", staging ",
      mib(f.formula.staging), ", activations ", mib(f.formula.activations), ", backend workspace ",
      mib(f.workspace), "). To fit: ", advice,
      "; where the device is shared, train.memory_limit_mib sets this rank's share");
}

}  // namespace tetrad
