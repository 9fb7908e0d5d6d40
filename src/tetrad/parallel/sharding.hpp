// Which part of every parameter tensor a rank of the (X, Y, Z) grid holds (4d-parallelism.md).
//
// Every tensor of the ParamTable gets a layout, chosen by its role (model/family.hpp, TensorRole):
//   Normal      GEMM weight [N, K] of a layer whose input features are split over X and output
//               features over Y: the block rows(y) x cols(x). Token embedding and output head too.
//   Transposed  GEMM weight [N, K] with the roles swapped: rows(x) x cols(y).
//   ColsX       a vector over the hidden size (norm weights and biases, biases of transposed
//               layers) or the position table [S, C]: its columns split over X, replicated over Y.
//   RowsY       bias of a normal layer: split over Y like the layer's output, replicated over X.
// Rows of a Y-split tensor are not always one contiguous slice: a fused q|k|v weight must give
// each y complete q, k and v rows of its own heads, so the layout keeps an explicit row list.
// GEMM weights (Normal, Transposed) are then flattened and split again over Z (the fully-sharded
// axis): a rank stores block / Gz elements (the block must divide evenly). Everything else is
// replicated over Z.
//
// Pure functions of (model config, grid, coordinate): testable without MPI.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/layer_split.hpp"

namespace tetrad::parallel {

// Replicated: every rank holds the whole tensor (a vector over one head: q_norm, k_norm).
enum class ShardLayout { Normal, Transposed, ColsX, RowsY, Replicated };

struct TensorShard {
  const ParamSpec* spec = nullptr;
  ShardLayout layout = ShardLayout::ColsX;
  std::vector<int64_t> rows;   // global row of each local row (1-D tensors: one row)
  int64_t col0 = 0, cols = 0;  // local columns are global [col0, col0 + cols)
  int64_t block_numel = 0;     // rows.size() * cols
  bool z_sharded = false;
  // Split over the expert fold (GridShape::e() > 1; the experts' gate|up and down): the block is
  // the rows of this rank's n_experts / E experts, replicated only over its expert-data group
  // (ProcessGroups::expert_replicas()), not over every replica.
  bool expert = false;
  // Whether this rank is the first of the ranks along the replica axes (C, D) holding this same
  // block (for an expert tensor, the first of its expert-data group): the one that writes it to
  // a checkpoint, gathers it and counts it in the gradient norm.
  bool first_replica = true;
  // With a pipeline axis (Gp > 1) a rank stores only the layers its stage runs (the plan's
  // LayerSplit) plus every top-level tensor (embeddings, final norm, head: each stage keeps a
  // copy); the other layers' tensors keep their block geometry but have shard_numel = 0 (no parameters,
  // gradients or optimizer state here).
  bool stored = true;
  int64_t shard_numel = 0;     // elements this rank stores: block / Gz if z_sharded, 0 if !stored
  int64_t offset = 0;          // offset of this rank's shard in the local parameter buffer
  int64_t block_offset = 0;    // offset of the block in its layer's gathered buffer (z-sharded
                               // blocks take shard_numel * Gz there, the all-gather's output)
};

struct ShardPlan {
  GridShape grid;
  GridCoord coord;
  std::vector<TensorShard> tensors;  // same order as the ParamTable
  int64_t local_total = 0;           // size of the local parameter buffer
  // Throws Error naming the dimension when the grid does not divide the model.
  // split: the pipeline's layer split (virtual stage j on stage j % Gp), which decides which
  // layers a stage stores when grid.p() > 1; empty means the even split with one chunk per stage.
  static ShardPlan build(const ModelConfig& c, const ParamTable& table, const GridShape& grid,
                         const GridCoord& coord, const LayerSplit& split = {});
};

// Checks that the grid divides the model: heads and kv heads by Gy, hidden by Gx and Gy, ffn
// and vocabulary by Gx and Gy. Throws Error naming what does not divide.
void validate_grid_for_model(const ModelConfig& c, const GridShape& grid);

// Copies a rank's block of `full` (the whole tensor, row-major) into block[block_numel].
void extract_block(const TensorShard& t, const float* full, float* block);
// Writes a block back into the whole tensor (the inverse of extract_block).
void insert_block(const TensorShard& t, const float* block, float* full);

}  // namespace tetrad::parallel
