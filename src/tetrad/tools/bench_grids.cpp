// `tetrad bench --grids` (tools/bench.hpp, run_bench_grids): every grid of the ranks under mpirun.
#include "tetrad/tools/bench.hpp"

#include <mpi.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/profile.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/memory_model.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/pipeline.hpp"
#include "tetrad/train/auto_grid.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/backend/ceilings.hpp"
#include "tetrad/model/gemm_shapes.hpp"
#include "tetrad/train/optimizer.hpp"
#include "tetrad/train/step_runner.hpp"
#include "tetrad/train/trainer.hpp"
#include "tetrad/tools/bench_common.hpp"

namespace tetrad {

namespace {

using namespace bench_detail;

// ---- parallel mode (run_bench_grids) ----------------------------------------------------------

// The --overlap list ("both" = off,on); refuses an unknown mode.
std::vector<std::string> overlap_modes(const BenchOptions& opt) {
  std::vector<std::string> modes;
  std::stringstream ss(opt.overlap == "both" ? std::string("off,on") : opt.overlap);
  for (std::string m; std::getline(ss, m, ',');) {
    if (m != "off" && m != "on" && m != "poll" && m != "thread" && m != "chunked")
      fail("--overlap: expected a list of off, on, poll, thread, chunked (or both), got '", m,
           "'");
    modes.push_back(m);
  }
  return modes;
}

// The overlap of a mode. "on": the parallel.* defaults as the run plan resolves them for this
// launch (`on`: RunPlan::model.overlap, what training uses). poll / thread: every bit-identical
// overlap on (backward all-reduce, reduce-scatter, prefetch depth 1, data-parallel buckets),
// whatever the defaults are, with progress by polling between kernels / by the helper thread.
parallel::OverlapOptions overlap_of_mode(const std::string& mode, const parallel::OverlapOptions& on) {
  using parallel::OverlapOptions;
  OverlapOptions ov = mode == "off" ? OverlapOptions::all_off() : on;
  if (mode == "poll" || mode == "thread") {
    ov.backward_allreduce = ov.reduce_scatter = ov.dp_overlap = true;
    ov.prefetch_depth = std::max(ov.prefetch_depth, 1);
    ov.progress_thread = mode == "thread";
  }
  if (mode == "chunked") ov.forward_chunks = 2;  // the defaults + forward all-reduce in 2 chunks
  return ov;
}

// One configuration of a sweep: what every grid and mode of it shares.
struct GridSweep {
  GridSweep(const BenchOptions& o, comm::Communicator& w, std::ofstream& j)
      : opt(o), world(w), json_out(j) {}
  const BenchOptions& opt;
  comm::Communicator& world;
  std::ofstream& json_out;
  int threads = 0, G = 0;
  double baseline_rss = 0;  // the process before any model existed
  std::string name;
  ModelConfig mc;
  int Bg = 0, T = 0;
  int64_t serial_state = 0;  // p, g, m, v in fp32
  RunConfig settings;          // the flags as the run configuration's keys (bench_settings)
  parallel::ParallelOptions po;  // what they resolve to (resolve_settings): ZeRO, recompute, ...
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::OneFOneB;
  size_t n_shapes = 0, n_modes = 0;
};

// The run plan of this grid (the trainer's resolver: grid against the ranks, the micro-batch's
// split over Z x D, precision, GEMM layouts, the pipeline's settings), or none when the model
// does not run on it; prints why not.
std::optional<RunPlan> grid_plan(const GridSweep& sw, const parallel::GridShape& shape,
                                 std::ostream& out) {
  using namespace parallel;
  try {
    validate_grid(shape, sw.G);
    validate_grid_for_model(sw.mc, shape);
    const int M = shape.p() > 1 || sw.opt.accumulate ? sw.opt.micro_batches : 1;
    Launch launch;
    launch.world = sw.G;
    launch.ranks_per_node = launcher_ranks_per_node();
    launch.threads = sw.threads;
    launch.mpi = true;
    RunPlan plan = resolve_run_plan(
        bench_run_config(sw.settings, sw.name, sw.mc, sw.Bg, sw.T, M, shape.to_arg()), launch,
        backend::cpu_backend());
    ShardPlan::build(sw.mc, build_param_table(sw.mc), shape, coord_of(0, shape), plan.layer_split);
    return plan;
  } catch (const Error& e) {
    out << "  " << shape.to_string() << "   skipped: " << e.what() << "\n";
    return std::nullopt;
  }
}

// The timed steps of one grid and mode, this rank's figures.
struct GridSteps {
  std::vector<double> times;  // the slowest rank's wall time of each timed step
  double sum_step = 0;        // this rank's wall time of the timed steps
  double wait_total = 0, busy_total = 0;  // Gp > 1: idle and compute of the timed steps
  std::vector<double> op_s_sum;  // Gp > 1: every stage's op times summed over the timed steps
};

// Warm-up and timed steps of the trainer's StepRunner on this grid; the profile is cleared (and
// the trace starts) at the first timed step.
GridSteps time_grid_steps(const BenchOptions& opt, StepRunner& runner,
                          parallel::ProcessGroups& g, const parallel::GridShape& shape,
                          const std::vector<int32_t>& tokens, double tokens_per_step,
                          StepProfile& profile, TraceLog& trace_log) {
  using namespace parallel;
  GridSteps r;
  PipelineDriver* const pipe = runner.pipeline();
  for (int s = 0; s < opt.warmup + opt.steps; ++s) {
    if (s == opt.warmup) {
      profile.clear();
      g.world.barrier();
      trace_log.recording = true;
      trace_log.origin = std::chrono::steady_clock::now();
    }
    const auto t0 = std::chrono::steady_clock::now();
    runner.wait_for_slowest_rank();
    runner.run(tokens.data(), tokens.data() + 1, tokens_per_step, 1e-4, s);
    if (pipe && s >= opt.warmup) {
      // Idle = the pipeline's makespan (the steps start together after the barrier; the
      // slowest stage ends it) minus this rank's compute: waits inside the step plus the
      // head and tail of the flush, which the textbook bubble counts too.
      const double busy = pipe->last_step_s() - pipe->last_wait_s();
      double makespan = pipe->last_step_s();
      g.world.allreduce_max(&makespan, 1);
      r.wait_total += makespan - busy;
      r.busy_total += busy;
      // Every stage's op times (the same count on each: 2 m v), for the replay below.
      const std::vector<double>& mine = pipe->last_op_s();
      std::vector<double> all(mine.size() * size_t(shape.p()));
      g.p().allgather(mine.data(), all.data(), mine.size());
      if (r.op_s_sum.empty()) r.op_s_sum.assign(all.size(), 0.0);
      for (size_t k = 0; k < all.size(); ++k) r.op_s_sum[k] += all[k];
    }
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= opt.warmup) r.sum_step += dt;
    g.world.allreduce_max(&dt, 1);
    if (s >= opt.warmup) r.times.push_back(dt);
  }
  return r;
}

// The pipeline's bubble of the timed steps (Gp > 1), measured and replayed.
struct Bubble {
  double bubble = 0, bubble_min = 0, expected = 0, replayed = 0, imbalance = 0;
};

// Each rank's idle time over its compute time; with equal stages every rank idles (p - 1)
// chunk-times of m v per step: the textbook (p - 1) / (v m). Prints the pipeline line.
Bubble pipeline_bubble(const GridSweep& sw, parallel::ParallelTransformer& model,
                       parallel::ProcessGroups& g, const parallel::GridShape& shape, int M,
                       const GridSteps& st, std::ostream& out) {
  using namespace parallel;
  const BenchOptions& opt = sw.opt;
  Bubble b;
  b.bubble = st.wait_total / st.busy_total;
  g.world.allreduce_sum(&b.bubble, 1);
  b.bubble /= sw.G;
  double neg = -(st.wait_total / st.busy_total);
  g.world.allreduce_max(&neg, 1);
  b.bubble_min = -neg;
  b.expected = double(shape.p() - 1) / (double(M) * opt.virtual_stages);
  // The schedule replayed with the ops' measured times (mean over the timed steps): the
  // bubble these stages' real costs imply (the last stage's head and loss, the first's
  // embedding, the copies and sends), with no waiting for messages beyond that.
  const size_t nops = st.op_s_sum.size() / size_t(shape.p());
  const PipelineTiming replay = simulate_pipeline(
      sw.schedule, shape.p(), M, opt.virtual_stages,
      [&](int s, size_t i, const PipeOp&) { return st.op_s_sum[size_t(s) * nops + i] / opt.steps; });
  b.replayed = replay.mean_bubble();
  double stage_max = 0, stage_min = 1e300;
  for (double x : replay.busy) stage_max = std::max(stage_max, x), stage_min = std::min(stage_min, x);
  b.imbalance = stage_max / stage_min - 1;
  out << "  pipeline " << shape.to_string() << ": " << opt.schedule << ", " << M
      << " micro-batches, " << opt.virtual_stages << " chunk(s) per stage, layers "
      << sw.mc.n_layer << " split " << model.layer_split().to_string() << " ("
      << opt.pipeline_layers << "): bubble (idle / compute, mean over ranks) " << std::fixed
      << std::setprecision(3) << b.bubble << " (least-waiting rank " << b.bubble_min
      << ") vs (p - 1) / (v m) = " << b.expected << "; ratio " << b.bubble / b.expected
      << "; the schedule replayed with the measured op times " << b.replayed << " (stages "
      << std::setprecision(1) << 100 * b.imbalance << "% apart); measured / replayed "
      << std::setprecision(3) << b.bubble / b.replayed << "\n"
      << std::defaultfloat;
  return b;
}

// What one grid and mode measured, the largest rank's figure where ranks differ.
struct GridResult {
  double step = 0, tok_s = 0;
  double comm_s = 0, wait_s = 0, issued_s = 0, comm_share = 0, wait_share = 0, hidden = 0;
  double state_max = 0, rss = 0, estimate = 0;
  double staging = 0, formula_state = 0, stash = 0, formula_max = 0, activation = 0;
  double peak = 0, baseline_max = 0, peak_total = 0, total_ratio = 0;
  double growth[3] = {0, 0, 0}, base_kinds[3] = {0, 0, 0};
  bool hwm_reset = false;
};

// The time split, state and resident memory of the steps just run, reduced over the ranks.
// rss_start, kinds_start: this rank's resident memory before the grid's model existed.
GridResult measure_grid(const GridSweep& sw, parallel::ParallelTransformer& model,
                        parallel::ProcessGroups& g, const parallel::GridShape& shape,
                        const parallel::ParallelOptions& pov, int Bl, int M, const GridSteps& st,
                        const StepProfile& profile, double rss_start,
                        const ResidentKinds& kinds_start) {
  using namespace parallel;
  GridResult r;
  r.step = median(st.times);
  // Shares of the slowest rank's step: exposed communication, idle (waiting for another
  // rank) and the rest (compute, optimizer); hidden = issued communication not exposed.
  double sums[4] = {profile.seconds[size_t(Phase::Comm)], profile.seconds[size_t(Phase::Wait)],
                    profile.comm_issued_s, st.sum_step};
  g.world.allreduce_max(sums, 4);
  r.comm_s = sums[0];
  r.wait_s = sums[1];
  r.issued_s = sums[2];
  const double total = sums[3];
  r.comm_share = r.comm_s / total, r.wait_share = r.wait_s / total;
  r.hidden = r.issued_s > 0 ? std::max(0.0, 1 - r.comm_s / r.issued_s) : 0.0;
  const double state = double(model.state_bytes());
  r.state_max = state;
  g.world.allreduce_max(&r.state_max, 1);
  r.tok_s = double(sw.Bg) * sw.T * M / r.step;  // the step's M micro-batches
  // Resident memory while the model is alive, largest rank, against state + activations
  // (+ the process's baseline before any model existed).
  r.rss = double(current_rss_bytes());
  g.world.allreduce_max(&r.rss, 1);
  r.estimate = state + double(model.activation_bytes() + model.context_bytes()) + sw.baseline_rss;
  g.world.allreduce_max(&r.estimate, 1);
  // Peak resident memory of the steps above this grid's starting point, largest rank,
  // against the memory formula (parallel::model_memory, the planner's and the trainer's fit
  // check's: weights 4P (+2P bf16 copy), gradients 4P (/ Gd with ZeRO 2), Adam 8P (/ Gd with
  // ZeRO >= 1) over this rank's P = its local shard, the gather and staging buffers, the
  // activations of the recompute mode and, Gp > 1, the stashes of the micro-batches in flight).
  const parallel::ModelMemory mem = parallel::model_memory(
      sw.mc, shape, g.coord, Bl, sw.T, pov, sw.schedule, M);
  r.staging = double(mem.gathered + mem.staging);
  r.formula_state = double(mem.state());
  r.stash = double(mem.pipeline);
  const double formula = double(mem.total());
  r.activation = double(model.activation_bytes(sw.po.recompute));
  // The process baseline: what was resident before this grid's model existed (program,
  // libraries, MPI's buffers and shared memory, anything earlier grids left). The formula
  // counts the training state above it; both views are reported, largest rank each.
  const double hwm = double(hwm_rss_bytes());
  r.peak = hwm - rss_start;
  r.formula_max = formula;
  r.baseline_max = rss_start, r.peak_total = hwm;
  r.total_ratio = hwm / (formula + rss_start);  // this rank's peak over formula + baseline
  g.world.allreduce_max(&r.peak, 1);
  g.world.allreduce_max(&r.formula_max, 1);
  g.world.allreduce_max(&r.baseline_max, 1);
  g.world.allreduce_max(&r.peak_total, 1);
  g.world.allreduce_max(&r.total_ratio, 1);
  // Growth by kind from the baseline to now (after the steps, the model still alive).
  const ResidentKinds kinds_now = resident_kinds();
  r.growth[0] = kinds_now.anon - kinds_start.anon;
  r.growth[1] = kinds_now.file - kinds_start.file;
  r.growth[2] = kinds_now.shmem - kinds_start.shmem;
  g.world.allreduce_max(r.growth, 3);
  r.base_kinds[0] = kinds_start.anon, r.base_kinds[1] = kinds_start.file;
  r.base_kinds[2] = kinds_start.shmem;
  g.world.allreduce_max(r.base_kinds, 3);
  return r;
}

// The memory lines and the table row of one grid and mode.
void print_grid(const GridSweep& sw, const parallel::GridShape& shape, const std::string& mode,
                const GridResult& r, std::ostream& out) {
  const std::string grid = shape.to_string();
  out << "  memory " << grid << ": peak " << std::fixed << std::setprecision(1)
      << r.peak / 1048576.0 << " MiB per rank (largest) vs formula " << r.formula_max / 1048576.0
      << " MiB = state " << r.formula_state / 1048576.0 << " (of which staging "
      << r.staging / 1048576.0 << ") + activations " << r.activation / 1048576.0 << "; ratio "
      << std::setprecision(3) << r.peak / r.formula_max
      << (r.hwm_reset ? "" : " (peak not resettable here: includes earlier grids)") << "\n"
      << "  memory " << grid << " with the process baseline: baseline "
      << std::setprecision(1) << r.baseline_max / 1048576.0 << " MiB before the model (anonymous "
      << r.base_kinds[0] / 1048576.0 << ", file-backed " << r.base_kinds[1] / 1048576.0
      << ", shared memory " << r.base_kinds[2] / 1048576.0 << "); peak "
      << r.peak_total / 1048576.0 << " MiB resident vs formula + baseline; ratio "
      << std::setprecision(3) << r.total_ratio << " (largest rank); resident growth from the "
      << "baseline after the steps: anonymous +" << std::setprecision(1)
      << r.growth[0] / 1048576.0 << ", file-backed (library code) +" << r.growth[1] / 1048576.0
      << ", shared memory (MPI) +" << r.growth[2] / 1048576.0 << " MiB\n"
      << std::defaultfloat;
  out << "  " << std::left << std::setw(9) << grid << " " << std::setw(7) << mode
      << std::right << std::fixed << std::setprecision(1) << std::setw(9) << r.tok_s
      << std::setprecision(3) << std::setw(9) << r.step << std::setprecision(1) << std::setw(8)
      << 100 * (1 - r.comm_share - r.wait_share) << "%" << std::setw(8) << 100 * r.comm_share << "%"
      << std::setw(7) << 100 * r.hidden << "%" << std::setw(5) << 100 * r.wait_share << "%"
      << std::setw(10) << r.state_max / 1048576.0
      << " MiB" << std::setprecision(3) << std::setw(9) << r.state_max / (sw.serial_state / double(sw.G))
      << "x" << std::setprecision(1) << std::setw(9) << r.rss / 1048576.0 << " MiB"
      << std::setw(7) << r.estimate / 1048576.0 << " MiB" << std::defaultfloat << "\n";
}

// The --json row of one grid and mode.
nlohmann::json grid_json(const GridSweep& sw, const parallel::GridShape& shape,
                         const std::string& mode, int M, const parallel::LayerSplit& layer_split,
                         const GridResult& r, const Bubble& b) {
  const BenchOptions& opt = sw.opt;
  const double per_G = sw.serial_state / double(sw.G);
  return nlohmann::json{{"config", sw.name}, {"grid", shape.to_string()}, {"ranks", sw.G},
                        {"global_batch", sw.Bg}, {"seq", sw.T},
                        {"threads", sw.threads}, {"overlap", mode},
                        {"tokens_per_s", r.tok_s}, {"median_step_s", r.step},
                        {"comm_share", r.comm_share}, {"comm_exposed_s_per_step", r.comm_s / opt.steps},
                        {"comm_issued_s_per_step", r.issued_s / opt.steps},
                        {"comm_hidden_fraction", r.hidden}, {"wait_share", r.wait_share},
                        {"state_bytes_per_rank", r.state_max},
                        {"state_vs_serial_over_G", r.state_max / per_G},
                        {"rss_mb", r.rss / 1048576.0},
                        {"estimate_mb", r.estimate / 1048576.0},
                        {"zero", sw.po.zero}, {"recompute", recompute_name(sw.po.recompute)},
                        {"peak_mb", r.peak / 1048576.0},
                        {"formula_mb", r.formula_max / 1048576.0},
                        {"formula_state_mb", r.formula_state / 1048576.0},
                        {"stash_mb", r.stash / 1048576.0},
                        {"activation_mb", r.activation / 1048576.0},
                        {"peak_vs_formula", r.peak / r.formula_max},
                        {"baseline_mb", r.baseline_max / 1048576.0},
                        {"peak_total_mb", r.peak_total / 1048576.0},
                        {"peak_total_vs_formula_plus_baseline", r.total_ratio},
                        {"baseline_anon_mb", r.base_kinds[0] / 1048576.0},
                        {"baseline_file_mb", r.base_kinds[1] / 1048576.0},
                        {"baseline_shmem_mb", r.base_kinds[2] / 1048576.0},
                        {"growth_anon_mb", r.growth[0] / 1048576.0},
                        {"growth_file_mb", r.growth[1] / 1048576.0},
                        {"growth_shmem_mb", r.growth[2] / 1048576.0},
                        {"micro_batches", M}, {"schedule", opt.schedule},
                        {"virtual_stages", opt.virtual_stages},
                        {"pipeline_layers", opt.pipeline_layers},
                        {"layer_split", layer_split.counts()},
                        {"layers", sw.mc.n_layer}, {"bubble", b.bubble}, {"bubble_replayed", b.replayed}, {"stage_imbalance", b.imbalance},
                        {"bubble_least_waiting", b.bubble_min},
                        {"bubble_formula", b.expected}};
}

// One grid and overlap mode of a sweep: the model built on the grid's process groups, its timed
// steps, the trace, the pipeline, memory and row lines and the --json row.
void bench_grid_mode(const GridSweep& sw, const RunPlan& plan, parallel::ProcessGroups& g,
                     const parallel::GridShape& shape, const std::string& mode, std::ostream& out) {
  using namespace parallel;
  const BenchOptions& opt = sw.opt;
  const int Bl = plan.local_batch, T = plan.seq_len;
  const parallel::OverlapOptions ov = overlap_of_mode(mode, plan.model.overlap);
  // Memory of this grid alone, from here: the previous grid's buffers are freed (returned to
  // Linux: they are large, so malloc maps them).
  const double rss_start = double(current_rss_bytes());
  const ResidentKinds kinds_start = resident_kinds();
  parallel::ParallelOptions pov = plan.model;
  pov.overlap = ov;  // dp_overlap is dropped by the model with ZeRO or Gp > 1
  parallel::ParallelTransformer model(sw.mc, g, Bl, T, pov);
  model.init_weights(1);
  AdamW adam = make_adam(model, backend::cpu_backend());
  const int M = shape.p() > 1 || opt.accumulate ? opt.micro_batches : 1;
  const std::vector<int32_t> tokens = random_tokens(size_t(M) * Bl * T + 1, sw.mc.vocab_size);
  StepProfile profile;
  TraceLog trace_log;
  if (!opt.trace_path.empty()) profile.trace = &trace_log;
  model.set_profile(&profile);
  // The trainer's step (train/step_runner.hpp), clipped at norm 1. Gp > 1: the step's
  // micro-batches through the pipeline schedule (tokens: M of them); M > 1 without a
  // pipeline (--accumulate): gradient accumulation, as the trainer runs train.grad_accum.
  StepOptions so;
  so.micro_batches = M;
  so.B = Bl;
  so.T = T;
  so.schedule = sw.schedule;
  so.profile = &profile;
  StepRunner runner(model, adam, g, so);
  // The peak of the training steps: the high-water mark restarts after the set-up (whose
  // whole-tensor temporaries of init_weights are not training memory).
  const bool hwm_reset = reset_peak_rss();
  const GridSteps st = time_grid_steps(opt, runner, g, shape, tokens, double(sw.Bg) * T * M,
                                       profile, trace_log);
  model.set_profile(nullptr);
  if (!opt.trace_path.empty()) {
    trace_log.recording = false;
    std::string path = opt.trace_path;
    if (sw.n_shapes > 1 || sw.n_modes > 1 || opt.configs.size() > 1) {
      const size_t dot = path.rfind('.');
      const std::string tag = "." + sw.name + "-" + shape.to_string() + "-overlap-" + mode;
      path = dot == std::string::npos ? path + tag : path.substr(0, dot) + tag + path.substr(dot);
    }
    parallel::write_trace(g.world, trace_log, path);
    out << "  trace: " << path << "\n";
  }
  GridResult r = measure_grid(sw, model, g, shape, pov, Bl, M, st, profile, rss_start, kinds_start);
  r.hwm_reset = hwm_reset;
  const Bubble b = runner.pipeline() ? pipeline_bubble(sw, model, g, shape, M, st, out) : Bubble{};
  print_grid(sw, shape, mode, r, out);
  if (sw.json_out) sw.json_out << grid_json(sw, shape, mode, M, model.layer_split(), r, b).dump() << "\n";
}

}  // namespace

