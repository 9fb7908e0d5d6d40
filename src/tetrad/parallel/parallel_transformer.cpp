// The GPT-2 / Llama model on the grid (parallel_transformer.hpp): construction (sizes, ZeRO
// layout, buffers, the activation layout) and the model's forward and backward, which wire the
// vocabulary-parallel embedding (vocab_parallel.cpp), the blocks (parallel_block.cpp), the final
// norm (parallel_norm.cpp), the output head (a normal layer, parallel_linear.cpp) and the loss,
// with the weight gathers (weight_gather.cpp) and gradient reductions (grad_reduction.cpp)
// between layers.
#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>
#include <cstring>

#include "tetrad/backend/rope_tables.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/parallel/activation_layout.hpp"

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
  norm_ = cfg_.desc().norm;
  mlp_ = cfg_.desc().mlp;
  positions_ = cfg_.desc().positions;
  dims_ = LocalDims::of(cfg_, G);
  ctx_.groups = &g_;
  ctx_.queue = &q_;
  ctx_.be = be_;
  ctx_.dims = dims_;

  params_ = backend::DeviceArray<float>(*be_, plan_.local_total);
  const bool bf16_weights = precision_ == backend::Precision::BF16 && opt_.bf16_weight_copy;
  if (bf16_weights && !be_->capabilities().gemm_bf16_storage)
    fail("bf16 weight copy: backend '", be_->name(), "' cannot read bf16-stored GEMM operands "
         "(Capabilities::gemm_bf16_storage); set ParallelOptions::bf16_weight_copy = false");
  bf16_acts_ = precision_ == backend::Precision::BF16 && opt_.bf16_activations;
  wgrad_nn_ = bf16_acts_ && opt_.bf16_weight_grad_nn && be_->capabilities().bf16_producers;

  // Each tensor's place in the model, by its role (fused groups follow their first tensor:
  // build_param_table checked that k, v follow q and up follows gate).
  layers_.resize(cfg_.n_layer);
  for (size_t i = 0; i < table_.specs.size(); ++i) {
    const ParamSpec& s = table_.specs[i];
    const int ti = int(i);
    using R = TensorRole;
    if (s.layer < 0) {
      switch (s.role) {
        case R::TokenEmbedding: wte_ = ti; break;
        case R::PositionEmbedding: wpe_ = ti; break;
        case R::FinalNorm: lnf_w_ = ti; break;
        case R::FinalNormBias: lnf_b_ = ti; break;
        case R::Head: head_ = ti; break;
        default: fail("tensor '", s.name, "' (", role_name(s.role), ") outside the blocks");
      }
      continue;
    }
    Layer& L = layers_[size_t(s.layer)];
    switch (s.role) {
      case R::AttnNorm: L.ln1_w = ti; break;
      case R::AttnNormBias: L.ln1_b = ti; break;
      case R::Qkv: case R::Q: L.qkv_w = ti; break;
      case R::K: L.k_w = ti; break;
      case R::V: L.v_w = ti; break;
      case R::QkvBias: L.qkv_b = ti; break;
      case R::AttnOut: L.proj_w = ti; break;
      case R::AttnOutBias: L.proj_b = ti; break;
      case R::MlpNorm: L.ln2_w = ti; break;
      case R::MlpNormBias: L.ln2_b = ti; break;
      case R::MlpIn: case R::Gate: L.fc_w = ti; break;
      case R::Up: L.up_w = ti; break;
      case R::MlpInBias: L.fc_b = ti; break;
      case R::MlpOut: L.fcproj_w = ti; break;
      case R::MlpOutBias: L.fcproj_b = ti; break;
      default: fail("tensor '", s.name, "' (", role_name(s.role), ") inside a block");
    }
  }
  if (cfg_.tie_embeddings) head_ = wte_;

  std::vector<char> gemm_weights(plan_.tensors.size());
  for (size_t i = 0; i < gemm_weights.size(); ++i) gemm_weights[i] = gemm_weight(int(i));
  gather_ = std::make_unique<WeightGatherer>(ctx_, plan_, params_.data(), std::move(gemm_weights),
                                             wte_, cfg_.n_layer, ov_, bf16_weights);

  reduce_ = std::make_unique<GradReducer>(ctx_, plan_, opt_, ov_, cfg_.n_layer, wte_, head_,
                                          int64_t(local_batch) * max_len);

  const int64_t N = int64_t(local_batch) * max_len;
  layer_slots_ = layer_slots(cfg_.n_layer, split_, G.p(), g_.coord.p());
  // The activation buffer and its views, both from the spec list (activation_layout.hpp).
  const ActivationSizes sz = activation_sizes(opt_.recompute);
  acts_ = backend::DeviceArray<float>(*be_, size_t(sz.total));
  a_ = std::make_unique<Acts>(lay_out_activations(acts_.data(), sz, layer_slots_, bf16_acts_));
  stats_ = backend::DeviceArray<double>(*be_, size_t(N) * 2);
  if (!be_->capabilities().host_visible)
    for (auto& b : ids_dev_) b = be_->alloc_array<int32_t>(size_t(N));
  row_max_ = be_->alloc_array<float>(size_t(N));
  scalar_ = be_->alloc_array<double>(1);
  argmax_idx_ = be_->alloc_array<int32_t>(size_t(local_batch));
  argmax_val_ = be_->alloc_array<float>(size_t(local_batch));

  if (positions_ == Positions::Rope) {
    const int64_t half = dims_.hd / 2;
    // The tables are built on the host once (the model's rotary settings) and copied over.
    const size_t n = size_t(cfg_.max_seq) * size_t(half);
    std::vector<float> cos_host(n), sin_host(n);
    k::rope_tables(cos_host.data(), sin_host.data(), cfg_.max_seq, dims_.hd, rope_frequencies(cfg_));
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
  const size_t n = params_.size() + 2 * size_t(optimizer_layout().state_size);
  return int64_t(n * sizeof(float)) + reduce_->bytes() + gather_->bytes();
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
  gather_->ensure_bf16_copy();

  set_layer(-1);
  if (embed || head) gather_->issue(-1);
  if (l1 > l0 && ov_.prefetch_depth > 0) {  // the chunk's first layer gathers during the embedding
    gather_->issue(l0);
    gather_->prefetch(l0, +1, l0, l1);
  }
  if (embed || head) gather_->gather(-1);
  if (embed) embedding_forward(inputs, N, T);

  const float* x = l0 == 0 ? a.emb : a.layer[l0 - 1].resid_out;  // the chunk's input
  for (int l = l0; l < l1; ++l) {
    set_layer(l);
    gather_->gather(l);
    gather_->prefetch(l, +1, l0, l1);
    layer_forward(l, x, B, T);
    x = a.layer[l].resid_out;
  }
  set_layer(-1);
  if (!head) return;
  norm_fwd(a.lnf, a.lnf_mean, a.lnf_rstd, x, lnf_w_, lnf_b_, N, a.lnf16);
  // Output head: normal layer on the embedding's block -> logits [N, V/Gy].
  gemm_allreduce(GemmSite::Head, a.logits, act(a.lnf, a.lnf16), head_, N);
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
  reduce_->micro_batch_done();
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
  gather_->ensure_bf16_copy();

  set_layer(-1);
  if (embed || head) {
    gather_->gather(-1);
    reduce_->zero_layer_blocks(-1);
  }
  if (reduce_->sparse_embedding() && embed)  // the token ids the Z group's embedding rows belong to
    reduce_->start_embedding_ids(device_ids(inputs, N, 0), N);
  if (head) {
    const float* x_last = l1 > 0 ? a.layer[l1 - 1].resid_out : a.emb;
    // Head: dlogits [N, Vy] -> dlnf [N, Cx] (sum over Y), d(head block): a normal layer.
    linear_bwd(GemmSite::Head, a.dln, a.logits, act(a.lnf, a.lnf16), head_, -1, N,
               head_dy16_ready_);
    head_dy16_ready_ = false;
    if (reduce_->sparse_embedding()) reduce_->scatter_top(/*head_part=*/true);
    zero_dev(a.dresid, N * dims_.Cx);
    norm_bwd(a.dresid, a.dln, x_last, a.lnf_mean, a.lnf_rstd, lnf_w_, lnf_b_, N);
  } else {
    // From the next stage, in host memory (the pipeline's receive buffer).
    bq().copy_to_device(a.dresid, dout, size_t(N * dims_.Cx) * sizeof(float));
  }

  for (int l = l1 - 1; l >= l0; --l) {
    const float* x_in = l == 0 ? a.emb : a.layer[l - 1].resid_out;
    set_layer(l);
    gather_->gather(l);
    gather_->prefetch(l, -1, l0, l1);
    reduce_->zero_layer_blocks(l);
    layer_backward(l, x_in, B, T);
    reduce_->scatter_layer(l);
    if (reduce_->last_micro_batch()) reduce_->layer_final(l, false);
  }
  set_layer(-1);

  if (embed) embedding_backward(inputs, N, T);
  if (embed || head) {
    if (reduce_->sparse_embedding()) {  // Gp = 1: embed and head together
      reduce_->scatter_top(/*head_part=*/false);
      reduce_->accumulate_embedding_rows(a.dresid, N);
    } else {
      reduce_->scatter_layer(-1);
    }
    if (reduce_->last_micro_batch()) reduce_->layer_final(-1, false);
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
