#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tetrad/core/error.hpp"
#include "tetrad/kernels/attention.hpp"
#include "tetrad/kernels/fast_math.hpp"
#include "tetrad/kernels/ops.hpp"
#include "tetrad/model/transformer.hpp"

namespace tetrad::parallel {

namespace k = kernels;
using tetrad::init_parameter;

// Activation views, local sizes: N tokens of this rank, Cx = C/Gx hidden slice, QKVy = q|k|v of
// this rank's heads, Ay = C/Gy attention output slice, FWy/Fy = MLP slices, Vy = vocabulary slice.
struct ParallelTransformer::Acts {
  struct PerLayer {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *resid_mid, *ln2, *ln2_mean, *ln2_rstd,
        *fc, *fc_act, *resid_out;
  };
  std::vector<PerLayer> layer;
  float *emb, *lnf, *lnf_mean, *lnf_rstd, *logits, *losses, *tmp;
  float *dresid, *dln, *dqkv, *datty, *dfc, *dfc_act;
};

Recompute parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::None;
  if (text == "selective") return Recompute::Selective;
  if (text == "full") return Recompute::Full;
  fail("train.recompute: expected \"none\", \"selective\" or \"full\", got \"", text, "\"");
}

const char* recompute_name(Recompute mode) {
  switch (mode) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}

