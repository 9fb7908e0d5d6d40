// Checkpoints of a training run, and finding the one to resume from.
//
//   run_dir/checkpoints/
//     step_000100/            model.safetensors, config.json (an HF folder: transformers loads it
//                             as is), tokenizer.model (if given), trainer_state.bin
//     step_000200/
//     latest                  "step_000200\n", replaced atomically
//
// A checkpoint is built in `step_000200.tmp/`, every file fsync'ed, and renamed into place;
// only then is `latest` updated and older checkpoints pruned. trainer_state.bin is written last
// and records the XXH64 of the folder's other files (info["checkpoint_files"]), so a folder is
// valid when its trainer state verifies and every file hashes to what it records.
//
// Not done here: coordination between ranks (only rank 0 calls these), locking against two
// writers of one run_dir. Failures writing throw tetrad::Error; damaged checkpoints found while
// looking for the latest are reported to the given stream and skipped.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>

#include "tetrad/checkpoint/trainer_state.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"

namespace tetrad {

struct CheckpointOptions {
  std::string tokenizer_path;     // copied into the checkpoint as tokenizer.model if non-empty
  int keep_last = 3;              // complete checkpoints kept, the new one included (0: keep all)
  nlohmann::json extra_metadata;  // passed to the safetensors metadata (see save_hf)
};

// "step_000123" (six digits at least; more when the step needs them).
std::string checkpoint_folder_name(int64_t step);

// Writes run_dir/checkpoints/step_<state.step>/ as described above and returns its path.
// An existing folder of the same step is replaced. Afterwards, checkpoints of later steps
// (left from a timeline this run abandoned by resuming from an earlier one) are deleted, and of
// the earlier ones only the newest keep_last - 1 are kept.
std::string save_run_checkpoint(const std::string& run_dir, const ModelConfig& cfg,
                                const ParamTable& table, const float* params,
                                const TrainerState& state, const CheckpointOptions& opts = {});

// Why the checkpoint folder `dir` cannot be resumed from, or nullopt if it is valid: files
// present, config.json readable, model.safetensors header valid, trainer_state.bin checksum and
// the recorded file hashes matching.
std::optional<std::string> checkpoint_problem(const std::string& dir);

struct FoundCheckpoint {
  std::string dir;  // run_dir/checkpoints/step_000123
  int64_t step = 0;
};

// The checkpoint to resume from: the one `latest` names if it is valid, else the newest valid
// step_* folder (saying on `log` which one and why). Leftover `.tmp` folders and files from an
// interrupted save are removed. Returns nullopt when the run has no checkpoint at all; throws
// Error when it has checkpoints but none is valid (listing why each was rejected).
std::optional<FoundCheckpoint> find_latest_checkpoint(const std::string& run_dir, std::ostream& log);

// Loads a checkpoint folder: weights into `params` (checked against `cfg`, see load_hf_params)
// and the trainer state (moments of table.total floats). Verifies the recorded file hashes.
TrainerState load_run_checkpoint(const std::string& dir, const ModelConfig& cfg,
                                 const ParamTable& table, float* params);

}  // namespace tetrad
