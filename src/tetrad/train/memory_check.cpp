#include "tetrad/train/memory_check.hpp"

#include <filesystem>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <vector>

#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/memory_model.hpp"
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
    // The context exchange's buffers of the method this run uses (parallel.cp_comm).
    in.cp_comm = plan.model.cp_comm == parallel::ContextComm::Ring ? planner::CpComm::Ring
                                                                   : planner::CpComm::AllGather;
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

double parameter_count(const ModelConfig& mc) {
  // The family's table is its top tensors, the same tensors per layer, and its bottom ones.
  ModelConfig one = mc, two = mc;
  one.n_layer = 1;
  two.n_layer = 2;
  const double p1 = double(build_param_table(one).total), p2 = double(build_param_table(two).total);
  return p1 + (p2 - p1) * (double(mc.n_layer) - 1);
}

namespace {

std::string gib(double bytes) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1);
  if (bytes < double(1ull << 30)) o << bytes / double(1 << 20) << " MiB";
  else o << bytes / double(1ull << 30) << " GiB";
  return o.str();
}

void refuse_unless_fits(const ModelConfig& mc, const std::string& source,
                        const std::string& command, double params, double bytes,
                        const std::string& what) {
  if (!(params >= 1 && bytes >= 1))  // sizes whose products overflow 64 bits
    fail(command, ": the model of '", source, "' has sizes too large to count (n_layer ",
         mc.n_layer, ", n_embd ", mc.n_embd, ", ffn ", mc.ffn, ", vocab_size ", mc.vocab_size,
         ", max_seq ", mc.max_seq, "); nothing was allocated. Is its config.json right?");
  const backend::MemoryAvailable m = backend::host_memory_available();
  if (m.available == 0) return;  // no figure: not checked
  const int sharing = std::max(1, launcher_ranks_per_node());
  const double avail = double(m.available) / sharing;
  if (bytes <= avail) return;
  std::ostringstream sizes;
  sizes << "n_layer " << mc.n_layer << ", n_embd " << mc.n_embd << ", ffn " << mc.ffn
        << ", vocab_size " << mc.vocab_size << ", max_seq " << mc.max_seq;
  std::ostringstream count;
  count << std::setprecision(3) << params;
  fail(command, ": the model of '", source, "' (", sizes.str(), ": ", count.str(),
       " parameters) needs at least ", gib(bytes), " (", what, ") but this machine has ",
       gib(avail), " available (", m.source, " ", gib(double(m.available)), " of ",
       gib(double(m.total)), sharing > 1 ? detail::concat(" / ", sharing, " ranks on the node") : "",
       "); nothing was allocated. Is its config.json right?");
}

// The weights a folder holds (its *.safetensors and shard_*.bin files) must be able to hold the
// parameters config.json describes, at two bytes each at least: else config.json does not
// belong to them (and reading them would fail after allocating the model anyway).
void refuse_unless_weights_hold(const ModelConfig& mc, const std::string& dir,
                                const std::string& command, double params) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  double bytes = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool weights = name.ends_with(".safetensors") || (name.starts_with("shard_") && name.ends_with(".bin"));
    if (weights && e.is_regular_file(ec)) bytes += double(e.file_size(ec));
  }
  if (bytes == 0 || params * 2 <= bytes) return;  // no weight files: the loader says so
  std::ostringstream count;
  count << std::setprecision(3) << params;
  fail(command, ": config.json of '", dir, "' describes a model of ", count.str(),
       " parameters (n_layer ", mc.n_layer, ", n_embd ", mc.n_embd, ", ffn ", mc.ffn,
       ", vocab_size ", mc.vocab_size, "), at least ", gib(params * 2), " in 16-bit weights, but "
       "its weight files hold ", gib(bytes), ": config.json does not describe these weights; "
       "nothing was allocated");
}

}  // namespace

void check_model_fits_host(const ModelConfig& mc, const std::string& source,
                           const std::string& command, double fp32_copies) {
  const double params = parameter_count(mc);
  refuse_unless_weights_hold(mc, source, command, params);
  refuse_unless_fits(mc, source, command, params, params * 4.0 * fp32_copies,
                     detail::concat(fp32_copies, " fp32 cop", fp32_copies == 1 ? "y" : "ies",
                                    " of its parameters"));
}

void check_inference_fits_host(const ModelConfig& mc, const std::string& source,
                               const std::string& command, const parallel::GridShape& shape,
                               const parallel::GridCoord& coord, int local_batch, int max_len,
                               const parallel::ParallelOptions& options) {
  // The parameters alone first: the formula's per-layer tables must not be the allocation that
  // exhausts the machine.
  const double params = parameter_count(mc);
  refuse_unless_weights_hold(mc, source, command, params);
  refuse_unless_fits(mc, source, command, params, params * 4.0 / double(shape.size()),
                     "its fp32 parameters, this rank's share");
  double bytes = 0;
  try {
    bytes = double(parallel::model_memory(mc, shape, coord, local_batch, max_len, options).total());
  } catch (const Error&) {
    return;  // a layout the formula cannot take; the model's own checks report what is wrong
  }
  refuse_unless_fits(mc, source, command, params, bytes,
                     detail::concat("the inference model on grid ", shape.to_string(),
                                    " for sequences of ", max_len, " tokens: weights, buffers and "
                                    "activations of one rank"));
}

}  // namespace tetrad