ParallelTransformer::ParallelTransformer(const ModelConfig& config, ProcessGroups& groups,
                                         int local_batch, int max_len, ParallelOptions options)
    : cfg_(config), g_(groups), opt_(options), local_batch_(local_batch), max_len_(max_len) {
  if (opt_.zero < 0 || opt_.zero > 2)
    fail("parallel.zero: expected 0, 1 or 2 (ZeRO stage over the data axis), got ", opt_.zero);
  if (opt_.virtual_stages < 1)
    fail("parallel.virtual_stages must be at least 1, got ", opt_.virtual_stages);
  if (cfg_.n_layer < groups.shape.p * opt_.virtual_stages)
    fail("model.n_layer (", cfg_.n_layer, ") is smaller than the pipeline's virtual stages Gp x "
         "parallel.virtual_stages = ", groups.shape.p * opt_.virtual_stages,
         ": every stage needs at least one layer");
  cfg_.validate();
  if (max_len <= 0 || max_len > cfg_.max_seq)
    fail("sequence length ", max_len, " is outside what the model supports (1..", cfg_.max_seq,
         " = model.max_seq)");
  if (local_batch <= 0) fail("local micro-batch must be positive, got ", local_batch);
  table_ = build_param_table(cfg_);
  plan_ = ShardPlan::build(cfg_, table_, g_.shape, g_.coord);
  const GridShape& G = g_.shape;
  gpt2_ = cfg_.family == Family::GPT2;
  hd_ = cfg_.head_dim();
  Cx_ = cfg_.n_embd / G.x;
  Ay_ = cfg_.n_embd / G.y;
  nhy_ = cfg_.n_head / G.y;
  nkvy_ = cfg_.n_kv_head / G.y;
  QKVy_ = (nhy_ + 2 * nkvy_) * hd_;
  Fy_ = cfg_.ffn / G.y;
  FWy_ = gpt2_ ? Fy_ : 2 * Fy_;
  Vy_ = cfg_.vocab_size / G.y;

  // ZeRO pieces: each tensor's local shard cut into Gd pieces of ceil(n / Gd), piece d on rank d.
  const int Gd = G.d, dc = g_.coord.d;
  int64_t piece_max = 0;
  for (const auto& t : plan_.tensors) {
    const int64_t n = t.shard_numel;
    if (opt_.zero == 0) {
      piece_.push_back(n);
      zl_.param_offsets.push_back(t.offset);
      zl_.grad_offsets.push_back(t.offset);
      zl_.state_offsets.push_back(t.offset);
      zl_.sizes.push_back(n);
      continue;
    }
    const int64_t q = (n + Gd - 1) / Gd, lo = std::min(n, q * dc), hi = std::min(n, lo + q);
    piece_.push_back(q);
    piece_max = std::max(piece_max, q);
    zl_.param_offsets.push_back(t.offset + lo);
    zl_.grad_offsets.push_back(opt_.zero == 2 ? zl_.state_size : t.offset + lo);
    zl_.state_offsets.push_back(zl_.state_size);
    zl_.sizes.push_back(hi - lo);
    zl_.state_size += q;
  }
  if (opt_.zero == 0) zl_.state_size = plan_.local_total;
  else zero_tmp_ = Buffer<float>(size_t(Gd + 1) * piece_max);

  params_ = Buffer<float>(plan_.local_total);
  grads_ = Buffer<float>(opt_.zero == 2 ? zl_.state_size : plan_.local_total);

  auto idx = [&](const std::string& name) -> int {
    for (size_t i = 0; i < table_.specs.size(); ++i)
      if (table_.specs[i].name == name) return int(i);
    return -1;
  };
  layers_.resize(cfg_.n_layer);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    Layer& L = layers_[l];
    if (gpt2_) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      L.ln1_w = idx(p + "ln_1.weight"); L.ln1_b = idx(p + "ln_1.bias");
      L.qkv_w = idx(p + "attn.c_attn.weight"); L.qkv_b = idx(p + "attn.c_attn.bias");
      L.proj_w = idx(p + "attn.c_proj.weight"); L.proj_b = idx(p + "attn.c_proj.bias");
      L.ln2_w = idx(p + "ln_2.weight"); L.ln2_b = idx(p + "ln_2.bias");
      L.fc_w = idx(p + "mlp.c_fc.weight"); L.fc_b = idx(p + "mlp.c_fc.bias");
      L.fcproj_w = idx(p + "mlp.c_proj.weight"); L.fcproj_b = idx(p + "mlp.c_proj.bias");
    } else {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      L.ln1_w = idx(p + "input_layernorm.weight");
      L.qkv_w = idx(p + "self_attn.q_proj.weight");
      L.k_w = idx(p + "self_attn.k_proj.weight");
      L.v_w = idx(p + "self_attn.v_proj.weight");
      L.proj_w = idx(p + "self_attn.o_proj.weight");
      L.ln2_w = idx(p + "post_attention_layernorm.weight");
      L.fc_w = idx(p + "mlp.gate_proj.weight");
      L.up_w = idx(p + "mlp.up_proj.weight");
      L.fcproj_w = idx(p + "mlp.down_proj.weight");
    }
  }
  wte_ = gpt2_ ? idx("transformer.wte.weight") : idx("model.embed_tokens.weight");
  wpe_ = gpt2_ ? idx("transformer.wpe.weight") : -1;
  lnf_w_ = gpt2_ ? idx("transformer.ln_f.weight") : idx("model.norm.weight");
  lnf_b_ = gpt2_ ? idx("transformer.ln_f.bias") : -1;
  head_ = cfg_.tie_embeddings ? wte_ : idx("lm_head.weight");

  // Gather and gradient-block buffers: only when Z shards weights (Gz = 1 computes in place),
  // or, for the gradient blocks, when ZeRO 2 keeps only a piece of each gradient.
  if (G.z > 1 || opt_.zero == 2) {
    int64_t layer_max = 0, top = 0, shard_max = 0;
    for (const auto& t : plan_.tensors) {
      const int64_t end = t.block_offset + (t.z_sharded ? t.shard_numel * G.z : t.block_numel);
      if (t.spec->layer < 0) top = std::max(top, end);
      else layer_max = std::max(layer_max, end);
      shard_max = std::max(shard_max, t.shard_numel);
    }
    if (G.z > 1) {
      gathered_ = Buffer<float>(layer_max);
      gathered_top_ = Buffer<float>(top);
      scatter_tmp_ = Buffer<float>(shard_max);
    }
    gblock_ = Buffer<float>(layer_max);
    gblock_top_ = Buffer<float>(top);
  }

  const int64_t N = int64_t(local_batch) * max_len;
  acts_ = Buffer<float>(size_t(activation_bytes(opt_.recompute) / int64_t(sizeof(float))));
  a_ = std::make_unique<Acts>();
  float* cur = acts_.data();
  auto take = [&](int64_t n) { float* p = cur; cur += n; return p; };
  // Kept tensors get their own memory per layer; recomputed ones share one layer's scratch.
  const Recompute rc = opt_.recompute;
  const bool full = rc == Recompute::Full, attn = rc != Recompute::None;
  int64_t scratch_n = 0;
  {
    const int64_t per_layer = Cx_ + 2 + QKVy_ + Ay_ + nhy_ + Cx_ + Cx_ + 2 + FWy_ + Fy_ + Cx_;
    scratch_n = full ? per_layer - Cx_ : attn ? Ay_ + nhy_ : 0;
  }
  float* scratch = take(N * scratch_n);
  a_->layer.resize(cfg_.n_layer);
  layer_begin_.clear();
  for (auto& A : a_->layer) {
    layer_begin_.push_back(cur);
    float* sc = scratch;
    auto place = [&](bool kept, int64_t n) {
      if (kept) return take(N * n);
      float* p = sc;
      sc += N * n;
      return p;
    };
    A.ln1 = place(!full, Cx_); A.ln1_mean = place(!full, 1); A.ln1_rstd = place(!full, 1);
    A.qkv = place(!full, QKVy_); A.atty = place(!attn, Ay_); A.lse = place(!attn, nhy_);
    A.resid_mid = place(!full, Cx_); A.ln2 = place(!full, Cx_); A.ln2_mean = place(!full, 1);
    A.ln2_rstd = place(!full, 1); A.fc = place(!full, FWy_); A.fc_act = place(!full, Fy_);
    A.resid_out = take(N * Cx_);  // the next block's input: always kept
    TETRAD_CHECK(sc == scratch + N * scratch_n);
  }
  layer_begin_.push_back(cur);  // end of the layers: the global activations follow
  a_->emb = take(N * Cx_); a_->lnf = take(N * Cx_); a_->lnf_mean = take(N); a_->lnf_rstd = take(N);
  a_->logits = take(N * Vy_); a_->losses = take(N); a_->tmp = take(N * Cx_);
  a_->dresid = take(N * Cx_); a_->dln = take(N * Cx_); a_->dqkv = take(N * QKVy_);
  a_->datty = take(N * Ay_); a_->dfc = take(N * FWy_); a_->dfc_act = take(N * Fy_);
  TETRAD_CHECK(cur == acts_.data() + acts_.size());
  stats_ = Buffer<double>(size_t(N) * 2);

  if (!gpt2_) {
    const int64_t half = hd_ / 2;
    rope_cos_ = Buffer<float>(size_t(cfg_.max_seq) * half);
    rope_sin_ = Buffer<float>(size_t(cfg_.max_seq) * half);
    k::rope_tables(rope_cos_.data(), rope_sin_.data(), cfg_.max_seq, hd_, cfg_.rope_theta);
  }
}

ParallelTransformer::~ParallelTransformer() = default;

int64_t ParallelTransformer::activation_bytes(Recompute mode) const {
  const int64_t N = int64_t(local_batch_) * max_len_, L = cfg_.n_layer;
  const int64_t per_layer = Cx_ + 2 + QKVy_ + Ay_ + nhy_ + Cx_ + Cx_ + 2 + FWy_ + Fy_ + Cx_;
  const int64_t global = (Cx_ + Cx_ + 2 + Vy_ + 1 + Cx_) + (Cx_ + Cx_ + QKVy_ + Ay_ + FWy_ + Fy_);
  int64_t per_token = 0;
  switch (mode) {
    case Recompute::None: per_token = L * per_layer; break;
    case Recompute::Selective: per_token = L * (per_layer - Ay_ - nhy_) + (Ay_ + nhy_); break;
    case Recompute::Full: per_token = L * Cx_ + (per_layer - Cx_); break;
  }
  return int64_t(sizeof(float)) * N * (per_token + global);
}

int64_t ParallelTransformer::state_bytes() const {
  const size_t n = params_.size() + grads_.size() + 2 * size_t(zl_.state_size) + gathered_.size() +
                   gathered_top_.size() + gblock_.size() + gblock_top_.size() +
                   scatter_tmp_.size() + zero_tmp_.size();
  return int64_t(n * sizeof(float));
}

