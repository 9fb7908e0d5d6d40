// The GPT-2 / Llama model on the grid (parallel_transformer.hpp): construction (sizes, ZeRO
// layout, buffers, the activation layout, the parts) and the model's forward and backward, which
// compose its parts: the vocabulary-parallel ends (embedding, output head and loss:
// vocab_parallel.hpp), the family's block for every layer (block.hpp, dense_block.hpp) and the
// final norm (parallel_ops.hpp), with the weight gathers (weight_gather.hpp) and gradient
// reductions (grad_reduction.hpp) between layers.
#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>
#include <cstring>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/activation_layout.hpp"
#include "tetrad/parallel/block.hpp"
#include "tetrad/parallel/context_split.hpp"
#include "tetrad/parallel/expert_parallel.hpp"
#include "tetrad/parallel/parallel_ops.hpp"
#include "tetrad/parallel/vocab_parallel.hpp"

namespace tetrad::parallel {

ParallelTransformer::ParallelTransformer(const ModelConfig& config, ProcessGroups& groups,
                                         int local_batch, int max_len, ParallelOptions options)
    : cfg_(config), opt_(options), local_batch_(local_batch), max_len_(max_len),
      ov_(options.overlap) {
  ctx_.groups = &groups;
  ctx_.queue = &q_;
  ctx_.be = opt_.device ? opt_.device : &backend::cpu_backend();
  backend::Backend* const be = ctx_.be;
  precision_ = opt_.precision;
  if (precision_ == backend::Precision::BF16 && !be->capabilities().gemm_bf16)
    fail("precision bf16: backend '", be->name(), "' has no bf16 GEMM");
  if (opt_.attention_precision == backend::Precision::BF16 &&
      !be->capabilities().attention_bf16_products)
    fail("attention precision bf16: backend '", be->name(), "' has no bf16 attention products");
  attention_precision_ =
      opt_.attention_precision ? *opt_.attention_precision
      : precision_ == backend::Precision::BF16 && be->capabilities().attention_bf16_faster
          ? backend::Precision::BF16
          : backend::Precision::FP32;
  if (opt_.zero < 0 || opt_.zero > 2)
    fail("parallel.zero: expected 0, 1 or 2 (ZeRO stage over the data axis), got ", opt_.zero);
  if (opt_.virtual_stages < 1)
    fail("parallel.virtual_stages must be at least 1, got ", opt_.virtual_stages);
  if (opt_.reduce_scatter_chunk_bytes < 1)
    fail("reduce-scatter chunk size must be at least 1 byte, got ", opt_.reduce_scatter_chunk_bytes);
  for (const comm::Communicator* c : {&groups.z(), &groups.d(), &groups.tokens()})
    if (opt_.grad_comm_bf16 && c->size() > 1 && std::string(c->transport()) == "NCCL")
      fail("train.grad_comm_precision = \"bf16\" is not implemented on NCCL (group '", c->name(),
           "'); use \"fp32\"");
  check_document_options();
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
  q_.set_compute_queue(&be->queue());  // collectives start after, and complete into, its work
  groups.use_backend(*be);  // device buffers through host memory where a group moves host memory
  backend_use_.groups = &groups;
  backend_use_.be = be;
  cfg_.validate();
  if (max_len <= 0 || max_len > cfg_.max_seq)
    fail("sequence length ", max_len, " is outside what the model supports (1..", cfg_.max_seq,
         " = model.max_seq)");
  // Context axis: each rank holds two of the 2 Gc chunks of every sequence.
  ContextSplit::of(groups.shape, groups.coord).check_divides(max_len);
  local_len_ = max_len / groups.shape.c();
  if (local_batch <= 0) fail("local micro-batch must be positive, got ", local_batch);
  table_ = build_param_table(cfg_);
  // The split uses the sequence length this model runs (its attention cost, for "balanced"), as
  // the planner does with its seq; resolve_layer_split names what is wrong with the setting.
  if (groups.shape.p() > 1)
    split_ = resolve_layer_split(opt_.pipeline_layers, cfg_, max_len, groups.shape.p(),
                                 opt_.virtual_stages);
  plan_ = ShardPlan::build(cfg_, table_, groups.shape, groups.coord, split_);
  const GridShape& G = groups.shape;
  ctx_.dims = LocalDims::of(cfg_, G);

  params_ = backend::DeviceArray<float>(*be, plan_.local_total);
  const bool bf16_weights = precision_ == backend::Precision::BF16 && opt_.bf16_weight_copy;
  if (bf16_weights && !be->capabilities().gemm_bf16_storage)
    fail("bf16 weight copy: backend '", be->name(), "' cannot read bf16-stored GEMM operands "
         "(Capabilities::gemm_bf16_storage); set ParallelOptions::bf16_weight_copy = false");
  bf16_acts_ = precision_ == backend::Precision::BF16 && opt_.bf16_activations;
  wgrad_nn_ = bf16_acts_ && opt_.bf16_weight_grad_nn && be->capabilities().bf16_producers;

  // The ends' tensors, by role (the block binds its own: make_block).
  for (size_t i = 0; i < table_.specs.size(); ++i) {
    const ParamSpec& s = table_.specs[i];
    if (s.layer >= 0) continue;
    const int ti = int(i);
    using R = TensorRole;
    switch (s.role) {
      case R::TokenEmbedding: wte_ = ti; break;
      case R::PositionEmbedding: wpe_ = ti; break;
      case R::FinalNorm: lnf_w_ = ti; break;
      case R::FinalNormBias: lnf_b_ = ti; break;
      case R::Head: head_ = ti; break;
      default: fail("tensor '", s.name, "' (", role_name(s.role), ") outside the blocks");
    }
  }
  if (cfg_.tie_embeddings) head_ = wte_;

  std::vector<char> gemm_weights(plan_.tensors.size());
  for (size_t i = 0; i < gemm_weights.size(); ++i) gemm_weights[i] = gemm_weight(int(i));
  gather_ = std::make_unique<WeightGatherer>(ctx_, plan_, params_.data(), std::move(gemm_weights),
                                             wte_, cfg_.n_layer, ov_, bf16_weights);

  reduce_ = std::make_unique<GradReducer>(ctx_, plan_, opt_, ov_, cfg_.n_layer, wte_, head_,
                                          int64_t(local_batch) * local_len_);

  const int64_t N = int64_t(local_batch) * local_len_;
  check_sequence_shard(opt_, G, N);
  layer_slots_ = layer_slots(cfg_.n_layer, split_, G.p(), groups.coord.p());
  // The activation buffer and its views, both from the spec list (activation_layout.hpp).
  const ActivationSizes sz = activation_sizes(opt_.recompute);
  acts_ = backend::DeviceArray<float>(*be, size_t(sz.total));
  a_ = std::make_unique<Acts>(lay_out_activations(acts_.data(), sz, layer_slots_, bf16_acts_));

  // The parts, on the buffers above (their own scratch allocated by each).
  ops_ = std::make_unique<ParallelOps>(
      ctx_, *gather_, *reduce_, layouts_, ov_, precision_, bf16_acts_, cfg_.desc().norm,
      cfg_.n_embd, cfg_.norm_eps,
      ParallelOps::Scratch{a_->tmp, a_->dout16, a_->dout16_t, a_->dfull}, N, opt_.sequence_shard);
  vocab_ = std::make_unique<VocabParallel>(
      ctx_, *ops_, *reduce_, *a_, VocabParallel::Tensors{wte_, wpe_, head_}, cfg_.vocab_size, N,
      local_batch, bf16_acts_ && G.p() == 1 && be->capabilities().bf16_loss_grad);
  block_ = make_block(BlockParts{cfg_, table_, ctx_, *ops_, *a_, opt_.recompute,
                                 attention_precision_, max_len_, local_batch_, opt_.cp_comm,
                                 opt_.cp_skip_masked_pairs, wgrad_nn_});
  if (ops_->sequence_sharded() && !block_->sequence_shardable())
    fail("parallel.sequence_shard is not implemented for the blocks of model family '",
         family_name(cfg_.family), "'; set parallel.sequence_shard = false");

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
    if (resolve_gemm_layouts("tune", precision_, *be, &why) == GemmLayouts::Rule)
      layout_summary_ = "gemm layouts: " + why + ", " + rule_forms;
    else if (!bf16_acts_)
      layout_summary_ = std::string("gemm layouts: rule (tune: needs bf16 activations), ") + rule_forms;
    else
      tune_gemm_layouts();
  }
}

