// tetrad: the command-line front door. Thin: every subcommand parses its options and calls one
// library function; errors (tetrad::Error) are printed as one clear message and exit status 1.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/data/prepare.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/model/sampling.hpp"
#include "tetrad/tools/bench.hpp"
#include "tetrad/tools/memorization.hpp"
#include "tetrad/train/config.hpp"
#include "tetrad/train/trainer.hpp"

namespace fs = std::filesystem;
using namespace tetrad;

namespace {

// A model folder given on the command line: a Hugging Face-format folder (config.json +
// model.safetensors) or a run folder, meaning its latest good checkpoint.
std::string resolve_model_dir(const std::string& path) {
  if (fs::exists(path + "/config.json")) return path;
  if (fs::exists(path + "/checkpoints")) {
    auto found = find_latest_checkpoint(path, std::cerr);
    if (found) return found->dir;
    fail("run folder '", path, "' has no checkpoint yet");
  }
  fail("'", path, "' is neither a model folder (config.json + model.safetensors) nor a run "
       "folder (checkpoints/)");
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
  prepare->add_option("-i,--input", prep.inputs, "text files or folders (*.txt)")->required();
  prepare->add_option("-o,--out", prep.out_dir, "output folder")->required();
  prepare->add_option("--tokenizer", prep.tokenizer_model,
                      "existing SentencePiece .model (default: train a BPE model)");
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

  // train
  std::string config_path;
  std::vector<std::string> overrides;
  TrainOptions topt;
  auto* train_cmd = app.add_subcommand("train", "train a model as the config says");
  train_cmd->add_option("-c,--config", config_path, "TOML config (docs/config.md)");
  train_cmd->add_option("-s,--set", overrides, "override: section.key=value (repeatable)");
  train_cmd->add_flag("--resume", topt.resume, "continue from the latest good checkpoint");
  std::string grid_arg;
  train_cmd->add_option("--grid", grid_arg,
                        "process grid x,y,z,d or x,y,z,p,d (same as --set parallel.grid=...); "
                        "run under mpirun -n with their product");
  auto* config_doc = app.add_subcommand("config-doc", "print the reference of every config key");

  // eval
  std::string model_dir, data_dir = "data/kjv", split = "val";
  int eval_batches = 20, eval_b = 4, eval_t = 0;
  auto* eval = app.add_subcommand("eval", "loss and perplexity of a model on a prepared split");
  eval->add_option("-m,--model", model_dir, "model folder or run folder")->required();
  eval->add_option("-d,--data", data_dir, "prepared data folder")->capture_default_str();
  eval->add_option("--split", split, "train | val")->capture_default_str();
  eval->add_option("--batches", eval_batches)->capture_default_str();
  eval->add_option("--micro-batch", eval_b)->capture_default_str();
  eval->add_option("--seq-len", eval_t, "default: the model's max_seq");

  // generate
  std::string prompt = "In the beginning";
  int max_new = 100;
  SamplingOptions sopt;
  uint64_t gen_seed = 1;
  auto* gen = app.add_subcommand("generate", "sample text from a model (KV cache)");
  gen->add_option("-m,--model", model_dir, "model folder or run folder")->required();
  gen->add_option("-p,--prompt", prompt)->capture_default_str();
  gen->add_option("-n,--max-new", max_new, "tokens to generate")->capture_default_str();
  gen->add_option("-t,--temperature", sopt.temperature, "0 = greedy")->capture_default_str();
  gen->add_option("--top-k", sopt.top_k, "0 = off")->capture_default_str();
  gen->add_option("--top-p", sopt.top_p, "nucleus mass, 1 = off")->capture_default_str();
  gen->add_option("--seed", gen_seed)->capture_default_str();

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
  bench->add_option("--layers", bopt.layers, "replace the configuration's layer count (0: keep)")
      ->capture_default_str();
  bench->add_option("--anchor", bopt.anchor_cmd,
                    "command running the PyTorch anchor (default: bench/pytorch_gpt2.py if "
                    "torch is importable; 'none' to skip)");

  // export
  std::string export_out;
  auto* exp = app.add_subcommand("export", "copy a run's latest checkpoint as a Hugging Face folder");
  exp->add_option("-m,--model", model_dir, "run folder or checkpoint")->required();
  exp->add_option("-o,--out", export_out, "output folder")->required();

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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (*prepare) {
      data::prepare_data(prep, std::cout);
    } else if (*config_doc) {
      std::cout << config_reference_markdown();
    } else if (*train_cmd) {
      if (!grid_arg.empty()) overrides.push_back("parallel.grid=\"" + grid_arg + "\"");
      RunConfig cfg = load_run_config(config_path, overrides);
      TrainResult r = train(cfg, topt, std::cout);
      if (!r.last_checkpoint.empty())
        std::cout << (r.stopped_by_signal ? "stopped" : "done") << " at step " << r.steps_done
                  << "; final checkpoint " << r.last_checkpoint << "\n";
    } else if (*eval) {
      const std::string dir = resolve_model_dir(model_dir);
      const double loss = evaluate_checkpoint(dir, data_dir, split, eval_b, eval_t, eval_batches,
                                              std::cout);
      std::cout << "loss " << loss << " | perplexity " << std::exp(loss) << "\n";
    } else if (*gen) {
      const std::string dir = resolve_model_dir(model_dir);
      const ModelConfig mc = read_hf_config(dir);
      if (!fs::exists(dir + "/tokenizer.model"))
        fail("model folder '", dir, "' has no tokenizer.model to encode the prompt with");
      auto tok = data::Tokenizer::load(dir + "/tokenizer.model");
      Transformer<float> model(mc, 1, mc.max_seq);
      load_hf_params(dir, mc, model.table(), model.params());
      Rng rng(gen_seed);
      std::vector<int32_t> ids = tok.encode(prompt);
      std::cout << prompt << std::flush;
      std::vector<int32_t> sofar;
      std::string printed;
      generate(model, ids, max_new, sopt, rng, tok.eos_id(), [&](int32_t t) {
        // Decode the whole continuation and print what is new, so multi-token characters and
        // SentencePiece's word-boundary spaces come out right while streaming.
        sofar.push_back(t);
        std::vector<int32_t> all = ids;
        all.insert(all.end(), sofar.begin(), sofar.end());
        const std::string text = tok.decode(all);
        const std::string base = tok.decode(ids);
        const std::string cont = text.substr(std::min(text.size(), base.size()));
        if (cont.size() > printed.size()) {
          std::cout << cont.substr(printed.size()) << std::flush;
          printed = cont;
        }
      });
      std::cout << "\n";
    } else if (*bench) {
      if (bench_grids) {
        if (!mpi) fail("bench --grids runs under mpirun (e.g. mpirun -n 2 tetrad bench --grids)");
        run_bench_grids(bopt, std::cout);
      } else {
        run_bench(bopt, std::cout);
      }
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
      Transformer<float> model(mc, 1, int(ids.size()));
      load_hf_params(dir, mc, model.table(), model.params());
      const float* lg = model.forward_logits(ids.data(), 1, int(ids.size()));
      std::ofstream f(logits_out, std::ios::binary);
      f.write(reinterpret_cast<const char*>(lg), std::streamsize(ids.size() * mc.vocab_size * sizeof(float)));
      if (!f) fail("cannot write '", logits_out, "'");
      std::cout << "wrote logits [" << ids.size() << ", " << mc.vocab_size << "] to " << logits_out << "\n";
    } else if (*exp) {
      const std::string dir = resolve_model_dir(model_dir);
      const ModelConfig mc = read_hf_config(dir);
      std::vector<float> params(build_param_table(mc).total);
      const ParamTable table = build_param_table(mc);
      load_hf_params(dir, mc, table, params.data());
      save_hf(export_out, mc, table, params.data());
      if (fs::exists(dir + "/tokenizer.model"))
        fs::copy_file(dir + "/tokenizer.model", export_out + "/tokenizer.model",
                      fs::copy_options::overwrite_existing);
      std::cout << "exported " << dir << " -> " << export_out << "\n";
    }
  } catch (const std::exception& e) {
    return fatal(e.what());
  }
  return 0;
}
