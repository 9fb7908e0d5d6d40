#include "tetrad/train/memory_check.hpp"

#include <iomanip>
#include <ostream>
#include <sstream>
#include <vector>

#include "tetrad/core/error.hpp"
#include "tetrad/train/auto_grid.hpp"
#include "tetrad/train/device_memory.hpp"

namespace tetrad {

namespace {

std::string fixed1(double v) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << v;
  return o.str();
}

// The memory this rank may use, and where that figure comes from.
void available_memory(const RunConfig& cfg, int ranks_on_node, backend::Backend& device,
                      MemoryFit& fit) {
  const double MiB = double(1 << 20);
  if (cfg.train.memory_limit_mib > 0) {
    fit.available = double(cfg.train.memory_limit_mib) * MiB;
    fit.available_from = detail::concat("train.memory_limit_mib = ", cfg.train.memory_limit_mib);
    return;
  }
  const backend::MemoryAvailable m = device.memory_available();
  // Host memory is shared by every rank of the node; a GPU by the ranks on it: "cuda" picks
  // local_rank % devices (backend/device_select.hpp), "cuda:N" puts every rank on N.
  int sharing = std::max(1, ranks_on_node);
  if (!m.host_shared && cfg.train.device == "cuda" && m.devices > 1) {
    sharing = 0;
    for (int r = 0; r < ranks_on_node; ++r) sharing += r % m.devices == m.index;
    sharing = std::max(1, sharing);
  }
  fit.available = double(m.available) / sharing;
  fit.available_from = detail::concat(
      m.source, " ", fixed1(double(m.available) / MiB), " MiB of ", fixed1(double(m.total) / MiB),
      " MiB",
      sharing > 1 ? detail::concat(" / ", sharing, m.host_shared ? " ranks on the node"
                                                                 : " ranks on the device")
                  : std::string());
  if (m.available == 0) fit.available_from = m.source + " gave no figure: not checked";
}

std::string memory_problem_of_this_rank(const RunConfig& cfg, const RunPlan& plan,
                                        const Launch& launch, int rank, backend::Backend& device,
                                        std::ostream& out, bool quiet) {
  const parallel::GridShape& shape = plan.grid;
  MemoryFit fit;
  try {
    planner::PlanInput in = plan_input_of(cfg, launch.world, device);
    in.precision = plan.model.precision;  // as run on this device
    fit.formula = planner::memory_per_rank(in, shape);
  } catch (const Error&) {
    return "";  // a layout the formula cannot take; the model's own checks report what is wrong
  }
  if (device.name().rfind("cuda", 0) == 0) fit.workspace = backend_reserve_bytes(fit.formula);
  fit.device = device.name();
  available_memory(cfg, launch.ranks_on_node(), device, fit);
  if (!quiet) out << memory_fit_line(fit) << std::endl;  // out before any rank can stop the job
  FitContext c;
  c.rank = rank;
  c.world = launch.world;
  c.micro_batch = cfg.train.micro_batch;
  c.recompute = cfg.train.recompute;
  c.bf16 = plan.bf16();
  return memory_fit_problem(fit, c);
}

}  // namespace

void check_memory_fits(const RunConfig& cfg, const RunPlan& plan, const Launch& launch,
                       backend::Backend& device, const comm::Communicator& world_group,
                       std::ostream& out, bool quiet) {
  const int world = launch.world, rank = world_group.rank();
  const std::string why =
      memory_problem_of_this_rank(cfg, plan, launch, rank, device, out, quiet);
  // The lowest rank that does not fit, or world when all do (every rank gets here: a rank that
  // throws before it ends the job under mpirun, it does not leave the others waiting).
  int32_t first_bad = why.empty() ? world : rank;
  if (world > 1) {
    first_bad = -first_bad;
    world_group.allreduce_max(&first_bad, 1);
    first_bad = -first_bad;
  }
  if (first_bad == world) return;
  // Every rank stops with that rank's message: the first error ends the job (MPI_Abort), so
  // whichever rank's comes out, it carries the numbers.
  std::string msg = why;
  if (world > 1) {
    int64_t len = int64_t(msg.size());
    world_group.broadcast(&len, 1, first_bad);
    std::vector<uint16_t> text(static_cast<size_t>(len));  // bytes, one an element
    if (rank == first_bad)
      for (size_t i = 0; i < msg.size(); ++i) text[i] = static_cast<unsigned char>(msg[i]);
    world_group.broadcast(text.data(), text.size(), first_bad);
    msg.resize(text.size());
    for (size_t i = 0; i < text.size(); ++i) msg[i] = static_cast<char>(text[i]);
  }
  fail(msg);
}

}  // namespace tetrad
