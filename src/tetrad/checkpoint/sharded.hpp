// Sharded checkpoints: every rank writes only the shards it owns (parameters and AdamW moments),
// in parallel, and any grid can load any other grid's checkpoint, each rank reading only the
// chunks that hold its elements (docs/checkpoints.md, "Sharded checkpoints").
//
//   step_000200/
//     meta.json            magic, version, step, grid, model config, tokenizer identity, data
//                          positions, every tensor's shape and dtype, and for every shard file
//                          its size, per-chunk XXH64 checksums and its pieces; self-checksummed
//     shard_00000.bin      64-byte header (magic TTRDSHRD, version, writer rank, step,
//     shard_00001.bin      checkpoint id, data size) + the pieces' float32 data
//     config.json          the Hugging Face config (tools that read a model folder)
//     tokenizer.model      copy of the run's tokenizer, when it has one
//
// A piece is one tensor's shard of one array (params, adam_m, adam_v) as written by one rank.
// Its elements are described as global flat indices of the whole tensor (row-major, internal
// layout): a list of strided runs (start, len, stride, count) = count segments of len elements
// at start + k * stride, in file order. This covers every ShardPlan layout (row/column blocks
// over X and Y, fused q|k|v row lists, then flattened and split over Z), so loading is an
// any-to-any interval intersection and does not depend on the saving grid's layout rules.
// Replicated shards (equal on several ranks) are written by one of them only.
//
// This module is the format: the file layout, snapshots and shard files, the metadata, checking
// and loading. Writing a checkpoint into a run folder (its step_N name, `latest`, pruning:
// run_checkpoint.hpp) is sharded_saver.hpp's, one level up, so that the run folder's rules,
// which know both formats, sit between the two.
// Thread-safety: the free functions are reentrant. MPI is only called from the calling thread.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/sharding.hpp"

