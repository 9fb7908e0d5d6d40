// Before the model is allocated, on every rank: the memory the planner's formula gives for this
// run on this grid (weights, gradients, optimizer state, gathered weights, activations;
// planner.hpp), plus the backend's own workspace, must fit the memory this rank has on its device
// (train.memory_limit_mib, else Backend::memory_available() divided among the ranks that share
// the device), or the run stops with the formula's numbers (rather than allocating until the
// device runs out, or failing inside a step). The arithmetic is train/device_memory.hpp's.
#pragma once
#include <iosfwd>

#include "tetrad/backend/backend.hpp"
#include "tetrad/comm/communicator.hpp"
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

}  // namespace tetrad
