#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tetrad/core/error.hpp"
#include "tetrad/backend/cpu/attention.hpp"
#include "tetrad/backend/cpu/fast_math.hpp"
#include "tetrad/backend/cpu/ops.hpp"
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
    : cfg_(config), g_(groups), opt_(options), local_batch_(local_batch), max_len_(max_len),
      ov_(options.overlap) {
  if (opt_.zero < 0 || opt_.zero > 2)
    fail("parallel.zero: expected 0, 1 or 2 (ZeRO stage over the data axis), got ", opt_.zero);
  if (opt_.virtual_stages < 1)
    fail("parallel.virtual_stages must be at least 1, got ", opt_.virtual_stages);
  if (opt_.reduce_scatter_chunk_bytes < 1)
    fail("reduce-scatter chunk size must be at least 1 byte, got ", opt_.reduce_scatter_chunk_bytes);
  if (ov_.prefetch_depth < 0) fail("parallel.prefetch_depth must be >= 0, got ", ov_.prefetch_depth);
  if (ov_.forward_chunks < 1) fail("parallel.forward_chunks must be >= 1, got ", ov_.forward_chunks);
  if (!(ov_.dp_bucket_mb >= 0)) fail("parallel.dp_bucket_mb must be >= 0, got ", ov_.dp_bucket_mb);
  // Data-parallel buckets during the last backward only without ZeRO and without the pipeline:
  // ZeRO reduce-scatters over D itself (per layer with ZeRO 2, into pieces at the end of the step
  // with ZeRO 1), which the buckets' all-reduces would duplicate; with Gp > 1 the top-level
  // gradients are first summed over P in reduce_gradients(), and the pipeline's backward chunks
  // do not count micro-batches the way forward_backward does. Both reduce in reduce_gradients().
  if (opt_.zero >= 1 || groups.shape.p > 1) ov_.dp_overlap = false;
  opt_.overlap = ov_;
  q_.enable_progress_thread(ov_.progress_thread);
  cfg_.validate();
  if (max_len <= 0 || max_len > cfg_.max_seq)
    fail("sequence length ", max_len, " is outside what the model supports (1..", cfg_.max_seq,
         " = model.max_seq)");
  if (local_batch <= 0) fail("local micro-batch must be positive, got ", local_batch);
  table_ = build_param_table(cfg_);
  // The split uses the sequence length this model runs (its attention cost, for "balanced"), as
  // the planner does with its seq; resolve_layer_split names what is wrong with the setting.
  if (g_.shape.p > 1)
    split_ = resolve_layer_split(opt_.pipeline_layers, cfg_, max_len, g_.shape.p,
                                 opt_.virtual_stages);
  plan_ = ShardPlan::build(cfg_, table_, g_.shape, g_.coord, split_);
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
      // Slots for gathered layers: the one in use plus prefetch_depth ahead, or all of them.
      const int nslots = std::max(1, ov_.cache_gathered_weights
                                         ? cfg_.n_layer
                                         : std::min(ov_.prefetch_depth + 1, cfg_.n_layer));
      for (int s = 0; s < nslots; ++s) gathered_.emplace_back(layer_max);
      slot_layer_.assign(size_t(nslots), -2);
      slot_tickets_.resize(size_t(nslots));
      gathered_top_ = Buffer<float>(top);
      scatter_tmp_ = Buffer<float>(plan_.local_total);  // each shard lands at its own offset
    }
    (void)shard_max;
    gblock_[0] = Buffer<float>(layer_max);
    gblock_[1] = Buffer<float>(layer_max);
    gblock_top_ = Buffer<float>(top);
  }
  if (opt_.sparse_embedding_grad && G.z > 1 && G.p == 1 && opt_.zero != 2) {
    // Rows plus ids against the dense block: worth it when the Z group's tokens are fewer than
    // this rank's vocabulary rows.
    const int64_t rows = int64_t(G.z) * local_batch * max_len;
    sparse_embedding_ = rows * (Cx_ + 1) < Vy_ * Cx_;
    if (sparse_embedding_) {
      emb_rows_ = Buffer<float>(size_t(rows * Cx_));
      emb_ids_ = Buffer<int32_t>(size_t(rows));
    }
  }
  rs_remaining_.assign(size_t(cfg_.n_layer) + 1, 0);
  final_sharded_.assign(size_t(cfg_.n_layer) + 1, 0);
  final_repl_.assign(size_t(cfg_.n_layer) + 1, 0);
  build_buckets();

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
  size_t gathered = 0;
  for (const auto& b : gathered_) gathered += b.size();
  const size_t n = params_.size() + grads_.size() + 2 * size_t(zl_.state_size) + gathered +
                   gathered_top_.size() + gblock_[0].size() + gblock_[1].size() +
                   gblock_top_.size() + scatter_tmp_.size() + zero_tmp_.size() +
                   bucket_buf_.size() + emb_rows_.size() + emb_ids_.size();
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
  if (!t.stored) return {};  // another pipeline stage's layer
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
  // Disjoint blocks summed into zeros: exact. Only one owner of each replicated block writes.
  // A stage that does not store the tensor (another stage's layer) contributes zeros; every
  // rank of its Z group is in the same stage, so the Z all-gather is skipped by all or none.
  std::fill(full, full + t.spec->numel, 0.0f);
  if (t.stored) {
    std::vector<float> block(t.z_sharded ? t.shard_numel * g_.shape.z : t.block_numel);
    if (t.z_sharded && g_.shape.z > 1)
      g_.z.allgather(shard, block.data(), size_t(t.shard_numel));
    else
      std::memcpy(block.data(), shard, t.block_numel * sizeof(float));
    const GridCoord& c = g_.coord;
    bool owner = c.d == 0 && c.z == 0 && owns(t);
    if (t.layout == ShardLayout::ColsX) owner = owner && c.y == 0;
    if (t.layout == ShardLayout::RowsY) owner = owner && c.x == 0;
    if (owner) insert_block(t, block.data(), full);
  }
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
  if (q > 0) g_.d.allgather(mine, pieces, size_t(q));  // q = 0: not stored on this stage
  gather_shard(pieces, i, full);  // the pieces in D order are the shard (padding past its end)
}

