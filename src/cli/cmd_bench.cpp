// `tetrad bench`: the standard configurations timed (tools/bench), or with --grids every grid of
// the ranks under mpirun.
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/tools/bench.hpp"

namespace tetrad::cli {

namespace {

struct Options {
  BenchOptions bench;
  bool grids = false;
};

void add_options(CLI::App& sub, Options& o) {
  BenchOptions& b = o.bench;
  sub.add_option("--configs", b.configs, "names (tiny, small, gpt2-124m, llama-small, ...)")
      ->delimiter(',')->capture_default_str();
  sub.add_option("--steps", b.steps, "timed steps")->capture_default_str();
  sub.add_option("--warmup", b.warmup, "untimed steps first")->capture_default_str();
  sub.add_option("--threads", b.threads, "0 = all cores")->capture_default_str();
  sub.add_option("--precision", b.precision, "fp32 | bf16 (bf16 GEMM operands, fp32 accumulation)")
      ->capture_default_str();
  sub.add_option("--gemm-layouts", b.gemm_layouts,
                 "bf16 GEMM layouts: auto (tune where bf16 GEMMs are native), rule or tune "
                 "(train.gemm_layouts)")
      ->capture_default_str();
  sub.add_option("--json", b.json_path, "also write one JSON object per config here");
  sub.add_flag("--grids", o.grids,
               "parallel mode, under mpirun: every grid of the ranks on the same global batch");
  // The grid sweep's own options: each says so in its help, and is refused without --grids.
  auto grids_option = [&](const char* name, auto& value, const std::string& help) {
    sub.add_option(name, value, "with --grids: " + help)->capture_default_str();
  };
  grids_option("--grid", b.grid, "only this grid \"x,y,z,d\" or \"x,y,z,p,d\"");
  grids_option("--zero", b.zero, "ZeRO stage over D (0, 1, 2; parallel.zero)");
  grids_option("--recompute", b.recompute,
               "activation recomputation (none, selective, full; train.recompute)");
  grids_option("--micro-batches", b.micro_batches, "micro-batches per step of a pipeline grid");
  grids_option("--schedule", b.schedule, "pipeline schedule (1f1b, interleaved; parallel.schedule)");
  grids_option("--virtual-stages", b.virtual_stages,
               "pipeline chunks per stage (interleaved; parallel.virtual_stages)");
  grids_option("--pipeline-layers", b.pipeline_layers,
               "layer split over the virtual stages (even, balanced, or counts such as 3,1; "
               "parallel.pipeline_layers)");
  grids_option("--layers", b.layers, "replace the configuration's layer count (0: keep)");
  grids_option("--overlap", b.overlap,
               "a list of off, on (the parallel.* defaults), poll, thread (every bit-identical "
               "overlap on, with either progress mode), chunked (the defaults with 2 forward "
               "chunks); both = off,on");
  sub.add_flag("--accumulate", b.accumulate,
               "with --grids: grids without a pipeline also run --micro-batches micro-batches per "
               "step (gradient accumulation), so every grid does the same work per step");
  sub.add_option("--seq", b.seq, "tokens per sequence (0: the configuration's max_seq)")
      ->capture_default_str();
  sub.add_option("--batch", b.batch,
                 "sequences per step (0: the configuration's standard batch); not with --grids")
      ->capture_default_str();
  sub.add_option("--device", b.device,
                 "where the model computes: cpu, cpu-strict, cuda, cuda:N (train.device); not "
                 "with --grids")
      ->capture_default_str();
  sub.add_option("--anchor", b.anchor_cmd,
                 "command running the PyTorch anchor (default: bench/pytorch_gpt2.py if "
                 "torch is importable; 'none' to skip)");
  sub.add_option("--trace", b.trace_path,
                 "Chrome trace-event JSON of the timed steps (one file per grid and mode)");
}

// The options that only the grid sweep reads (add_options' grids_option and --accumulate).
constexpr const char* kGridsOnly[] = {"--grid",   "--zero",          "--recompute",
                                      "--micro-batches", "--schedule", "--virtual-stages",
                                      "--pipeline-layers", "--layers", "--overlap",
                                      "--accumulate"};

void run(Context& ctx, const CLI::App& sub, const Options& o) {
  const BenchOptions& b = o.bench;
  if (!o.grids) {
    // Refused rather than ignored: the serial run times each configuration as named, on one rank.
    for (const char* name : kGridsOnly)
      if (sub.count(name) > 0)
        fail("bench ", name, ": only with --grids (the grid sweep under mpirun); the serial run "
             "times each configuration as named");
    run_bench(b, std::cout);
    return;
  }
  // Refused rather than ignored: the grid sweep builds its models on the CPU.
  if (b.device != "cpu")
    fail("bench --grids --device ", b.device, ": the grid sweep runs on the CPU only; "
         "drop --device, or time one device with `tetrad bench --device ", b.device, "`");
  if (b.batch != 0)
    fail("bench --grids --batch: the sweep uses each configuration's standard global batch");
  if (!ctx.mpi) fail("bench --grids runs under mpirun (e.g. mpirun -n 2 tetrad bench --grids)");
  run_bench_grids(b, std::cout);
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  add_options(sub, *o);
  return [o, app = &sub](Context& ctx) { run(ctx, *app, *o); };
}

}  // namespace

const Command bench_command{"bench", "benchmark the standard configurations (fp32)", false, &setup};

}  // namespace tetrad::cli
