// The trainer's state beside the weights, so a resumed run continues exactly where it stopped:
// step, random generator state, free-form JSON (data loader positions, config hash, learning
// rate schedule, ...) and the AdamW moments.
//
// File layout of trainer_state.bin (all integers little-endian; docs/checkpoints.md):
//   [0, 8)          magic "TTRDSTAT"
//   [8, 12)         u32 format version (1)
//   [12, 20)        u64 J, length of the JSON header
//   [20, 20+J)      JSON: {"step": S, "rng_state": [u64, ...], "info": {...},
//                          "arrays": [{"name": "adam_m", "dtype": "F32", "numel": N}, {... "adam_v" ...}]}
//   then            the arrays in that order, float32
//   last 8 bytes    u64 XXH64 (seed 0) of every byte before it
//
// Not done here: sharded (per-rank) moments. A parallel run writes the one file from one rank
// with the streamed forms below, gathering one tensor per call.
// Failures (unreadable, truncated, corrupt, other version, wrong size) throw tetrad::Error
// naming the file.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tetrad/checkpoint/tensor_stream.hpp"

namespace tetrad {

struct TrainerState {
  int64_t step = 0;                 // optimizer steps done
  std::vector<uint64_t> rng_state;  // the trainer's generator state words
  nlohmann::json info = nlohmann::json::object();  // data positions, config hash, ...
  std::vector<float> adam_m, adam_v;  // same layout as the parameter buffer (ParamTable)
};

constexpr uint32_t kTrainerStateVersion = 1;

// Writes atomically (temporary file, fsync, rename). adam_m and adam_v must have equal sizes.
void save_trainer_state(const std::string& path, const TrainerState& state);
// The same from parts, for moments that live in the trainer's own flat buffers
// (adam_m, adam_v: numel floats each).
void save_trainer_state(const std::string& path, int64_t step, const std::vector<uint64_t>& rng_state,
                        const nlohmann::json& info, const float* adam_m, const float* adam_v,
                        size_t numel);

// The same file (byte for byte) from sources: each array is the concatenation of chunks of
// chunk_numel[i] floats (the ParamTable's tensors). Calls adam_m(i) for i = 0..n-1, then
// adam_v(i) for i = 0..n-1, exactly once each, in that order; one chunk is held in memory at a
// time. The checksum is computed while writing.
void save_trainer_state_streamed(const std::string& path, int64_t step,
                                 const std::vector<uint64_t>& rng_state, const nlohmann::json& info,
                                 const std::vector<int64_t>& chunk_numel, const TensorSource& adam_m,
                                 const TensorSource& adam_v);

// Reads and verifies the file; adam_m and adam_v must hold `expected_numel` floats each (the
// model's parameter count), else Error says how many they hold.
TrainerState load_trainer_state(const std::string& path, int64_t expected_numel);

// Verifies the structure and checksum while streaming the file; returns the state without the
// moment arrays (adam_m / adam_v empty). For checkpoint validation without the memory cost.
TrainerState verify_trainer_state(const std::string& path);

// Streaming load: verifies the whole file first (a streaming pass like verify_trainer_state,
// and that each array holds sum(chunk_numel) floats), so a damaged file is refused before any
// sink is called; then reads it again calling adam_m(i, data) for i = 0..n-1, then adam_v(i,
// data) for i = 0..n-1 (chunk i: chunk_numel[i] floats), one chunk in memory at a time, and
// checks the checksum again at the end (throws if the file changed in between). Returns the
// state with adam_m / adam_v empty. `already_verified`: the caller has just verified this file
// with verify_trainer_state; the first pass is skipped (the size check is still made before
// any sink is called).
TrainerState load_trainer_state_streamed(const std::string& path,
                                         const std::vector<int64_t>& chunk_numel,
                                         const TensorSink& adam_m, const TensorSink& adam_v,
                                         bool already_verified = false);

}  // namespace tetrad