const float* ParallelTransformer::w(int i) const {
  if (i < 0) return nullptr;
  const TensorShard& t = plan_.tensors[i];
  if (!t.z_sharded || g_.shape.z == 1) return params_.data() + t.offset;
  if (t.spec->layer < 0) return gathered_top_.data() + t.block_offset;
  return gathered_[size_t(slot_of(t.spec->layer))].data() + t.block_offset;
}

bool ParallelTransformer::staged(const TensorShard& t) const {
  return opt_.zero == 2 || (t.z_sharded && g_.shape.z > 1);
}

float* ParallelTransformer::gw(int i) {
  if (i < 0) return nullptr;
  const TensorShard& t = plan_.tensors[i];
  if (!staged(t)) return grads_.data() + t.offset;
  return (t.spec->layer < 0 ? gblock_top_.data() : gblock_[t.spec->layer & 1].data()) + t.block_offset;
}

void ParallelTransformer::gemm(const char* what, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                               const float* A, int64_t lda, const float* B, int64_t ldb,
                               float beta, float* C, int64_t ldc) {
  CommQueue::ProgressScope progress(q_);  // pending collectives move during the GEMM
  ScopedPhase sp(prof_, Phase::Gemm, what, M, N, K);
  k::gemm<float>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

void ParallelTransformer::issue_gather(int layer) {
  if (g_.shape.z == 1) return;
  std::vector<CommQueue::Ticket>* tickets;
  float* buf;
  if (layer < 0) {
    if (top_valid_) return;
    top_valid_ = true;
    tickets = &top_tickets_;
    buf = gathered_top_.data();
  } else {
    const int s = slot_of(layer);
    if (slot_layer_[size_t(s)] == layer) return;
    // The slot's previous layer is no longer in use (the schedule only prefetches into slots of
    // layers already done), but its gather may in principle still be pending.
    for (auto t : slot_tickets_[size_t(s)]) q_.wait(t);
    slot_layer_[size_t(s)] = layer;
    tickets = &slot_tickets_[size_t(s)];
    buf = gathered_[size_t(s)].data();
  }
  tickets->clear();
  for (const auto& t : plan_.tensors)
    if (t.spec->layer == layer && t.z_sharded)
      tickets->push_back(q_.start(
          g_.z.iallgather(params_.data() + t.offset, buf + t.block_offset, size_t(t.shard_numel)),
          g_.z, "allgather", "W", layer, t.shard_numel * g_.shape.z * int64_t(sizeof(float))));
}

void ParallelTransformer::gather_layer(int layer) {
  if (g_.shape.z == 1) return;
  issue_gather(layer);
  for (auto t : layer < 0 ? top_tickets_ : slot_tickets_[size_t(slot_of(layer))]) q_.wait(t);
}

void ParallelTransformer::prefetch(int layer, int direction, int lo, int hi) {
  if (g_.shape.z == 1) return;
  for (int k = 1; k <= ov_.prefetch_depth; ++k) {
    const int j = layer + direction * k;
    if (j >= lo && j < hi) issue_gather(j);
  }
}

void ParallelTransformer::invalidate_gathered() {
  prefetched_next_ = false;
  if (g_.shape.z == 1) return;
  if (q_.pending()) q_.wait_all();  // nothing may still write into the slots
  top_valid_ = false;
  std::fill(slot_layer_.begin(), slot_layer_.end(), -2);
}

void ParallelTransformer::issue_first_gathers() {
  issue_gather(-1);
  issue_gather(0);
  prefetch(0, +1, 0, cfg_.n_layer);
}

void ParallelTransformer::apply_update(
    const std::function<void(float* params, int64_t lo, int64_t hi)>& update) {
  // All of it is the optimizer step on the breakdown, except the MPI calls that issue and poll
  // the gathers (communication; the gathers' own time runs behind the update).
  ScopedPhase phase(prof_, Phase::Optimizer, "update");
  float* p = params();  // the parameters change: gathered copies are dropped
  const int64_t n = plan_.local_total;
  const bool across = ov_.prefetch_across_steps && ov_.prefetch_depth > 0 && g_.shape.z > 1 &&
                      g_.shape.p == 1;
  if (!across || opt_.zero >= 1) {
    // ZeRO: the gathers need the pieces every D replica updated, so they wait for
    // gather_updated_params(); they still overlap the trainer's work until the next forward.
    update(p, 0, n);
    gather_updated_params();
    if (across) {
      ScopedPhase issue(prof_, Phase::Comm, "issue next step's gathers");
      issue_first_gathers();
      prefetched_next_ = true;
    }
    return;
  }
  // The Z-sharded tensors of the top level and layers 0..prefetch_depth, as sorted, merged
  // intervals of the local buffer.
  std::vector<std::pair<int64_t, int64_t>> first;
  const int last_first = std::min(ov_.prefetch_depth, cfg_.n_layer - 1);
  for (const TensorShard& t : plan_.tensors)
    if (t.z_sharded && t.spec->layer <= last_first && t.shard_numel > 0)
      first.emplace_back(t.offset, t.offset + t.shard_numel);
  std::sort(first.begin(), first.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& iv : first)
    if (!merged.empty() && iv.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, iv.second);
    else
      merged.push_back(iv);
  for (const auto& [lo, hi] : merged) update(p, lo, hi);
  {
    ScopedPhase issue(prof_, Phase::Comm, "issue next step's gathers");
    issue_first_gathers();
  }
  prefetched_next_ = true;
  // The rest in slices, so the gathers move: by the progress thread while a slice computes, or
  // by a poll after each (about 4 MB of parameters, ~1 ms).
  constexpr int64_t kSlice = int64_t(1) << 20;
  auto rest = [&](int64_t lo, int64_t hi) {
    for (int64_t a = lo; a < hi; a += kSlice) {
      {
        CommQueue::ProgressScope progress(q_);
        update(p, a, std::min(hi, a + kSlice));
      }
      ScopedPhase poll(prof_, Phase::Comm, "poll");
      q_.poll();
    }
  };
  int64_t at = 0;
  for (const auto& [lo, hi] : merged) {
    rest(at, lo);
    at = hi;
  }
  rest(at, n);
}

void ParallelTransformer::zero_grads() {
  if (prefetched_next_) {
    // Only apply_update()'s gathers can be pending (reduce_gradients() finished every
    // reduction before the optimizer ran); they write gathered slots, not gradients, and hold
    // the current parameters, so they stay.
    prefetched_next_ = false;
    grads_.zero();
    reset_step_state();
    return;
  }
  q_.wait_all();  // pending reduce-scatters would add into the zeroed gradients
  grads_.zero();
  reset_step_state();
  invalidate_gathered();
}

void ParallelTransformer::begin_step(int micro_batches) {
  if (micro_batches <= 0) fail("begin_step: micro-batches must be positive, got ", micro_batches);
  zero_grads();
  // Only forward_backward counts micro-batches; the pipeline's chunks (Gp > 1) do not, and
  // dp_overlap is off there and with ZeRO (see the constructor).
  expected_micro_ = ov_.dp_overlap ? micro_batches : 0;
}

void ParallelTransformer::zero_layer_grad_blocks(int layer) {
  if (g_.shape.z == 1 && opt_.zero != 2) return;
  // The buffer's previous reduce-scatters (layer + 2, or last micro-batch's) read it: finish them.
  for (auto t : rs_tickets_[layer < 0 ? 2 : layer & 1]) q_.wait(t);
  float* buf = layer < 0 ? gblock_top_.data() : gblock_[layer & 1].data();
  for (const auto& t : plan_.tensors)
    if (t.spec->layer == layer && staged(t)) {
      const int64_t n = t.z_sharded ? t.shard_numel * g_.shape.z : t.block_numel;
      std::fill(buf + t.block_offset, buf + t.block_offset + n, 0.0f);
    }
}

// piece[piece_[i]] = this D rank's piece of Σ_D shard (the shard zero-padded to Gd pieces).
//
// In chunks of at most ParallelOptions::reduce_scatter_chunk_bytes per call: Open MPI's
// non-blocking reduce-scatter (coll/libnbc, which every collective here goes through) allocates
// a temporary of twice the whole message for each call, 32 MiB for the 16 MiB embedding
// gradient of the small configuration, the largest part of the memory benchmark's excess over
// the formula (found with heaptrack, docs/parallel.md "Memory per rank"). Chunk [a, a + len) of
// every piece is packed into the front of zero_tmp_ (the piece itself lies behind the Gd q
// padded elements) and reduce-scattered on its own. Every element is still summed over the same
// D ranks by the same algorithm, so the result does not depend on the chunking; every D rank
// makes the same calls (q and Gd are the same there).
void ParallelTransformer::reduce_scatter_d(size_t i, const float* shard, float* piece) {
  const int64_t n = plan_.tensors[i].shard_numel, q = piece_[i], Gd = g_.shape.d;
  if (Gd == 1) {
    std::memcpy(piece, shard, n * sizeof(float));
    return;
  }
  const int64_t chunk =
      std::max<int64_t>(1, opt_.reduce_scatter_chunk_bytes / (int64_t(sizeof(float)) * Gd));
  float* packed = zero_tmp_.data();
  for (int64_t a = 0; a < q; a += chunk) {
    const int64_t len = std::min(chunk, q - a);
    for (int64_t d = 0; d < Gd; ++d) {
      // Elements [d q + a, d q + a + len) of the shard zero-padded to Gd q.
      const int64_t first = d * q + a;
      const int64_t have = std::clamp<int64_t>(n - first, 0, len);
      if (have > 0) std::memcpy(packed + d * len, shard + first, size_t(have) * sizeof(float));
      std::fill(packed + d * len + have, packed + (d + 1) * len, 0.0f);
    }
    q_.run(g_.d.ireduce_scatter_sum(packed, piece + a, size_t(len)), g_.d, "reduce_scatter",
           "dW pieces over D", plan_.tensors[i].spec->layer, len * Gd * int64_t(sizeof(float)));
  }
}

void ParallelTransformer::scatter_layer_grads(int layer) {
  const bool last = last_micro_batch();
  if (opt_.zero == 2) {
    // ZeRO 2, every micro-batch: each staged block summed over Z (reduce-scatter of the Z shards,
    // all-reduce of the replicated ones), then reduce-scattered over D; this rank keeps its piece.
    // Blocking (through the queue): the pieces accumulate right away.
    float* buf = layer < 0 ? gblock_top_.data() : gblock_[layer & 1].data();
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const TensorShard& t = plan_.tensors[i];
      if (t.spec->layer != layer || !staged(t)) continue;
      float* block = buf + t.block_offset;
      const float* shard = block;
      if (t.z_sharded && g_.shape.z > 1) {
        float* land = scatter_tmp_.data() + t.offset;
        q_.run(g_.z.ireduce_scatter_sum(block, land, size_t(t.shard_numel)), g_.z,
               "reduce_scatter", "dW", layer, t.shard_numel * g_.shape.z * int64_t(sizeof(float)));
        shard = land;
      } else if (!t.z_sharded && g_.shape.z > 1) {
        sum_over(g_.z, block, t.block_numel, "replicated grads");  // replicated over Z: sum first
      }
      float* piece = zero_tmp_.data() + piece_[i] * g_.shape.d;
      reduce_scatter_d(i, shard, piece);
      k::add_inplace(grads_.data() + zl_.grad_offsets[i], piece, zl_.sizes[i]);
    }
    if (last_micro_batch()) layer_final(layer, true);
    return;
  }
  if (g_.shape.z == 1) {
    if (last) layer_final(layer, true);
    return;
  }
  rs_tickets_[layer < 0 ? 2 : layer & 1].clear();
  int& remaining = rs_remaining_[size_t(layer + 1)];
  remaining = 0;
  for (const auto& t : plan_.tensors)
    if (t.spec->layer == layer && t.z_sharded) ++remaining;
  for (const auto& t : plan_.tensors)
    if (t.spec->layer == layer && t.z_sharded) start_grad_reduce_scatter(t, last);
}