namespace tetrad {

constexpr const char* kShardedMagic = "tetrad-sharded-checkpoint";
constexpr int kShardedVersion = 1;
constexpr const char* kShardedMetaFile = "meta.json";
constexpr int64_t kShardHeaderBytes = 64;
constexpr int64_t kShardChunkBytes = int64_t(1) << 20;  // checksum and read granularity
constexpr int kShardedArrays = 3;                      // params, adam_m, adam_v
const char* sharded_array_name(int array);             // "params", "adam_m", "adam_v"

// count segments of len elements starting at start + k * stride (k < count).
struct IndexRun {
  int64_t start = 0, len = 0, stride = 0, count = 0;
  bool operator==(const IndexRun&) const = default;
};

// The global flat indices of a rank's shard of tensor t (its local order), as strided runs.
std::vector<IndexRun> shard_index_runs(const parallel::TensorShard& t, const parallel::GridShape& grid,
                                       const parallel::GridCoord& coord);
// Whether the rank at `coord` writes its shard of t: one rank per distinct shard (data replica
// 0; Z coordinate 0 for tensors replicated over Z; y = 0 for ColsX, x = 0 for RowsY tensors).
bool writes_shard(const parallel::TensorShard& t, const parallel::GridCoord& coord);

// One piece of a shard file (see above). offset: bytes from the start of the data section.
struct ShardPiece {
  int array = 0;
  size_t tensor = 0;
  int64_t offset = 0, numel = 0;
  int64_t local_offset = 0;  // where the shard sits in the writer's local buffer
  std::vector<IndexRun> runs;
};
// The pieces the rank of `plan` writes, in file order (params, then adam_m, then adam_v; each
// in table order), with offsets assigned; total data bytes in *data_bytes.
std::vector<ShardPiece> shard_file_pieces(const parallel::ShardPlan& plan, int64_t* data_bytes);

std::string shard_file_name(int rank);  // "shard_00003.bin"

// What a checkpoint records beside the tensors.
struct ShardedCheckpointInfo {
  int64_t step = 0;
  parallel::GridShape grid;
  int virtual_stages = 1;           // pipeline chunks per stage of the saving grid (grid.p() > 1)
  // Layers of each of the saving grid's Gp x virtual_stages virtual stages (grid.p() > 1; empty:
  // the even split, which is what checkpoints written before uneven splits used).
  std::vector<int> pipeline_layers;
  uint64_t tokenizer_identity = 0;  // 0: unknown (not checked on load)
  nlohmann::json data = nlohmann::json::object();  // data loader positions (trainer-defined)
  nlohmann::json rng = nlohmann::json::object();   // random state (trainer-defined)
  nlohmann::json extra = nlohmann::json::object(); // anything else (config text, tokens seen)
  bool has_moments = true;  // false: params only (an imported model; moments load as zeros)
};

// Host copy of one rank's pieces: the shard file's data section.
struct ShardSnapshot {
  std::vector<ShardPiece> pieces;
  std::vector<char> data;
};
// Copies this rank's owned shards out of the local buffers (laid out by plan; adam_m / adam_v
// may be null when info.has_moments is false).
ShardSnapshot snapshot_shards(const parallel::ShardPlan& plan, const float* params,
                              const float* adam_m, const float* adam_v, bool with_moments);

// Writes (and fsyncs) one shard file from a snapshot; returns the XXH64 of each chunk of the
// data section. The header names `rank`, `step` and the checkpoint id.
std::vector<uint64_t> write_shard_file(const std::string& path, const ShardSnapshot& s, int rank,
                                       int64_t step, uint64_t checkpoint_id);
// The same from the data section's parts in order (e.g. straight from the live buffers).
std::vector<uint64_t> write_shard_file(const std::string& path,
                                       const std::vector<std::pair<const char*, size_t>>& parts,
                                       int rank, int64_t step, uint64_t checkpoint_id);

// The metadata of a checkpoint written by `grid`: every rank's pieces (ShardPlan::build per
// coordinate), the given sizes and chunk hashes per rank (empty hashes: the rank writes no
// file), and the checksum. `model` must match `table`.
nlohmann::json build_sharded_meta(const ModelConfig& model, const ParamTable& table,
                                  const ShardedCheckpointInfo& info, uint64_t checkpoint_id,
                                  const std::vector<int64_t>& data_bytes,
                                  const std::vector<std::vector<uint64_t>>& chunk_hashes);
// Writes meta.json, config.json (and tokenizer.model when tokenizer_path is set) into `dir`,
// each fsync'ed.
void write_sharded_meta_files(const std::string& dir, const nlohmann::json& meta,
                              const ModelConfig& model, const std::string& tokenizer_path);

bool is_sharded_checkpoint(const std::string& dir);  // has meta.json
// Reads and checks meta.json: magic, version, checksum, structure. Throws Error naming the file.
nlohmann::json read_sharded_meta(const std::string& dir);
// Why `dir` is not a usable sharded checkpoint (metadata, files present with the recorded sizes,
// headers, every tensor of every array covered exactly once), or nullopt. Cheap: reads the
// metadata and the file headers, not the data (the data's checksums are verified on load).
std::optional<std::string> sharded_checkpoint_problem(const std::string& dir);
// Reads every byte of every shard file and checks every chunk checksum too. Throws Error.
void verify_sharded_checkpoint(const std::string& dir);

// Loads the checkpoint into local buffers laid out by `plan` (any grid): each tensor's elements
// this rank needs, read from the chunks that contain them, each chunk verified. Checks first
// the model config against `expected` and, if both are known, the tokenizer identity. adam_m /
// adam_v may be null (not loaded); a params-only checkpoint fills them with zeros. Returns the
// recorded info. Throws Error (naming the file and what is wrong) before returning; on error the
// buffers may be partly overwritten.
ShardedCheckpointInfo load_sharded_checkpoint(const std::string& dir, const ModelConfig& expected,
                                              uint64_t tokenizer_identity,
                                              const parallel::ShardPlan& plan, float* params,
                                              float* adam_m, float* adam_v);
// The whole parameters (table layout, table.total floats) on one process: the load on the
// one-rank grid.
ShardedCheckpointInfo load_sharded_params(const std::string& dir, const ModelConfig& expected,
                                          const ParamTable& table, float* params);
// Reads the recorded model config (HF fields).
ModelConfig sharded_model_config(const std::string& dir);

}  // namespace tetrad
