#include "tetrad/parallel/sharding.hpp"

#include <cstring>
#include <map>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/layer_split.hpp"

namespace tetrad::parallel {

void validate_grid_for_model(const ModelConfig& c, const GridShape& g) {
  auto divides = [](const char* what, int64_t n, const char* axis, int k) {
    if (n % k != 0)
      fail("grid: ", what, " (", n, ") is not divisible by G", axis, " = ", k);
  };
  divides("model.n_embd", c.n_embd, "x", g.x());
  divides("model.n_embd", c.n_embd, "y", g.y());
  divides("model.n_head", c.n_head, "y", g.y());
  divides("model.n_kv_head", c.n_kv_head, "y", g.y());
  divides("model.ffn", c.ffn, "x", g.x());
  divides("model.ffn", c.ffn, "y", g.y());
  divides("model.vocab_size", c.vocab_size, "y", g.y());
  divides("model.shared_expert_ffn", c.shared_expert_ffn, "y", g.y());
  if (g.e() > 1) {
    if (!c.moe())
      fail("grid: the expert-parallel fold E = ", g.e(), " needs a mixture-of-experts model "
           "(model.n_experts > 0); ", c.desc().display, " here is dense (use e=1)");
    if (c.n_experts % g.e() != 0)
      fail("grid: model.n_experts (", c.n_experts, ") is not divisible by E = ", g.e(),
           " (each expert-parallel rank holds n_experts / E whole experts)");
    const int replicas = g.size(replica_axes());
    if (replicas % g.e() != 0)
      fail("grid: the expert-parallel fold E = ", g.e(), " must divide the data x context ranks "
           "Gd x Gc = ", replicas, " (E folds over them and adds no ranks)");
  }
  if (c.moe() && c.moe_capacity_factor > 0 && g.c() > 1)
    fail("grid: ", c.desc().display, "'s capacity factor (model.moe_capacity_factor = ",
         c.moe_capacity_factor, ") with the context axis (Gc = ", g.c(), ") is not implemented: "
         "an expert's capacity is taken in token order, which the context chunks interleave; "
         "use Gc = 1 or a dropless router (moe_capacity_factor = 0)");
}

namespace {

std::vector<int64_t> contiguous(int64_t first, int64_t n) {
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[size_t(i)] = first + i;
  return r;
}

std::vector<int64_t> slice_rows(int64_t total, int parts, int index) {
  return contiguous(total / parts * index, total / parts);
}

// Fused q|k|v [(nh + 2 nkv) hd, .]: y holds the q, k and v rows of its own heads.
std::vector<int64_t> qkv_rows(const ModelConfig& c, const GridShape& g, const GridCoord& at) {
  std::vector<int64_t> rows;
  const int64_t hd = c.head_dim(), q = c.n_head * hd, kv = c.n_kv_head * hd;
  for (int64_t r : slice_rows(q, g.y(), at.y())) rows.push_back(r);
  for (int64_t r : slice_rows(kv, g.y(), at.y())) rows.push_back(q + r);
  for (int64_t r : slice_rows(kv, g.y(), at.y())) rows.push_back(q + kv + r);
  return rows;
}

// This rank's experts' block of the stacked expert tensors: experts [El ε, El (ε + 1)) of the
// expert rank ε (El = n_experts / E), each expert a normal layer (gate|up [2F, C]: its F gate
// rows and its F up rows each over Y, columns over X) or a transposed one (down [C, F]: rows over
// X, columns over Y), so that the expert's GEMMs are the dense MLP's on the same X/Y blocks.
void expert_block(const ModelConfig& c, TensorRole role, const GridShape& g, const GridCoord& at,
                  TensorShard& t) {
  const int64_t El = c.n_experts / g.e(), e0 = El * expert_rank(at, g);  // the grid's check
  const int64_t C = c.n_embd, F = c.ffn, Cx = C / g.x(), Fy = F / g.y();
  t.rows.clear();
  if (role == TensorRole::ExpertGateUp) {
    t.layout = ShardLayout::Normal;
    for (int64_t e = e0; e < e0 + El; ++e)
      for (int64_t half = 0; half < 2; ++half)  // gate rows, then up rows
        for (int64_t r = 0; r < Fy; ++r) t.rows.push_back(e * 2 * F + half * F + at.y() * Fy + r);
    t.col0 = Cx * at.x();
    t.cols = Cx;
  } else {
    t.layout = ShardLayout::Transposed;
    for (int64_t e = e0; e < e0 + El; ++e)
      for (int64_t r = 0; r < Cx; ++r) t.rows.push_back(e * C + at.x() * Cx + r);
    t.col0 = Fy * at.y();
    t.cols = Fy;
  }
  t.z_sharded = true;
  t.expert = g.e() > 1;
}

// The block of tensor `s` this rank holds, by the tensor's role (layout, rows, columns, whether
// Z shards it); sizes and offsets are ShardPlan::build's.
TensorShard block_of(const ModelConfig& c, const ParamSpec& s, const GridShape& g,
                     const GridCoord& at) {
  TensorShard t;
  t.spec = &s;
  const bool matrix = s.shape.size() == 2;
  const int64_t R = matrix ? s.shape[0] : 1, K = matrix ? s.shape[1] : s.shape[0];
  auto normal = [&](std::vector<int64_t> rows) {  // GEMM weight: rows over Y, columns over X
    t.layout = ShardLayout::Normal;
    t.rows = std::move(rows);
    t.col0 = K / g.x() * at.x();
    t.cols = K / g.x();
    t.z_sharded = true;
  };
  auto cols_x = [&](std::vector<int64_t> rows) {  // columns over X, replicated over Y
    t.layout = ShardLayout::ColsX;
    t.rows = std::move(rows);
    t.col0 = K / g.x() * at.x();
    t.cols = K / g.x();
  };
  // Bias of a normal layer: one entry per output row of the layer, so split over Y the same
  // way. Kept as a list of entries (cols = 1, col0 = -1 marks a 1-D entry list).
  auto rows_y = [&](std::vector<int64_t> rows) {
    t.layout = ShardLayout::RowsY;
    t.rows = std::move(rows);
    t.col0 = -1;
    t.cols = 1;
  };
  using R_ = TensorRole;
  switch (s.role) {
    case R_::PositionEmbedding:  // position table [S, C]: columns over X
      cols_x(contiguous(0, R));
      break;
    case R_::TokenEmbedding:
    case R_::Head:
    case R_::Q:
    case R_::K:
    case R_::V:
    case R_::MlpIn:
    case R_::Gate:
    case R_::Up:
    case R_::SharedGate:  // the shared expert (Qwen2-MoE's; dense, reduced over every data rank)
    case R_::SharedUp:    // is the dense MLP's pair: gate|up normal, down transposed
      normal(slice_rows(R, g.y(), at.y()));
      break;
    case R_::Router:  // [n_experts, C]: columns over X (its input is ln2's X slice), every
      // expert's row on every Y rank (the logits are whole: the routing needs them all), Z-sharded
    case R_::SharedExpertGate:  // [1, C]: the shared expert's gate, whole over Y like the router
      cols_x(contiguous(0, R));
      t.z_sharded = true;
      break;
    case R_::ExpertGateUp:  // [n_experts x 2F, C] and [n_experts x C, F]: this rank's experts
    case R_::ExpertDown:    // (n_experts / E of them), each split over X and Y like the dense MLP
      expert_block(c, s.role, g, at, t);
      break;
    case R_::Qkv:
      normal(qkv_rows(c, g, at));
      break;
    case R_::AttnOut:
    case R_::MlpOut:  // transposed layer: rows over X, columns over Y
    case R_::SharedDown:
      t.layout = ShardLayout::Transposed;
      t.rows = slice_rows(R, g.x(), at.x());
      t.col0 = K / g.y() * at.y();
      t.cols = K / g.y();
      t.z_sharded = true;
      break;
    case R_::QkvBias:
      rows_y(qkv_rows(c, g, at));
      break;
    case R_::QBias:  // separate q, k, v biases: each split over Y like its weight's rows
    case R_::KBias:
    case R_::VBias:
    case R_::MlpInBias:
      rows_y(slice_rows(K, g.y(), at.y()));
      break;
    case R_::QNorm:  // over one head's width: every rank whole (its heads share the vector)
    case R_::KNorm:
    case R_::ExpertBias:  // [E], whole on every rank (each updates it the same way)
      t.layout = ShardLayout::Replicated;
      t.rows = {0};
      t.col0 = 0;
      t.cols = K;
      break;
    case R_::AttnNorm:
    case R_::AttnNormBias:
    case R_::MlpNorm:
    case R_::MlpNormBias:
    case R_::FinalNorm:
    case R_::FinalNormBias:
    case R_::AttnOutBias:
    case R_::MlpOutBias:  // vectors over C: norms and the biases of transposed layers
      cols_x({0});
      break;
  }
  return t;
}

}  // namespace

ShardPlan ShardPlan::build(const ModelConfig& c, const ParamTable& table, const GridShape& g,
                           const GridCoord& at, const LayerSplit& layer_split) {
  validate_grid_for_model(c, g);
  // Which layers each stage stores: the given split, or the even one with one chunk per stage.
  LayerSplit split;
  if (g.p() > 1) {
    split = layer_split.bounds.empty() ? LayerSplit::even(c.n_layer, g.p()) : layer_split;
    if (split.n_layer() != c.n_layer || split.virtual_stages() % g.p() != 0)
      fail("grid: the pipeline layer split ", split.to_string(), " (", split.virtual_stages(),
           " virtual stages, ", split.n_layer(), " layers) does not fit Gp = ", g.p(), " and ",
           c.n_layer, " layers (expected a multiple of Gp virtual stages summing to n_layer)");
  }
  ShardPlan plan;
  plan.grid = g;
  plan.coord = at;
  int64_t local = 0;
  std::map<int, int64_t> layer_end;
  for (const ParamSpec& s : table.specs) {
    TensorShard t = block_of(c, s, g, at);
    t.first_replica = t.expert ? expert_data_rank(at, g) == 0 : at.c() == 0 && at.d() == 0;
    const std::string& n = s.name;
    t.block_numel = int64_t(t.rows.size()) * t.cols;
    // Blocks that are computed on together (q|k|v, gate|up) must stay adjacent when gathered, so
    // Z shards are never padded: the block must divide evenly.
    if (t.z_sharded && t.block_numel % g.z() != 0)
      fail("grid: the block of '", n, "' on each rank has ", t.block_numel,
           " elements, not divisible by Gz = ", g.z());
    // A pipeline stage stores only its own layers (and every top-level tensor, see the header).
    t.stored = g.p() == 1 || s.layer < 0 || split.stage_of(s.layer, g.p()) == at.p();
    t.shard_numel = !t.stored ? 0 : t.z_sharded ? t.block_numel / g.z() : t.block_numel;
    t.offset = local;
    local += t.shard_numel;
    // Tensors outside the blocks (layer -1: embeddings, final norm, head) share one buffer.
    int64_t& layer_block = layer_end[s.layer];
    t.block_offset = layer_block;
    layer_block += t.z_sharded ? t.shard_numel * g.z() : t.block_numel;  // all-gather output size
    plan.tensors.push_back(std::move(t));
  }
  plan.local_total = local;
  return plan;
}

// A 1-D RowsY tensor keeps its selected entries in `rows` (cols = 1, col0 = -1): entry i of the
// block is element rows[i] of the vector. Every other layout: block[r][j] = full[rows[r]][col0+j].
void extract_block(const TensorShard& t, const float* full, float* block) {
  const int64_t K = t.spec->shape.size() == 2 ? t.spec->shape[1] : t.spec->shape[0];
  if (t.col0 < 0) {
    for (size_t i = 0; i < t.rows.size(); ++i) block[i] = full[t.rows[i]];
    return;
  }
  for (size_t r = 0; r < t.rows.size(); ++r)
    std::memcpy(block + r * t.cols, full + t.rows[r] * K + t.col0, t.cols * sizeof(float));
}

void insert_block(const TensorShard& t, const float* block, float* full) {
  const int64_t K = t.spec->shape.size() == 2 ? t.spec->shape[1] : t.spec->shape[0];
  if (t.col0 < 0) {
    for (size_t i = 0; i < t.rows.size(); ++i) full[t.rows[i]] = block[i];
    return;
  }
  for (size_t r = 0; r < t.rows.size(); ++r)
    std::memcpy(full + t.rows[r] * K + t.col0, block + r * t.cols, t.cols * sizeof(float));
}

}  // namespace tetrad::parallel