// The reduce-scatter over Z of one tensor's gradient block (the layer's staging buffer); on
// completion this rank's shard is added into the gradients, and the layer is final once its last
// one (rs_remaining_) is in, on the step's last micro-batch. Waited for at once without
// OverlapOptions::reduce_scatter.
CommQueue::Ticket ParallelTransformer::start_grad_reduce_scatter(const TensorShard& t, bool last) {
  const int layer = t.spec->layer;
  const float* block = (layer < 0 ? gblock_top_.data() : gblock_[layer & 1].data()) + t.block_offset;
  float* land = scatter_tmp_.data() + t.offset;
  float* gp = grads_.data() + t.offset;
  const int64_t n = t.shard_numel;
  int& remaining = rs_remaining_[size_t(layer + 1)];
  auto done = [this, land, gp, n, layer, last, &remaining] {
    k::add_inplace(gp, land, n);
    if (--remaining == 0 && last) layer_final(layer, true);
  };
  const auto ticket = q_.start(g_.z.ireduce_scatter_sum(block, land, size_t(n)), g_.z,
                               "reduce_scatter", "dW", layer,
                               n * g_.shape.z * int64_t(sizeof(float)), done);
  if (ov_.reduce_scatter) rs_tickets_[layer < 0 ? 2 : layer & 1].push_back(ticket);
  else q_.wait(ticket);
  return ticket;
}

