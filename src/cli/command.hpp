// The `tetrad` commands: each one a file (cli/cmd_<name>.cpp) that adds its options to its
// CLI11 subcommand and returns what runs it; cli/main.cpp holds the table of them and dispatches.
//
// Adding a command: a file cli/cmd_<name>.cpp defining `const Command <name>_command`, its
// declaration below, and its row in kCommands (cli/main.cpp; the row's place is its place in
// `tetrad --help`). CMake globs src/cli/*.cpp.
//
// A command's options live in the closure setup returns (one std::shared_ptr'd struct), so they
// outlive the parse. What a command throws is printed by main as one `tetrad: error: ...` line
// and exit status 1 (under MPI the job is aborted, so peers do not wait in a collective).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace tetrad::comm {
class MpiEnvironment;
}

namespace tetrad::cli {

// What every command may use: the MPI environment and the model folder resolution.
struct Context {
  comm::MpiEnvironment* mpi = nullptr;  // null when not launched by mpirun / srun
  bool root() const;                    // rank 0, or not under MPI

  // The checkpoint resolve_model_dir chose in a run folder ("" when given a model folder). When
  // the command fails and that checkpoint is gone (pruned by a trainer still running there),
  // main runs the command again on the newest one.
  std::string resolved_run_checkpoint;

  // A model folder given on the command line: a Hugging Face-format folder (config.json +
  // model.safetensors) or a run folder, meaning its latest good checkpoint.
  std::string resolve_model_dir(const std::string& path);
};

using Runner = std::function<void(Context&)>;

struct Command {
  const char* name;
  const char* usage;  // one line in `tetrad --help`
  // Reads a run folder's latest checkpoint read-only: retried on the newest one when the run's
  // trainer pruned it meanwhile (see Context::resolved_run_checkpoint).
  bool reads_a_model;
  Runner (*setup)(CLI::App& sub);  // adds the options to `sub`; returns what runs the command
};

extern const Command prepare_command, tokenize_command, train_command, config_doc_command,
    cpu_command, eval_command, generate_command, bench_command, report_command, export_command,
    verify_command, import_command, bench_checkpoint_command, memorization_command,
    logits_command, plan_command;

// Flag checks shared by commands (cli/flags.cpp). Unlike CLI::Range they also refuse NaN and
// infinity (every comparison with NaN is false, so a range lets it through).
CLI::Validator finite_at_least(double lo, const std::string& what);
CLI::Validator int_in(long long lo, long long hi, const std::string& what);
CLI::Validator probability_mass(const std::string& what);  // (0, 1]

}  // namespace tetrad::cli
