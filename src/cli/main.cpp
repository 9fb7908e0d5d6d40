// tetrad: the command-line front door. Thin: every command (cli/cmd_<name>.cpp) parses its
// options and calls library functions; main brings MPI up when launched by mpirun, picks the
// command and turns an error (tetrad::Error) into one clear message and exit status 1.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/core/signals.hpp"

namespace fs = std::filesystem;
using namespace tetrad;

namespace {

// Every command, in the order `tetrad --help` lists them (cli/command.hpp: adding one).
const cli::Command* const kCommands[] = {
    &cli::prepare_command,  &cli::tokenize_command,         &cli::train_command,
    &cli::config_doc_command, &cli::cpu_command,            &cli::eval_command,
    &cli::generate_command, &cli::bench_command,            &cli::report_command,
    &cli::export_command,   &cli::verify_command,           &cli::import_command,
    &cli::bench_checkpoint_command, &cli::memorization_command, &cli::logits_command,
    &cli::plan_command,
};

// Launched by mpirun / srun (the launcher sets these): bring MPI up for the whole process.
bool under_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_NUM_TASKS"})
    if (std::getenv(v)) return true;
  return false;
}

// On error under MPI, end the whole job at once: peers blocked in a collective would otherwise
// wait for their timeout.
int fatal(const comm::MpiEnvironment* mpi, const std::string& msg) {
  int rank = 0, size = 1;
  if (mpi) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  std::cerr << "tetrad: error" << (size > 1 ? " (rank " + std::to_string(rank) + ")" : "")
            << ": " << msg << std::endl;
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<comm::MpiEnvironment> mpi;
  if (under_mpi_launcher()) mpi = std::make_unique<comm::MpiEnvironment>(&argc, &argv);
  CLI::App app{"tetrad: train GPT-2 and Llama models, exactly and fast"};
  app.require_subcommand(1);
  struct Entry {
    const cli::Command* command;
    CLI::App* sub;
    cli::Runner run;
  };
  std::vector<Entry> entries;
  for (const cli::Command* c : kCommands) {
    CLI::App* sub = app.add_subcommand(c->name, c->usage);
    entries.push_back({c, sub, c->setup(*sub)});
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const Entry* chosen = nullptr;
  for (const Entry& e : entries)
    if (*e.sub) chosen = &e;
  if (!chosen) return 0;

  // A read-only command on a run folder reads its latest checkpoint; a trainer still running
  // there may prune that checkpoint meanwhile (renamed away, then deleted: files already open
  // stay readable, ones opened after are gone). Then the command starts again on the newest one.
  cli::Context ctx;
  ctx.mpi = mpi.get();
  for (int attempt = 0;; ++attempt) {
    ctx.resolved_run_checkpoint.clear();
    try {
      chosen->run(ctx);
    } catch (const Interrupted& e) {
      // Stopped by SIGINT/SIGTERM, its unfinished output removed (core/signals.hpp): status
      // 128 + the signal, as a shell reports a command that signal ended.
      if (mpi) return fatal(mpi.get(), e.what());
      std::cerr << "tetrad: " << e.what() << std::endl;
      return 128 + e.signal;
    } catch (const std::exception& e) {
      const std::string& dir = ctx.resolved_run_checkpoint;
      if (chosen->command->reads_a_model && attempt < 4 && !dir.empty() && !fs::exists(dir)) {
        std::cerr << "tetrad: " << dir << " was pruned by the run's trainer while being read; "
                  << "reading the newest checkpoint instead\n";
        continue;
      }
      return fatal(mpi.get(), e.what());
    }
    return 0;
  }
}