// The sparse embedding gradient's top-level reduce-scatters over Z, in two parts: the head tensor
// right after the head's backward (tied: the embedding's dense part, which nothing adds to
// afterwards), the other Z-sharded top tensors but the embedding after the embedding's backward.
// The embedding's rows (accumulate_embedding_rows) count as one more completion of the top.
void ParallelTransformer::scatter_top_grads(bool head_part) {
  auto scattered = [&](int i) {  // an untied embedding has no dense part to reduce
    const TensorShard& t = plan_.tensors[size_t(i)];
    return t.spec->layer < 0 && t.z_sharded && (i == head_ || i != wte_);
  };
  if (head_part) {
    rs_tickets_[2].clear();
    int& remaining = rs_remaining_[0];
    remaining = 1;  // the rows
    for (int i = 0; i < int(plan_.tensors.size()); ++i) remaining += scattered(i);
  }
  for (int i = 0; i < int(plan_.tensors.size()); ++i) {
    if (!scattered(i) || (i == head_) != head_part) continue;
    const auto ticket = start_grad_reduce_scatter(plan_.tensors[size_t(i)], last_micro_batch());
    if (i == head_) head_rs_ticket_ = ticket;
  }
}

// This rank's shard of the token embedding's gradient += every Z rank's embedding-output
// gradient rows at their tokens, in Z-rank then token order (after the head's dense part, so
// the additions have one order whatever the overlap does).
void ParallelTransformer::accumulate_embedding_rows(int64_t N) {
  const int64_t Z = g_.shape.z, rows = Z * N;
  q_.run(g_.z.iallgather(a_->dresid, emb_rows_.data(), size_t(N * Cx_)), g_.z, "allgather",
         "embedding rows", -1, rows * Cx_ * int64_t(sizeof(float)));
  q_.wait(emb_ids_ticket_);
  if (head_ == wte_) q_.wait(head_rs_ticket_);
  const TensorShard& t = plan_.tensors[size_t(wte_)];
  const int64_t s0 = int64_t(g_.z.rank()) * t.shard_numel, s1 = s0 + t.shard_numel;
  float* gp = grads_.data() + t.offset;
  const int64_t v0 = Vy_ * g_.coord.y;
  const float* R = emb_rows_.data();
  const int32_t* ids = emb_ids_.data();
  {
    ScopedPhase sp(prof_, Phase::Embedding, "rows");
    constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < Cx_; c0 += kBlock) {
      const int64_t c1 = std::min(Cx_, c0 + kBlock);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t v = ids[r] - v0;
        if (v < 0 || v >= Vy_) continue;
        const int64_t e = v * Cx_;  // the row's first element in the block
        const int64_t lo = std::max(c0, s0 - e), hi = std::min(c1, s1 - e);
        for (int64_t c = lo; c < hi; ++c) gp[e + c - s0] += R[r * Cx_ + c];
      }
    }
  }
  if (--rs_remaining_[0] == 0 && last_micro_batch()) layer_final(-1, true);
}