// ---------------------------------------------------------------------------------------------
// Parameters

void ParallelTransformer::init_weights(uint64_t seed) {
  for (size_t i = 0; i < table_.specs.size(); ++i) {
    std::vector<float> full(table_.specs[i].numel);
    init_parameter(cfg_, table_.specs[i], i, seed, full.data());
    set_tensor(i, full.data());
  }
}

std::vector<float> ParallelTransformer::shard_of(size_t i, const float* full) const {
  const TensorShard& t = plan_.tensors[i];
  std::vector<float> block(t.z_sharded ? t.shard_numel * g_.shape.z : t.block_numel, 0.0f);
  extract_block(t, full, block.data());
  const int64_t first = t.z_sharded ? t.shard_numel * g_.coord.z : 0;
  return std::vector<float>(block.begin() + first, block.begin() + first + t.shard_numel);
}

void ParallelTransformer::scatter_tensor(float* local, size_t i, const float* full) const {
  const TensorShard& t = plan_.tensors[i];
  const std::vector<float> shard = shard_of(i, full);
  std::memcpy(local + t.offset, shard.data(), t.shard_numel * sizeof(float));
}

void ParallelTransformer::gather_tensor(const float* local, size_t i, float* full) {
  gather_shard(local + plan_.tensors[i].offset, i, full);
}

void ParallelTransformer::gather_shard(const float* shard, size_t i, float* full) {
  const TensorShard& t = plan_.tensors[i];
  std::vector<float> block(t.z_sharded ? t.shard_numel * g_.shape.z : t.block_numel);
  if (t.z_sharded && g_.shape.z > 1)
    g_.z.allgather(shard, block.data(), size_t(t.shard_numel));
  else
    std::memcpy(block.data(), shard, t.block_numel * sizeof(float));
  // Disjoint blocks summed into zeros: exact. Only one owner of each replicated block writes.
  std::fill(full, full + t.spec->numel, 0.0f);
  const GridCoord& c = g_.coord;
  bool owner = c.d == 0 && c.z == 0 && owns(t);
  if (t.layout == ShardLayout::ColsX) owner = owner && c.y == 0;
  if (t.layout == ShardLayout::RowsY) owner = owner && c.x == 0;
  if (owner) insert_block(t, block.data(), full);
  if (g_.world.size() > 1) g_.world.allreduce_sum(full, size_t(t.spec->numel));
}

void ParallelTransformer::scatter_state_tensor(float* state, size_t i, const float* full) const {
  if (opt_.zero == 0) return scatter_tensor(state, i, full);
  const std::vector<float> shard = shard_of(i, full);
  const int64_t lo = zl_.param_offsets[i] - plan_.tensors[i].offset;
  std::memcpy(state + zl_.state_offsets[i], shard.data() + lo, zl_.sizes[i] * sizeof(float));
}

void ParallelTransformer::gather_state_tensor(const float* state, size_t i, float* full) {
  if (opt_.zero == 0) return gather_tensor(state, i, full);
  const int64_t q = piece_[i];
  float* pieces = zero_tmp_.data();
  float* mine = pieces + q * g_.shape.d;
  std::fill(mine, mine + q, 0.0f);
  std::memcpy(mine, state + zl_.state_offsets[i], zl_.sizes[i] * sizeof(float));
  g_.d.allgather(mine, pieces, size_t(q));
  gather_shard(pieces, i, full);  // the pieces in D order are the shard (padding past its end)
}

const float* ParallelTransformer::w(int i) const {
  if (i < 0) return nullptr;
  const TensorShard& t = plan_.tensors[i];
  if (!t.z_sharded || g_.shape.z == 1) return params_.data() + t.offset;
  return (t.spec->layer < 0 ? gathered_top_.data() : gathered_.data()) + t.block_offset;
}

bool ParallelTransformer::staged(const TensorShard& t) const {
  return opt_.zero == 2 || (t.z_sharded && g_.shape.z > 1);
}

float* ParallelTransformer::gw(int i) {
  if (i < 0) return nullptr;
  const TensorShard& t = plan_.tensors[i];
  if (!staged(t)) return grads_.data() + t.offset;
  return (t.spec->layer < 0 ? gblock_top_.data() : gblock_.data()) + t.block_offset;
}

void ParallelTransformer::gather_layer(int layer) {
  if (g_.shape.z == 1) return;
  ScopedPhase sp(prof_, Phase::Comm);
  float* buf = layer < 0 ? gathered_top_.data() : gathered_.data();
  for (const auto& t : plan_.tensors)
    if (t.spec->layer == layer && t.z_sharded)
      g_.z.allgather(params_.data() + t.offset, buf + t.block_offset, size_t(t.shard_numel));
}

void ParallelTransformer::zero_layer_grad_blocks(int layer) {
  if (g_.shape.z == 1 && opt_.zero != 2) return;
  float* buf = layer < 0 ? gblock_top_.data() : gblock_.data();
  for (const auto& t : plan_.tensors)
    if (t.spec->layer == layer && staged(t)) {
      const int64_t n = t.z_sharded ? t.shard_numel * g_.shape.z : t.block_numel;
      std::fill(buf + t.block_offset, buf + t.block_offset + n, 0.0f);
    }
}

// piece[piece_[i]] = this D rank's piece of Σ_D shard (the shard zero-padded to Gd pieces).
void ParallelTransformer::reduce_scatter_d(size_t i, const float* shard, float* piece) {
  const int64_t n = plan_.tensors[i].shard_numel, q = piece_[i];
  if (g_.shape.d == 1) {
    std::memcpy(piece, shard, n * sizeof(float));
    return;
  }
  float* padded = zero_tmp_.data();
  std::memcpy(padded, shard, n * sizeof(float));
  std::fill(padded + n, padded + q * g_.shape.d, 0.0f);
  g_.d.reduce_scatter_sum(padded, piece, size_t(q));
}

