// The GPT-2 / Llama model on the grid (parallel_transformer.hpp): construction (sizes, ZeRO
// layout, buffers, the activation layout) and the model's forward and backward, which wire the
// vocabulary-parallel embedding (vocab_parallel.cpp), the blocks (parallel_block.cpp), the final
// norm (parallel_norm.cpp), the output head (a normal layer, parallel_linear.cpp) and the loss,
// with the weight gathers (weight_gather.cpp) and gradient reductions (grad_reduction.cpp)
// between layers.
#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>
#include <cstring>

#include "tetrad/backend/cpu/ops.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/parallel/transformer_activations.hpp"

namespace tetrad::parallel {

namespace k = kernels;

ParallelTransformer::ParallelTransformer(const ModelConfig& config, ProcessGroups& groups,
                                         int local_batch, int max_len, ParallelOptions options)
    : cfg_(config), g_(groups), opt_(options), local_batch_(local_batch), max_len_(max_len),
      ov_(options.overlap) {
  be_ = opt_.device ? opt_.device : &backend::cpu_backend();
  precision_ = opt_.precision;
  if (precision_ == backend::Precision::BF16 && !be_->capabilities().gemm_bf16)
    fail("precision bf16: backend '", be_->name(), "' has no bf16 GEMM");
  if (opt_.attention_precision == backend::Precision::BF16 &&
      !be_->capabilities().attention_bf16_products)
    fail("attention precision bf16: backend '", be_->name(), "' has no bf16 attention products");
  attention_precision_ =
      opt_.attention_precision ? *opt_.attention_precision
      : precision_ == backend::Precision::BF16 && be_->capabilities().attention_bf16_faster
          ? backend::Precision::BF16
          : backend::Precision::FP32;
  if (opt_.zero < 0 || opt_.zero > 2)
    fail("parallel.zero: expected 0, 1 or 2 (ZeRO stage over the data axis), got ", opt_.zero);
  if (opt_.virtual_stages < 1)
    fail("parallel.virtual_stages must be at least 1, got ", opt_.virtual_stages);
  if (opt_.reduce_scatter_chunk_bytes < 1)
    fail("reduce-scatter chunk size must be at least 1 byte, got ", opt_.reduce_scatter_chunk_bytes);
  for (const comm::Communicator* c : {&g_.z(), &g_.d(), &g_.tokens()})
    if (opt_.grad_comm_bf16 && c->size() > 1 && std::string(c->transport()) == "NCCL")
      fail("train.grad_comm_precision = \"bf16\" is not implemented on NCCL (group '", c->name(),
           "'); use \"fp32\"");
  if (ov_.prefetch_depth < 0) fail("parallel.prefetch_depth must be >= 0, got ", ov_.prefetch_depth);
  if (ov_.forward_chunks < 1) fail("parallel.forward_chunks must be >= 1, got ", ov_.forward_chunks);
  if (!(ov_.dp_bucket_mb >= 0)) fail("parallel.dp_bucket_mb must be >= 0, got ", ov_.dp_bucket_mb);
  // Data-parallel buckets during the last backward only without ZeRO and without the pipeline:
  // ZeRO reduce-scatters over D itself (per layer with ZeRO 2, into pieces at the end of the step
  // with ZeRO 1), which the buckets' all-reduces would duplicate; with Gp > 1 the top-level
  // gradients are first summed over P in reduce_gradients(), and the pipeline's backward chunks
  // do not count micro-batches the way forward_backward does. Both reduce in reduce_gradients().
  if (opt_.zero >= 1 || groups.shape.p() > 1) ov_.dp_overlap = false;
  opt_.overlap = ov_;
  q_.enable_progress_thread(ov_.progress_thread);
  q_.set_compute_queue(&be_->queue());  // collectives start after, and complete into, its work
  g_.use_backend(*be_);  // device buffers through host memory where a group moves host memory
  backend_use_.groups = &g_;
  backend_use_.be = be_;
  cfg_.validate();
  if (max_len <= 0 || max_len > cfg_.max_seq)
    fail("sequence length ", max_len, " is outside what the model supports (1..", cfg_.max_seq,
         " = model.max_seq)");
  if (local_batch <= 0) fail("local micro-batch must be positive, got ", local_batch);
  table_ = build_param_table(cfg_);
  // The split uses the sequence length this model runs (its attention cost, for "balanced"), as
  // the planner does with its seq; resolve_layer_split names what is wrong with the setting.
  if (g_.shape.p() > 1)
    split_ = resolve_layer_split(opt_.pipeline_layers, cfg_, max_len, g_.shape.p(),
                                 opt_.virtual_stages);
  plan_ = ShardPlan::build(cfg_, table_, g_.shape, g_.coord, split_);
  const GridShape& G = g_.shape;
  gpt2_ = cfg_.family == Family::GPT2;
  hd_ = cfg_.head_dim();
  Cx_ = cfg_.n_embd / G.x();
  Ay_ = cfg_.n_embd / G.y();
  nhy_ = cfg_.n_head / G.y();
  nkvy_ = cfg_.n_kv_head / G.y();
  QKVy_ = (nhy_ + 2 * nkvy_) * hd_;
  Fy_ = cfg_.ffn / G.y();
  FWy_ = gpt2_ ? Fy_ : 2 * Fy_;
  Vy_ = cfg_.vocab_size / G.y();

  // ZeRO pieces: each tensor's local shard cut into Gd pieces of ceil(n / Gd), piece d on rank d.
  const int Gd = G.d(), dc = g_.coord.d();
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
  else zero_tmp_ = backend::DeviceArray<float>(*be_, size_t(Gd + 1) * piece_max);

  params_ = backend::DeviceArray<float>(*be_, plan_.local_total);
  if (precision_ == backend::Precision::BF16 && opt_.bf16_weight_copy) {
    if (!be_->capabilities().gemm_bf16_storage)
      fail("bf16 weight copy: backend '", be_->name(), "' cannot read bf16-stored GEMM operands "
           "(Capabilities::gemm_bf16_storage); set ParallelOptions::bf16_weight_copy = false");
    bf16_weights_ = true;
    params16_ = be_->alloc_array<uint16_t>(size_t(plan_.local_total));
  }
  bf16_acts_ = precision_ == backend::Precision::BF16 && opt_.bf16_activations;
  wgrad_nn_ = bf16_acts_ && opt_.bf16_weight_grad_nn && be_->capabilities().bf16_producers;
  grads_ = backend::DeviceArray<float>(*be_, opt_.zero == 2 ? zl_.state_size : plan_.local_total);

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
  if (G.z() > 1 || opt_.zero == 2) {
    int64_t layer_max = 0, top = 0, shard_max = 0;
    for (const auto& t : plan_.tensors) {
      const int64_t end = t.block_offset + (t.z_sharded ? t.shard_numel * G.z() : t.block_numel);
      if (t.spec->layer < 0) top = std::max(top, end);
      else layer_max = std::max(layer_max, end);
      shard_max = std::max(shard_max, t.shard_numel);
    }
    if (G.z() > 1) {
      // Slots for gathered layers: the one in use plus prefetch_depth ahead, or all of them.
      const int nslots = std::max(1, ov_.cache_gathered_weights
                                         ? cfg_.n_layer
                                         : std::min(ov_.prefetch_depth + 1, cfg_.n_layer));
      for (int s = 0; s < nslots; ++s) gathered_.emplace_back(*be_, size_t(layer_max));
      if (bf16_weights_)
        for (int s = 0; s < nslots; ++s)
          gathered16_.push_back(be_->alloc_array<uint16_t>(size_t(layer_max)));
      slot_layer_.assign(size_t(nslots), -2);
      slot_tickets_.resize(size_t(nslots));
      gathered_top_ = backend::DeviceArray<float>(*be_, top);
      if (bf16_weights_) gathered16_top_ = be_->alloc_array<uint16_t>(size_t(top));
      scatter_tmp_ = backend::DeviceArray<float>(*be_, plan_.local_total);  // each shard lands at its own offset
    }
    (void)shard_max;
    gblock_[0] = backend::DeviceArray<float>(*be_, layer_max);
    gblock_[1] = backend::DeviceArray<float>(*be_, layer_max);
    gblock_top_ = backend::DeviceArray<float>(*be_, top);
  }
  if (opt_.sparse_embedding_grad && G.z() > 1 && G.p() == 1 && opt_.zero != 2) {
    // Rows plus ids against the dense block: worth it when the Z group's tokens are fewer than
    // this rank's vocabulary rows.
    const int64_t rows = int64_t(G.z()) * local_batch * max_len;
    sparse_embedding_ = rows * (Cx_ + 1) < Vy_ * Cx_;
    if (sparse_embedding_) {
      emb_rows_ = backend::DeviceArray<float>(*be_, size_t(rows * Cx_));
      emb_ids_ = backend::DeviceArray<int32_t>(*be_, size_t(rows));
    }
  }
  rs_remaining_.assign(size_t(cfg_.n_layer) + 1, 0);
  final_sharded_.assign(size_t(cfg_.n_layer) + 1, 0);
  final_repl_.assign(size_t(cfg_.n_layer) + 1, 0);
  build_buckets();

  const int64_t N = int64_t(local_batch) * max_len;
  layer_slots_ = layer_slots(cfg_.n_layer, split_, G.p(), g_.coord.p());
  acts_ = backend::DeviceArray<float>(*be_, size_t(activation_bytes(opt_.recompute) / int64_t(sizeof(float))));
  a_ = std::make_unique<Acts>();
  float* cur = acts_.data();
  auto take = [&](int64_t n) { float* p = cur; cur += n; return p; };
  const bool b16 = bf16_acts_;
  // A bf16 tensor of N x n elements takes ceil(N n / 2) floats of the buffer (activation_sizes).
  auto as16 = [](float* p) { return reinterpret_cast<uint16_t*>(p); };
  const ActivationSizes sz = activation_sizes(opt_.recompute);
  float* scratch = take(sz.scratch);
  a_->layer.resize(cfg_.n_layer);
  layer_begin_.clear();
  for (int l = 0; l < cfg_.n_layer; ++l) {
    auto& A = a_->layer[size_t(l)];
    layer_begin_.push_back(cur);
    // A pipeline stage holds only the layers it runs, and the output slot of the layer before
    // each of its chunks (the chunk's input arrives there); other layers have no memory here.
    A = {};
    if (layer_slots_[size_t(l)] == LayerSlots::None) continue;
    if (layer_slots_[size_t(l)] == LayerSlots::Input) {
      A.resid_out = take(N * Cx_);
      continue;
    }
    float* sc = scratch;
    // Kept tensors get their own memory per layer; recomputed ones share one layer's scratch.
    auto place = [&](bool kept, int64_t floats) {
      if (kept) return take(floats);
      float* p = sc;
      sc += floats;
      return p;
    };
    const ActivationSizes::Layer& s = sz.layer;
    A.ln1 = place(s.ln1.kept, s.ln1.floats);
    if (b16) A.ln1_16 = as16(A.ln1), A.ln1 = nullptr;
    A.ln1_mean = place(s.ln1_mean.kept, s.ln1_mean.floats);
    A.ln1_rstd = place(s.ln1_rstd.kept, s.ln1_rstd.floats);
    A.qkv = place(s.qkv.kept, s.qkv.floats);
    A.atty = place(s.atty.kept, s.atty.floats);
    A.lse = place(s.lse.kept, s.lse.floats);
    A.resid_mid = place(s.resid_mid.kept, s.resid_mid.floats);
    A.ln2 = place(s.ln2.kept, s.ln2.floats);
    if (b16) A.ln2_16 = as16(A.ln2), A.ln2 = nullptr;
    A.ln2_mean = place(s.ln2_mean.kept, s.ln2_mean.floats);
    A.ln2_rstd = place(s.ln2_rstd.kept, s.ln2_rstd.floats);
    A.fc = place(s.fc.kept, s.fc.floats);
    A.fc_act = place(s.fc_act.kept, s.fc_act.floats);
    if (b16) A.fc_act16 = as16(A.fc_act), A.fc_act = nullptr;
    A.resid_out = take(N * Cx_);  // the next block's input: always kept
    TETRAD_CHECK(sc == scratch + sz.scratch);
  }
  layer_begin_.push_back(cur);  // end of the layers: the global activations follow
  a_->emb = take(N * Cx_);
  a_->lnf = take(b16 ? (N * Cx_ + 1) / 2 : N * Cx_);
  if (b16) a_->lnf16 = as16(a_->lnf), a_->lnf = nullptr;
  a_->lnf_mean = take(N); a_->lnf_rstd = take(N);
  a_->logits = take(N * Vy_); a_->losses = take(N); a_->tmp = take(N * Cx_);
  a_->dresid = take(N * Cx_); a_->dln = take(N * Cx_); a_->dqkv = take(N * QKVy_);
  a_->datty = take(N * Ay_); a_->dfc = take(N * FWy_); a_->dfc_act = take(N * Fy_);
  if (b16) {
    a_->dout16 = as16(take(sz.dout16));
    a_->dout16_t = as16(take(sz.dout16));
    dout16_floats_ = sz.dout16;
  }
  TETRAD_CHECK(cur == acts_.data() + acts_.size());
  stats_ = backend::DeviceArray<double>(*be_, size_t(N) * 2);
  if (!be_->capabilities().host_visible)
    for (auto& b : ids_dev_) b = be_->alloc_array<int32_t>(size_t(N));
  row_max_ = be_->alloc_array<float>(size_t(N));
  scalar_ = be_->alloc_array<double>(1);
  argmax_idx_ = be_->alloc_array<int32_t>(size_t(local_batch));
  argmax_val_ = be_->alloc_array<float>(size_t(local_batch));

  if (!gpt2_) {
    const int64_t half = hd_ / 2;
    // The tables are built on the host once (the model's rotary settings) and copied over.
    const size_t n = size_t(cfg_.max_seq) * size_t(half);
    std::vector<float> cos_host(n), sin_host(n);
    k::rope_tables(cos_host.data(), sin_host.data(), cfg_.max_seq, hd_, rope_frequencies(cfg_));
    rope_cos_ = be_->alloc_array<float>(n);
    rope_sin_ = be_->alloc_array<float>(n);
    bq().copy_to_device(rope_cos_.data(), cos_host.data(), n * sizeof(float));
    bq().copy_to_device(rope_sin_.data(), sin_host.data(), n * sizeof(float));
    bq().synchronize();
  }

  // The GEMM layout of every site: given, tuned here (collective over the world), or the rule.
  layouts_ = rule_gemm_layouts();
  const char* rule_forms = wgrad_nn_ ? "forward NT, dx NN, dw NN on dY16ᵀ"
                                     : "forward NT, dx NN, dw TN";
  layout_summary_ = std::string("gemm layouts: rule (") + rule_forms + ")";
  if (!opt_.gemm_layout_plan.empty()) {
    const GemmLayoutPlan given = GemmLayoutPlan::parse(opt_.gemm_layout_plan, "given");
    if (!set_gemm_layout_plan(given))
      fail("gemm layout plan \"", opt_.gemm_layout_plan, "\": its sizes are not this model's (",
           rule_gemm_layouts().to_string(), ")");
  } else if (opt_.gemm_layouts == GemmLayouts::Tune) {
    std::string why;
    if (resolve_gemm_layouts("tune", precision_, *be_, &why) == GemmLayouts::Rule)
      layout_summary_ = "gemm layouts: " + why + ", " + rule_forms;
    else if (!bf16_acts_)
      layout_summary_ = std::string("gemm layouts: rule (tune: needs bf16 activations), ") + rule_forms;
    else
      tune_gemm_layouts();
  }
}

ParallelTransformer::~ParallelTransformer() = default;

ParallelTransformer::ActivationSizes ParallelTransformer::activation_sizes(Recompute mode) const {
  return parallel::activation_sizes(cfg_, g_.shape, local_batch_, max_len_, bf16_acts_, mode,
                                    layer_slots_);
}

int64_t ParallelTransformer::activation_bytes(Recompute mode) const {
  return int64_t(sizeof(float)) * activation_sizes(mode).total;
}

int64_t ParallelTransformer::state_bytes() const {
  size_t gathered = 0;
  for (const auto& b : gathered_) gathered += b.size();
  const size_t n = params_.size() + grads_.size() + 2 * size_t(zl_.state_size) + gathered +
                   gathered_top_.size() + gblock_[0].size() + gblock_[1].size() +
                   gblock_top_.size() + scatter_tmp_.size() + zero_tmp_.size() +
                   bucket_buf_.size() + emb_rows_.size() + emb_ids_.size();
  size_t bf16_bytes = params16_.bytes() + gathered16_top_.bytes();
  for (const auto& b : gathered16_) bf16_bytes += b.bytes();
  return int64_t(n * sizeof(float) + bf16_bytes);
}

// ---------------------------------------------------------------------------------------------
// Forward

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
  const int64_t N = int64_t(B) * T;
  Acts& a = *a_;
  ensure_params16();

