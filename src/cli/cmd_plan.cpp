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
#include <type_traits>
#include <variant>

#include "cli/command.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/planner/long_context.hpp"
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
              recompute, overlap = "none", ranks_text, scaling, grids, points, svg, why, cp_comm = "auto",
              sequence_shard, attention_kernel = "fused";
  std::vector<std::string> sets;
  int64_t global_batch = 0, micro_batch = 0, micro_batch_per_replica = 0, micro_batch_per_data_group = 0;
  int seq = 0, zero = -1, ranks = 0, top = 30, threads = 1, show_rejected = 20, virtual_stages = 0;
  int sweep_grids = 0;
  bool no_pipeline = false, no_context = false, published = false, quick = false, published_scaling = false,
       published_context = false;
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
    in.model = planner_model_of(model0, o.sets).model;  // -s model.k=v on a named base
    in.model_name = model0;
    cfg.train.seq_len = in.model.max_seq;
  }
  in.seq = o.seq > 0 ? o.seq : cfg.train.seq_len;
  in.micro_batch = o.micro_batch;
  in.micro_batch_per_replica = o.micro_batch_per_replica;
  in.micro_batch_per_data_group = o.micro_batch_per_data_group;
  // No micro-batch on the command line: the planner chooses one per grid (with the
  // accumulation it implies); the default global batch stays the config's micro_batch x grad_accum.
  in.search_micro_batch = o.micro_batch == 0 && o.micro_batch_per_replica == 0 && o.micro_batch_per_data_group == 0;
  in.global_batch = o.global_batch > 0 ? o.global_batch
                                       : int64_t(cfg.train.micro_batch) * cfg.train.grad_accum;
  if (!o.precision.empty()) in.precision = parse_precision(o.precision);
  else if (model0.ends_with(".toml"))  // as the trainer resolves it on the CPU
    in.precision = plan_input_of(cfg, 1, backend::cpu_backend()).precision;
  // Unset on the command line: the config's settings as the trainer's run plan resolves them
  // (train.recompute, parallel.zero, the pipeline's; their defaults for a named model).
  const RunSettings settings = resolve_settings(cfg);
  in.recompute = o.recompute.empty() ? settings.model.recompute : parse_recompute(o.recompute);
  in.zero = o.zero >= 0 ? o.zero : settings.model.zero;
  // The trainer reduces its fp32 gradients in fp32 unless train.grad_comm_precision = "bf16".
  in.z_grad_comm_bytes = in.dp_grad_comm_bytes = settings.model.grad_comm_bf16 ? 2 : 4;
  in.tensor_comm_bytes = 4;  // the tensor-parallel sums of its fp32 GEMM outputs, in every precision
  if (o.sequence_shard.empty()) in.sequence_shard = settings.model.sequence_shard;
  else if (o.sequence_shard == "on" || o.sequence_shard == "off") in.sequence_shard = o.sequence_shard == "on";
  else fail("--sequence-shard: expected on or off, got '", o.sequence_shard, "'");
  in.overlap = parse_overlap(o.overlap);
  in.schedule = settings.schedule;
  in.virtual_stages = settings.model.virtual_stages;
  in.pipeline_layers = settings.model.pipeline_layers;
  in.ranks = o.ranks > 0 ? o.ranks : m.ranks_per_node;
  in.allow_pipeline = !o.no_pipeline;
  in.allow_context = !o.no_context;
  in.cp_comm = parse_cp_comm(o.cp_comm);
  in.attention_kernel = parse_attention_kernel(o.attention_kernel);
  in.expert_parallel = cfg.expert_parallel;  // > 1: the plan's E fixed (1: searched)
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
                 const std::vector<PlannerModel>& model_list) {
  using namespace planner;
  ScalingSpec spec;
  spec.kind = parse_scaling_kind(o.scaling);
  spec.base = in;
  spec.ranks = o.rank_list;
  for (const auto& pm : model_list) {
    spec.model_names.push_back(pm.name);
    spec.models.push_back(pm.model);
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
  if (o.published_context) {
    std::cout << "TorchTitan's Llama 3.1 8B on 8 H100 (FSDP + CP, full recomputation, FP8 GEMMs) against "
                 "the planner in bf16 (machines/h100-ib.toml; TorchTitan's mesh: Gz = 8 / CP, C = CP, "
                 "parameters sharded over Z x C, K|V all-gathered):\n"
              << planner::context_rows_text(planner::torchtitan_context_rows());
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
  // `--scaling weak --model a,b,c`: one model per point (names or TOML run configs, each
  // checked here); the first sets up the input (its [train] and [parallel] settings).
  std::vector<PlannerModel> model_list;
  std::string model0 = o.model;
  if (o.model.find(',') != std::string::npos) {
    if (o.scaling.empty()) fail("--model '", o.model, "': a list of models needs --scaling weak");
    model_list = planner_model_list(o.model, o.sets);
    model0 = o.model.substr(0, o.model.find(','));
  }
  const PlanInput in = plan_input(o, model0, m);
  if (!o.scaling.empty()) {
    run_scaling(o, in, m, model_list);
    return;
  }
  if (!o.grids.empty() || !o.points.empty() || !o.svg.empty())
    fail("--grids, --points and --svg belong to a scaling curve (--scaling weak|strong)");
  if (!o.why.empty()) {  // one grid's terms, valid or not
    const GridShape g = parallel::parse_grid(o.why);
    if (g.size() != in.ranks)
      fail("--why ", o.why, ": the grid has ", g.size(), " ranks, the plan ", in.ranks, " (--ranks)");
    require_rate(m, in.precision);
    in.validate();
    std::cout << why_text(in, m, estimate(in, g, m));
    return;
  }
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

// Every option of `tetrad plan`, in --help's order: its flags, the field it sets (a flag for a
// bool), its help and whether --help shows the default.
using Field = std::variant<std::string Options::*, std::vector<std::string> Options::*, int Options::*,
                           int64_t Options::*, bool Options::*>;
struct OptionRow {
  const char* flags;
  Field field;
  const char* help;
  bool show_default = false;
};
const OptionRow kOptions[] = {
    {"--model", &Options::model,
     "named model (tiny, small, gpt2-124m, llama-small, llama-405b, gpt-1t, gpt-80b, ...) or a TOML "
     "run config (its [model] and [train] sections); with --scaling weak a comma list of either, one "
     "per point (a.toml,b.toml)", true},
    {"-s,--set", &Options::sets, "override in the config: section.key=value"},
    {"--machine", &Options::machine, "machine file or name of a shipped one (machines/*.toml)"},
    {"--ranks", &Options::ranks_text,
     "number of ranks (default: the machine's ranks per node); with --scaling a list, 512,1024,2048"},
    {"--scaling", &Options::scaling,
     "weak | strong: a scaling curve over the --ranks list (weak: --model a,b,c one per point, or "
     "one model with the batch in proportion to the ranks)"},
    {"--grids", &Options::grids,
     "with --scaling: the grid of each point instead of the fastest, 'x,y,z,p,d;x,y,z,p,d;...'"},
    {"--points", &Options::points,
     "with --scaling: measured or published points to plot beside the prediction (JSON: "
     "[{\"ranks\": 512, \"pflops\": 80.8, \"efficiency\": 1, \"label\": \"...\"}])"},
    {"--svg", &Options::svg, "with --scaling: write the plot (self-contained SVG) to this file"},
    {"--published-scaling", &Options::published_scaling,
     "the published scaling rows (AxoNN on Perlmutter, ORNL on Frontier): predicted vs reported"},
    {"--global-batch", &Options::global_batch,
     "sequences per step (default: the config's micro_batch x grad_accum)"},
    {"--micro-batch", &Options::micro_batch,
     "sequences per micro-batch of the whole job, split over Z x D (train.micro_batch); default: "
     "chosen per grid, the fastest that fits, with the accumulation it implies"},
    {"--micro-batch-per-replica", &Options::micro_batch_per_replica,
     "sequences per micro-batch per (z, d) replica instead (Megatron's meaning)"},
    {"--micro-batch-per-data-group", &Options::micro_batch_per_data_group,
     "sequences per micro-batch per data-parallel group, divided over Z instead (AxoNN's "
     "--micro-batch-size; Gz must divide it)"},
    {"--seq", &Options::seq, "tokens per sequence (default: the config's seq_len)"},
    {"--precision", &Options::precision, "fp32 | bf16 (default: a config file's train.precision, else fp32)"},
    {"--recompute", &Options::recompute,
     "none | selective | full (default: the config's train.recompute, else none)"},
    {"--zero", &Options::zero,
     "ZeRO stage over the data axis: 0 | 1 | 2 (default: the config's parallel.zero, else 0)"},
    {"--sequence-shard", &Options::sequence_shard,
     "on | off: the residual stream split along the tokens over Y (parallel.sequence_shard; "
     "default: the config's, else off)"},
    {"--overlap", &Options::overlap,
     "none (every collective exposed) | tensor (AxoNN's OAR/ORS/OAG) | all (+ data-parallel; "
     "tetrad's training defaults)", true},
    {"--schedule", &Options::schedule,
     "pipeline schedule: 1f1b | interleaved (parallel.schedule; default: the config's)"},
    {"--virtual-stages", &Options::virtual_stages,
     "model chunks per pipeline stage, interleaved (parallel.virtual_stages)"},
    {"--no-pipeline", &Options::no_pipeline, "only grids with Gp = 1"},
    {"--no-context", &Options::no_context, "only grids with Gc = 1 (no context-parallel axis)"},
    {"--cp-comm", &Options::cp_comm,
     "how a context axis C > 1 exchanges keys and values: auto (the faster per grid) | ring | "
     "all-gather (parallel.cp_comm)", true},
    {"--attention-kernel", &Options::attention_kernel,
     "fused (FlashAttention's way; tetrad's kernel) | materialized (the [S, S] scores written to "
     "memory, softmax and dropout passes between batched GEMMs: Megatron-LM before FlashAttention; "
     "needs --no-context)", true},
    {"--why", &Options::why,
     "one grid's step terms, collectives and memory items, valid or rejected (x,y,z,p,d or "
     "named, d=4,z=2)"},
    {"--top", &Options::top, "valid grids shown (0: all)", true},
    {"--rejected", &Options::show_rejected, "rejected grids shown (-1: all)", true},
    {"--json", &Options::json, "write the whole plan as JSON to this file ('-': stdout)"},
    {"--measure-machine", &Options::measure_out,
     "measure this machine (run under mpirun -n N for collectives among N ranks) and write its "
     "machine file"},
    {"--threads", &Options::threads, "threads per rank for --measure-machine", true},
    {"--quick", &Options::quick, "shorter --measure-machine"},
    {"--compare", &Options::compare,
     "JSON lines of `tetrad bench --grids --json`: predicted vs measured per grid"},
    {"--published-context", &Options::published_context,
     "TorchTitan's long-context rows (Llama 3.1 8B, 8 H100, 32K-256K tokens, CP 1-8): predicted vs reported"},
    {"--published", &Options::published, "the published rows of performance-model.md: predicted vs reported"},
    {"--sweep-grids", &Options::sweep_grids,
     "print the local validation sweep's grids of N ranks (pipeline grids included) as `tetrad "
     "bench --grids` arguments, one line each"},
};

void add_options(CLI::App& sub, Options& o) {
  for (const OptionRow& row : kOptions)
    std::visit(
        [&](auto field) {
          auto& target = o.*field;
          if constexpr (std::is_same_v<std::remove_reference_t<decltype(target)>, bool>) {
            sub.add_flag(row.flags, target, row.help);
          } else {
            CLI::Option* opt = sub.add_option(row.flags, target, row.help);
            if (row.show_default) opt->capture_default_str();
          }
        },
        row.field);
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