void ParallelTransformer::scatter_layer_grads(int layer) {
  if (g_.shape.z == 1 && opt_.zero != 2) return;
  ScopedPhase sp(prof_, Phase::Comm);
  float* buf = layer < 0 ? gblock_top_.data() : gblock_.data();
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const TensorShard& t = plan_.tensors[i];
    if (t.spec->layer != layer || !staged(t)) continue;
    float* block = buf + t.block_offset;
    const float* shard = block;
    if (t.z_sharded && g_.shape.z > 1) {
      g_.z.reduce_scatter_sum(block, scatter_tmp_.data(), size_t(t.shard_numel));
      shard = scatter_tmp_.data();
    } else if (!t.z_sharded && g_.shape.z > 1) {
      g_.z.allreduce_sum(block, size_t(t.block_numel));  // ZeRO 2: replicated over Z, sum first
    }
    if (opt_.zero == 2) {
      // Summed over Z, now over D: this rank keeps its piece only.
      float* piece = zero_tmp_.data() + piece_[i] * g_.shape.d;
      reduce_scatter_d(i, shard, piece);
      k::add_inplace(grads_.data() + zl_.grad_offsets[i], piece, zl_.sizes[i]);
    } else {
      k::add_inplace(grads_.data() + t.offset, shard, t.shard_numel);
    }
  }
}

void ParallelTransformer::reduce_gradients() {
  ScopedPhase sp(prof_, Phase::Comm);
  if (g_.shape.p > 1) {
    // Embedding (first stage) and head (last stage; the same tensor when tied), final norm,
    // positions: summed over the stages, so every stage's copy takes the same update. (ZeRO 2:
    // the pieces, already reduced over Z and D.)
    for (size_t i = 0; i < plan_.tensors.size(); ++i)
      if (plan_.tensors[i].spec->layer < 0) {
        const bool piece = opt_.zero == 2;
        float* gp = grads_.data() + (piece ? zl_.grad_offsets[i] : plan_.tensors[i].offset);
        const int64_t n = piece ? zl_.sizes[i] : plan_.tensors[i].shard_numel;
        if (n > 0) g_.p.allreduce_sum(gp, size_t(n));
      }
  }
  if (opt_.zero == 2) return;  // every layer was reduced (over Z and D) right after its backward
  if (opt_.zero == 1) {
    // Replicated tensors first over Z; then every shard reduce-scattered over D into its piece.
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const TensorShard& t = plan_.tensors[i];
      float* gp = grads_.data() + t.offset;
      if (!t.z_sharded && g_.shape.z > 1) g_.z.allreduce_sum(gp, size_t(t.shard_numel));
      if (g_.shape.d == 1) continue;
      float* piece = zero_tmp_.data() + piece_[i] * g_.shape.d;
      reduce_scatter_d(i, gp, piece);
      std::memcpy(grads_.data() + zl_.grad_offsets[i], piece, zl_.sizes[i] * sizeof(float));
    }
    return;
  }
  // Z-sharded weights: each shard already summed over Z; sum over data replicas.
  // Replicated tensors: sum over every token-splitting axis (Z and D) at once.
  for (const auto& t : plan_.tensors) {
    float* gp = grads_.data() + t.offset;
    if (t.z_sharded) {
      if (g_.shape.d > 1) g_.d.allreduce_sum(gp, size_t(t.shard_numel));
    } else if (g_.zd.size() > 1) {
      g_.zd.allreduce_sum(gp, size_t(t.shard_numel));
    }
  }
}

void ParallelTransformer::gather_updated_params() {
  if (opt_.zero == 0 || g_.shape.d == 1) return;
  ScopedPhase sp(prof_, Phase::Comm);
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const TensorShard& t = plan_.tensors[i];
    const int64_t q = piece_[i];
    float* pieces = zero_tmp_.data();
    float* mine = pieces + q * g_.shape.d;
    std::fill(mine, mine + q, 0.0f);
    std::memcpy(mine, params_.data() + zl_.param_offsets[i], zl_.sizes[i] * sizeof(float));
    g_.d.allgather(mine, pieces, size_t(q));
    std::memcpy(params_.data() + t.offset, pieces, t.shard_numel * sizeof(float));
  }
}

double ParallelTransformer::grad_sum_squares() {
  // Each element is counted by one rank: its owner on every axis it is replicated over (with
  // ZeRO each D rank holds a different piece, so D is no longer such an axis).
  const GridCoord& c = g_.coord;
  double local = 0;
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const TensorShard& t = plan_.tensors[i];
    bool owner = (opt_.zero > 0 || c.d == 0) && owns(t);
    if (!t.z_sharded) owner = owner && c.z == 0;
    if (t.layout == ShardLayout::ColsX) owner = owner && c.y == 0;
    if (t.layout == ShardLayout::RowsY) owner = owner && c.x == 0;
    if (owner) local += k::sum_squares(grads_.data() + zl_.grad_offsets[i], zl_.sizes[i]);
  }
  if (g_.world.size() > 1) g_.world.allreduce_sum(&local, 1);
  return local;
}

// ---------------------------------------------------------------------------------------------
// Exact norms over a hidden size split across X: row statistics are all-reduced over X.

namespace {

void row_sums(const float* x, int64_t N, int64_t C, double* out, int stride, const float* sub) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = x + t * C;
    double s = 0;
    if (sub) {
      const double m = sub[t];
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += (r[c] - m) * (r[c] - m);
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += r[c];
    }
    out[t * stride] = s;
  }
}

}  // namespace

// A sum over a group, skipped when the group is one rank; its time counts as communication.
template <typename T>
void ParallelTransformer::sum_over(const comm::Communicator& group, T* data, int64_t n) {
  if (group.size() == 1) return;
  ScopedPhase comm_phase(prof_, Phase::Comm);
  group.allreduce_sum(data, size_t(n));
}

// ---------------------------------------------------------------------------------------------
// Forward

