// `parallel.grid = "auto"` (`tetrad train --grid auto`, and a multi-rank launch whose config
// names no grid): the planner's first choice among the grids the trainer can run, for the run's own model, batch and rank count, on the machine
// `parallel.machine` describes. The trainer's side of the planner: the conversion of a run
// config into a planner query lives here, with the trainer, so the planner (planner/) stays a
// pure cost model that knows nothing of run configs.
#pragma once
#include <string>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/planner/planner.hpp"
#include "tetrad/train/config.hpp"

namespace tetrad {

struct AutoGrid {
  parallel::GridShape grid;  // the grid the trainer builds its process groups on
  std::string why;           // a few lines: machine, prediction, runner-up, how many considered
};

// The planner input of a run config: global batch = micro_batch x grad_accum, the whole job's
// micro-batch, seq_len, train.precision ("auto" resolved on `device` as the trainer does,
// backend::resolve_precision), no recomputation, ZeRO 0 and no overlap (what the trainer does
// today).
planner::PlanInput plan_input_of(const RunConfig& cfg, int ranks, const backend::Backend& device);

// One model of `tetrad plan --model` (or of its comma list, one per point of --scaling weak): a
// TOML run config path (its [model] section, with the `overrides` that start with "model.") or
// a planner model name (planner::planner_model). `name` is what the tables print: the name, or
// the config's file name.
struct PlannerModel {
  ModelConfig model;
  std::string name;
};
PlannerModel planner_model_of(const std::string& name_or_toml, const std::vector<std::string>& overrides = {});
// "a.toml,gpt-10b,c.toml" -> each entry by planner_model_of; throws Error naming the entry (its
// position and text) that is empty, not a file, not a TOML config or not a model, and what is
// expected.
std::vector<PlannerModel> planner_model_list(const std::string& list, const std::vector<std::string>& overrides = {});

// Throws Error when no trainable grid is valid (naming the first rejections).
// `ranks_per_node`: > 0 replaces the machine file's (the launcher knows how many ranks share
// this node: OMPI_COMM_WORLD_LOCAL_SIZE).
// `device`: the run's backend (train.device), which says what precision "auto" means.
AutoGrid choose_grid(const RunConfig& cfg, int ranks, int ranks_per_node,
                     const backend::Backend& device);

// The grid a run trains on, and why (empty for a grid the config names): parallel.grid as
// given, "auto" as choose_grid, and a config that names no grid (parallel.grid = ""): 1x1x1x1
// on one rank, on more the planner's choice as for "auto", saying that no grid was named.
// Throws Error when the grid does not match `ranks` ("grid 2x2x1x1 needs 4 ranks but mpirun
// started 2 ..."): an explicit grid is never replaced by another. Every rank computes the same
// answer from the same inputs (config, rank count, machine file), so they agree without talking.
AutoGrid resolve_grid(const RunConfig& cfg, int ranks, int ranks_per_node,
                      const backend::Backend& device);

// Ranks on this node as the launcher says (Open MPI, MPICH/Hydra, Slurm); 0 if unknown.
int launcher_ranks_per_node();

}  // namespace tetrad