// Buckets in the order their gradients become final: layers from the last to the first, then the
// embedding/head tensors; within each, one open bucket per group, closed once it reaches
// dp_bucket_mb (0: every tensor alone).
void ParallelTransformer::build_buckets() {
  buckets_.clear();
  if (opt_.zero >= 1) {  // ZeRO: reduce_gradients() reduce-scatters over D instead of buckets
    bucket_buf_ = Buffer<float>(1);
    return;
  }
  const int64_t cap = int64_t(ov_.dp_bucket_mb * 1048576.0 / sizeof(float));
  Bucket open[2];  // [0]: replicated over zd, [1]: Z shards over d
  int64_t staged = 0;
  auto close = [&](Bucket& b) {
    if (b.tensors.empty()) return;
    if (b.tensors.size() > 1) {
      b.offset = staged;
      staged += b.numel;
    } else {
      b.offset = -1;  // in place
    }
    buckets_.push_back(std::move(b));
    b = Bucket{};
  };
  for (int l = cfg_.n_layer - 1; l >= -1; --l) {
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const TensorShard& t = plan_.tensors[i];
      if (t.spec->layer != l || !t.stored) continue;
      const comm::Communicator& grp = t.z_sharded ? g_.d : g_.zd;
      if (grp.size() == 1) continue;
      Bucket& b = open[t.z_sharded ? 1 : 0];
      b.group = &grp;
      b.sharded = t.z_sharded;
      b.tensors.push_back(int(i));
      if (b.layers.empty() || b.layers.back() != l) b.layers.push_back(l);
      b.numel += t.shard_numel;
      if (b.numel >= cap) close(b);
    }
  }
  close(open[1]);
  close(open[0]);
  bucket_buf_ = Buffer<float>(size_t(std::max<int64_t>(staged, 1)));
}

void ParallelTransformer::start_bucket(Bucket& b) {
  b.started = true;
  const char* what = b.sharded ? "dW shards" : "replicated grads";
  const int layer = b.layers.front();
  if (b.offset < 0) {
    const TensorShard& t = plan_.tensors[size_t(b.tensors[0])];
    b.ticket = q_.start(b.group->iallreduce_sum(grads_.data() + t.offset, size_t(t.shard_numel)),
                        *b.group, "allreduce", what, layer, t.shard_numel * int64_t(sizeof(float)));
    return;
  }
  float* stage = bucket_buf_.data() + b.offset;
  int64_t o = 0;
  for (int i : b.tensors) {
    const TensorShard& t = plan_.tensors[size_t(i)];
    std::memcpy(stage + o, grads_.data() + t.offset, size_t(t.shard_numel) * sizeof(float));
    o += t.shard_numel;
  }
  Bucket* bp = &b;
  b.ticket = q_.start(b.group->iallreduce_sum(stage, size_t(b.numel)), *b.group, "allreduce",
                      what, layer, b.numel * int64_t(sizeof(float)), [this, bp, stage] {
                        int64_t off = 0;
                        for (int i : bp->tensors) {
                          const TensorShard& t = plan_.tensors[size_t(i)];
                          std::memcpy(grads_.data() + t.offset, stage + off,
                                      size_t(t.shard_numel) * sizeof(float));
                          off += t.shard_numel;
                        }
                      });
}

void ParallelTransformer::layer_final(int layer, bool sharded) {
  (sharded ? final_sharded_ : final_repl_)[size_t(layer + 1)] = 1;
  if (ov_.dp_overlap) start_ready_buckets();
}

// Each group's buckets strictly in list order, so every rank starts them in the same order
// (the two groups are independent communicators).
void ParallelTransformer::start_ready_buckets() {
  for (int kind = 0; kind < 2; ++kind) {
    size_t& i = next_bucket_[kind];
    for (; i < buckets_.size(); ++i) {
      Bucket& b = buckets_[i];
      if (int(b.sharded) != kind) continue;
      const auto& fin = b.sharded ? final_sharded_ : final_repl_;
      bool ready = true;
      for (int l : b.layers) ready = ready && fin[size_t(l + 1)];
      if (!ready) break;
      start_bucket(b);
    }
  }
}

void ParallelTransformer::reset_step_state() {
  next_bucket_[0] = next_bucket_[1] = 0;
  for (auto& b : buckets_) b.started = false, b.ticket = 0;
  std::fill(final_sharded_.begin(), final_sharded_.end(), 0);
  std::fill(final_repl_.begin(), final_repl_.end(), 0);
  expected_micro_ = micro_done_ = 0;
}

void ParallelTransformer::reduce_gradients() {
  ScopedPhase sp(prof_, Phase::Other);
  q_.wait_all();  // reduce-scatters still running; buckets already started
  if (g_.shape.p > 1) {
    // Embedding (first stage) and head (last stage; the same tensor when tied), final norm,
    // positions: summed over the stages, so every stage's copy takes the same update. (ZeRO 2:
    // the pieces, already reduced over Z and D.) No bucket has started (dp_overlap is off with
    // Gp > 1), so the data-parallel sums below see the stage sums.
    for (size_t i = 0; i < plan_.tensors.size(); ++i)
      if (plan_.tensors[i].spec->layer < 0) {
        const bool piece = opt_.zero == 2;
        float* gp = grads_.data() + (piece ? zl_.grad_offsets[i] : plan_.tensors[i].offset);
        const int64_t n = piece ? zl_.sizes[i] : plan_.tensors[i].shard_numel;
        if (n > 0) sum_over(g_.p, gp, n, "top-level grads over P");
      }
  }
  if (opt_.zero == 2) {  // every layer was reduced (over Z and D) right after its backward
    reset_step_state();
    return;
  }
  if (opt_.zero == 1) {
    // Replicated tensors first over Z; then every shard reduce-scattered over D into its piece.
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const TensorShard& t = plan_.tensors[i];
      if (!t.stored) continue;  // another pipeline stage's layer
      float* gp = grads_.data() + t.offset;
      if (!t.z_sharded && g_.shape.z > 1) sum_over(g_.z, gp, t.shard_numel, "replicated grads");
      if (g_.shape.d == 1) continue;
      float* piece = zero_tmp_.data() + piece_[i] * g_.shape.d;
      reduce_scatter_d(i, gp, piece);
      std::memcpy(grads_.data() + zl_.grad_offsets[i], piece, zl_.sizes[i] * sizeof(float));
    }
    reset_step_state();
    return;
  }
  // Z-sharded weights: each shard already summed over Z; sum over data replicas.
  // Replicated tensors: sum over every token-splitting axis (Z and D) at once. Buckets not yet
  // started go in list order (each group's started ones are a prefix of its list).
  for (auto& b : buckets_) {
    if (b.started) continue;
    start_bucket(b);
    if (!ov_.dp_overlap) q_.wait(b.ticket);
  }
  q_.wait_all();
  reset_step_state();
}