void ParallelTransformer::norm_fwd(float* out, float* mean, float* rstd, const float* x, int wi,
                                   int bi, int64_t N) {
  const int64_t C = cfg_.n_embd;
  const float eps = cfg_.norm_eps;
  double* st = stats_.data();
  ScopedPhase sp(prof_, Phase::Norm);
  if (gpt2_) {
    row_sums(x, N, Cx_, st, 1, nullptr);
    sum_over(g_.x, st, N);
    for (int64_t t = 0; t < N; ++t) mean[t] = float(st[t] / double(C));
    row_sums(x, N, Cx_, st, 1, mean);
    sum_over(g_.x, st, N);
    for (int64_t t = 0; t < N; ++t) rstd[t] = float(1.0 / std::sqrt(st[t] / double(C) + eps));
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      const float* r = x + t * Cx_;
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < Cx_; ++c) s += double(r[c]) * r[c];
      st[t] = s;
    }
    sum_over(g_.x, st, N);
    for (int64_t t = 0; t < N; ++t) rstd[t] = float(1.0 / std::sqrt(st[t] / double(C) + eps));
  }
  const float* wv = w(wi);
  const float* bv = w(bi);
  const bool gpt2 = gpt2_;
  const int64_t Cx = Cx_;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = x + t * Cx;
    float* o = out + t * Cx;
    const float m = gpt2 ? mean[t] : 0.0f, s = rstd[t];
    if (bv) {
#pragma omp simd
      for (int64_t c = 0; c < Cx; ++c) o[c] = (r[c] - m) * s * wv[c] + bv[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < Cx; ++c) o[c] = r[c] * s * wv[c];
    }
  }
}

// Normal layer: out[N, n_out] = in[N, Cx-like] · Wᵀ, partial over X -> all-reduce X, + bias.
void ParallelTransformer::normal_fwd(float* out, const float* in, int wi, int bi, int64_t k_in,
                                     int64_t n_out, int64_t N) {
  timed(Phase::Gemm, [&] { k::gemm<float>(false, true, N, n_out, k_in, 1.0f, in, k_in, w(wi), k_in, 0.0f, out, n_out); });
  sum_over(g_.x, out, N * n_out);
  if (const float* b = w(bi)) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < n_out; ++j) out[t * n_out + j] += b[j];
  }
}

// Transposed layer + residual: out[N, Cx] = resid + all-reduce_Y(in · Wᵀ) + bias.
void ParallelTransformer::transposed_fwd(float* out, const float* resid, const float* in, int wi,
                                         int bi, int64_t k_in, int64_t N) {
  float* tmp = a_->tmp;
  const int64_t Cx = Cx_;
  timed(Phase::Gemm, [&] { k::gemm<float>(false, true, N, Cx, k_in, 1.0f, in, k_in, w(wi), k_in, 0.0f, tmp, Cx); });
  sum_over(g_.y, tmp, N * Cx);
  const float* b = w(bi);
  ScopedPhase sp(prof_, Phase::Residual);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < Cx; ++c)
      out[t * Cx + c] = resid[t * Cx + c] + tmp[t * Cx + c] + (b ? b[c] : 0.0f);
}

// Attention of layer l from its stored q|k|v (after RoPE): atty and lse.
void ParallelTransformer::attention_forward(int l, int B, int T) {
  auto& A = a_->layer[l];
  k::AttentionDims d{};
  d.B = B; d.Tq = T; d.Tk = T; d.n_head = int(nhy_); d.n_kv_head = int(nkvy_); d.head_dim = int(hd_);
  d.q_stride = d.kv_stride = QKVy_; d.q_batch_stride = d.kv_batch_stride = T * QKVy_;
  d.out_stride = Ay_; d.out_batch_stride = T * Ay_;
  timed(Phase::Attention, [&] {
    k::attention_forward<float>(A.atty, A.lse, A.qkv, A.qkv + nhy_ * hd_, A.qkv + (nhy_ + nkvy_) * hd_, d);
  });
}

// One block from its input x (its weights gathered): every activation of a_->layer[l].
void ParallelTransformer::layer_forward(int l, const float* x, int B, int T) {
  const int64_t N = int64_t(B) * T;
  const Layer& L = layers_[l];
  auto& A = a_->layer[l];
  norm_fwd(A.ln1, A.ln1_mean, A.ln1_rstd, x, L.ln1_w, L.ln1_b, N);
  normal_fwd(A.qkv, A.ln1, L.qkv_w, L.qkv_b, Cx_, QKVy_, N);
  if (!gpt2_)
    timed(Phase::Attention, [&] { k::rope_forward(A.qkv, N, T, 0, nhy_ + nkvy_, hd_, QKVy_, rope_cos_.data(), rope_sin_.data()); });
  attention_forward(l, B, T);
  transposed_fwd(A.resid_mid, x, A.atty, L.proj_w, L.proj_b, Ay_, N);
  norm_fwd(A.ln2, A.ln2_mean, A.ln2_rstd, A.resid_mid, L.ln2_w, L.ln2_b, N);
  normal_fwd(A.fc, A.ln2, L.fc_w, L.fc_b, Cx_, FWy_, N);
  timed(Phase::Activation, [&] {
    if (gpt2_) k::gelu_forward(A.fc_act, A.fc, N * Fy_);
    else k::swiglu_forward(A.fc_act, A.fc, N, Fy_);
  });
  transposed_fwd(A.resid_out, A.resid_mid, A.fc_act, L.fcproj_w, L.fcproj_b, Fy_, N);
  scratch_layer_ = l;  // with recomputation, the shared scratch now holds this layer
}

void ParallelTransformer::forward(const int32_t* inputs, int B, int T) {
  forward_chunk(0, cfg_.n_layer, true, true, inputs, B, T);
}

