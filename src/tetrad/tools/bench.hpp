// `tetrad bench`: the standard configurations trained on random tokens, timed, and reported
// against this machine's own ceilings and (when available) PyTorch on the same CPU.
// See docs/benchmarks.md for what each number means.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

namespace tetrad {

struct RunConfig;

struct BenchOptions {
  std::vector<std::string> configs = {"tiny", "small", "gpt2-124m"};
  int steps = 5;
  int warmup = 2;
  int threads = 0;        // 0: all cores
  std::string json_path;  // also write one JSON object per line here
  std::string anchor_cmd; // "" = auto (python3 bench/pytorch_gpt2.py if torch imports), "none"
  std::string precision = "fp32";  // "fp32" | "bf16" (backend/precision.hpp)
  // bf16 GEMM layouts of the model: "auto" | "rule" | "tune" (train.gemm_layouts)
  std::string gemm_layouts = "auto";
  bool quick_ceilings = false;  // the longer measurement is steadier on a shared machine
  std::string trace_path;  // Chrome trace-event JSON of the timed steps ("": none)
  // --grids: "off" (every collective blocking), "on" (the parallel.* defaults), "both" (side by
  // side); grid: only this grid ("x,y,z,d" or "x,y,z,p,d"; "": every factorisation).
  std::string overlap = "both";
  std::string grid;
  // --grids: ZeRO stage and activation recomputation of the model (parallel.zero,
  // train.recompute).
  int zero = 0;
  std::string recompute = "none";
  // --grids with Gp > 1: micro-batches per step, schedule, chunks per stage; and (--grids) a
  // layer count replacing the configuration's (0: keep it).
  int micro_batches = 4;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  std::string pipeline_layers = "even";  // parallel.pipeline_layers: even | balanced | "3,1"
  int layers = 0;
  // --grids: Gp = 1 grids also run `micro_batches` micro-batches per step (gradient
  // accumulation, as train.grad_accum), so every grid of a sweep that mixes pipeline and
  // non-pipeline grids does the same work per step (the planner's validation).
  bool accumulate = false;
  // Tokens per sequence (0: the configuration's max_seq); at most max_seq.
  int seq = 0;
  // Sequences per step on one rank (0: the configuration's standard batch). Serial mode only.
  int batch = 0;
  // Where the serial model computes: "cpu", "cpu-strict", "cuda", "cuda:N" (backend::create;
  // train.device). Serial mode only; --grids runs on the CPU.
  std::string device = "cpu";
};

void run_bench(const BenchOptions& opt, std::ostream& out);

// The bench flags as the run configuration's keys, so that the trainer's resolver
// (train/run_plan.hpp: resolve_settings, resolve_run_plan) decides them as `tetrad train` would:
// --precision, --gemm-layouts (train.*) and --device; with --grids (`grids`) also --zero,
// --recompute, --schedule, --virtual-stages and --pipeline-layers (parallel.*, train.recompute).
// Throws Error for a --gemm-layouts other than auto, rule or tune.
RunConfig bench_settings(const BenchOptions& opt, bool grids);

// Parallel mode, run under mpirun: every grid of the world size that divides the model trains
// the configuration on the same global batch (its standard micro-batch); rank 0 prints tokens/s,
// the time split into compute, exposed communication and idle, the share of communication hidden
// behind compute (with overlap off and on, --overlap), per-rank memory of
// parameters + gradients + Adam against the serial figure / G, and each rank's peak resident
// memory during the steps against the formula of docs/parallel.md ("Memory per rank"). Compare
// with `tetrad bench` on one
// rank with as many threads as ranks here (bench/parallel.sh does both).
void run_bench_grids(const BenchOptions& opt, std::ostream& out);

}  // namespace tetrad