ParallelTransformer::~ParallelTransformer() = default;

ParallelTransformer::ActivationSizes ParallelTransformer::activation_sizes(Recompute mode) const {
  return parallel::activation_sizes(cfg_, ctx_.shape(), local_batch_, max_len_, bf16_acts_, mode,
                                    layer_slots_, seq_shard_ways(opt_, ctx_.shape()),
                                    opt_.bf16_stash);
}

int64_t ParallelTransformer::activation_bytes(Recompute mode) const {
  return int64_t(sizeof(float)) * activation_sizes(mode).total;
}

int64_t ParallelTransformer::context_bytes() const { return block_->scratch_bytes(); }
int64_t ParallelTransformer::expert_exchange_bytes() const { return block_->expert_exchange_bytes(); }
int64_t ParallelTransformer::expert_exchange_bound() const {
  const GridShape& G = ctx_.shape();
  if (G.e() == 1 || !cfg_.moe()) return 0;
  return ExpertParallel::scratch_bytes(
      ctx_.dims, ExpertParallel::max_rows(cfg_, G, int64_t(local_batch_) * local_len_));
}

int64_t ParallelTransformer::state_bytes() const {
  const size_t n = params_.size() + 2 * size_t(optimizer_layout().state_size);
  return int64_t(n * sizeof(float)) + reduce_->bytes() + gather_->bytes();
}