void ParallelTransformer::forward_chunk(int l0, int l1, bool embed, bool head,
                                        const int32_t* inputs, int B, int T) {
  if (B <= 0 || B > local_batch_)
    fail("micro-batch of ", B, " sequences on this rank; the model was set up for 1..", local_batch_);
  if (T <= 0 || T > max_len_)
    fail("sequence of ", T, " tokens is longer than the model's maximum of ", max_len_,
         " (model.max_seq / train.seq_len)");
  const int64_t N = int64_t(B) * T, V = cfg_.vocab_size;
  Acts& a = *a_;

  if (embed || head) gather_layer(-1);
  if (embed) {
    // Vocabulary-parallel lookup: rows of this y's vocabulary slice, zeros elsewhere; sum over Y.
    ScopedPhase sp(prof_, Phase::Embedding);
    for (int64_t t = 0; t < N; ++t)
      if (inputs[t] < 0 || inputs[t] >= V)
        fail("token id ", inputs[t], " at position ", t, " is outside the model's vocabulary [0, ", V, ")");
    const float* E = w(wte_);
    const int64_t v0 = Vy_ * g_.coord.y;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      float* o = a.emb + t * Cx_;
      const int64_t v = inputs[t] - v0;
      if (v >= 0 && v < Vy_) std::memcpy(o, E + v * Cx_, Cx_ * sizeof(float));
      else std::fill(o, o + Cx_, 0.0f);
    }
    sum_over(g_.y, a.emb, N * Cx_);
    if (wpe_ >= 0) {
      const float* P = w(wpe_);
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < N; ++t)
        for (int64_t c = 0; c < Cx_; ++c) a.emb[t * Cx_ + c] += P[(t % T) * Cx_ + c];
    }
  }

  const float* x = l0 == 0 ? a.emb : a.layer[l0 - 1].resid_out;  // the chunk's input
  for (int l = l0; l < l1; ++l) {
    gather_layer(l);
    layer_forward(l, x, B, T);
    x = a.layer[l].resid_out;
  }
  if (!head) return;
  norm_fwd(a.lnf, a.lnf_mean, a.lnf_rstd, x, lnf_w_, lnf_b_, N);
  // Output head: normal layer on the embedding's block -> logits [N, V/Gy].
  timed(Phase::Gemm, [&] { k::gemm<float>(false, true, N, Vy_, Cx_, 1.0f, a.lnf, Cx_, w(head_), Cx_, 0.0f, a.logits, Vy_); });
  sum_over(g_.x, a.logits, N * Vy_);
}

// Vocabulary-parallel cross-entropy over Y: global row max, then Σ exp and the target logit
// (from the rank that owns it) in one all-reduce. With grad: logits -> dlogits in place.
double ParallelTransformer::cross_entropy(const int32_t* targets, int64_t N, float grad_scale,
                                          bool with_grad) {
  ScopedPhase sp(prof_, Phase::Loss);
  const int64_t V = cfg_.vocab_size, v0 = Vy_ * g_.coord.y;
  for (int64_t t = 0; t < N; ++t)
    if (targets[t] >= V)
      fail("target token id ", targets[t], " at position ", t, " is outside the model's vocabulary [0, ", V, ")");
  float* L = a_->logits;
  std::vector<float> mx(N);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = L + t * Vy_;
    float m = r[0];
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < Vy_; ++j) m = std::max(m, r[j]);
    mx[t] = m;
  }
  if (g_.y.size() > 1) {
    ScopedPhase comm(prof_, Phase::Comm);
    g_.y.allreduce_max(mx.data(), size_t(N));
  }
  double* st = stats_.data();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* r = L + t * Vy_;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < Vy_; ++j) s += k::fast_exp(r[j] - mx[t]);
    st[2 * t] = s;
    const int64_t v = targets[t] - v0;
    st[2 * t + 1] = (targets[t] >= 0 && v >= 0 && v < Vy_) ? r[v] : 0.0;
  }
  sum_over(g_.y, st, 2 * N);
  double total = 0;
  for (int64_t t = 0; t < N; ++t) {
    const bool kept = targets[t] >= 0;
    a_->losses[t] = kept ? float(std::log(st[2 * t]) + mx[t] - st[2 * t + 1]) : 0.0f;
    total += a_->losses[t];
  }
  if (with_grad) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      float* r = L + t * Vy_;
      if (targets[t] < 0) {
        std::fill(r, r + Vy_, 0.0f);
        continue;
      }
      const float scale = grad_scale / float(st[2 * t]), m = mx[t];
#pragma omp simd
      for (int64_t j = 0; j < Vy_; ++j) r[j] = k::fast_exp(r[j] - m) * scale;
      const int64_t v = targets[t] - v0;
      if (v >= 0 && v < Vy_) r[v] -= grad_scale;
    }
  }
  return total;
}

double ParallelTransformer::forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T) {
  forward(inputs, B, T);
  return cross_entropy(targets, int64_t(B) * T, 0.0f, false);
}

double ParallelTransformer::forward_backward(const int32_t* inputs, const int32_t* targets,
                                             int B, int T, float grad_scale) {
  forward(inputs, B, T);
  const double loss = cross_entropy(targets, int64_t(B) * T, grad_scale, true);
  backward(inputs, B, T);
  return loss;
}

// ---------------------------------------------------------------------------------------------
// Backward

void ParallelTransformer::backward(const int32_t* inputs, int B, int T) {
  backward_chunk(0, cfg_.n_layer, true, true, inputs, nullptr, B, T);
}

