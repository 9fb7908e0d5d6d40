// The one model for the commands that read a model (eval, generate, logits, memorization): a
// Hugging Face folder's weights in a parallel::ParallelTransformer on a process grid, fp32 GEMMs.
// Grid 1x1x1x1 (one process, no MPI needed) is the same code with trivial groups.
#pragma once
#include <memory>
#include <string>

#include "tetrad/model/model_config.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"

namespace tetrad {

struct InferenceModel {
  std::unique_ptr<parallel::ProcessGroups> groups;  // the model keeps a reference: stable address
  std::unique_ptr<parallel::ParallelTransformer> model;
  std::string grid;  // "x,y,z,d" as run
};

// The grid a read-only command runs on: `grid` ("x,y,z,d") when given, else all `world_size`
// ranks on the data axis ("1,1,1,n"; "1,1,1,1" for one process). Pipeline grids are refused
// (a stage holds only its own layers; decoding needs them all); so are context-parallel grids
// (c > 1) unless `context` (eval and logits: each rank takes its chunks of every sequence;
// decoding with a KV cache splits no sequence), naming `command`.
std::string inference_grid(const std::string& grid, int world_size, const char* command,
                           bool context = false);
// Ranks of this job: MPI_COMM_WORLD's size under mpirun, else 1.
int inference_world_size();

// Loads `dir` (config `mc`, checked as load_hf_params checks it) into the one model on `grid`
// (inference_grid's result; collective over MPI_COMM_WORLD, except "1,1,1,1": this process
// alone, each rank of an mpirun by itself) for micro-batches of
// local_batch sequences of up to max_len tokens per rank.
InferenceModel load_inference_model(const std::string& dir, const ModelConfig& mc,
                                    const std::string& grid, int local_batch, int max_len);

}  // namespace tetrad
