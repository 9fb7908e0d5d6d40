// `tetrad plan`: predict step time and memory of every grid and rank them (planner/), or one of
// --measure-machine, --compare, --published, --published-scaling, --sweep-grids, or a scaling
// curve (--scaling).
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/planner/machine.hpp"
#include "tetrad/planner/planner.hpp"
#include "tetrad/planner/report.hpp"
#include "tetrad/planner/scaling.hpp"
#include "tetrad/planner/validate.hpp"
#include "tetrad/train/auto_grid.hpp"
#include "tetrad/train/config.hpp"

namespace fs = std::filesystem;

namespace tetrad::cli {

namespace {

struct Options {
  std::string model = "small", machine, json, measure_out, compare, precision, schedule,
              recompute, overlap = "none", ranks_text, scaling, grids, points, svg;
  std::vector<std::string> sets;
  int64_t global_batch = 0, micro_batch = 0, micro_batch_per_replica = 0;
  int seq = 0, zero = -1, ranks = 0, top = 30, threads = 1, show_rejected = 20, virtual_stages = 0;
  int sweep_grids = 0;
  bool no_pipeline = false, published = false, quick = false, published_scaling = false;
  std::vector<int> rank_list;  // --ranks with --scaling
};

// The plan's input as the trainer would run it: a named model or a TOML run config, with the
// command line's settings over the config's. `model0` is the first of --model's list.
planner::PlanInput plan_input(const Options& o, const std::string& model0, const planner::Machine& m) {
  using namespace planner;
  PlanInput in;
  RunConfig cfg;
  if (model0.ends_with(".toml")) {
    cfg = load_run_config(model0, o.sets);
    in.model_name = cfg.model_name + " (" + model0 + ")";
    in.model = cfg.model;
  } else {
    cfg = load_run_config("", o.sets);
    std::vector<std::string> model_sets;
    for (const auto& s : o.sets)
      if (s.starts_with("model.")) model_sets.push_back(s);
    in.model = planner_model(model0);
    in.model_name = model0;
    if (!model_sets.empty()) {
      // Named bases the config schema knows take the overrides; the published ones are fixed.
      model_sets.insert(model_sets.begin(), "model.name=" + model0);
      in.model = load_run_config("", model_sets).model;
    }
    cfg.train.seq_len = in.model.max_seq;
  }
  in.seq = o.seq > 0 ? o.seq : cfg.train.seq_len;
  in.micro_batch = o.micro_batch;
  in.micro_batch_per_replica = o.micro_batch_per_replica;
  if (o.micro_batch == 0 && o.micro_batch_per_replica == 0) in.micro_batch = cfg.train.micro_batch;
  in.global_batch = o.global_batch > 0 ? o.global_batch
                                       : (in.micro_batch > 0 ? in.micro_batch : 1) * cfg.train.grad_accum;
  if (!o.precision.empty()) in.precision = parse_precision(o.precision);
  else if (model0.ends_with(".toml"))  // as the trainer resolves it on the CPU
    in.precision = plan_input_of(cfg, 1, backend::cpu_backend()).precision;
  // Unset on the command line: the config's settings as the trainer's run plan resolves them
  // (train.recompute, parallel.zero, the pipeline's; their defaults for a named model).
  const RunSettings settings = resolve_settings(cfg);
  in.recompute = o.recompute.empty() ? settings.model.recompute : parse_recompute(o.recompute);
  in.zero = o.zero >= 0 ? o.zero : settings.model.zero;
  in.overlap = parse_overlap(o.overlap);
  in.schedule = settings.schedule;
  in.virtual_stages = settings.model.virtual_stages;
  in.pipeline_layers = settings.model.pipeline_layers;
  in.ranks = o.ranks > 0 ? o.ranks : m.ranks_per_node;
  in.allow_pipeline = !o.no_pipeline;
  return in;
}

// Measured or published points beside the predicted curve.
void print_reference_points(const std::string& points_path,
                            const std::vector<planner::ReferencePoint>& refs,
                            const std::vector<planner::ScalingPoint>& pts) {
  std::cout << "reference points (" << points_path << "):\n";
  for (const auto& r : refs) {
    std::cout << "  " << r.label << ": " << r.ranks << " ranks";
    if (r.pflops >= 0) std::cout << ", " << r.pflops << " PFLOP/s";
    if (r.efficiency >= 0) std::cout << ", efficiency " << 100 * r.efficiency << "%";
    for (const auto& q : pts)
      if (q.valid && q.ranks == r.ranks) {
        if (r.pflops > 0)
          std::cout << " | predicted " << q.hardware_flops_per_s / 1e15 << " PFLOP/s ("
                    << std::showpos << 100 * (q.hardware_flops_per_s / 1e15 / r.pflops - 1)
                    << "%" << std::noshowpos << ")";
        if (r.efficiency >= 0)
          std::cout << " | predicted efficiency " << 100 * q.efficiency << "%";
      }
    std::cout << "\n";
  }
}

// `--scaling weak|strong`: the curve over the --ranks list, as text or JSON, and the plot.
void run_scaling(const Options& o, const planner::PlanInput& in, const planner::Machine& m,
                 const std::vector<std::string>& model_list) {
  using namespace planner;
  ScalingSpec spec;
  spec.kind = parse_scaling_kind(o.scaling);
  spec.base = in;
  spec.ranks = o.rank_list;
  for (const auto& n : model_list) {
    spec.model_names.push_back(n);
    spec.models.push_back(planner_model(n));
  }
  if (!o.grids.empty()) spec.grids = parse_grid_list(o.grids);
  const auto pts = scaling_curve(spec, m);
  const std::vector<ReferencePoint> refs =
      o.points.empty() ? std::vector<ReferencePoint>{} : load_reference_points(o.points);
  if (o.json == "-") {
    std::cout << scaling_json(spec, m, pts).dump(2) << "\n";
  } else {
    std::cout << scaling_text(spec, m, pts);
    if (!refs.empty()) print_reference_points(o.points, refs, pts);
  }
  if (!o.json.empty() && o.json != "-") {
    std::ofstream f(o.json);
    f << scaling_json(spec, m, pts).dump(2) << "\n";
    if (!f) fail("cannot write '", o.json, "'");
    std::cout << "wrote " << o.json << "\n";
  }
  if (!o.svg.empty()) {
    std::ofstream f(o.svg);
    f << scaling_svg(spec, m, pts, refs);
    if (!f) fail("cannot write '", o.svg, "'");
    if (o.json != "-") std::cout << "wrote " << o.svg << "\n";
  }
}

// The modes that answer without a plan input; true when one did.
bool run_other_modes(const Options& o, bool under_mpi) {
  using namespace planner;
  if (o.sweep_grids > 0) {  // the local validation sweep's grids, as `tetrad bench --grids` arguments
    std::cout << local_sweep_bench_args(o.sweep_grids);
    return true;
  }
  int rank = 0;
  if (under_mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (!o.measure_out.empty()) {
    const std::string stem = fs::path(o.measure_out).stem().string();
    const Machine m = measure_machine(stem, o.threads, o.quick);
    if (rank == 0) {
      std::ofstream f(o.measure_out);
      f << machine_to_toml(m) << std::flush;
      if (!f) fail("cannot write machine file '", o.measure_out, "'");
      std::cout << machine_to_toml(m) << "wrote " << o.measure_out << "\n";
    }
    return true;
  }
  if (rank != 0) return true;  // planning is serial: only rank 0 answers when launched under mpirun
  if (o.published_scaling) {
    std::cout << published_scaling_text(planner::published_scaling())
              << "\nSensitivity to the assumed global batches (every series' batch scaled):\n"
              << published_scaling_sensitivity_text();
    return true;
  }
  if (o.published) {
    std::cout << published_text(published_results()) << "\nSensitivity to the assumed numbers:\n"
              << published_sensitivity_text();
    return true;
  }
  return false;
}

void run(const Options& o, bool under_mpi) {
  using namespace planner;
  if (run_other_modes(o, under_mpi)) return;
  if (o.machine.empty())
    fail("tetrad plan needs --machine (a file or one of the shipped names; "
         "tetrad plan --measure-machine FILE measures this one)");
  const Machine m = load_machine(o.machine);
  if (!o.compare.empty()) {
    std::cout << comparison_text(compare_with_bench(o.compare, m),
                                 "predicted (machine " + m.name + ") vs measured (" + o.compare + ")");
    return;
  }
  // `--scaling weak --model a,b,c`: one named model per point; the first sets up the input.
  std::vector<std::string> model_list;
  if (o.model.find(',') != std::string::npos) {
    if (o.scaling.empty()) fail("--model '", o.model, "': a list of models needs --scaling weak");
    std::stringstream ms(o.model);
    for (std::string tok; std::getline(ms, tok, ',');) model_list.push_back(tok);
  }
  const std::string model0 = model_list.empty() ? o.model : model_list.front();
  const PlanInput in = plan_input(o, model0, m);
  if (!o.scaling.empty()) {
    run_scaling(o, in, m, model_list);
    return;
  }
  if (!o.grids.empty() || !o.points.empty() || !o.svg.empty())
    fail("--grids, --points and --svg belong to a scaling curve (--scaling weak|strong)");
  const auto p = plan(in, m);
  if (o.json == "-") {
    std::cout << plan_json(in, m, p).dump(2) << "\n";
    return;
  }
  std::cout << plan_text(in, m, p, o.show_rejected, o.top);
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << plan_json(in, m, p).dump(2) << "\n" << std::flush;
    if (!f) fail("cannot write '", o.json, "'");
    std::cout << "wrote " << o.json << "\n";
  }
}

// The command line's settings as the planner reads them: --schedule / --virtual-stages are the
// trainer's config keys and go through its parser; --ranks is one count, or with --scaling a list.
void resolve_options(Options& o) {
  if (!o.schedule.empty()) o.sets.push_back("parallel.schedule=" + o.schedule);
  if (o.virtual_stages > 0) o.sets.push_back("parallel.virtual_stages=" + std::to_string(o.virtual_stages));
  if (!o.ranks_text.empty()) {
    if (!o.scaling.empty()) {
      o.rank_list = planner::parse_rank_list(o.ranks_text);
    } else {
      const auto one = planner::parse_rank_list(o.ranks_text);
      if (one.size() != 1)
        fail("--ranks '", o.ranks_text, "': a list of rank counts needs --scaling weak|strong");
      o.ranks = one.front();
    }
  } else if (!o.scaling.empty()) {
    fail("--scaling needs --ranks with the rank counts of the curve, e.g. --ranks 512,1024,2048");
  }
}

void add_options(CLI::App& sub, Options& o) {
  sub.add_option("--model", o.model,
                 "named model (tiny, small, gpt2-124m, llama-small, gpt-1t, gpt-80b) or a "
                 "TOML run config (its [model] and [train] sections)")->capture_default_str();
  sub.add_option("-s,--set", o.sets, "override in the config: section.key=value");
  sub.add_option("--machine", o.machine, "machine file or name of a shipped one (machines/*.toml)");
  sub.add_option("--ranks", o.ranks_text,
                 "number of ranks (default: the machine's ranks per node); with --scaling a "
                 "list, 512,1024,2048");
  sub.add_option("--scaling", o.scaling,
                 "weak | strong: a scaling curve over the --ranks list (weak: --model a,b,c "
                 "one per point, or one model with the batch in proportion to the ranks)");
  sub.add_option("--grids", o.grids,
                 "with --scaling: the grid of each point instead of the fastest, "
                 "'x,y,z,p,d;x,y,z,p,d;...'");
  sub.add_option("--points", o.points,
                 "with --scaling: measured or published points to plot beside the prediction "
                 "(JSON: [{\"ranks\": 512, \"pflops\": 80.8, \"efficiency\": 1, \"label\": \"...\"}])");
  sub.add_option("--svg", o.svg, "with --scaling: write the plot (self-contained SVG) to this file");
  sub.add_flag("--published-scaling", o.published_scaling,
               "the published scaling rows (AxoNN on Perlmutter, ORNL on Frontier): predicted vs reported");
  sub.add_option("--global-batch", o.global_batch,
                 "sequences per step (default: the config's micro_batch x grad_accum)");
  sub.add_option("--micro-batch", o.micro_batch,
                 "sequences per micro-batch of the whole job, split over Z x D "
                 "(train.micro_batch; default: the config's)");
  sub.add_option("--micro-batch-per-replica", o.micro_batch_per_replica,
                 "sequences per micro-batch per (z, d) replica instead (Megatron's meaning)");
  sub.add_option("--seq", o.seq, "tokens per sequence (default: the config's seq_len)");
  sub.add_option("--precision", o.precision,
                 "fp32 | bf16 (default: a config file's train.precision, else fp32)");
  sub.add_option("--recompute", o.recompute,
                 "none | selective | full (default: the config's train.recompute, else none)");
  sub.add_option("--zero", o.zero,
                 "ZeRO stage over the data axis: 0 | 1 | 2 (default: the config's parallel.zero, else 0)");
  sub.add_option("--overlap", o.overlap,
                 "none (every collective exposed) | tensor (AxoNN's OAR/ORS/OAG) | all (+ data-parallel; tetrad's training defaults)")
      ->capture_default_str();
  sub.add_option("--schedule", o.schedule,
                 "pipeline schedule: 1f1b | interleaved (parallel.schedule; default: the config's)");
  sub.add_option("--virtual-stages", o.virtual_stages,
                 "model chunks per pipeline stage, interleaved (parallel.virtual_stages)");
  sub.add_flag("--no-pipeline", o.no_pipeline, "only grids with Gp = 1");
  sub.add_option("--top", o.top, "valid grids shown (0: all)")->capture_default_str();
  sub.add_option("--rejected", o.show_rejected, "rejected grids shown (-1: all)")->capture_default_str();
  sub.add_option("--json", o.json, "write the whole plan as JSON to this file ('-': stdout)");
  sub.add_option("--measure-machine", o.measure_out,
                 "measure this machine (run under mpirun -n N for collectives among N ranks) "
                 "and write its machine file");
  sub.add_option("--threads", o.threads, "threads per rank for --measure-machine")->capture_default_str();
  sub.add_flag("--quick", o.quick, "shorter --measure-machine");
  sub.add_option("--compare", o.compare,
                 "JSON lines of `tetrad bench --grids --json`: predicted vs measured per grid");
  sub.add_flag("--published", o.published,
               "the published rows of performance-model.md: predicted vs reported");
  sub.add_option("--sweep-grids", o.sweep_grids,
                 "print the local validation sweep's grids of N ranks (pipeline grids "
                 "included) as `tetrad bench --grids` arguments, one line each");
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  add_options(sub, *o);
  return [o](Context& ctx) {
    resolve_options(*o);
    run(*o, ctx.mpi != nullptr);
  };
}

}  // namespace

const Command plan_command{
    "plan", "predict step time and memory of every grid and rank them (docs/planner.md)", false,
    &setup};

}  // namespace tetrad::cli