void ParallelTransformer::backward_chunk(int l0, int l1, bool embed, bool head,
                                         const int32_t* inputs, const float* dout, int B, int T) {
  const int64_t N = int64_t(B) * T, C = cfg_.n_embd;
  Acts& a = *a_;
  double* st = stats_.data();

  // dx += norm backward; dw, db accumulate. Row sums of dn and dn*n are all-reduced over X.
  auto norm_bwd = [&](float* dx, const float* dout, const float* x, const float* mean,
                      const float* rstd, int wi, int bi) {
    ScopedPhase sp(prof_, Phase::Norm);
    const float* wv = w(wi);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      const float* r = x + t * Cx_;
      const float* d = dout + t * Cx_;
      const float m = gpt2_ ? mean[t] : 0.0f, s = rstd[t];
      double a1 = 0, a2 = 0;
#pragma omp simd reduction(+ : a1, a2)
      for (int64_t c = 0; c < Cx_; ++c) {
        const float dn = d[c] * wv[c];
        a1 += dn;
        a2 += dn * ((r[c] - m) * s);
      }
      st[2 * t] = a1;
      st[2 * t + 1] = a2;
    }
    sum_over(g_.x, st, 2 * N);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      const float* r = x + t * Cx_;
      const float* d = dout + t * Cx_;
      const float m = gpt2_ ? mean[t] : 0.0f, s = rstd[t];
      const float mean_dn = gpt2_ ? float(st[2 * t] / double(C)) : 0.0f;
      const float mean_dnn = float(st[2 * t + 1] / double(C));
      float* o = dx + t * Cx_;
#pragma omp simd
      for (int64_t c = 0; c < Cx_; ++c) {
        const float n = (r[c] - m) * s;
        o[c] += (d[c] * wv[c] - mean_dn - n * mean_dnn) * s;
      }
    }
    float* dw = gw(wi);
    float* db = gw(bi);
    constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < Cx_; c0 += kBlock) {
      const int64_t c1 = std::min(Cx_, c0 + kBlock);
      for (int64_t t = 0; t < N; ++t) {
        const float* r = x + t * Cx_;
        const float* d = dout + t * Cx_;
        const float m = gpt2_ ? mean[t] : 0.0f, s = rstd[t];
        for (int64_t c = c0; c < c1; ++c) {
          dw[c] += d[c] * (r[c] - m) * s;
          if (db) db[c] += d[c];
        }
      }
    }
  };
  // Bias gradient: Σ over tokens, parallel over columns (fixed order).
  auto bias_bwd = [&](float* db, const float* dout, int64_t width) {
    if (!db) return;
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < width; j0 += 256) {
      const int64_t j1 = std::min(width, j0 + 256);
      for (int64_t t = 0; t < N; ++t)
        for (int64_t j = j0; j < j1; ++j) db[j] += dout[t * width + j];
    }
  };
  // Normal layer backward: din[N, k_in] = all-reduce_Y(dout · W); dW += doutᵀ · in.
  auto normal_bwd = [&](float* din, const float* dout, const float* in, int wi, int bi, int64_t k_in, int64_t n_out) {
    timed(Phase::Gemm, [&] {
      k::gemm<float>(false, false, N, k_in, n_out, 1.0f, dout, n_out, w(wi), k_in, 0.0f, din, k_in);
      k::gemm<float>(true, false, n_out, k_in, N, 1.0f, dout, n_out, in, k_in, 1.0f, gw(wi), k_in);
    });
    bias_bwd(gw(bi), dout, n_out);
    sum_over(g_.y, din, N * k_in);
  };
  // Transposed layer backward: din[N, k_in] = all-reduce_X(dout · W); dW += doutᵀ · in.
  auto transposed_bwd = [&](float* din, const float* dout, const float* in, int wi, int bi, int64_t k_in) {
    timed(Phase::Gemm, [&] {
      k::gemm<float>(false, false, N, k_in, Cx_, 1.0f, dout, Cx_, w(wi), k_in, 0.0f, din, k_in);
      k::gemm<float>(true, false, Cx_, k_in, N, 1.0f, dout, Cx_, in, k_in, 1.0f, gw(wi), k_in);
    });
    bias_bwd(gw(bi), dout, Cx_);
    sum_over(g_.x, din, N * k_in);
  };

  if (embed || head) {
    gather_layer(-1);
    zero_layer_grad_blocks(-1);
  }
  if (head) {
    const float* x_last = l1 > 0 ? a.layer[l1 - 1].resid_out : a.emb;
    // Head: dlogits [N, Vy] -> dlnf [N, Cx] (sum over Y), d(head block).
    timed(Phase::Gemm, [&] {
      k::gemm<float>(false, false, N, Cx_, Vy_, 1.0f, a.logits, Vy_, w(head_), Cx_, 0.0f, a.dln, Cx_);
      k::gemm<float>(true, false, Vy_, Cx_, N, 1.0f, a.logits, Vy_, a.lnf, Cx_, 1.0f, gw(head_), Cx_);
    });
    sum_over(g_.y, a.dln, N * Cx_);
    std::fill(a.dresid, a.dresid + N * Cx_, 0.0f);
    norm_bwd(a.dresid, a.dln, x_last, a.lnf_mean, a.lnf_rstd, lnf_w_, lnf_b_);
  } else {
    std::memcpy(a.dresid, dout, size_t(N * Cx_) * sizeof(float));  // from the next stage
  }

  for (int l = l1 - 1; l >= l0; --l) {
    const Layer& L = layers_[l];
    auto& A = a.layer[l];
    const float* x_in = l == 0 ? a.emb : a.layer[l - 1].resid_out;
    gather_layer(l);
    zero_layer_grad_blocks(l);
    // Recomputation: the scratch holds only the last layer run forward (the last one, at first).
    if (opt_.recompute == Recompute::Full && scratch_layer_ != l) layer_forward(l, x_in, B, T);
    if (opt_.recompute == Recompute::Selective && scratch_layer_ != l) {
      attention_forward(l, B, T);
      scratch_layer_ = l;
    }
    transposed_bwd(a.dfc_act, a.dresid, A.fc_act, L.fcproj_w, L.fcproj_b, Fy_);
    timed(Phase::Activation, [&] {
      if (gpt2_) k::gelu_backward(a.dfc, a.dfc_act, A.fc, N * Fy_);
      else k::swiglu_backward(a.dfc, a.dfc_act, A.fc, N, Fy_);
    });
    normal_bwd(a.dln, a.dfc, A.ln2, L.fc_w, L.fc_b, Cx_, FWy_);
    norm_bwd(a.dresid, a.dln, A.resid_mid, A.ln2_mean, A.ln2_rstd, L.ln2_w, L.ln2_b);
    transposed_bwd(a.datty, a.dresid, A.atty, L.proj_w, L.proj_b, Ay_);
    k::AttentionDims d{};
    d.B = B; d.Tq = T; d.Tk = T; d.n_head = int(nhy_); d.n_kv_head = int(nkvy_); d.head_dim = int(hd_);
    d.q_stride = d.kv_stride = QKVy_; d.q_batch_stride = d.kv_batch_stride = T * QKVy_;
    d.out_stride = Ay_; d.out_batch_stride = T * Ay_;
    timed(Phase::Attention, [&] {
      k::attention_backward<float>(a.dqkv, a.dqkv + nhy_ * hd_, a.dqkv + (nhy_ + nkvy_) * hd_, a.datty,
                                   A.qkv, A.qkv + nhy_ * hd_, A.qkv + (nhy_ + nkvy_) * hd_, A.atty, A.lse, d);
      if (!gpt2_) k::rope_backward(a.dqkv, N, T, 0, nhy_ + nkvy_, hd_, QKVy_, rope_cos_.data(), rope_sin_.data());
    });
    normal_bwd(a.dln, a.dqkv, A.ln1, L.qkv_w, L.qkv_b, Cx_, QKVy_);
    norm_bwd(a.dresid, a.dln, x_in, A.ln1_mean, A.ln1_rstd, L.ln1_w, L.ln1_b);
    scatter_layer_grads(l);
  }

  if (embed) {
    ScopedPhase sp(prof_, Phase::Embedding);
    float* dE = gw(wte_);
    const int64_t v0 = Vy_ * g_.coord.y;
    float* dP = gw(wpe_);
    constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < Cx_; c0 += kBlock) {
      const int64_t c1 = std::min(Cx_, c0 + kBlock);
      for (int64_t t = 0; t < N; ++t) {
        const float* dr = a.dresid + t * Cx_;
        const int64_t v = inputs[t] - v0;
        if (v >= 0 && v < Vy_)
          for (int64_t c = c0; c < c1; ++c) dE[v * Cx_ + c] += dr[c];
        if (dP)
          for (int64_t c = c0; c < c1; ++c) dP[(t % T) * Cx_ + c] += dr[c];
      }
    }
  }
  if (embed || head) scatter_layer_grads(-1);
}