// ---------------------------------------------------------------------------------------------
// Forward

void ParallelTransformer::forward(const int32_t* inputs, int B, int T, bool whole_logits) {
  forward_chunk(0, cfg_.n_layer, true, true, inputs, B, T, whole_logits);
}

void ParallelTransformer::forward_chunk(int l0, int l1, bool embed, bool head,
                                        const int32_t* inputs, int B, int T, bool whole_logits) {
  if (B <= 0 || B > local_batch_)
    fail("micro-batch of ", B, " sequences on this rank; the model was set up for 1..", local_batch_);
  if (local_len_ != max_len_) {  // Gc > 1: T is this rank's two chunks of each sequence
    if (T <= 0 || T > local_len_ || T % 2 != 0)
      fail("context parallelism (grid c=", ctx_.shape().c(), "): ", T, " tokens per sequence on "
           "this rank; expected an even count of at most ", local_len_, " (two chunks of a "
           "sequence of at most ", max_len_, " tokens)");
  } else if (T <= 0 || T > max_len_) {
    fail("sequence of ", T, " tokens is longer than the model's maximum of ", max_len_,
         " (model.max_seq / train.seq_len)");
  }
  const int64_t N = int64_t(B) * T;
  if (ops_->sequence_sharded() && N % ctx_.shape().y() != 0)
    fail("parallel.sequence_shard: a micro-batch of ", B, " x ", T, " tokens on this rank does "
         "not split evenly over Gy = ", ctx_.shape().y());
  Acts& a = *a_;
  gather_->ensure_bf16_copy();
  select_documents(inputs, B, T);

  set_layer(-1);
  if (embed || head) gather_->issue(-1);
  if (l1 > l0 && ov_.prefetch_depth > 0) {  // the chunk's first layer gathers during the embedding
    gather_->issue(l0);
    gather_->prefetch(l0, +1, l0, l1);
  }
  if (embed || head) gather_->gather(-1);
  if (embed) vocab_->embedding_forward(inputs, N, T);

  const float* x = l0 == 0 ? a.emb : a.layer[l0 - 1].resid_out;  // the chunk's input
  for (int l = l0; l < l1; ++l) {
    set_layer(l);
    gather_->gather(l);
    gather_->prefetch(l, +1, l0, l1);
    block_->forward(l, x, B, T);
    x = a.layer[l].resid_out;
  }
  set_layer(-1);
  if (!head) return;
  ops_->norm_fwd(a.lnf, a.lnf_mean, a.lnf_rstd, x, lnf_w_, lnf_b_, N, a.lnf16);
  vocab_->head_forward(N, whole_logits);
}

