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
// The *_streamed forms hold one tensor in memory at a time (TensorSource / TensorSink, see
// tensor_stream.hpp), for parallel runs in which no rank may hold the whole model.
//
// Not done here: coordination between ranks (only rank 0 calls these; in the streamed forms its
// callbacks may gather from / scatter to the other ranks). Locking against two writers of one
// run_dir is RunLock's (run_lock.hpp), taken by the trainer; the functions that change a run
// folder (save, publish, prune, clean_run_folder) are for its holder only. The finders
// (find_latest_checkpoint, resume_candidates, checkpoint_problem) only read. Failures writing throw tetrad::Error; damaged checkpoints found while
// looking for the latest are reported to the given stream and skipped.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "tetrad/checkpoint/tensor_stream.hpp"
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

// Writes exactly the same folder as save_run_checkpoint (the same bytes in model.safetensors,
// config.json and trainer_state.bin; the same temporary folder, rename, `latest` and pruning),
// from sources that provide one tensor at a time (numel = table.specs[i].numel floats, internal
// layout). Call order, part of the contract (a parallel caller runs a collective per call):
//   params(0), ..., params(n-1), then adam_m(0), ..., adam_m(n-1), then adam_v(0), ..., adam_v(n-1)
// with n = table.specs.size(), each exactly once. Nothing else is called back. If a source
// throws, the partial folder is removed and the exception propagates.
std::string save_run_checkpoint_streamed(const std::string& run_dir, const ModelConfig& cfg,
                                         const ParamTable& table, const TensorSource& params,
                                         const TensorSource& adam_m, const TensorSource& adam_v,
                                         int64_t step, const std::vector<uint64_t>& rng_state,
                                         const nlohmann::json& info,
                                         const CheckpointOptions& opts = {});

// Why the checkpoint folder `dir` cannot be resumed from, or nullopt if it is valid: files
// present, config.json readable, model.safetensors header valid, trainer_state.bin checksum and
// the recorded file hashes matching.
std::optional<std::string> checkpoint_problem(const std::string& dir);

struct FoundCheckpoint {
  std::string dir;  // run_dir/checkpoints/step_000123
  int64_t step = 0;
};

// The checkpoint to resume from: the one `latest` names if it is valid, else the newest valid
// step_* folder (saying on `log` which one and why). Read-only: leftovers of an interrupted save
// (a `.tmp` folder may be a running trainer's save in progress) are skipped, never removed.
// Returns nullopt when the run has no checkpoint at all; throws
// Error when it has checkpoints but none is valid (listing why each was rejected).
std::optional<FoundCheckpoint> find_latest_checkpoint(const std::string& run_dir, std::ostream& log);

// Every usable checkpoint, in the order to try them: the one `latest` names (if valid), then the
// other valid step_* folders, newest first (what is skipped and why goes to `log`; leftovers of
// interrupted saves are skipped; read-only). first_only: stop at the first. Empty when the run has no
// checkpoint; throws Error when it has some but none is valid. A sharded checkpoint's problem
// here is structural (metadata, files and sizes); its data checksums are verified by the load,
// so a caller falls back to the next candidate when a load fails.
std::vector<FoundCheckpoint> resume_candidates(const std::string& run_dir, std::ostream& log,
                                               bool first_only = false);

// After a complete folder run_dir/checkpoints/step_<step> is in place: replaces `latest` with
// its name (atomically) and, if `prune`, calls prune_checkpoints.
void publish_checkpoint(const std::string& run_dir, int64_t step, int keep_last, bool prune = true);
// Deletes the step folders of later steps (an abandoned timeline) and earlier ones beyond the
// newest keep_last - 1 (keep_last = 0: keeps all), except that the newest healthy checkpoint
// (checkpoint_healthy) is kept besides them when none of the kept ones is healthy; folders no
// resume can use (checkpoint_problem: half-deleted, damaged) do not count and are deleted. Each folder
// is renamed to step_N.pruning (atomically out of sight) before it is deleted.
void prune_checkpoints(const std::string& run_dir, int64_t step, int keep_last);
// What the trainer recorded about the loss at that checkpoint ("healthy": finite and not
// diverged, see trainer.cpp): true / false, or nullopt when not recorded or unreadable.
std::optional<bool> checkpoint_healthy(const std::string& dir);
// The steps of the complete checkpoint folders (step_*, renamed into place), newest first.
std::vector<int64_t> checkpoint_steps(const std::string& run_dir);
// For the run folder's lock holder, at start: removes what an interrupted save or prune left
// (step_N.tmp, *.tmp-*, *.old-*, step_N.pruning), saying so on `log`. Throws Error when one
// cannot be removed.
void clean_run_folder(const std::string& run_dir, std::ostream& log);

// Loads a checkpoint folder: weights into `params` (checked against `cfg`, see load_hf_params)
// and the trainer state (moments of table.total floats). Verifies the recorded file hashes.
TrainerState load_run_checkpoint(const std::string& dir, const ModelConfig& cfg,
                                 const ParamTable& table, float* params);

// The same, tensor by tensor. First everything load_run_checkpoint verifies (checkpoint_problem:
// recorded file hashes, trainer_state.bin checksum; config and tensor shapes against `cfg`), so
// a damaged or mismatching checkpoint is refused before any sink is called. Then, in this order
// (part of the contract, as for the save):
//   params(0..n-1), then adam_m(0..n-1), then adam_v(0..n-1)
// each with table.specs[i].numel floats in internal layout, valid during the call only.
// Returns step, rng_state and info (without the reserved checkpoint_files key); adam_m and
// adam_v are left EMPTY. (A trainer_state.bin whose checksum verifies but whose moments have the
// wrong length is only detected after the params sinks ran.)
TrainerState load_run_checkpoint_streamed(const std::string& dir, const ModelConfig& cfg,
                                          const ParamTable& table, const TensorSink& params,
                                          const TensorSink& adam_m, const TensorSink& adam_v);

}  // namespace tetrad