// ---------------------------------------------------------------------------------------------
// Pipeline support

int ParallelTransformer::layer_stage(int l) const {
  const int p = g_.shape.p, V = p * opt_.virtual_stages;
  for (int j = 0; j < V; ++j)
    if (l >= stage_layers(cfg_.n_layer, V, j).first && l < stage_layers(cfg_.n_layer, V, j).second)
      return j % p;
  return 0;
}

bool ParallelTransformer::owns(const TensorShard& t) const {
  if (g_.shape.p == 1) return true;
  // Top-level tensors: every stage keeps the same copy (their gradients are summed over P);
  // stage 0 speaks for them.
  if (t.spec->layer < 0) return g_.coord.p == 0;
  return layer_stage(t.spec->layer) == g_.coord.p;
}

float* ParallelTransformer::chunk_input(int l0) {
  return l0 == 0 ? a_->emb : a_->layer[l0 - 1].resid_out;
}
const float* ParallelTransformer::chunk_output(int l1) const {
  return l1 == 0 ? a_->emb : a_->layer[l1 - 1].resid_out;
}
const float* ParallelTransformer::input_grad() const { return a_->dresid; }

// What a chunk's backward reads from its forward: the recompute scratch, its layers' kept
// activations from its input (layer l0 - 1's output) on, and with the embedding or the head the
// global activations (embedding output, final norm, logits). Activation regions are contiguous
// per layer in layer order (see the constructor).
std::vector<std::pair<float*, size_t>> ParallelTransformer::chunk_regions(int l0, int l1, bool embed,
                                                                          bool head) {
  std::vector<std::pair<float*, size_t>> r;
  r.push_back({acts_.data(), size_t(layer_begin_[0] - acts_.data())});
  float* from = layer_begin_[std::max(0, l0 - 1)];
  r.push_back({from, size_t(layer_begin_[l1] - from)});
  if (embed || head) r.push_back({layer_begin_[cfg_.n_layer], size_t(acts_.data() + acts_.size() - layer_begin_[cfg_.n_layer])});
  return r;
}

std::vector<float> ParallelTransformer::stash(int l0, int l1, bool embed, bool head) {
  std::vector<float> out;
  for (auto [p, n] : chunk_regions(l0, l1, embed, head)) out.insert(out.end(), p, p + n);
  out.push_back(float(scratch_layer_));  // exact for any layer index
  return out;
}

void ParallelTransformer::restore(int l0, int l1, bool embed, bool head, const std::vector<float>& s) {
  size_t at = 0;
  for (auto [p, n] : chunk_regions(l0, l1, embed, head)) {
    TETRAD_CHECK(at + n < s.size(), "activation stash of the wrong chunk");
    std::memcpy(p, s.data() + at, n * sizeof(float));
    at += n;
  }
  TETRAD_CHECK(at + 1 == s.size(), "activation stash of the wrong chunk");
  scratch_layer_ = int(s.back());
}

std::vector<int32_t> ParallelTransformer::greedy_next_tokens(const int32_t* inputs, int B,
                                                             int T) {
  forward(inputs, B, T);
  const int64_t v0 = int64_t(g_.coord.y) * Vy_;  // first vocabulary id of this rank's slice
  std::vector<double> mine(2 * size_t(B));        // (best logit, its global id) per sequence
  for (int b = 0; b < B; ++b) {
    const float* row = a_->logits + (int64_t(b) * T + T - 1) * Vy_;
    const int64_t j = std::max_element(row, row + Vy_) - row;
    mine[2 * b] = row[j];
    mine[2 * b + 1] = double(v0 + j);
  }
  const int gy = g_.y.size();
  std::vector<double> all(mine.size() * size_t(gy));
  if (gy == 1) {
    all = mine;
  } else {
    ScopedPhase comm_phase(prof_, Phase::Comm);
    g_.y.allgather(mine.data(), all.data(), mine.size());
  }
  std::vector<int32_t> next(B);
  for (int b = 0; b < B; ++b) {
    double best = all[2 * b], id = all[2 * b + 1];
    for (int r = 1; r < gy; ++r) {
      const double v = all[(size_t(r) * B + b) * 2], i = all[(size_t(r) * B + b) * 2 + 1];
      if (v > best || (v == best && i < id)) best = v, id = i;
    }
    next[b] = int32_t(id);
  }
  return next;
}

}  // namespace tetrad::parallel