void ParallelTransformer::gather_updated_params() {
  if (opt_.zero == 0 || g_.shape.d == 1) return;
  invalidate_gathered();  // the parameters change: gathered copies are stale
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const TensorShard& t = plan_.tensors[i];
    if (!t.stored) continue;  // another pipeline stage's layer
    const int64_t q = piece_[i];
    float* pieces = zero_tmp_.data();
    float* mine = pieces + q * g_.shape.d;
    std::fill(mine, mine + q, 0.0f);
    std::memcpy(mine, params_.data() + zl_.param_offsets[i], zl_.sizes[i] * sizeof(float));
    q_.run(g_.d.iallgather(mine, pieces, size_t(q)), g_.d, "allgather", "updated pieces over D",
           t.spec->layer, q * g_.shape.d * int64_t(sizeof(float)));
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
void ParallelTransformer::sum_over(const comm::Communicator& group, T* data, int64_t n,
                                   const char* what) {
  if (group.size() == 1) return;
  q_.run(group.iallreduce_sum(data, size_t(n)), group, "allreduce", what,
         prof_ ? prof_->layer : -2, n * int64_t(sizeof(T)));
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
    sum_over(g_.x, st, N, "norm mean");
    for (int64_t t = 0; t < N; ++t) mean[t] = float(st[t] / double(C));
    row_sums(x, N, Cx_, st, 1, mean);
    sum_over(g_.x, st, N, "norm var");
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
    sum_over(g_.x, st, N, "norm ms");
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

// out[N, n_out] = in · Wᵀ, partial over `group` and all-reduced there. With forward_chunks > 1
// the rows go in chunks: chunk i's all-reduce runs while chunk i+1's GEMM computes.
void ParallelTransformer::gemm_allreduce(const char* what, float* out, const float* in, int wi,
                                         int64_t k_in, int64_t n_out,
                                         const comm::Communicator& group, int64_t N) {
  const int64_t chunks = group.size() > 1 ? std::min<int64_t>(ov_.forward_chunks, N) : 1;
  if (chunks == 1) {
    gemm(what, false, true, N, n_out, k_in, in, k_in, w(wi), k_in, 0.0f, out, n_out);
    sum_over(group, out, N * n_out, what);
    return;
  }
  std::vector<CommQueue::Ticket> tickets;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = N * c / chunks, r1 = N * (c + 1) / chunks;
    gemm(what, false, true, r1 - r0, n_out, k_in, in + r0 * k_in, k_in, w(wi), k_in, 0.0f,
         out + r0 * n_out, n_out);
    tickets.push_back(q_.start(group.iallreduce_sum(out + r0 * n_out, size_t((r1 - r0) * n_out)),
                               group, "allreduce", what, prof_ ? prof_->layer : -2,
                               (r1 - r0) * n_out * int64_t(sizeof(float))));
  }
  for (auto t : tickets) q_.wait(t);
}

// Normal layer: out[N, n_out] = in[N, Cx-like] · Wᵀ, partial over X -> all-reduce X, + bias.
void ParallelTransformer::normal_fwd(const char* what, float* out, const float* in, int wi, int bi,
                                     int64_t k_in, int64_t n_out, int64_t N) {
  gemm_allreduce(what, out, in, wi, k_in, n_out, g_.x, N);
  if (const float* b = w(bi)) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < n_out; ++j) out[t * n_out + j] += b[j];
  }
  q_.poll();
}

