// train(): the run's components made in order (run plan, data, run folder, model, checkpointer,
// metrics, progress, validator, stop control), then the loop over steps.
#include "tetrad/train/trainer.hpp"

#include <algorithm>

#include <mpi.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "tetrad/comm/communicator.hpp"
#include "tetrad/comm/roll_call.hpp"
#include "tetrad/comm/transports.hpp"
#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/profile.hpp"
#include "tetrad/core/signals.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/pipeline.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/auto_grid.hpp"
#include "tetrad/train/checkpointer.hpp"
#include "tetrad/train/memory_check.hpp"
#include "tetrad/train/metrics_log.hpp"
#include "tetrad/train/optimizer.hpp"
#include "tetrad/train/progress.hpp"
#include "tetrad/train/run_folder.hpp"
#include "tetrad/train/run_plan.hpp"
#include "tetrad/train/step_runner.hpp"
#include "tetrad/train/stop_control.hpp"
#include "tetrad/train/training_data.hpp"
#include "tetrad/train/validator.hpp"

namespace tetrad {

namespace {

using parallel::ProcessGroups;
using Clock = std::chrono::steady_clock;

// train.threads = 0: OMP_NUM_THREADS if set, else this node's cores shared among its ranks
// (ranks x threads above the cores makes OpenMP spin against itself).
void set_threads(int threads) {
  int n = threads;
  if (n <= 0) {
    if (const char* env = std::getenv("OMP_NUM_THREADS"); env && std::atoi(env) > 0) {
      n = std::atoi(env);
    } else {
      n = std::max(1, num_cores() / std::max(1, launcher_ranks_per_node()));
    }
  }
  omp_set_num_threads(n);
}

Launch this_launch() {
  int mpi_ready = 0;
  MPI_Initialized(&mpi_ready);
  Launch l;
  if (mpi_ready) MPI_Comm_size(MPI_COMM_WORLD, &l.world);
  l.mpi = mpi_ready != 0;
  l.ranks_per_node = launcher_ranks_per_node();
  l.threads = omp_get_max_threads();
  l.open_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  if (const char* g = std::getenv("OMPI_MCA_odls_base_sigkill_timeout")) l.sigkill_timeout = g;
  return l;
}

// Where the model computes (train.device): its parameters, gradients, moments and activations
// live there; the host reaches them through the backend's queue. Refuses naming what this build
// and machine lack.
struct Device {
  std::unique_ptr<backend::Backend> owner;
  backend::Backend* be = &backend::cpu_backend();
  explicit Device(const std::string& name) {
    if (name == "cpu") return;
    owner = backend::create(name);
    be = owner.get();
  }
};

// The model's transport (comm/transports.hpp: collective where it asks whether ranks share a
// GPU), and its groups on NCCL when that is the choice, else null: the trainer's own MPI groups.
// The trainer's own groups are MPI's (or self() on one rank), whatever train.comm says: every
// value the trainer reduces lives in host memory (loss sums, token counts, the weights' sum of
// squares, failure flags, signals, the run-folder and checkpoint agreements), and NCCL
// collectives take device memory only. Made after the device, whose creation selects this rank's
// GPU (NCCL's communicators live on the current device).
std::unique_ptr<ProcessGroups> model_groups_on_nccl(const RunConfig& cfg, const RunPlan& plan,
                                                    const Launch& launch,
                                                    const ProcessGroups& groups,
                                                    comm::TransportChoice& transport) {
  transport = comm::choose_transport(cfg.train.comm, cfg.train.device, plan.grid.p(), groups.world);
  if (transport.name != "nccl") return nullptr;
  return std::make_unique<ProcessGroups>(ProcessGroups::on_nccl(
      launch.mpi ? comm::Communicator::world() : comm::Communicator::self("world"), plan.grid));
}

StepOptions step_options(const RunConfig& cfg, const RunPlan& plan, StepProfile* prof) {
  StepOptions o;
  o.micro_batches = cfg.train.grad_accum;
  o.B = plan.local_batch;
  o.T = plan.seq_len / plan.grid.c();  // this rank's tokens per sequence (its context chunks)
  o.grad_clip = cfg.train.grad_clip;
  o.max_bad_steps = cfg.train.max_bad_steps;
  o.schedule = parallel::parse_pipeline_schedule(cfg.schedule);
  o.profile = prof;
  return o;
}

// What the loop works with, made in order by train().
struct Loop {
  const RunConfig& cfg;
  const TrainOptions& opt;
  const RunPlan& plan;
  const ProcessGroups& groups;
  std::ostream& out;
  parallel::ParallelTransformer& model;
  StepRunner& runner;
  TrainingData& data;
  Checkpointer& ckpt;
  MetricsLog& metrics;
  ProgressReporter& progress;
  Validator& validator;
  StopControl& stop;
  StepProfile& prof;
  TraceLog& trace;
  TrainResult& result;
};

// The batch of step `step` (0-based) read and masked, then the step itself (the step runner);
// dropped: the fraction of targets the loss mask dropped.
StepResult train_step(Loop& l, int64_t step, double& dropped) {
  std::array<double, 2> counts;  // kept targets, dropped by the loss mask
  {
    ScopedPhase sp(&l.prof, Phase::Data);
    counts = l.data.next_step(step);
  }
  l.runner.sum_over_replicas(counts.data(), 2);
  const double kept = std::max(counts[0], 1.0);
  dropped = counts[1] / (counts[0] + counts[1]);
  if (l.data.documents())
    l.model.set_documents(l.data.inputs().data(), l.data.doc_starts().data(),
                          int64_t(l.data.inputs().size()));
  return l.runner.run(l.data.inputs().data(), l.data.targets().data(), kept,
                      learning_rate(l.cfg.train, step), step);
}

// A non-finite step: reported and skipped; train.max_bad_steps in a row stop the run.
void skip_step(Loop& l, int64_t step, const StepResult& r) {
  const TrainConfig& t = l.cfg.train;
  l.out << "step " << step + 1 << ": non-finite " << (std::isfinite(r.loss) ? "gradient" : "loss")
        << " (loss " << r.loss << ", grad norm " << r.grad_norm << "); step skipped ("
        << r.bad_steps << " in a row, limit train.max_bad_steps = " << t.max_bad_steps << ")\n";
  l.metrics.write(skipped_record(step + 1));
  if (r.verdict == StepVerdict::Stop)
    fail("stopping: ", r.bad_steps, " consecutive non-finite steps; the last good checkpoint (",
         l.ckpt.last_checkpoint().empty() ? "none written this run" : l.ckpt.last_checkpoint(),
         ") is intact. Lower train.lr or check the data.");
}

// The timeline records trace_steps steps from trace_from (the ranks' clocks aligned first).
void trace_window(Loop& l, int64_t step, int64_t trace_from) {
  if (!l.prof.trace) return;
  const bool rec = step >= trace_from && step < trace_from + l.opt.trace_steps;
  if (rec && !l.trace.recording && l.groups.world.size() > 1) l.groups.world.barrier();
  if (rec && !l.trace.recording) l.trace.origin = Clock::now();
  l.trace.recording = rec;
}

// The steps from `step` to train.max_steps, or to a stop signal; returns the step reached.
int64_t run_loop(Loop& l, int64_t step) {
  const TrainConfig& t = l.cfg.train;
  // The timeline skips the first step (one-off allocation and warm-up) when the run is longer.
  const int64_t trace_from = step + (t.max_steps - step > l.opt.trace_steps ? 1 : 0);
  l.progress.start(step);
  // A signal during start-up: stopped before the first step, every rank at the same one.
  if (const int sig = l.stop.agreed_signal()) {
    l.out << StopControl::stop_line(sig, step);
    l.result.stopped_by_signal = true;
    return step;
  }
  for (; step < t.max_steps; ++step) {
    l.prof.clear();
    trace_window(l, step, trace_from);
    const auto t0 = Clock::now();
    l.stop.begin_step(step + 1);
    l.runner.wait_for_slowest_rank();
    double dropped = 0;
    const StepResult r = train_step(l, step, dropped);
    l.result.losses.push_back(r.loss);
    if (r.verdict != StepVerdict::Apply) {
      skip_step(l, step, r);
      continue;
    }
    const auto t1 = Clock::now();
    const StepBreakdown bd = breakdown_of(l.prof, std::chrono::duration<double>(t1 - t0).count());
    l.result.breakdowns.push_back(bd);
    const int64_t done = step + 1;
    StepMetrics m = l.progress.measure(done, r.loss, learning_rate(t, step), r.grad_norm,
                                       dropped, bd, t1);
    add_moe_metrics(m, r.moe, l.model.config().moe());
    l.metrics.write(step_record(m));
    l.progress.print_step(m, l.data.masking());
    l.ckpt.poll();
    if (l.validator.due(done)) {
      l.stop.arm(done, "validation");
      l.result.val_losses.push_back(l.validator.run(done));
    }
    if (t.checkpoint_interval > 0 && done % t.checkpoint_interval == 0 && done < t.max_steps)
      l.ckpt.save(done, /*wait=*/false, l.result.losses);
    // Every rank stops at the same step: the signal may reach ranks at different times.
    if (const int sig = l.stop.agreed_signal()) {
      l.out << StopControl::stop_line(sig, done);
      l.result.stopped_by_signal = true;
      return done;
    }
  }
  return step;
}

// After the loop: the trace written, a last validation where the loop did not just run one, the
// final checkpoint, no collective left pending.
void finish_run(Loop& l, int64_t step) {
  l.result.steps_done = step;
  l.model.set_profile(nullptr);
  if (!l.opt.trace_path.empty()) {
    l.trace.recording = false;
    parallel::write_trace(l.groups.world, l.trace, l.opt.trace_path);
    if (!l.opt.quiet) l.out << "trace: " << l.opt.trace_path << " (open in https://ui.perfetto.dev)\n";
  }
  l.stop.arm(step, "validation");
  if (l.validator.enabled() && !l.validator.due(step) && !l.result.stopped_by_signal)
    l.result.val_losses.push_back(l.validator.run(step));
  const bool saved = l.ckpt.save(step, /*wait=*/true, l.result.losses);
  l.model.finish_communication();  // the next step's prefetched gathers: none is left pending
  l.stop.disarm();
  l.result.last_checkpoint = l.ckpt.last_checkpoint();
  l.result.checkpoint_blocked_s = l.ckpt.blocked_s();
  // A run that cannot write its final checkpoint has not done what it was asked: not exit 0.
  if (!saved) {
    const std::string& mine = l.result.last_checkpoint;
    fail("the run ended at step ", step, " with weights that are not finite, so no final "
         "checkpoint was written; ",
         !mine.empty() ? "the latest checkpoint, " + mine + ", holds this run's last finite weights"
         : !l.result.resumed_from.empty()
             ? "the latest checkpoint is still " + l.result.resumed_from + ", the one it resumed from"
             : std::string("the run folder has no checkpoint"),
         ". Lower train.lr, check the initial weights or the data, then resume or start again");
  }
}

}  // namespace

TrainResult train(const RunConfig& cfg, const TrainOptions& opt, std::ostream& log_stream) {
  cfg.validate();
  const TrainConfig& t = cfg.train;
  set_threads(t.threads);
  if (t.comm_timeout > 0) comm::set_collective_timeout(t.comm_timeout, "train.comm_timeout");
  const Launch launch = this_launch();
  // Before anything large is allocated or read: a SIGINT/SIGTERM from here on is recorded and
  // stops the run cleanly (before its first step, if it comes during start-up); under Open MPI
  // a SIGCONT while running is mpirun's first notice (core/signals.hpp).
  const StopSignals signals(launch.open_mpi);
  Device device(t.device);
  RunPlan plan = resolve_run_plan(cfg, launch, *device.be);
  if (launch.world > 1) check_precision_agreed(plan, comm::Communicator::world());
  ProcessGroups groups =
      launch.world > 1 ? ProcessGroups(comm::Communicator::world(), plan.grid) : ProcessGroups();
  // A timed-out collective names the rank that stopped (comm/roll_call.hpp): the ranks still
  // running answer within half a timeout (1 to 10 s).
  if (launch.world > 1)
    comm::enable_roll_call(std::min(10.0, std::max(1.0, comm::collective_timeout() / 2)));
  const bool root = groups.world.rank() == 0;
  std::ostream null_stream(nullptr);
  std::ostream& out = root ? log_stream : null_stream;
  out << plan.grid_why;
  // This rank's share of the tokens: slot z + Gz d of the Z x D replicas.
  const int slot = token_slot(groups.coord, plan.grid);
  TrainingData data(cfg, DataSlot{plan.local_batch, plan.seq_len, slot, plan.replicas,
                                  parallel::ContextSplit::of(plan.grid, groups.coord)});
  comm::TransportChoice transport;
  const std::unique_ptr<ProcessGroups> nccl_groups =
      model_groups_on_nccl(cfg, plan, launch, groups, transport);
  ProcessGroups& model_groups = nccl_groups ? *nccl_groups : groups;
  check_memory_fits(cfg, plan, launch, *device.be, groups.world, out, opt.quiet);
  const RunFolder folder(cfg.run_dir, to_toml(resolved_config(cfg, plan)),
                         ClaimOptions{opt.resume, opt.overwrite, opt.quiet}, groups.world, out);

  parallel::ParallelOptions popt = plan.model;
  popt.device = device.be;
  parallel::ParallelTransformer model(cfg.model, model_groups, plan.local_batch, plan.seq_len, popt);
  StepProfile prof;
  TraceLog trace_log;
  if (!opt.trace_path.empty()) prof.trace = &trace_log;
  model.set_profile(&prof);
  // The split actually run ("balanced" is resolved from the model's costs: say what it chose).
  if (plan.grid.p() > 1 && !opt.quiet)
    out << "# pipeline: " << cfg.schedule << ", layers per virtual stage "
        << model.layer_split().to_string() << " (parallel.pipeline_layers = \""
        << cfg.pipeline_layers << "\")\n";
  const parallel::OptimizerLayout& ol = model.optimizer_layout();
  AdamW adam(decay_ranges(model.table(), t, ol.param_offsets, ol.sizes, ol.state_offsets, ol.grad_offsets),
             ol.state_size, t, *device.be);
  // The step (train/step_runner.hpp); Gp > 1: its micro-batches go through the stages in the
  // pipeline schedule's order. Host values are summed over the trainer's own MPI groups.
  StepRunner runner(model, adam, groups, step_options(cfg, plan, &prof));

  StopControl stop(t.step_timeout, groups.world, opt.step_hook);
  Checkpointer ckpt({cfg, plan, model, adam, *device.be, groups.world, data, stop.watchdog(), out,
                     opt.quiet});
  const Checkpointer::Start start = ckpt.resume_or_init(opt.resume, opt.allow_data_change);
  folder.write_config();
  TrainResult result;
  result.first_step = start.step;
  result.resumed_from = start.resumed_from;

  const MfuPeak peak = mfu_peak(opt.peak_gflops, plan.model.precision, *device.be);
  ProgressReporter progress(cfg, plan, peak, launch.world, out, opt.quiet);
  progress.print_header(model, model_groups, transport.why, *device.be, omp_get_max_threads());
  progress.print_rank_shares(model, groups, log_stream);
  MetricsLog metrics;
  if (root) {
    metrics.open(cfg.run_dir, &ckpt.last_checkpoint());
    metrics.write(start_record(start.step, start.loaded, t.max_steps));
    if (!start.data_changes.empty()) metrics.write(data_change_record(start.step, start.data_changes));
  }
  Validator validator(cfg, data, model, runner.pipeline(), groups, metrics, out, opt.quiet);
  if (!opt.quiet) data.describe_loss_mask(out);
  progress.print_precision(model, *device.be, start.layouts_resumed);
  if (!opt.quiet && launch.open_mpi) StopControl::note_kill_grace(launch.sigkill_timeout, out);

  Loop loop{cfg,     opt,      plan,      groups, out,  model,     runner, data,
            ckpt,    metrics,  progress,  validator, stop, prof, trace_log, result};
  finish_run(loop, run_loop(loop, start.step));
  return result;
}

}  // namespace tetrad
