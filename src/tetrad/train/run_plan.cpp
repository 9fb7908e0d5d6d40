#include "tetrad/train/run_plan.hpp"

#include "tetrad/comm/communicator.hpp"
#include "tetrad/comm/transports.hpp"
#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/parallel/context_split.hpp"
#include "tetrad/parallel/gemm_layouts.hpp"
#include "tetrad/train/auto_grid.hpp"

namespace tetrad {

bool progress_thread_wins(const std::string& mode, int ranks_on_node, int threads) {
  if (mode == "true") return true;
  if (mode == "false") return false;
  if (mode != "auto")
    fail("parallel.progress_thread must be true, false or \"auto\", got \"", mode, "\"");
  // The thread polls every ~50 us while collectives are pending: with a spare core it costs
  // nothing, on a full node it takes that time from the kernels (bench/overlap_train.sh: +10% on
  // the Z grid's step with 2 ranks x 1 thread on 2 cores, where polling costs nothing).
  return int64_t(ranks_on_node) * (threads + 1) <= num_cores();
}

parallel::OverlapOptions overlap_options(const OverlapConfig& c, int ranks_on_node, int threads) {
  parallel::OverlapOptions o;
  o.backward_allreduce = c.backward_allreduce;
  o.reduce_scatter = c.reduce_scatter;
  o.prefetch_depth = c.prefetch_depth;
  o.prefetch_across_steps = c.prefetch_across_steps;
  o.cache_gathered_weights = c.cache_gathered_weights;
  o.dp_overlap = c.dp_overlap;
  o.dp_bucket_mb = c.dp_bucket_mb;
  o.forward_chunks = c.forward_chunks;
  o.progress_thread = progress_thread_wins(c.progress_thread, ranks_on_node, threads);
  return o;
}

RunConfig resolved_config(const RunConfig& cfg, const RunPlan& plan) {
  RunConfig saved = cfg;
  if (saved.grid.empty()) saved.grid = plan.grid.to_arg();
  return saved;
}

backend::PrecisionChoice run_precision(const RunConfig& cfg, const backend::Backend& device) {
  return backend::resolve_precision(resolve_settings(cfg).precision, device);
}

RunPlan resolve_run_plan(const RunConfig& cfg, const Launch& launch, const backend::Backend& device) {
  const TrainConfig& t = cfg.train;
  // What the config alone decides (RunConfig::validate checks the same): recomputation, ZeRO,
  // the pipeline's settings, attention precision, a given GEMM layout plan, gradient
  // communication precision.
  const RunSettings settings = resolve_settings(cfg);
  RunPlan plan;
  // "auto", or no grid named on more than one rank: the planner's first choice, and why. Every
  // rank computes the same answer from the same inputs, so they agree without talking.
  const AutoGrid chosen = resolve_grid(cfg, launch.world, launch.ranks_per_node, device);
  plan.grid = chosen.grid;
  plan.grid_why = chosen.why;
  comm::check_transport(t.comm, t.device, plan.grid.p());  // a chosen grid may have a pipeline axis
  plan.replicas = token_slots(plan.grid);
  if (t.micro_batch % plan.replicas != 0)
    fail("train.micro_batch (", t.micro_batch, ") must be divisible by Gz x Gd = ", plan.replicas,
         " (its sequences are split over the Z and data-parallel ranks)");
  plan.local_batch = t.micro_batch / plan.replicas;
  // The context axis cuts each sequence into 2 Gc chunks (parallel/context_split.hpp).
  parallel::ContextSplit{plan.grid.c(), 0}.check_divides(t.seq_len);
  plan.seq_len = t.seq_len;
  plan.tokens_per_step = int64_t(t.micro_batch) * t.seq_len * t.grad_accum;
  // A chosen grid's split is checked here, a named one's already by resolve_settings.
  if (plan.grid.p() > 1)
    plan.layer_split = parallel::resolve_layer_split(cfg.pipeline_layers, cfg.model, t.seq_len,
                                                     plan.grid.p(), cfg.virtual_stages);

  // GEMM precision of this run's model (not a process-wide switch: the model carries it). "auto"
  // is the device's to say (Backend::auto_precision: bf16 where it has bf16 matrix hardware).
  parallel::ParallelOptions& popt = plan.model;
  popt = settings.model;
  const backend::PrecisionChoice precision = backend::resolve_precision(settings.precision, device);
  popt.precision = precision.precision;
  plan.precision_why = precision.why;
  plan.layouts_why = "a plan given";
  if (popt.gemm_layout_plan.empty())
    popt.gemm_layouts = parallel::resolve_gemm_layouts(settings.gemm_layouts, popt.precision,
                                                       device, &plan.layouts_why);
  // dp_overlap is dropped by the model with ZeRO or Gp > 1.
  popt.overlap = overlap_options(cfg.overlap, launch.ranks_on_node(), launch.threads);
  return plan;
}

void check_precision_agreed(const RunPlan& plan, const comm::Communicator& world) {
  if (world.size() <= 1) return;
  int32_t lo = -int32_t(plan.model.precision), hi = int32_t(plan.model.precision);
  world.allreduce_max(&lo, 1);
  world.allreduce_max(&hi, 1);
  if (-lo != hi)
    fail("train.precision = \"auto\" resolved to fp32 on some ranks and bf16 on others (this "
         "rank: ", backend::precision_name(plan.model.precision), ", because ", plan.precision_why,
         "); set train.precision = \"fp32\" or \"bf16\", or share one TETRAD_CACHE_DIR between "
         "the nodes");
}

}  // namespace tetrad
