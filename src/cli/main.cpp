// tetrad: the command-line front door. Thin: every subcommand parses its options and calls one
// library function; errors (tetrad::Error) are printed as one clear message and exit status 1.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/checkpoint/sharded_saver.hpp"
#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/backend/backend.hpp"
#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/hash.hpp"
#include "tetrad/data/prepare.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/model/sampling.hpp"
#include "tetrad/train/auto_grid.hpp"
#include "tetrad/planner/machine.hpp"
#include "tetrad/planner/planner.hpp"
#include "tetrad/planner/scaling.hpp"
#include "tetrad/planner/validate.hpp"
#include "tetrad/tools/bench.hpp"
#include "tetrad/tools/checkpoint_bench.hpp"
#include "tetrad/tools/memorization.hpp"
#include "tetrad/tools/report.hpp"
#include "tetrad/train/config.hpp"
#include "tetrad/train/inference.hpp"
#include "tetrad/train/trainer.hpp"

namespace fs = std::filesystem;
using namespace tetrad;

namespace {

// A model folder given on the command line: a Hugging Face-format folder (config.json +
// model.safetensors) or a run folder, meaning its latest good checkpoint.
// The checkpoint resolve_model_dir chose in a run folder ("" when given a model folder).
std::string g_resolved_run_checkpoint;

std::string resolve_model_dir(const std::string& path) {
  if (fs::exists(path + "/config.json")) return path;
  if (fs::exists(path + "/checkpoints")) {
    auto found = find_latest_checkpoint(path, std::cerr);
    if (found) return g_resolved_run_checkpoint = found->dir;
    fail("run folder '", path, "' has no checkpoint yet");
  }
  fail("'", path, "' is neither a model folder (config.json + model.safetensors) nor a run "
       "folder (checkpoints/)");
}

// `tetrad tokenize`: standard input line by line (without its '\n' and a '\r' before it).
void run_tokenize_command(const std::string& path, bool decode) {
  std::string where = path;
  if (fs::is_directory(path) && fs::exists(path + "/checkpoints")) where = resolve_model_dir(path);
  const data::Tokenizer tok = data::Tokenizer::load(where);
  std::ios::sync_with_stdio(false);
  std::string line, out;
  uint64_t number = 0;
  while (std::getline(std::cin, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out.clear();
    if (!decode) {
      const std::vector<int32_t> ids = tok.encode(line);
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ' ';
        out += std::to_string(ids[i]);
      }
    } else {
      std::vector<int32_t> ids;
      std::istringstream ss(line);
      for (std::string item; ss >> item;) {
        size_t used = 0;
        long long v = -1;
        try {
          v = std::stoll(item, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != item.size() || v < 0 || v >= tok.vocab_size())
          fail("standard input line ", number, ": '", item, "' is not a token id of this tokenizer (0..",
               tok.vocab_size() - 1, ")");
        ids.push_back(int32_t(v));
      }
      out = tok.decode(ids);
    }
    out += '\n';
    std::cout.write(out.data(), std::streamsize(out.size()));
  }
  if (std::cin.bad()) fail("error reading standard input");
  std::cout.flush();
}

// `tetrad plan`: one of --measure-machine, --compare, --published, or the plan itself.
void run_plan_command(const std::string& model, const std::vector<std::string>& sets,
                      const std::string& machine, int ranks, int64_t global_batch,
                      int64_t micro_batch, int64_t micro_batch_per_replica, int seq,
                      const std::string& precision, const std::string& recompute, int zero,
                      const std::string& overlap, bool no_pipeline, int top, int show_rejected,
                      const std::string& json_path, const std::string& measure_out, int threads,
                      bool quick, const std::string& compare, bool published, bool under_mpi,
                      int sweep_ranks, const std::string& scaling, const std::vector<int>& rank_list,
                      const std::string& grids, const std::string& points_path,
                      const std::string& svg_path, bool published_scaling) {
  using namespace planner;
  if (sweep_ranks > 0) {  // the local validation sweep's grids, as `tetrad bench --grids` arguments
    std::cout << local_sweep_bench_args(sweep_ranks);
    return;
  }
  int rank = 0;
  if (under_mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (!measure_out.empty()) {
    const std::string stem = fs::path(measure_out).stem().string();
    const Machine m = measure_machine(stem, threads, quick);
    if (rank == 0) {
      std::ofstream f(measure_out);
      f << machine_to_toml(m) << std::flush;
      if (!f) fail("cannot write machine file '", measure_out, "'");
      std::cout << machine_to_toml(m) << "wrote " << measure_out << "\n";
    }
    return;
  }
  if (rank != 0) return;  // planning is serial: only rank 0 answers when launched under mpirun
  if (published_scaling) {
    std::cout << published_scaling_text(planner::published_scaling())
              << "\nSensitivity to the assumed global batches (every series' batch scaled):\n"
              << published_scaling_sensitivity_text();
    return;
  }
  if (published) {
    std::cout << published_text(published_results()) << "\nSensitivity to the assumed numbers:\n"
              << published_sensitivity_text();
    return;
  }
  if (machine.empty())
    fail("tetrad plan needs --machine (a file or one of the shipped names; "
         "tetrad plan --measure-machine FILE measures this one)");
  const Machine m = load_machine(machine);
  if (!compare.empty()) {
    std::cout << comparison_text(compare_with_bench(compare, m),
                                 "predicted (machine " + m.name + ") vs measured (" + compare + ")");
    return;
  }
  // `--scaling weak --model a,b,c`: one named model per point; the first sets up the input.
  std::vector<std::string> model_list;
  if (model.find(',') != std::string::npos) {
    if (scaling.empty()) fail("--model '", model, "': a list of models needs --scaling weak");
    std::stringstream ms(model);
    for (std::string tok; std::getline(ms, tok, ',');) model_list.push_back(tok);
  }
  const std::string model0 = model_list.empty() ? model : model_list.front();
  PlanInput in;
  RunConfig cfg;
  if (model0.ends_with(".toml")) {
    cfg = load_run_config(model0, sets);
    in.model_name = cfg.model_name + " (" + model0 + ")";
    in.model = cfg.model;
  } else {
    cfg = load_run_config("", sets);
    std::vector<std::string> model_sets;
    for (const auto& s : sets)
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
  in.seq = seq > 0 ? seq : cfg.train.seq_len;
  in.micro_batch = micro_batch;
  in.micro_batch_per_replica = micro_batch_per_replica;
  if (micro_batch == 0 && micro_batch_per_replica == 0) in.micro_batch = cfg.train.micro_batch;
  in.global_batch = global_batch > 0 ? global_batch
                                     : (in.micro_batch > 0 ? in.micro_batch : 1) * cfg.train.grad_accum;
  if (!precision.empty()) in.precision = parse_precision(precision);
  else if (model0.ends_with(".toml"))  // as the trainer resolves it on the CPU
    in.precision = plan_input_of(cfg, 1, backend::cpu_backend()).precision;
  // Unset on the command line: the config's train.recompute and parallel.zero (their defaults,
  // none and 0, for a named model), as the trainer would run it.
  in.recompute = parse_recompute(recompute.empty() ? cfg.train.recompute : recompute);
  in.zero = zero >= 0 ? zero : cfg.zero;
  in.overlap = parse_overlap(overlap);
  // Pipeline schedule as the trainer reads it (parallel.schedule, parallel.virtual_stages; the
  // config's validation already refused virtual stages without interleaving).
  in.schedule = parse_pipeline_schedule(cfg.schedule);
  in.virtual_stages = cfg.virtual_stages;
  in.pipeline_layers = cfg.pipeline_layers;
  in.ranks = ranks > 0 ? ranks : m.ranks_per_node;
  in.allow_pipeline = !no_pipeline;
  if (!scaling.empty()) {
    ScalingSpec spec;
    spec.kind = parse_scaling_kind(scaling);
    spec.base = in;
    spec.ranks = rank_list;
    for (const auto& n : model_list) {
      spec.model_names.push_back(n);
      spec.models.push_back(planner_model(n));
    }
    if (!grids.empty()) spec.grids = parse_grid_list(grids);
    const auto pts = scaling_curve(spec, m);
    const std::vector<ReferencePoint> refs =
        points_path.empty() ? std::vector<ReferencePoint>{} : load_reference_points(points_path);
    if (json_path == "-") {
      std::cout << scaling_json(spec, m, pts).dump(2) << "\n";
    } else {
      std::cout << scaling_text(spec, m, pts);
      if (!refs.empty()) {
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
    }
    if (!json_path.empty() && json_path != "-") {
      std::ofstream f(json_path);
      f << scaling_json(spec, m, pts).dump(2) << "\n";
      if (!f) fail("cannot write '", json_path, "'");
      std::cout << "wrote " << json_path << "\n";
    }
    if (!svg_path.empty()) {
      std::ofstream f(svg_path);
      f << scaling_svg(spec, m, pts, refs);
      if (!f) fail("cannot write '", svg_path, "'");
      if (json_path != "-") std::cout << "wrote " << svg_path << "\n";
    }
    return;
  }
  if (!grids.empty() || !points_path.empty() || !svg_path.empty())
    fail("--grids, --points and --svg belong to a scaling curve (--scaling weak|strong)");
  const auto p = plan(in, m);
  if (json_path == "-") {
    std::cout << plan_json(in, m, p).dump(2) << "\n";
    return;
  }
  std::cout << plan_text(in, m, p, show_rejected, top);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << plan_json(in, m, p).dump(2) << "\n" << std::flush;
    if (!f) fail("cannot write '", json_path, "'");
    std::cout << "wrote " << json_path << "\n";
  }
}

// Range checks for command-line numbers that also catch NaN and infinity (CLI::Range lets NaN
// through: every comparison with it is false).
std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
CLI::Validator finite_at_least(double lo, const std::string& what) {
  return CLI::Validator(
      [lo, what](std::string& in) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        if (end == in.c_str() || *end != '\0' || !std::isfinite(v) || !(v >= lo))
          return what + " must be a finite number >= " + number_text(lo) + ", got '" + in + "'";
        return std::string();
      },
      ">= " + number_text(lo));
}
CLI::Validator int_in(long long lo, long long hi, const std::string& what) {
  return CLI::Validator(
      [lo, hi, what](std::string& in) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(in.c_str(), &end, 10);
        if (end == in.c_str() || *end != '\0' || errno == ERANGE || v < lo || v > hi)
          return what + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                 "], got '" + in + "'";
        return std::string();
      },
      "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}
CLI::Validator probability_mass(const std::string& what) {
  return CLI::Validator(
      [what](std::string& in) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        if (end == in.c_str() || *end != '\0' || !(v > 0 && v <= 1))
          return what + " must be a number in (0, 1], got '" + in + "'";
        return std::string();
      },
      "(0, 1]");
}

}  // namespace

// Launched by mpirun / srun (the launcher sets these): bring MPI up for the whole process.
bool under_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_NUM_TASKS"})
    if (std::getenv(v)) return true;
  return false;
}

int main(int argc, char** argv) {
  std::unique_ptr<comm::MpiEnvironment> mpi;
  if (under_mpi_launcher()) mpi = std::make_unique<comm::MpiEnvironment>(&argc, &argv);
  // On error under MPI, end the whole job at once: peers blocked in a collective would otherwise
  // wait for their timeout.
  auto fatal = [&](const std::string& msg) {
    int rank = 0, size = 1;
    if (mpi) {
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    std::cerr << "tetrad: error" << (size > 1 ? " (rank " + std::to_string(rank) + ")" : "")
              << ": " << msg << std::endl;
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  };
  CLI::App app{"tetrad: train GPT-2 and Llama models, exactly and fast"};
  app.require_subcommand(1);

  // prepare
  data::PrepareOptions prep;
  auto* prepare = app.add_subcommand("prepare", "text files -> tokenizer + token shards");
  prepare->add_option("-i,--input", prep.inputs,
                      "text or JSON-lines files (*.jsonl, one document per line), or folders of "
                      "them")->required();
  prepare->add_option("--text-field", prep.text_field,
                      "JSON lines: the field holding each document's text")->capture_default_str();
  prepare->add_flag("--skip-bad-lines", prep.skip_bad_lines,
                    "JSON lines: skip lines that are not JSON objects with the text field (counted) "
                    "instead of failing on the first");
  prepare->add_option("-o,--out", prep.out_dir, "output folder")->required();
  prepare->add_option("--tokenizer", prep.tokenizer_model,
                      "the model's tokenizer: a tokenizer.json, a SentencePiece .model, or a model folder "
                      "holding either (default: train a SentencePiece BPE model)");
  prepare->add_option("--vocab-size", prep.vocab_size, "vocabulary of the trained tokenizer")
      ->capture_default_str();
  prepare->add_option("--val-fraction", prep.val_fraction, "documents held out for validation")
      ->capture_default_str();
  prepare->add_option("--doc-split", prep.doc_split,
                      "auto | file | blank-line | line | kjv-chapter")->capture_default_str();
  prepare->add_option("--seed", prep.seed)->capture_default_str();
  prepare->add_option("--canary", prep.canaries,
                      "a document to insert into the training split (repeatable; memorization "
                      "experiments)");
  prepare->add_option("--canary-repeats", prep.canary_repeats,
                      "copies of each canary: one count for all, or one per --canary")
      ->delimiter(',');

  // tokenize
  std::string tokenize_path;
  bool tokenize_decode = false;
  auto* tokenize_cmd = app.add_subcommand(
      "tokenize", "token ids of each line of standard input, one output line each (no BOS/EOS)");
  tokenize_cmd->add_option("--tokenizer", tokenize_path,
                           "tokenizer.json, SentencePiece .model, or a model, data or run folder "
                           "holding one")->required();
  tokenize_cmd->add_flag("--decode", tokenize_decode,
                         "the reverse: lines of space-separated ids in, their text out");

  // train
  std::string config_path;
  std::vector<std::string> overrides;
  TrainOptions topt;
  auto* train_cmd = app.add_subcommand("train", "train a model as the config says");
  train_cmd->add_option("-c,--config", config_path, "TOML config (docs/config.md)");
  train_cmd->add_option("-s,--set", overrides, "override: section.key=value (repeatable)");
  train_cmd->add_flag("--resume", topt.resume, "continue from the latest good checkpoint");
  train_cmd->add_flag("--overwrite", topt.overwrite,
                      "run.dir already holds checkpoints: delete them and start afresh (without "
                      "this or --resume such a folder is refused)");
  std::string device_arg;
  train_cmd->add_option("--device", device_arg,
                        "where the model computes: cpu, cpu-strict, cuda, cuda:N (same as --set "
                        "train.device=...)");
  std::string grid_arg;
  train_cmd->add_option("--grid", grid_arg,
                        "process grid x,y,z,d or x,y,z,p,d (same as --set parallel.grid=...); "
                        "run under mpirun -n with their product");
  train_cmd->add_option("--trace", topt.trace_path,
                        "write a Chrome trace-event JSON timeline (every rank's compute and "
                        "communication; open in https://ui.perfetto.dev)");
  train_cmd->add_option("--trace-steps", topt.trace_steps, "steps on the timeline")
      ->capture_default_str();
  auto* config_doc = app.add_subcommand("config-doc", "print the reference of every config key");
  auto* cpu_cmd = app.add_subcommand(
      "cpu", "what this CPU runs: features, kernel paths, bf16 GEMMs, what precision auto picks");

  // eval
  std::string model_dir, data_dir = "data/kjv", split = "val";
  int eval_batches = 20, eval_b = 4, eval_t = 0;
  auto* eval = app.add_subcommand("eval", "loss and perplexity of a model on a prepared split");
  eval->add_option("-m,--model", model_dir, "model folder or run folder")->required();
  eval->add_option("-d,--data", data_dir, "prepared data folder")->capture_default_str();
  eval->add_option("--split", split, "train | val")->capture_default_str();
  eval->add_option("--batches", eval_batches)->capture_default_str()
      ->check(int_in(1, 1 << 30, "--batches"));
  eval->add_option("--micro-batch", eval_b)->capture_default_str()
      ->check(int_in(1, 1 << 20, "--micro-batch"));
  eval->add_option("--seq-len", eval_t, "default: the model's max_seq")
      ->check(int_in(0, 1 << 24, "--seq-len"));
  std::string eval_grid;
  eval->add_option("--grid", eval_grid,
                   "under mpirun: process grid x,y,z,d (default 1,1,1,<ranks>); the micro-batches "
                   "are dealt out over Z x D, rank 0 prints");

  // generate
  std::string prompt = "In the beginning";
  int max_new = 100;
  SamplingOptions sopt;
  uint64_t gen_seed = 1;
  auto* gen = app.add_subcommand("generate", "sample text from a model (KV cache)");
  gen->add_option("-m,--model", model_dir, "model folder or run folder")->required();
  gen->add_option("-p,--prompt", prompt)->capture_default_str();
  gen->add_option("-n,--max-new", max_new, "tokens to generate")->capture_default_str()
      ->check(int_in(1, 1 << 24, "-n/--max-new"));
  gen->add_option("-t,--temperature", sopt.temperature, "0 = greedy")->capture_default_str()
      ->check(finite_at_least(0, "-t/--temperature"));
  gen->add_option("--top-k", sopt.top_k, "0 = off")->capture_default_str()
      ->check(int_in(0, 1 << 30, "--top-k"));
  gen->add_option("--top-p", sopt.top_p, "nucleus mass, 1 = off")->capture_default_str()
      ->check(probability_mass("--top-p"));
  gen->add_option("--seed", gen_seed)->capture_default_str();
  std::string gen_grid;
  gen->add_option("--grid", gen_grid,
                  "under mpirun: process grid x,y,z,d (default 1,1,1,<ranks>); every rank decodes "
                  "the prompt with its share of the model, rank 0 prints");

  // bench
  BenchOptions bopt;
  auto* bench = app.add_subcommand("bench", "benchmark the standard configurations (fp32)");
  bench->add_option("--configs", bopt.configs, "names (tiny, small, gpt2-124m, llama-small, ...)")
      ->delimiter(',')->capture_default_str();
  bench->add_option("--steps", bopt.steps, "timed steps")->capture_default_str();
  bench->add_option("--warmup", bopt.warmup, "untimed steps first")->capture_default_str();
  bench->add_option("--threads", bopt.threads, "0 = all cores")->capture_default_str();
  bench->add_option("--precision", bopt.precision, "fp32 | bf16 (bf16 GEMM operands, fp32 accumulation)")
      ->capture_default_str();
  bench->add_option("--gemm-layouts", bopt.gemm_layouts,
                    "bf16 GEMM layouts: auto (tune where bf16 GEMMs are native), rule or tune "
                    "(train.gemm_layouts)")
      ->capture_default_str();
  bench->add_option("--json", bopt.json_path, "also write one JSON object per config here");
  bool bench_grids = false;
  bench->add_flag("--grids", bench_grids,
                  "parallel mode, under mpirun: every grid of the ranks on the same global batch");
  bench->add_option("--grid", bopt.grid, "with --grids: only this grid \"x,y,z,d\" or \"x,y,z,p,d\"");
  bench->add_option("--zero", bopt.zero, "with --grids: ZeRO stage over D (0, 1, 2)")
      ->capture_default_str();
  bench->add_option("--recompute", bopt.recompute,
                    "with --grids: activation recomputation (none, selective, full)")
      ->capture_default_str();
  bench->add_option("--micro-batches", bopt.micro_batches,
                    "with --grids and a pipeline grid: micro-batches per step")
      ->capture_default_str();
  bench->add_option("--schedule", bopt.schedule, "with --grids: pipeline schedule (1f1b, interleaved)")
      ->capture_default_str();
  bench->add_option("--virtual-stages", bopt.virtual_stages,
                    "with --grids: pipeline chunks per stage (interleaved)")
      ->capture_default_str();
  bench->add_option("--pipeline-layers", bopt.pipeline_layers,
                    "with --grids: layer split over the virtual stages (even, balanced, or counts "
                    "such as 3,1; parallel.pipeline_layers)")
      ->capture_default_str();
  bench->add_option("--layers", bopt.layers, "replace the configuration's layer count (0: keep)")
      ->capture_default_str();
  bench->add_flag("--accumulate", bopt.accumulate,
                  "with --grids: grids without a pipeline also run --micro-batches micro-batches per "
                  "step (gradient accumulation), so every grid does the same work per step");
  bench->add_option("--seq", bopt.seq, "tokens per sequence (0: the configuration's max_seq)")
      ->capture_default_str();
  bench->add_option("--batch", bopt.batch,
                    "sequences per step (0: the configuration's standard batch); not with --grids")
      ->capture_default_str();
  bench->add_option("--device", bopt.device,
                    "where the model computes: cpu, cpu-strict, cuda, cuda:N (train.device); not "
                    "with --grids")
      ->capture_default_str();
  bench->add_option("--anchor", bopt.anchor_cmd,
                    "command running the PyTorch anchor (default: bench/pytorch_gpt2.py if "
                    "torch is importable; 'none' to skip)");
  bench->add_option("--trace", bopt.trace_path,
                    "Chrome trace-event JSON of the timed steps (one file per grid and mode)");
  bench->add_option("--overlap", bopt.overlap,
                    "with --grids: a list of off, on (the parallel.* defaults), poll, thread (every "
                    "bit-identical overlap on, with either progress mode), chunked (the defaults "
                    "with 2 forward chunks); both = off,on")
      ->capture_default_str();

  // report
  std::string report_dir, report_out;
  auto* report = app.add_subcommand(
      "report", "one self-contained HTML page of a run: loss curves, speed, time breakdown, config");
  report->add_option("run_dir", report_dir, "run folder (metrics.jsonl, config.toml)")->required();
  report->add_option("-o,--out", report_out,
                     "output file (default NAME-report.html in the current folder, NAME the run "
                     "folder's name: report never writes into a run folder)");
  std::string report_trace;
  report->add_option("--trace", report_trace,
                     "trace of the run (`tetrad train --trace`; default RUN_DIR/trace.json if it "
                     "exists): adds where the exposed communication went");

  // export
  std::string export_out;
  auto* exp = app.add_subcommand("export", "copy a run's latest checkpoint as a Hugging Face folder");
  exp->add_option("-m,--model", model_dir, "run folder or checkpoint")->required();
  exp->add_option("-o,--out", export_out, "output folder")->required();

  // verify / import / bench-checkpoint
  auto* verify = app.add_subcommand(
      "verify", "check a checkpoint completely: metadata, every shard's every chunk checksum, load");
  verify->add_option("-m,--model", model_dir, "run folder (its `latest` checkpoint) or checkpoint folder")
      ->required();
  std::string import_hf, import_out, import_tokenizer;
  auto* imp = app.add_subcommand(
      "import", "make a run folder whose checkpoint (step 0, zero moments) is a Hugging Face model");
  imp->add_option("--hf", import_hf, "Hugging Face folder (config.json + model.safetensors)")->required();
  imp->add_option("-o,--out", import_out, "run folder to create")->required();
  imp->add_option("--tokenizer", import_tokenizer, "tokenizer file or folder to keep with it (default: the one in --hf)");
  CheckpointBenchOptions cbopt;
  auto* cbench = app.add_subcommand(
      "bench-checkpoint", "sharded checkpoint write/read bandwidth and async blocked time");
  cbench->add_option("--model-name", cbopt.model, "named model configuration")->capture_default_str();
  cbench->add_option("--dir", cbopt.dir, "run folder for the checkpoints (deleted first)")->required();
  cbench->add_option("--grid", cbopt.grid, "x,y,z,d (under mpirun)")->capture_default_str();
  cbench->add_option("--repeats", cbopt.repeats, "saves of each kind (median reported)")->capture_default_str();

  // memorization
  auto* memo = app.add_subcommand(
      "memorization", "extraction of training text: greedy continuation of each document's prefix");
  MemorizationCommand memo_cmd;
  memo->add_option("-m,--model", model_dir, "model folder or run folder")->required();
  memo->add_option("--prefix", memo_cmd.opt.prefix_len, "prefix tokens given")->capture_default_str();
  memo->add_option("--suffix", memo_cmd.opt.suffix_len, "tokens generated and compared")->capture_default_str();
  memo->add_option("--batch", memo_cmd.opt.batch, "documents decoded together (per rank)")->capture_default_str();
  memo->add_option("--json", memo_cmd.json_out, "also write the report as JSON");
  memo->add_option("--data", memo_cmd.data_dir,
                   "also take --samples windows of prefix+suffix tokens from this prepared data");
  memo->add_option("--split", memo_cmd.split, "split of --data")->capture_default_str();
  memo->add_option("--samples", memo_cmd.samples, "windows taken from --data, evenly spaced");
  memo->add_option("--grid", memo_cmd.grid,
                   "process grid x,y,z,d under mpirun (default: all ranks on the data axis)");
  memo->add_option("docs", memo_cmd.doc_files, "document files (one document each)");

  // logits (for checking against other implementations, e.g. scripts/hf_check.py)
  std::string tokens_csv, logits_out;
  auto* logits_cmd = app.add_subcommand(
      "logits", "write the logits [T, V] (float32, little-endian) of a token sequence");
  logits_cmd->add_option("-m,--model", model_dir, "model folder or run folder")->required();
  logits_cmd->add_option("--tokens", tokens_csv, "comma-separated token ids")->required();
  logits_cmd->add_option("-o,--out", logits_out, "output file")->required();
  std::string logits_grid;
  logits_cmd->add_option("--grid", logits_grid,
                         "under mpirun: process grid x,y,z,d (default 1,1,1,<ranks>); rank 0 "
                         "writes the file");

  // plan
  struct {
    std::string model = "small", machine, json, measure_out, compare, precision, schedule,
                recompute, overlap = "none", ranks_text, scaling, grids, points, svg;
    std::vector<std::string> sets;
    int64_t global_batch = 0, micro_batch = 0, micro_batch_per_replica = 0;
    int seq = 0, zero = -1, ranks = 0, top = 30, threads = 1, show_rejected = 20, virtual_stages = 0;
    int sweep_grids = 0;
    bool no_pipeline = false, published = false, quick = false, published_scaling = false;
  } po;
  auto* plan_cmd = app.add_subcommand(
      "plan", "predict step time and memory of every grid and rank them (docs/planner.md)");
  plan_cmd->add_option("--model", po.model,
                       "named model (tiny, small, gpt2-124m, llama-small, gpt-1t, gpt-80b) or a "
                       "TOML run config (its [model] and [train] sections)")->capture_default_str();
  plan_cmd->add_option("-s,--set", po.sets, "override in the config: section.key=value");
  plan_cmd->add_option("--machine", po.machine,
                       "machine file or name of a shipped one (machines/*.toml)");
  plan_cmd->add_option("--ranks", po.ranks_text,
                       "number of ranks (default: the machine's ranks per node); with --scaling a "
                       "list, 512,1024,2048");
  plan_cmd->add_option("--scaling", po.scaling,
                       "weak | strong: a scaling curve over the --ranks list (weak: --model a,b,c "
                       "one per point, or one model with the batch in proportion to the ranks)");
  plan_cmd->add_option("--grids", po.grids,
                       "with --scaling: the grid of each point instead of the fastest, "
                       "'x,y,z,p,d;x,y,z,p,d;...'");
  plan_cmd->add_option("--points", po.points,
                       "with --scaling: measured or published points to plot beside the prediction "
                       "(JSON: [{\"ranks\": 512, \"pflops\": 80.8, \"efficiency\": 1, \"label\": \"...\"}])");
  plan_cmd->add_option("--svg", po.svg, "with --scaling: write the plot (self-contained SVG) to this file");
  plan_cmd->add_flag("--published-scaling", po.published_scaling,
                     "the published scaling rows (AxoNN on Perlmutter, ORNL on Frontier): predicted vs reported");
  plan_cmd->add_option("--global-batch", po.global_batch,
                       "sequences per step (default: the config's micro_batch x grad_accum)");
  plan_cmd->add_option("--micro-batch", po.micro_batch,
                       "sequences per micro-batch of the whole job, split over Z x D "
                       "(train.micro_batch; default: the config's)");
  plan_cmd->add_option("--micro-batch-per-replica", po.micro_batch_per_replica,
                       "sequences per micro-batch per (z, d) replica instead (Megatron's meaning)");
  plan_cmd->add_option("--seq", po.seq, "tokens per sequence (default: the config's seq_len)");
  plan_cmd->add_option("--precision", po.precision,
                       "fp32 | bf16 (default: a config file's train.precision, else fp32)");
  plan_cmd->add_option("--recompute", po.recompute,
                       "none | selective | full (default: the config's train.recompute, else none)");
  plan_cmd->add_option("--zero", po.zero,
                       "ZeRO stage over the data axis: 0 | 1 | 2 (default: the config's parallel.zero, else 0)");
  plan_cmd->add_option("--overlap", po.overlap,
                       "none (every collective exposed) | tensor (AxoNN's OAR/ORS/OAG) | all (+ data-parallel; tetrad's training defaults)")
      ->capture_default_str();
  plan_cmd->add_option("--schedule", po.schedule,
                       "pipeline schedule: 1f1b | interleaved (parallel.schedule; default: the config's)");
  plan_cmd->add_option("--virtual-stages", po.virtual_stages,
                       "model chunks per pipeline stage, interleaved (parallel.virtual_stages)");
  plan_cmd->add_flag("--no-pipeline", po.no_pipeline, "only grids with Gp = 1");
  plan_cmd->add_option("--top", po.top, "valid grids shown (0: all)")->capture_default_str();
  plan_cmd->add_option("--rejected", po.show_rejected, "rejected grids shown (-1: all)")->capture_default_str();
  plan_cmd->add_option("--json", po.json, "write the whole plan as JSON to this file ('-': stdout)");
  plan_cmd->add_option("--measure-machine", po.measure_out,
                       "measure this machine (run under mpirun -n N for collectives among N ranks) "
                       "and write its machine file");
  plan_cmd->add_option("--threads", po.threads, "threads per rank for --measure-machine")->capture_default_str();
  plan_cmd->add_flag("--quick", po.quick, "shorter --measure-machine");
  plan_cmd->add_option("--compare", po.compare,
                       "JSON lines of `tetrad bench --grids --json`: predicted vs measured per grid");
  plan_cmd->add_flag("--published", po.published,
                     "the published rows of performance-model.md: predicted vs reported");
  plan_cmd->add_option("--sweep-grids", po.sweep_grids,
                       "print the local validation sweep's grids of N ranks (pipeline grids "
                       "included) as `tetrad bench --grids` arguments, one line each");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  // A read-only command on a run folder reads its latest checkpoint; a trainer still running
  // there may prune that checkpoint meanwhile (renamed away, then deleted: files already open
  // stay readable, ones opened after are gone). Then the command starts again on the newest one.
  const bool reads_a_model = *eval || *gen || *logits_cmd || *exp || *memo || *verify;
  for (int attempt = 0;; ++attempt) {
  g_resolved_run_checkpoint.clear();
  try {
    if (*prepare) {
      data::prepare_data(prep, std::cout);
    } else if (*cpu_cmd) {
      const backend::PrecisionChoice p = backend::cpu_backend().auto_precision();
      std::cout << "cpu: " << cpu_features().summary() << "\n"
                << "bf16 GEMMs: " << backend::cpu_backend().capabilities().gemm_bf16_path << "\n"
                << "precision auto: " << backend::precision_name(p.precision) << " (" << p.why
                << ")\n"
                << "switches: TETRAD_MAX_CPU_ISA=scalar|avx2|avx512|avx512_bf16|amx caps the "
                   "kernels (and oneDNN); TETRAD_BF16=emulate; TETRAD_PRECISION_AUTO=fp32|bf16\n";
    } else if (*tokenize_cmd) {
      run_tokenize_command(tokenize_path, tokenize_decode);
    } else if (*config_doc) {
      std::cout << config_reference_markdown();
    } else if (*train_cmd) {
      if (!grid_arg.empty()) overrides.push_back("parallel.grid=\"" + grid_arg + "\"");
      if (!device_arg.empty()) overrides.push_back("train.device=\"" + device_arg + "\"");
      RunConfig cfg = load_run_config(config_path, overrides);
      TrainResult r = train(cfg, topt, std::cout);
      if (!r.last_checkpoint.empty() && (!mpi || mpi->rank() == 0))
        std::cout << (r.stopped_by_signal ? "stopped" : "done") << " at step " << r.steps_done
                  << "; final checkpoint " << r.last_checkpoint << "\n";
    } else if (*eval) {
      const std::string dir = resolve_model_dir(model_dir);
      const std::string grid = inference_grid(eval_grid, inference_world_size());
      const bool root = !mpi || mpi->rank() == 0;
      std::ostream null_stream(nullptr);
      std::ostream& eout = root ? std::cout : null_stream;
      const double loss = evaluate_checkpoint(dir, data_dir, split, eval_b, eval_t, eval_batches,
                                              eout, grid);
      eout << "loss " << loss << " | perplexity " << std::exp(loss) << "\n";
    } else if (*gen) {
      const std::string dir = resolve_model_dir(model_dir);
      const ModelConfig mc = read_hf_config(dir);
      const std::string tok_file = data::find_tokenizer_file(dir);
      if (tok_file.empty())
        fail("model folder '", dir, "' has no tokenizer.model or tokenizer.json to encode the prompt with");
      auto tok = data::Tokenizer::load(tok_file);
      sopt.vocab_limit = tok.vocab_size();  // a padded model vocabulary: ids past it have no text
      const std::string grid = inference_grid(gen_grid, inference_world_size());
      InferenceModel im = load_inference_model(dir, mc, grid, 1, mc.max_seq);
      const bool root = im.groups->world.rank() == 0;
      std::ostream null_stream(nullptr);
      std::ostream& gout = root ? std::cout : null_stream;
      Rng rng(gen_seed);  // the same seed on every rank: every rank samples the same tokens
      std::vector<int32_t> ids = tok.encode(prompt);
      gout << prompt << std::flush;
      std::vector<int32_t> sofar;
      std::string printed;
      generate(*im.model, ids, max_new, sopt, rng, tok.eos_id(), [&](int32_t t) {
        if (!root) return;
        // Decode the whole continuation and print what is new, so multi-token characters and
        // SentencePiece's word-boundary spaces come out right while streaming.
        sofar.push_back(t);
        std::vector<int32_t> all = ids;
        all.insert(all.end(), sofar.begin(), sofar.end());
        const std::string text = tok.decode(all);
        const std::string base = tok.decode(ids);
        const std::string cont = text.substr(std::min(text.size(), base.size()));
        // A character whose bytes are not all sampled yet decodes as U+FFFD: wait for the rest.
        if (cont.ends_with("\xEF\xBF\xBD")) return;
        if (cont.size() > printed.size()) {
          std::cout << cont.substr(printed.size()) << std::flush;
          printed = cont;
        }
      });
      gout << "\n";
    } else if (*bench) {
      if (bench_grids) {
        // Refused rather than ignored: the grid sweep builds its models on the CPU.
        if (bopt.device != "cpu")
          fail("bench --grids --device ", bopt.device, ": the grid sweep runs on the CPU only; "
               "drop --device, or time one device with `tetrad bench --device ", bopt.device, "`");
        if (bopt.batch != 0)
          fail("bench --grids --batch: the sweep uses each configuration's standard global batch");
        if (!mpi) fail("bench --grids runs under mpirun (e.g. mpirun -n 2 tetrad bench --grids)");
        run_bench_grids(bopt, std::cout);
      } else {
        run_bench(bopt, std::cout);
      }
    } else if (*report) {
      std::string name = fs::path(report_dir).lexically_normal().filename().string();
      if (name.empty() || name == ".") name = fs::absolute(report_dir).lexically_normal().parent_path().filename().string();
      const std::string path = report_out.empty() ? (name.empty() ? "run" : name) + "-report.html" : report_out;
      const std::string trace =
          report_trace.empty() && std::filesystem::exists(report_dir + "/trace.json")
              ? report_dir + "/trace.json" : report_trace;
      write_run_report(report_dir, path, trace);
      std::cout << "wrote " << path << "\n";
      if (!trace.empty()) {
        int ranks = 0;
        const auto rows = exposed_communication(trace, &ranks);
        std::cout << "exposed communication by collective (" << trace << ", per rank of " << ranks
                  << "):\n";
        for (const auto& r : rows)
          std::printf("  %-40s %8.1f waits %10.1f ms %5.1f%%\n", r.what.c_str(), r.count,
                      r.seconds * 1e3, 100 * r.share);
      }
    } else if (*plan_cmd) {
      // --schedule / --virtual-stages are the trainer's config keys; they go through its parser.
      if (!po.schedule.empty()) po.sets.push_back("parallel.schedule=" + po.schedule);
      if (po.virtual_stages > 0) po.sets.push_back("parallel.virtual_stages=" + std::to_string(po.virtual_stages));
      std::vector<int> rank_list;
      if (!po.ranks_text.empty()) {
        if (!po.scaling.empty()) {
          rank_list = planner::parse_rank_list(po.ranks_text);
        } else {
          const auto one = planner::parse_rank_list(po.ranks_text);
          if (one.size() != 1)
            fail("--ranks '", po.ranks_text, "': a list of rank counts needs --scaling weak|strong");
          po.ranks = one.front();
        }
      } else if (!po.scaling.empty()) {
        fail("--scaling needs --ranks with the rank counts of the curve, e.g. --ranks 512,1024,2048");
      }
      run_plan_command(po.model, po.sets, po.machine, po.ranks, po.global_batch, po.micro_batch,
                       po.micro_batch_per_replica, po.seq, po.precision, po.recompute, po.zero,
                       po.overlap, po.no_pipeline, po.top, po.show_rejected, po.json,
                       po.measure_out, po.threads, po.quick, po.compare, po.published, mpi != nullptr,
                       po.sweep_grids, po.scaling, rank_list, po.grids, po.points, po.svg,
                       po.published_scaling);
    } else if (*memo) {
      memo_cmd.model_dir = resolve_model_dir(model_dir);
      run_memorization_command(memo_cmd, std::cout);
    } else if (*logits_cmd) {
      const std::string dir = resolve_model_dir(model_dir);
      const ModelConfig mc = read_hf_config(dir);
      std::vector<int32_t> ids;
      std::stringstream ss(tokens_csv);
      for (std::string item; std::getline(ss, item, ',');) {
        try {
          ids.push_back(std::stoi(item));
        } catch (const std::exception&) {
          fail("--tokens: '", item, "' is not an integer token id");
        }
      }
      if (ids.empty()) fail("--tokens: no token ids given");
      if (int64_t(ids.size()) > mc.max_seq)
        fail("--tokens: ", ids.size(), " tokens but the model's maximum length is ", mc.max_seq);
      // On a grid every rank runs the sequence with its share of the model (each Z x D slot the
      // same one) and holds the whole-vocabulary logits; rank 0 writes them.
      const std::string grid = inference_grid(logits_grid, inference_world_size());
      InferenceModel im = load_inference_model(dir, mc, grid, 1, int(ids.size()));
      const float* lg = im.model->forward_logits(ids.data(), 1, int(ids.size()));
      if (im.groups->world.rank() == 0) {
        std::ofstream f(logits_out, std::ios::binary);
        f.write(reinterpret_cast<const char*>(lg), std::streamsize(ids.size() * mc.vocab_size * sizeof(float)));
        f.flush();
        if (!f) fail("cannot write '", logits_out, "'");
        std::cout << "wrote logits [" << ids.size() << ", " << mc.vocab_size << "] to " << logits_out << "\n";
      }
    } else if (*verify) {
      std::string dir = model_dir;
      if (fs::exists(model_dir + "/checkpoints")) {
        // The run's `latest` must name a complete checkpoint: no fallback here.
        const std::string latest = model_dir + "/checkpoints/latest";
        if (!fs::exists(latest)) fail("run folder '", model_dir, "' has no checkpoints/latest");
        std::string name = read_small_file(latest);
        while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
        dir = model_dir + "/checkpoints/" + name;
        g_resolved_run_checkpoint = dir;
      }
      // The tokenizer kept with the checkpoint must load (generate needs it) and, where the
      // checkpoint records the shards' tokenizer, be that one.
      auto verify_tokenizer = [&](uint64_t expected) -> std::string {
        const std::string path = data::find_tokenizer_file(dir);
        if (path.empty()) return "no tokenizer";
        const std::string file = fs::path(path).filename().string();
        uint64_t id = 0;
        try {
          id = data::Tokenizer::load(path).identity();
        } catch (const std::exception& e) {
          fail("checkpoint ", dir, ": ", file, " does not load (damaged?): ", e.what());
        }
        if (expected != 0 && id != expected)
          fail("checkpoint ", dir, ": ", file, " (identity ", hex64(id),
               ") is not the tokenizer the model was trained with (the checkpoint records ",
               hex64(expected), ")");
        return "tokenizer " + hex64(id) + " loads";
      };
      if (!is_sharded_checkpoint(dir)) {
        if (auto problem = checkpoint_problem(dir)) fail("checkpoint ", dir, ": ", *problem);
        const std::string tok = verify_tokenizer(0);
        std::cout << "ok: " << dir << " (Hugging Face folder + trainer_state.bin) verified, " << tok << "\n";
      } else {
        verify_sharded_checkpoint(dir);
        const ModelConfig mc = sharded_model_config(dir);
        const ParamTable table = build_param_table(mc);
        std::vector<float> params(size_t(table.total));
        const ShardedCheckpointInfo info = load_sharded_params(dir, mc, table, params.data());
        const nlohmann::json meta = read_sharded_meta(dir);
        int64_t bytes = 0;
        for (const auto& f : meta["files"]) bytes += f["data_bytes"].get<int64_t>();
        const std::string tok = verify_tokenizer(info.tokenizer_identity);
        std::cout << "ok: " << dir << " verified: step " << info.step << ", grid "
                  << info.grid.to_string() << ", " << meta["files"].size() << " shard file(s), "
                  << bytes << " bytes, every chunk checksum matches, loads; " << tok << "\n";
      }
    } else if (*imp) {
      const ModelConfig mc = read_hf_config(import_hf);
      const ParamTable table = build_param_table(mc);
      std::vector<float> params(size_t(table.total));
      load_hf_params(import_hf, mc, table, params.data());
      ShardedCheckpointInfo info;
      info.has_moments = false;
      std::string tok = import_tokenizer;
      if (!tok.empty() && fs::is_directory(tok)) tok = data::find_tokenizer_file(tok);
      if (tok.empty()) tok = data::find_tokenizer_file(import_hf);
      if (!tok.empty()) info.tokenizer_identity = data::Tokenizer::load(tok).identity();
      const std::string dir = save_sharded_checkpoint_serial(import_out, mc, table, params.data(),
                                                             nullptr, nullptr, info, tok, 0);
      std::cout << "imported " << import_hf << " -> " << dir << "\n";
    } else if (*cbench) {
      run_checkpoint_bench(cbopt, std::cout);
    } else if (*exp) {
      const std::string dir = resolve_model_dir(model_dir);
      const ModelConfig mc = read_hf_config(dir);
      std::vector<float> params(build_param_table(mc).total);
      const ParamTable table = build_param_table(mc);
      load_hf_params(dir, mc, table, params.data());
      // The tokenizer goes along, so the folder is complete for AutoTokenizer; its BOS/EOS ids
      // go into config.json.
      const std::string tok_file = data::find_tokenizer_file(dir);
      nlohmann::json extra = nlohmann::json::object();
      std::optional<data::Tokenizer> tok;
      if (!tok_file.empty()) {
        tok.emplace(data::Tokenizer::load(tok_file));
        if (tok->bos_id() >= 0) extra["bos_token_id"] = tok->bos_id();
        if (tok->eos_id() >= 0) extra["eos_token_id"] = tok->eos_id();
      }
      save_hf(export_out, mc, table, params.data(), extra);
      if (tok) data::write_hf_tokenizer_files(*tok, export_out, mc.max_seq);
      else std::cerr << "tetrad: warning: " << dir << " has no tokenizer; the exported folder has none\n";
      std::cout << "exported " << dir << " -> " << export_out << "\n";
    }
  } catch (const std::exception& e) {
    const std::string& dir = g_resolved_run_checkpoint;
    if (reads_a_model && attempt < 4 && !dir.empty() && !fs::exists(dir)) {
      std::cerr << "tetrad: " << dir << " was pruned by the run's trainer while being read; "
                << "reading the newest checkpoint instead\n";
      continue;
    }
    return fatal(e.what());
  }
  break;
  }
  return 0;
}
