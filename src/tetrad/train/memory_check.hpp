// Before the model is allocated, on every rank: the memory the planner's formula gives for this
// run on this grid (weights, gradients, optimizer state, gathered weights, activations;
// planner.hpp), plus the backend's own workspace, must fit the memory this rank has on its device
// (train.memory_limit_mib, else Backend::memory_available() divided among the ranks that share
// the device), or the run stops with the formula's numbers (rather than allocating until the
// device runs out, or failing inside a step). The arithmetic is train/device_memory.hpp's.
#pragma once
#include <iosfwd>
#include <string>

#include "tetrad/backend/backend.hpp"
#include "tetrad/comm/communicator.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/options.hpp"
#include "tetrad/train/config.hpp"
#include "tetrad/train/run_plan.hpp"

namespace tetrad {

// Collective over `world` (every rank calls it). Root's "memory: formula ..." line is written
// (unless quiet) and flushed before the ranks decide together: a collective finds the lowest rank
// that does not fit, and every rank throws Error with that rank's message. (Deciding alone raced:
// a rank that stopped first made mpirun kill root before its line was out, and the log lost the
// figure the error is about.)
void check_memory_fits(const RunConfig& cfg, const RunPlan& plan, const Launch& launch,
                       backend::Backend& device, const comm::Communicator& world,
                       std::ostream& out, bool quiet);

// For the commands that build a model from a config file they did not write (a model folder's or
// checkpoint's config.json: import, export, generate, eval, logits, memorization): before
// anything of the model's size is allocated (even its parameter table), the parameters are
// counted arithmetically and `fp32_copies` copies of them (import, export: the whole model in
// memory), or the inference model's whole footprint on its grid (model_memory, the planner's
// formula) for local_batch sequences of max_len tokens, must fit this node's available host
// memory shared by its ranks; else Error naming `source`, the sizes it read, the bytes needed
// and the memory there is. No figure for the memory: not checked.
void check_model_fits_host(const ModelConfig& mc, const std::string& source,
                           const std::string& command, double fp32_copies);
void check_inference_fits_host(const ModelConfig& mc, const std::string& source,
                               const std::string& command, const parallel::GridShape& shape,
                               const parallel::GridCoord& coord, int local_batch, int max_len,
                               const parallel::ParallelOptions& options);
// The model's parameter count, as build_param_table would total it, without building the table
// (a config.json may give a billion layers).
double parameter_count(const ModelConfig& mc);

}  // namespace tetrad
