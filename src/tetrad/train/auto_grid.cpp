#include "tetrad/train/auto_grid.hpp"

#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "tetrad/core/error.hpp"
#include "tetrad/backend/backend.hpp"
#include "tetrad/planner/validate.hpp"

namespace tetrad {

using namespace planner;

PlanInput plan_input_of(const RunConfig& cfg, int ranks, const backend::Backend& device) {
  PlanInput in;
  in.model = cfg.model;
  in.model_name = cfg.model_name;
  in.micro_batch = cfg.train.micro_batch;
  in.global_batch = int64_t(cfg.train.micro_batch) * cfg.train.grad_accum;
  in.seq = cfg.train.seq_len;
  in.ranks = ranks;
  // What the trainer will run: the config's settings as the run plan resolves them
  // (resolve_settings), train.precision "auto" as the device says (Backend::auto_precision: bf16
  // where it has bf16 matrix hardware).
  const RunSettings s = resolve_settings(cfg);
  in.precision = backend::resolve_precision(s.precision, device).precision;
  in.recompute = s.model.recompute;
  in.zero = s.model.zero;
  in.schedule = s.schedule;
  in.virtual_stages = s.model.virtual_stages;
  in.pipeline_layers = s.model.pipeline_layers;
  // The switches that size the model's buffers (the rest only move when collectives run).
  in.overlap_switches.prefetch_depth = cfg.overlap.prefetch_depth;
  in.overlap_switches.cache_gathered_weights = cfg.overlap.cache_gathered_weights;
  in.overlap_switches.dp_bucket_mb = cfg.overlap.dp_bucket_mb;
  in.sparse_embedding_grad = s.model.sparse_embedding_grad;
  in.sequence_shard = s.model.sequence_shard;
  // The gradients' collectives move fp32 unless train.grad_comm_precision = "bf16".
  in.z_grad_comm_bytes = in.dp_grad_comm_bytes = s.model.grad_comm_bf16 ? 2 : 4;
  in.tensor_comm_bytes = 4;  // the tensor-parallel sums of its fp32 GEMM outputs, in every precision
  // parallel.expert_parallel > 1 fixes the fold E (the planner then tries that E alone); 1 lets
  // `--grid auto` choose it (a grid that names e= carries its own: planner::expert_fold_of).
  in.expert_parallel = cfg.expert_parallel;
  return in;
}

PlannerModel planner_model_of(const std::string& entry, const std::vector<std::string>& overrides) {
  std::vector<std::string> model_sets;
  for (const auto& s : overrides)
    if (s.starts_with("model.")) model_sets.push_back(s);
  if (entry.ends_with(".toml")) {
    const RunConfig cfg = load_run_config(entry, model_sets);
    return {cfg.model, std::filesystem::path(entry).filename().string()};
  }
  if (model_sets.empty()) return {planner_model(entry), entry};
  // Named bases the config schema knows take the overrides; the published ones are fixed.
  model_sets.insert(model_sets.begin(), "model.name=" + entry);
  return {load_run_config("", model_sets).model, entry};
}

std::vector<PlannerModel> planner_model_list(const std::string& list, const std::vector<std::string>& overrides) {
  std::vector<PlannerModel> out;
  std::stringstream ms(list);
  int n = 0;
  for (std::string entry; std::getline(ms, entry, ',');) {
    ++n;
    if (entry.empty())
      fail("--model '", list, "': entry ", n, " is empty (expected model names or TOML run "
           "config paths separated by commas, e.g. gpt-5b,gpt-10b or a.toml,b.toml)");
    try {
      out.push_back(planner_model_of(entry, overrides));
    } catch (const Error& e) {
      fail("--model '", list, "': entry ", n, " '", entry, "': ", e.what(),
           entry.ends_with(".toml") ? "" : " (or a TOML run config path ending in .toml)");
    }
  }
  if (list.ends_with(","))
    fail("--model '", list, "': entry ", n + 1, " is empty (a trailing comma)");
  return out;
}

int launcher_ranks_per_node() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* e = std::getenv(v); e && std::atoi(e) > 0) return std::atoi(e);
  return 0;
}

AutoGrid choose_grid(const RunConfig& cfg, int ranks, int ranks_per_node,
                     const backend::Backend& device) {
  Machine m = load_machine(cfg.machine);
  if (ranks_per_node > 0) m.ranks_per_node = ranks_per_node;
  const PlanInput in = plan_input_of(cfg, ranks, device);
  const std::vector<Estimate> all = plan(in, m);
  const Estimate* first = nullptr;
  const Estimate* second = nullptr;
  int trainable = 0, valid = 0;
  for (const auto& e : all) {
    if (!e.valid) continue;
    ++valid;
    if (!e.trainable) continue;
    ++trainable;
    if (!first) first = &e;
    else if (!second) second = &e;
  }
  if (!first) {
    std::ostringstream o;
    o << "parallel.grid = \"auto\": no grid of " << ranks << " ranks can train this run";
    int shown = 0;
    for (const auto& e : all)
      if (!e.valid && shown++ < 3) o << "; " << grid_label(e.grid) << ": " << e.reject;
    fail(o.str());
  }
  AutoGrid a;
  const parallel::GridShape& g = first->grid;
  a.grid = g;
  std::ostringstream w;
  w << std::fixed << std::setprecision(3);
  w << "grid auto: " << trainer_grid_string(g) << " (x,y,z,p,d = " << plan_label(*first)
    << "), the planner's first choice of " << trainable << " trainable grids (" << valid
    << " valid, " << all.size() << " in all) on machine '" << m.name << "' with "
    << m.ranks_per_node << " ranks/node\n"
    << "  predicted " << first->step << " s/step: compute " << std::setprecision(0)
    << 100 * first->compute / first->step << "%, exposed communication "
    << 100 * first->comm_exposed / first->step << "%, dominant " << first->dominant
    << ", memory/rank " << std::setprecision(1) << first->memory.total() / 1e6 << " MB\n";
  if (second)
    w << std::setprecision(3) << "  runner-up " << trainer_grid_string(second->grid) << " at "
      << second->step << " s/step (" << std::setprecision(1)
      << 100 * (second->step / first->step - 1) << "% slower, dominant " << second->dominant << ")\n";
  if (!all.empty() && all.front().valid && !all.front().trainable)
    w << "  (" << plan_label(all.front())
      << " with a pipeline axis is predicted faster, but the trainer does not take Gp > 1 yet)\n";
  a.why = w.str();
  return a;
}

AutoGrid resolve_grid(const RunConfig& cfg, int ranks, int ranks_per_node,
                      const backend::Backend& device) {
  AutoGrid a;
  if (cfg.grid == "auto") {
    a = choose_grid(cfg, ranks, ranks_per_node, device);
  } else if (cfg.grid.empty() && ranks > 1) {
    a = choose_grid(cfg, ranks, ranks_per_node, device);
    a.why = detail::concat("parallel.grid is not set and ", ranks, " ranks were launched: ",
                           "choosing one as parallel.grid = \"auto\" does (set parallel.grid or ",
                           "--grid to choose one yourself)\n", a.why);
  } else if (!cfg.grid.empty()) {
    a.grid = parallel::parse_grid(cfg.grid);
  }
  a.grid = with_expert_fold(a.grid, cfg.expert_parallel);
  parallel::validate_grid(a.grid, ranks);
  return a;
}

}  // namespace tetrad
