// `parallel.grid = "auto"` (`tetrad train --grid auto`): the planner's first choice among the
// grids the trainer can run, for the run's own model, batch and rank count, on the machine
// `parallel.machine` describes.
#pragma once
#include <string>

#include "tetrad/planner/planner.hpp"
#include "tetrad/train/config.hpp"

namespace tetrad::planner {

struct AutoGrid {
  Grid5 grid;
  std::string trainer_grid;  // "x,y,z,d" (or "x,y,z,p,d" once the trainer takes P)
  std::string why;           // a few lines: machine, prediction, runner-up, how many considered
};

// The planner input of a run config: global batch = micro_batch x grad_accum, the whole job's
// micro-batch, seq_len, train.precision ("auto" resolved as the trainer does), no
// recomputation, ZeRO 0 and no overlap (what the trainer does today).
PlanInput plan_input_of(const RunConfig& cfg, int ranks);

// Throws Error when no trainable grid is valid (naming the first rejections).
// `ranks_per_node`: > 0 replaces the machine file's (the launcher knows how many ranks share
// this node: OMPI_COMM_WORLD_LOCAL_SIZE).
AutoGrid choose_grid(const RunConfig& cfg, int ranks, int ranks_per_node);

// Ranks on this node as the launcher says (Open MPI, MPICH/Hydra, Slurm); 0 if unknown.
int launcher_ranks_per_node();

}  // namespace tetrad::planner