// Transposed layer + residual: out[N, Cx] = resid + all-reduce_Y(in · Wᵀ) + bias.
void ParallelTransformer::transposed_fwd(const char* what, float* out, const float* resid,
                                         const float* in, int wi, int bi, int64_t k_in, int64_t N) {
  float* tmp = a_->tmp;
  const int64_t Cx = Cx_;
  gemm_allreduce(what, tmp, in, wi, k_in, Cx, g_.y, N);
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
  normal_fwd("qkv", A.qkv, A.ln1, L.qkv_w, L.qkv_b, Cx_, QKVy_, N);
  if (!gpt2_)
    timed(Phase::Attention, [&] { k::rope_forward(A.qkv, N, T, 0, nhy_ + nkvy_, hd_, QKVy_, rope_cos_.data(), rope_sin_.data()); });
  attention_forward(l, B, T);
  q_.poll();
  transposed_fwd("proj", A.resid_mid, x, A.atty, L.proj_w, L.proj_b, Ay_, N);
  norm_fwd(A.ln2, A.ln2_mean, A.ln2_rstd, A.resid_mid, L.ln2_w, L.ln2_b, N);
  normal_fwd("fc", A.fc, A.ln2, L.fc_w, L.fc_b, Cx_, FWy_, N);
  timed(Phase::Activation, [&] {
    if (gpt2_) k::gelu_forward(A.fc_act, A.fc, N * Fy_);
    else k::swiglu_forward(A.fc_act, A.fc, N, Fy_);
  });
  q_.poll();
  transposed_fwd("fcproj", A.resid_out, A.resid_mid, A.fc_act, L.fcproj_w, L.fcproj_b, Fy_, N);
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

  set_layer(-1);
  if (embed || head) issue_gather(-1);
  if (l1 > l0 && ov_.prefetch_depth > 0) {  // the chunk's first layer gathers during the embedding
    issue_gather(l0);
    prefetch(l0, +1, l0, l1);
  }
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
    sum_over(g_.y, a.emb, N * Cx_, "embedding");
    if (wpe_ >= 0) {
      const float* P = w(wpe_);
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < N; ++t)
        for (int64_t c = 0; c < Cx_; ++c) a.emb[t * Cx_ + c] += P[(t % T) * Cx_ + c];
    }
  }

  const float* x = l0 == 0 ? a.emb : a.layer[l0 - 1].resid_out;  // the chunk's input
  for (int l = l0; l < l1; ++l) {
    set_layer(l);
    gather_layer(l);
    prefetch(l, +1, l0, l1);
    layer_forward(l, x, B, T);
    x = a.layer[l].resid_out;
  }
  set_layer(-1);
  if (!head) return;
  norm_fwd(a.lnf, a.lnf_mean, a.lnf_rstd, x, lnf_w_, lnf_b_, N);
  // Output head: normal layer on the embedding's block -> logits [N, V/Gy].
  gemm_allreduce("head", a.logits, a.lnf, head_, Cx_, Vy_, g_.x, N);
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
  if (g_.y.size() > 1)
    q_.run(g_.y.iallreduce_max(mx.data(), size_t(N)), g_.y, "allreduce_max", "logit max", -1,
           N * int64_t(sizeof(float)));
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
  sum_over(g_.y, st, 2 * N, "softmax sums");
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
  ScopedPhase sp(prof_, Phase::Other);
  forward(inputs, B, T);
  return cross_entropy(targets, int64_t(B) * T, 0.0f, false);
}