  set_layer(-1);
  if (embed || head) issue_gather(-1);
  if (l1 > l0 && ov_.prefetch_depth > 0) {  // the chunk's first layer gathers during the embedding
    issue_gather(l0);
    prefetch(l0, +1, l0, l1);
  }
  if (embed || head) gather_layer(-1);
  if (embed) embedding_forward(inputs, N, T);

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
  norm_fwd(a.lnf, a.lnf_mean, a.lnf_rstd, x, lnf_w_, lnf_b_, N, a.lnf16);
  // Output head: normal layer on the embedding's block -> logits [N, V/Gy].
  gemm_allreduce("head", a.logits, act(a.lnf, a.lnf16), head_, Cx_, Vy_, g_.x(), N);
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
  const int64_t N = int64_t(B) * T;
  Acts& a = *a_;
  ensure_params16();

  set_layer(-1);
  if (embed || head) {
    gather_layer(-1);
    zero_layer_grad_blocks(-1);
  }
  if (sparse_embedding_ && embed)  // the token ids the Z group's embedding rows belong to
    emb_ids_ticket_ = q_.start(g_.z().iallgather(device_ids(inputs, N, 0), emb_ids_.data(), size_t(N), q_.ready()), g_.z(),
                               "allgather", "embedding ids", -1,
                               N * g_.shape.z() * int64_t(sizeof(int32_t)));
  if (head) {
    const float* x_last = l1 > 0 ? a.layer[l1 - 1].resid_out : a.emb;
    // Head: dlogits [N, Vy] -> dlnf [N, Cx] (sum over Y), d(head block): a normal layer.
    linear_bwd("head", a.dln, a.logits, act(a.lnf, a.lnf16), head_, -1, Cx_, Vy_, g_.y(), N,
               head_dy16_ready_);
    head_dy16_ready_ = false;
    if (sparse_embedding_) scatter_top_grads(/*head_part=*/true);
    zero_dev(a.dresid, N * Cx_);
    norm_bwd(a.dresid, a.dln, x_last, a.lnf_mean, a.lnf_rstd, lnf_w_, lnf_b_, N);
  } else {
    // From the next stage, in host memory (the pipeline's receive buffer).
    bq().copy_to_device(a.dresid, dout, size_t(N * Cx_) * sizeof(float));
  }

  for (int l = l1 - 1; l >= l0; --l) {
    const float* x_in = l == 0 ? a.emb : a.layer[l - 1].resid_out;
    set_layer(l);
    gather_layer(l);
    prefetch(l, -1, l0, l1);
    zero_layer_grad_blocks(l);
    layer_backward(l, x_in, B, T);
    scatter_layer_grads(l);
    if (last_micro_batch()) layer_final(l, false);
  }
  set_layer(-1);

  if (embed) embedding_backward(inputs, N, T);
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

const int32_t* ParallelTransformer::device_ids(const int32_t* host, int64_t n, int slot) {
  if (be_->capabilities().host_visible) return host;
  bq().copy_to_device(ids_dev_[slot].data(), host, size_t(n) * sizeof(int32_t));
  return ids_dev_[slot].as<int32_t>();
}

double ParallelTransformer::read_scalar(const double* dev) {
  double v = 0;
  bq().copy_to_host(&v, dev, sizeof v);
  bq().synchronize();
  return v;
}

}  // namespace tetrad::parallel