MoeStats ParallelTransformer::take_moe_stats() { return block_->take_moe_stats(); }

double ParallelTransformer::chunk_loss(const int32_t* targets, int B, int T, float grad_scale,
                                       bool with_grad) {
  if (with_grad) block_->set_grad_scale(grad_scale);
  return vocab_->cross_entropy(targets, int64_t(B) * T, grad_scale, with_grad);
}

void ParallelTransformer::set_block_grad_scale(float grad_scale) {
  block_->set_grad_scale(grad_scale);
}

double ParallelTransformer::forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T) {
  ScopedPhase sp(ctx_.prof, Phase::Other);
  forward(inputs, B, T, false);
  return vocab_->cross_entropy(targets, int64_t(B) * T, 0.0f, false);
}

double ParallelTransformer::forward_backward(const int32_t* inputs, const int32_t* targets,
                                             int B, int T, float grad_scale) {
  // Model code outside the named kernels counts as compute ("other").
  ScopedPhase sp(ctx_.prof, Phase::Other);
  forward(inputs, B, T, false);
  const double loss = vocab_->cross_entropy(targets, int64_t(B) * T, grad_scale, true);
  block_->set_grad_scale(grad_scale);
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
  select_documents(inputs, B, T);

  set_layer(-1);
  if (embed || head) {
    gather_->gather(-1);
    reduce_->zero_layer_blocks(-1);
  }
  if (reduce_->sparse_embedding() && embed)  // the token ids the Z group's embedding rows belong to
    vocab_->start_embedding_ids(inputs, N);
  if (head) {
    const float* x_last = l1 > 0 ? a.layer[l1 - 1].resid_out : a.emb;
    const float* dlnf = vocab_->head_backward(a.dln, N);  // dlogits [N, Vy] -> dlnf [N, Cx]
    if (reduce_->sparse_embedding()) reduce_->scatter_top(/*head_part=*/true);
    ctx_.zero_dev(a.dresid, ops_->stream_rows(N) * ctx_.dims.Cx);
    ops_->norm_bwd(a.dresid, dlnf, x_last, a.lnf_mean, a.lnf_rstd, lnf_w_, lnf_b_, N);
  } else {
    // From the next stage, in host memory (the pipeline's receive buffer).
    ctx_.bq().copy_to_device(a.dresid, dout,
                             size_t(ops_->stream_rows(N) * ctx_.dims.Cx) * sizeof(float));
  }

  for (int l = l1 - 1; l >= l0; --l) {
    const float* x_in = l == 0 ? a.emb : a.layer[l - 1].resid_out;
    set_layer(l);
    gather_->gather(l);
    gather_->prefetch(l, -1, l0, l1);
    reduce_->zero_layer_blocks(l);
    block_->backward(l, x_in, B, T);
    reduce_->scatter_layer(l);
    if (reduce_->last_micro_batch()) reduce_->layer_final(l, false);
  }
  set_layer(-1);

  // The embedding's gradient: all N rows of the stream's (gathered over Y with sequence sharding).
  const float* demb = embed ? ops_->stream_grad(a.dresid, N) : nullptr;
  if (embed) vocab_->embedding_backward(demb, inputs, N, T);
  if (embed || head) {
    if (reduce_->sparse_embedding()) {  // Gp = 1: embed and head together
      reduce_->scatter_top(/*head_part=*/false);
      reduce_->accumulate_embedding_rows(demb, N);
    } else {
      reduce_->scatter_layer(-1);
    }
    if (reduce_->last_micro_batch()) reduce_->layer_final(-1, false);
  }
}

}  // namespace tetrad::parallel