double ParallelTransformer::forward_backward(const int32_t* inputs, const int32_t* targets,
                                             int B, int T, float grad_scale) {
  // Model code outside the named kernels counts as compute ("other").
  ScopedPhase sp(prof_, Phase::Other);
  forward(inputs, B, T);
  const double loss = cross_entropy(targets, int64_t(B) * T, grad_scale, true);
  backward(inputs, B, T);
  ++micro_done_;
  set_layer(-2);
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
    sum_over(g_.x, st, 2 * N, "norm grad");
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
  // din[N, k_in] = all-reduce over `group` of dout · W; dW[n_out, k_in] += doutᵀ · in; bias.
  // With backward_allreduce the all-reduce runs while dW computes (driven by the progress thread,
  // or by the polls after it).
  auto linear_bwd = [&](const char* what, float* din, const float* dout, const float* in, int wi,
                        int bi, int64_t k_in, int64_t n_out, const comm::Communicator& group) {
    gemm(what, false, false, N, k_in, n_out, dout, n_out, w(wi), k_in, 0.0f, din, k_in);
    if (ov_.backward_allreduce && group.size() > 1) {
      const auto t = q_.start(group.iallreduce_sum(din, size_t(N * k_in)), group, "allreduce",
                              what, prof_ ? prof_->layer : -2, N * k_in * int64_t(sizeof(float)));
      gemm(what, true, false, n_out, k_in, N, dout, n_out, in, k_in, 1.0f, gw(wi), k_in);
      bias_bwd(gw(bi), dout, n_out);
      q_.wait(t);
      return;
    }
    gemm(what, true, false, n_out, k_in, N, dout, n_out, in, k_in, 1.0f, gw(wi), k_in);
    bias_bwd(gw(bi), dout, n_out);
    sum_over(group, din, N * k_in, what);
  };
  // Normal layer backward: din = all-reduce_Y(dout · W). Transposed: all-reduce_X, n_out = Cx.
  auto normal_bwd = [&](const char* what, float* din, const float* dout, const float* in, int wi,
                        int bi, int64_t k_in, int64_t n_out) {
    linear_bwd(what, din, dout, in, wi, bi, k_in, n_out, g_.y);
  };
  auto transposed_bwd = [&](const char* what, float* din, const float* dout, const float* in,
                            int wi, int bi, int64_t k_in) {
    linear_bwd(what, din, dout, in, wi, bi, k_in, Cx_, g_.x);
  };

  set_layer(-1);
  if (embed || head) {
    gather_layer(-1);
    zero_layer_grad_blocks(-1);
  }
  if (sparse_embedding_ && embed)  // the token ids the Z group's embedding rows belong to
    emb_ids_ticket_ = q_.start(g_.z.iallgather(inputs, emb_ids_.data(), size_t(N)), g_.z,
                               "allgather", "embedding ids", -1,
                               N * g_.shape.z * int64_t(sizeof(int32_t)));
  if (head) {
    const float* x_last = l1 > 0 ? a.layer[l1 - 1].resid_out : a.emb;
    // Head: dlogits [N, Vy] -> dlnf [N, Cx] (sum over Y), d(head block): a normal layer.
    linear_bwd("head", a.dln, a.logits, a.lnf, head_, -1, Cx_, Vy_, g_.y);
    if (sparse_embedding_) scatter_top_grads(/*head_part=*/true);
    std::fill(a.dresid, a.dresid + N * Cx_, 0.0f);
    norm_bwd(a.dresid, a.dln, x_last, a.lnf_mean, a.lnf_rstd, lnf_w_, lnf_b_);
  } else {
    std::memcpy(a.dresid, dout, size_t(N * Cx_) * sizeof(float));  // from the next stage
  }

  for (int l = l1 - 1; l >= l0; --l) {
    const Layer& L = layers_[l];
    auto& A = a.layer[l];
    const float* x_in = l == 0 ? a.emb : a.layer[l - 1].resid_out;
    set_layer(l);
    gather_layer(l);
    prefetch(l, -1, l0, l1);
    zero_layer_grad_blocks(l);
    // Recomputation: the scratch holds only the last layer run forward (the last one, at first).
    if (opt_.recompute == Recompute::Full && scratch_layer_ != l) layer_forward(l, x_in, B, T);
    if (opt_.recompute == Recompute::Selective && scratch_layer_ != l) {
      attention_forward(l, B, T);
      scratch_layer_ = l;
    }
    transposed_bwd("fcproj", a.dfc_act, a.dresid, A.fc_act, L.fcproj_w, L.fcproj_b, Fy_);
    timed(Phase::Activation, [&] {
      if (gpt2_) k::gelu_backward(a.dfc, a.dfc_act, A.fc, N * Fy_);
      else k::swiglu_backward(a.dfc, a.dfc_act, A.fc, N, Fy_);
    });
    normal_bwd("fc", a.dln, a.dfc, A.ln2, L.fc_w, L.fc_b, Cx_, FWy_);
    norm_bwd(a.dresid, a.dln, A.resid_mid, A.ln2_mean, A.ln2_rstd, L.ln2_w, L.ln2_b);
    transposed_bwd("proj", a.datty, a.dresid, A.atty, L.proj_w, L.proj_b, Ay_);
    k::AttentionDims d{};
    d.B = B; d.Tq = T; d.Tk = T; d.n_head = int(nhy_); d.n_kv_head = int(nkvy_); d.head_dim = int(hd_);
    d.q_stride = d.kv_stride = QKVy_; d.q_batch_stride = d.kv_batch_stride = T * QKVy_;
    d.out_stride = Ay_; d.out_batch_stride = T * Ay_;
    timed(Phase::Attention, [&] {
      k::attention_backward<float>(a.dqkv, a.dqkv + nhy_ * hd_, a.dqkv + (nhy_ + nkvy_) * hd_, a.datty,
                                   A.qkv, A.qkv + nhy_ * hd_, A.qkv + (nhy_ + nkvy_) * hd_, A.atty, A.lse, d);
      if (!gpt2_) k::rope_backward(a.dqkv, N, T, 0, nhy_ + nkvy_, hd_, QKVy_, rope_cos_.data(), rope_sin_.data());
    });
    q_.poll();
    normal_bwd("qkv", a.dln, a.dqkv, A.ln1, L.qkv_w, L.qkv_b, Cx_, QKVy_);
    norm_bwd(a.dresid, a.dln, x_in, A.ln1_mean, A.ln1_rstd, L.ln1_w, L.ln1_b);
    scatter_layer_grads(l);
    if (last_micro_batch()) layer_final(l, false);
  }
  set_layer(-1);

  if (embed) {
    ScopedPhase sp(prof_, Phase::Embedding);
    float* dE = sparse_embedding_ ? nullptr : gw(wte_);  // sparse: accumulate_embedding_rows
    const int64_t v0 = Vy_ * g_.coord.y;
    float* dP = gw(wpe_);
    constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < Cx_; c0 += kBlock) {
      const int64_t c1 = std::min(Cx_, c0 + kBlock);
      for (int64_t t = 0; t < N; ++t) {
        const float* dr = a.dresid + t * Cx_;
        const int64_t v = inputs[t] - v0;
        if (dE && v >= 0 && v < Vy_)
          for (int64_t c = c0; c < c1; ++c) dE[v * Cx_ + c] += dr[c];
        if (dP)
          for (int64_t c = c0; c < c1; ++c) dP[(t % T) * Cx_ + c] += dr[c];
      }
    }
  }
  if (embed || head) {
    if (sparse_embedding_) {  // Gp = 1: embed and head together
      scatter_top_grads(/*head_part=*/false);
      accumulate_embedding_rows(N);
    } else {
      scatter_layer_grads(-1);
    }
    if (last_micro_batch()) layer_final(-1, false);
  }
}

// ---------------------------------------------------------------------------------------------
// Pipeline support

int ParallelTransformer::layer_stage(int l) const {
  if (g_.shape.p == 1) return 0;
  return split_.stage_of(l, g_.shape.p);
}

bool ParallelTransformer::owns(const TensorShard& t) const {
  // A layer's tensors: the stage that stores them (the plan decided). Top-level tensors: every
  // stage keeps the same copy (their gradients are summed over P); stage 0 speaks for them.
  return t.spec->layer < 0 ? g_.coord.p == 0 : t.stored;
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
  // Sized once: growing by insert() would hold up to twice the stash (and briefly the old
  // and the new storage) per micro-batch in flight.
  const auto regions = chunk_regions(l0, l1, embed, head);
  size_t total = 1;
  for (const auto& r : regions) total += r.second;
  std::vector<float> out;
  out.reserve(total);
  for (auto [p, n] : regions) out.insert(out.end(), p, p + n);
  out.push_back(float(scratch_layer_));  // exact for any layer index
  return out;
}

int64_t ParallelTransformer::stash_numel(int l0, int l1, bool embed, bool head) {
  int64_t n = 1;  // the scratch layer index stash() appends
  for (const auto& region : chunk_regions(l0, l1, embed, head)) n += int64_t(region.second);
  return n;
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
