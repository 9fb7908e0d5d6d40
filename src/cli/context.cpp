// What every command may use (cli/command.hpp): the MPI environment, model folder resolution.
#include <filesystem>
#include <iostream>

#include "cli/command.hpp"
#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/core/error.hpp"

namespace fs = std::filesystem;

namespace tetrad::cli {

bool Context::root() const { return !mpi || mpi->rank() == 0; }

std::string Context::resolve_model_dir(const std::string& path) {
  refuse_unfinished(path);  // what an interrupted export or import left is no model
  if (fs::exists(path + "/config.json")) return path;
  if (fs::exists(path + "/checkpoints")) {
    auto found = find_latest_checkpoint(path, std::cerr);
    if (found) return resolved_run_checkpoint = found->dir;
    fail("run folder '", path, "' has no checkpoint yet");
  }
  fail("'", path, "' is neither a model folder (config.json + model.safetensors) nor a run "
       "folder (checkpoints/)");
}

}  // namespace tetrad::cli
