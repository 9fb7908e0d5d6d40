// Checks of the planner against measurements (docs/planner.md, "Validation"):
//  - against `tetrad bench --grids --json` lines measured on this machine: predicted against
//    measured step time per grid, the rankings and their Spearman correlation;
//  - against published results (performance-model.md): the authors' configuration on a machine
//    file built from public specs only, predicted against reported throughput.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "tetrad/model/model_config.hpp"
#include "tetrad/planner/planner.hpp"

namespace tetrad::planner {

// named_model() plus the published models: "gpt-1t" (Narayanan et al. 2021: L=128, H=25600,
// 160 heads, S=2048, V=51200) and "gpt-80b" (Singh et al. 2023: L=42, H=12288, 96 heads, S=2048;
// V=51200 assumed). Both GPT blocks with FFN = 4H. The scaling series' GPT shapes (gpt-5b ...
// gpt-320b, gpt-175b), and "llama-405b" (Llama 3.1 405B's published shape: 126 layers, hidden
// 16384, 128 heads, 8 KV heads, FFN 53248, V = 128256, untied).
ModelConfig planner_model(const std::string& name);

// The local validation sweep (scripts/validate-planner.sh, docs/planner.md "Validation: on this
// machine"): `small` cut to 4 layers (so Gp = 4 still has a layer per stage) at 256 tokens per
// sequence, micro-batches of 4 sequences, and as many micro-batches per step as ranks, which every
// grid runs, pipeline or not (`bench --accumulate`), so all grids of a rank count do the same
// work per step and the pipeline's bubble shows: (2 - 1)/2 on 2 ranks; 1/4 and 3/4 on 4.
struct SweepConfig {
  std::string model = "small";
  int layers = 4, seq = 256, micro_batch = 4, micro_batches = 1;
  std::string schedule = "1f1b";
};
SweepConfig local_sweep_config(int ranks);
// The planner's input for that sweep on `ranks` ranks (what compare_with_bench rebuilds from the
// bench's JSON lines).
PlanInput sweep_plan_input(const SweepConfig& sc, int ranks);
// Every grid of `ranks` (pipeline grids included) the sweep's configuration divides over.
std::vector<GridShape> local_sweep_grids(int ranks);
// One line per grid: the `tetrad bench --grids` arguments that measure it.
std::string local_sweep_bench_args(int ranks);

struct MeasuredGrid {
  std::string config;
  GridShape grid;
  int ranks = 0;
  double measured_s = 0, predicted_s = 0;
  std::string dominant;
  std::string setting;  // what else differs between rows of one grid: "1f1b, m 4", "recompute full"
};
struct BenchComparison {
  std::vector<MeasuredGrid> rows;  // one per measured grid, in file order
  double spearman = 0;
  double top_choice_vs_best = 0;  // measured time of the predicted-fastest / measured best - 1
};
// Reads `tetrad bench --grids --json` lines (one group of ranks, one config per call: rows of
// other configs or rank counts are kept apart by the caller choosing the file).
BenchComparison compare_with_bench(const std::string& jsonl_path, const Machine& m);
std::string comparison_text(const BenchComparison& c, const std::string& title);

struct PublishedResult {
  std::string system, model, machine, configuration, metric;
  double reported = 0, predicted = 0;
  double predicted_without_contention = 0;  // the same with compute.collective_units = 0
  double error() const { return predicted / reported - 1; }
  double error_without_contention() const { return predicted_without_contention / reported - 1; }
  Estimate estimate;
  std::string assumptions;
};
// The two rows of performance-model.md, predicted with the shipped machine files (looked up by
// load_machine, so run from the source tree or an installed machines/ folder).
// `gemm_efficiency` > 0 replaces the machine files' value (the sensitivity table); `batch_80b`
// > 0 replaces the assumed global batch of the AxoNN row.
// `contention` false: the machine files' collective_units set to 0 (overlapped collectives free).
std::vector<PublishedResult> published_results(double gemm_efficiency = 0, int64_t batch_80b = 0,
                                               bool contention = true);
std::string published_text(const std::vector<PublishedResult>& rows);
// How the errors move with the one assumed number of the GPU files and the AxoNN row's batch.
std::string published_sensitivity_text();

}  // namespace tetrad::planner