void run_bench_grids(const BenchOptions& opt, std::ostream& log) {
  const int threads = opt.threads > 0 ? opt.threads : 1;
  omp_set_num_threads(threads);
  comm::Communicator world = comm::Communicator::world();
  const int G = world.size();
  std::ostream null_stream(nullptr);
  std::ostream& out = world.rank() == 0 ? log : null_stream;
  out << "parallel benchmark: " << G << " ranks x " << threads << " thread(s) | "
      << cpu_features().summary() << "\n";
  std::ofstream json_out;
  if (!opt.json_path.empty() && world.rank() == 0) json_out.open(opt.json_path);
  const double baseline_rss = double(current_rss_bytes());
  for (const std::string& name : opt.configs) {
    GridSweep sw(opt, world, json_out);
    sw.threads = threads, sw.G = G, sw.baseline_rss = baseline_rss;
    sw.name = name;
    sw.mc = named_model(name);
    if (opt.layers > 0) sw.mc.n_layer = opt.layers;
    sw.Bg = standard_batch(name), sw.T = bench_seq(opt.seq, sw.mc, name);
    sw.serial_state = 16 * build_param_table(sw.mc).total;  // p, g, m, v in fp32
    out << "\n== " << name << ": global batch " << sw.Bg << " x " << sw.T << " tokens\n"
        << "  grid      overlap tokens/s   step s  compute  exposed  hidden  idle  state/rank   "
           "vs serial/G   RSS/rank  estimate\n";
    std::vector<parallel::GridShape> shapes = parallel::factorizations(G);
    if (!opt.grid.empty()) shapes = {parallel::parse_grid(opt.grid)};
    const std::vector<std::string> modes = overlap_modes(opt);
    sw.settings = bench_settings(opt, true);
    const RunSettings resolved = resolve_settings(sw.settings);
    sw.po = resolved.model, sw.schedule = resolved.schedule;
    sw.n_shapes = shapes.size(), sw.n_modes = modes.size();
    out << "  zero " << sw.po.zero << ", recompute " << parallel::recompute_name(sw.po.recompute) << "\n";
    for (const parallel::GridShape& shape : shapes) {
      const std::optional<RunPlan> plan = grid_plan(sw, shape, out);
      if (!plan) continue;
      parallel::ProcessGroups g(world, plan->grid);
      for (const std::string& mode : modes) bench_grid_mode(sw, *plan, g, shape, mode, out);
    }
  }
}

}  // namespace tetrad
