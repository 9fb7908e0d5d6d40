// The GPT-2 / Llama model on a grid of ranks (X, Y, Z tensor parallelism x D data parallelism),
// as 4d-parallelism.md describes: every GEMM weight is a block split over X and Y and sharded
// again over Z; the hidden state is [tokens, C/Gx] on each rank (replicated over Y); norms are
// exact (row statistics all-reduced over X); heads are split over Y; the embedding, output head
// and cross-entropy are vocabulary-parallel over Y; tokens are split over Z and D.
//
// Memory: a rank stores only its shards (parameters, gradients); one layer's gathered weights
// (plus the embedding/head block, needed at both ends of the step) are live at a time.
//
// Gradients: per layer, weight-gradient blocks are reduce-scattered over Z as soon as the layer's
// backward is done; reduce_gradients() then all-reduces the Z shards over D and the replicated
// tensors (norms, biases, position table) over Z x D.
//
// Overlap (OverlapOptions, comm_schedule.hpp): every collective goes through one CommQueue; the
// switches move waits later (dIn all-reduce behind the dW GEMM, reduce-scatter behind earlier
// layers, all-gathers issued ahead, data-parallel buckets during the last backward, forward
// all-reduce in row chunks) without changing any message, so results do not depend on them.
// Gathered weights are reused while they are valid: from the first gather after a parameter
// change (params(), set_tensor, init_weights, begin_step, zero_grads) until the next one.
//
// The serial Transformer<T> (tests/support/transformer.hpp, the test oracle) is the reference
// this class is tested against: on any grid it must follow the same trajectory within fp32
// rounding.
// Not thread-safe. All methods except the accessors are collective over the grid.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/core/buffer.hpp"
#include "tetrad/core/profile.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/comm_schedule.hpp"
#include "tetrad/parallel/grad_reduction.hpp"
#include "tetrad/parallel/linear_layers.hpp"
#include "tetrad/parallel/local_dims.hpp"
#include "tetrad/parallel/moe_routing.hpp"
#include "tetrad/parallel/memory_model.hpp"
#include "tetrad/parallel/options.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/parallel/pipeline_schedule.hpp"
#include "tetrad/parallel/sharding.hpp"
#include "tetrad/parallel/step_context.hpp"
#include "tetrad/parallel/weight_gather.hpp"

namespace tetrad::parallel {

struct ParallelActivations;
class ParallelOps;
class TransformerBlock;
class VocabParallel;

class ParallelTransformer {
 public:
  // local_batch: sequences of this rank per micro-batch (the global micro-batch / (Gz * Gd)).
  // max_len: the longest sequence; with a context axis (Gc > 1) this rank holds two of its 2 Gc
  // chunks (context_split.hpp) and the forward's T is its part (local_len()).
  ParallelTransformer(const ModelConfig& config, ProcessGroups& groups, int local_batch,
                      int max_len, ParallelOptions options = {});
  // Overlap switches only (no recomputation, no ZeRO, one chunk per stage).
  ParallelTransformer(const ModelConfig& config, ProcessGroups& groups, int local_batch,
                      int max_len, const OverlapOptions& overlap)
      : ParallelTransformer(config, groups, local_batch, max_len, with_overlap(overlap)) {}
  ~ParallelTransformer();
  ParallelTransformer(const ParallelTransformer&) = delete;
  ParallelTransformer& operator=(const ParallelTransformer&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  const ShardPlan& plan() const { return plan_; }
  ProcessGroups& groups() { return ctx_.g(); }
  int64_t num_local_params() const { return plan_.local_total; }
  // Writable parameters: the caller may change them, so gathered copies (and the bf16 weight
  // copy) are dropped and remade before the next forward.
  float* params() {
    gather_->parameters_changed();
    return params_.data();
  }
  // Read-only parameters (checkpoints, norms): gathered copies stay valid.
  const float* param_data() const { return params_.data(); }
  float* grads() { return reduce_->grads(); }
  const ParallelOptions& options() const { return opt_; }
  // The backend the model computes on and its GEMM precision (ParallelOptions).
  backend::Backend& compute_backend() const { return *ctx_.be; }
  backend::Precision gemm_precision() const { return precision_; }
  // The arithmetic of attention's products (ParallelOptions::attention_precision, resolved).
  backend::Precision attention_precision() const { return attention_precision_; }
  // Bytes of this rank's activation buffer (the forward's saved tensors and the backward's
  // scratch) as allocated, and what it would be under any recompute mode.
  int64_t activation_bytes() const { return int64_t(acts_.size() * sizeof(float)); }
  int64_t activation_bytes(Recompute mode) const;
  // Bytes of the context axis's exchange buffers (Gc > 1: gathered or ring-passed q|k|v rows,
  // their gradients, partial results and log-sum-exp; ContextAttention::bytes()), 0 otherwise.
  // Allocated once beside the activation buffer and reused by every layer.
  int64_t context_bytes() const;
  // Bytes of the expert-parallel exchange's scratch (a mixture of experts on E > 1: the rows
  // received for this rank's experts and their GEMMs' work, ExpertParallel::bytes()), as grown
  // by the largest exchange so far; the memory formula counts its bound (model_memory).
  int64_t expert_exchange_bytes() const;
  // What it can grow to: the dropless worst case the memory formula counts
  // (ExpertParallel::max_rows for local_batch() x local_len() tokens); 0 without the fold.
  int64_t expert_exchange_bound() const;
  // The floats of the activation buffer by tensor under a recompute mode, as laid out
  // (memory_model.hpp: the same arithmetic the planner's memory formula calls).
  using ActivationSizes = parallel::ActivationSizes;
  ActivationSizes activation_sizes(Recompute mode) const;
  // Bytes this rank holds for parameters, gradients and Adam moments (two of
  // optimizer_state_size()), plus the gather / gradient-staging buffers.
  int64_t state_bytes() const;
  int max_len() const { return max_len_; }
  // Tokens of one sequence on this rank: max_len() / Gc (the context axis cuts each sequence;
  // the forward's T is this rank's part, context_split.hpp), max_len() without it.
  int local_len() const { return local_len_; }
  int local_batch() const { return local_batch_; }

  // The same initial values as Transformer<float>::init_weights(seed); each rank keeps its shard.
  void init_weights(uint64_t seed);
  // Whole tensors (checkpoints): set_tensor keeps this rank's shard of `full` (given on every
  // rank); get_tensor assembles the whole tensor on every rank (collective).
  void set_tensor(size_t index, const float* full) {
    gather_->parameters_changed();
    scatter_tensor(params_.data(), index, full);
  }
  void get_tensor(size_t index, float* full) { gather_tensor(params_.data(), index, full); }
  // The same for any buffer laid out like the parameters (gradients, optimizer moments).
  void scatter_tensor(float* local, size_t index, const float* full) const;
  void gather_tensor(const float* local, size_t index, float* full);
  // The same for optimizer state (Adam moments) laid out as optimizer_layout() says (pieces over
  // D with ZeRO 1/2; like the parameters otherwise).
  void scatter_state_tensor(float* state, size_t index, const float* full) const;
  void gather_state_tensor(const float* state, size_t index, float* full);

  // The layout the optimizer updates: with ZeRO, this D rank's pieces.
  const OptimizerLayout& optimizer_layout() const { return reduce_->layout(); }
  int64_t num_local_grads() const { return reduce_->num_grads(); }
  // After the optimizer step (ZeRO 1/2): all-gather the updated pieces over D so every replica
  // has the whole local shard again. No-op without ZeRO.
  void gather_updated_params();
  // The optimizer step: update(params, lo, hi) must apply the optimizer to the local parameters
  // at offsets [lo, hi) (it is called for disjoint intervals covering them all, in any order).
  // With OverlapOptions::prefetch_across_steps (and Z > 1, prefetch_depth > 0, Gp = 1) the
  // tensors the next forward gathers first (top-level ones, layers 0..prefetch_depth) are
  // updated first and their Z all-gathers start while the rest is updated, so the next step
  // does not begin waiting for them (with ZeRO they start after gather_updated_params()).
  // Otherwise one update(params, 0, n), then gather_updated_params().
  void apply_update(const std::function<void(float* params, int64_t lo, int64_t hi)>& update);
  // The same for an optimizer that also writes the bf16 weight copy in its pass (AdamW::update
  // with params_bf16, OpTable::adamw's p16): update(params, params16, lo, hi) must write both for
  // [lo, hi). params16 is null when the model keeps no bf16 copy (fp32, or bf16_weight_copy off).
  // The 3-argument form above casts each interval itself after the update.
  void apply_update(
      const std::function<void(float* params, uint16_t* params16, int64_t lo, int64_t hi)>& update);
  // Whether the GEMMs read a bf16 weight copy (ParallelOptions::bf16_weight_copy with bf16).
  bool bf16_weights() const { return gather_->bf16(); }
  // The GEMM layout of every site (gemm_layouts.hpp): the rule, tuned at construction
  // (ParallelOptions::gemm_layouts = Tune), given, or set from a checkpoint.
  const GemmLayoutPlan& gemm_layout_plan() const { return layouts_; }
  // One line for the run's log: "gemm layouts (tuned in 1.2 s on rank 0, used by every rank):
  // head.dx TN (495 vs rule NN 345 GFLOP/s), ...; the other products as the rule".
  const std::string& gemm_layout_summary() const { return layout_summary_; }
  // Runs `plan` from now on (a checkpoint's, on resume: the same sums as the run that wrote
  // it). Refused (Error) where its forms cannot run here (dY16ᵀ without bf16 activations).
  // Returns false, changing nothing, when its shapes are not this model's.
  bool set_gemm_layout_plan(const GemmLayoutPlan& plan);
  // Waits for every collective still pending (the next step's gathers apply_update started), so
  // a run that ends leaves no request to its destructors.
  void finish_communication() { ctx_.q().wait_all(); }
  void zero_grads();
  // A mixture of experts' router losses and expert load over the forward passes since the last
  // call (empty for a dense model): moe_routing.hpp's MoeStats.
  MoeStats take_moe_stats();
  // DeepSeek-V3's expert bias (ModelConfig::moe_expert_bias; nothing otherwise), after the
  // optimizer step: every layer this rank stores gets bias_e += expert_bias_rate * sign(mean
  // load - load_e) from `load` [n_layer * E], the step's choices per expert summed over the
  // token-sharing ranks (MoeStats::load; the same on each, so every copy stays equal).
  // expert_bias.cpp.
  void update_expert_bias(const std::vector<int64_t>& load);
  // zero_grads() for a step of `micro_batches` forward_backward calls: during the last one,
  // data-parallel buckets start as soon as their gradients are final (OverlapOptions::dp_overlap).
  // Without it (zero_grads only) every data-parallel reduction waits for reduce_gradients().
  // The pipeline (Gp > 1) and ZeRO never start buckets early (dp_overlap is off there).
  void begin_step(int micro_batches);
  // The switches in effect (dp_overlap cleared with ZeRO or Gp > 1).
  const OverlapOptions& overlap() const { return ov_; }
  // Whether the embedding gradient goes over Z as touched rows (ParallelOptions).
  bool sparse_embedding_grad() const { return reduce_->sparse_embedding(); }
  // One micro-batch of this rank's tokens: forward, vocabulary-parallel cross-entropy with
  // d(grad_scale * Σ loss), backward; parameter gradients accumulate (Z-reduced per layer).
  // Returns this rank's Σ loss over kept targets (sum over Z x D for the global figure).
  double forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T,
                          float grad_scale);
  // The documents of the tokens the next calls run (ParallelOptions::document_mask,
  // document_positions; documents.cpp): doc_start holds, for each of the n tokens at `tokens`
  // (a step's micro-batches or one batch, host memory, same layout), the position in its
  // sequence where its document begins (data::DataLoader::next_batch). A forward or backward
  // whose inputs lie inside [tokens, tokens + n) runs with the matching rows; with either option
  // on, one whose inputs lie outside is an Error (a batch without its documents). The arrays
  // must outlive those calls. Options off: ignored.
  void set_documents(const int32_t* tokens, const int32_t* doc_start, int64_t n);
  bool uses_documents() const { return opt_.document_mask || opt_.document_positions; }
  double forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T);
  // Greedy decoding on the grid: forward over this rank's [B, T] tokens, then for each sequence
  // the argmax over the whole vocabulary of its last position's logits (each Y slice's winner
  // compared after an all-gather over Y; ties go to the lowest id, as in the serial decoder).
  // Each call recomputes the whole prefix (decode() below keeps a KV cache). Collective.
  std::vector<int32_t> greedy_next_tokens(const int32_t* inputs, int B, int T);
  // Logits over the whole vocabulary of this rank's [B, T] tokens: [B*T, V] rows in host
  // memory, the same on every rank of the Y group (each slice's [B*T, V/Gy] all-gathered over
  // Y). Valid until the next call. Collective.
  const float* forward_logits(const int32_t* inputs, int B, int T);

  // Incremental decoding with a key/value cache (generation, extraction), on any grid without a
  // pipeline axis (kv_decode.cpp). start_cache(B) empties the cache for B sequences of this rank
  // (B <= local_batch; each rank caches its own heads' keys and values, as its attention
  // splits them over Y); decode() appends Tq tokens per sequence at cache_position() and returns
  // the logits of each sequence's last new token over the whole vocabulary, [B, V] in host
  // memory, on every rank of the Y group. Collective: every rank calls it, with its own tokens.
  void start_cache(int B);
  const float* decode(const int32_t* tokens, int B, int Tq);
  int cache_position() const { return cache_pos_ < 0 ? 0 : cache_pos_; }
  // After the step's last micro-batch: data-parallel and replicated-tensor reductions (those
  // already started are waited for).
  void reduce_gradients();
  // Σ g² over the whole model (each element counted once, on every rank).
  double grad_sum_squares();
  // AdamW ranges: the local buffer as (offset, numel, decays) runs, by parameter kind.
  void set_profile(StepProfile* p) {
    ctx_.prof = p;
    q_.set_profile(p);
  }

  // Pipeline (Gp > 1; parallel/pipeline.hpp drives these). Every stage keeps every tensor (its
  // own layers are the ones it computes and reports; see docs/parallel.md). A chunk is the layers
  // [l0, l1) of one virtual stage, with the embedding first (embed) and the final norm, head and
  // loss last (head). forward_chunk reads its input from chunk_input(l0) (write the previous
  // stage's output there; the embedding computes it) and leaves its output at chunk_output(l1).
  // whole_logits: the head writes every row of the logits on every X rank (forward_logits,
  // greedy decoding); without it only the rows this rank's loss reads (chunk_loss,
  // VocabParallel::head_forward).
  void forward_chunk(int l0, int l1, bool embed, bool head, const int32_t* inputs, int B, int T,
                     bool whole_logits = false);
  // Head chunk, after forward_chunk: the cross-entropy as forward_backward does it.
  double chunk_loss(const int32_t* targets, int B, int T, float grad_scale, bool with_grad);
  // The loss's gradient scale for the blocks' own loss terms (the router's losses of a mixture
  // of experts): every pipeline stage's, including those without the head (chunk_loss sets it
  // on the last).
  void set_block_grad_scale(float grad_scale);
  // dout: gradient of the chunk's output (ignored with head); afterwards input_grad() holds the
  // gradient of its input. Parameter gradients accumulate as in forward_backward.
  void backward_chunk(int l0, int l1, bool embed, bool head, const int32_t* inputs,
                      const float* dout, int B, int T);
  float* chunk_input(int l0);
  // Floats of the hidden state a chunk passes on for B x T tokens: [N, C/Gx], or this rank's
  // N/Gy rows of it with sequence sharding (ParallelOptions::sequence_shard).
  int64_t hidden_floats(int B, int T) const;
  const float* chunk_output(int l1) const;
  const float* input_grad() const;
  // The activations a chunk's backward needs, copied out after its forward and back before its
  // backward, so several micro-batches can be in flight on one activation buffer.
  std::vector<float> stash(int l0, int l1, bool embed, bool head);
  void restore(int l0, int l1, bool embed, bool head, const std::vector<float>& saved);
  // Elements stash() returns for that chunk (with the buffers as allocated now).
  int64_t stash_numel(int l0, int l1, bool embed, bool head);
  // The stage (0..Gp-1) whose chunk holds layer l.
  int layer_stage(int l) const;
  // The layers of each virtual stage (Gp > 1; empty without a pipeline axis).
  const LayerSplit& layer_split() const { return split_; }

 private:
  using Acts = ParallelActivations;  // activation_layout.hpp
  // Whether tensor i is a GEMM weight (a linear layer's matrix, or the output head's table).
  bool gemm_weight(int i) const;
  void set_layer(int l) {
    if (ctx_.prof) ctx_.prof->layer = l;
  }
  static ParallelOptions with_overlap(const OverlapOptions& o) {
    ParallelOptions p;
    p.overlap = o;
    return p;
  }

  // The implementation is split by role, one file each; the model's parts each have their own
  // (the blocks: block.hpp, dense_block.cpp; the vocabulary-parallel ends: vocab_parallel.cpp;
  // the parallel linear layers and norms: parallel_ops.hpp, parallel_linear.cpp,
  // parallel_norm.cpp; the weight gatherer and the gradient reducer).
  // parallel_transformer.cpp: construction; the model's forward and backward (the embedding, the
  // blocks, final norm, head and loss, with the gathers and gradient reductions between layers).
  void forward(const int32_t* inputs, int B, int T, bool whole_logits);
  void backward(const int32_t* inputs, int B, int T);

  // parallel_gemm_layouts.cpp: the rule plan for this model, the tuning, the site shapes.
  GemmLayoutPlan rule_gemm_layouts() const;
  void tune_gemm_layouts();
  void check_gemm_layout_plan(const GemmLayoutPlan& plan) const;

  // param_shards.cpp: whole tensors to and from this rank's shards.
  void gather_shard(const float* shard, size_t index, float* full);
  std::vector<float> shard_of(size_t index, const float* full) const;
  // n floats of host memory into device memory of the model's backend (complete on return).
  void upload(float* dev, const float* host, int64_t n) const;

  // pipeline_chunks.cpp: stage ownership and the activation regions a chunk stashes.
  bool owns(const TensorShard& t) const { return stage_owns(t, ctx_.g().coord); }
  std::vector<std::pair<float*, size_t>> chunk_regions(int l0, int l1, bool embed, bool head);

  // documents.cpp: the options checked at construction; the rows of the micro-batch whose
  // tokens are at `inputs` (set_documents) into ctx_.docs, uploaded to the device.
  void check_document_options() const;
  void select_documents(const int32_t* inputs, int B, int T);

  // kv_decode.cpp: layer l's cached keys and values.
  float* cache_k(int l);
  float* cache_v(int l);

  ModelConfig cfg_;
  // Releases the groups' staging of this model's backend (ProcessGroups::use_backend) last of
  // all, after the pending requests (q_) have copied their results back.
  struct BackendUse {
    ProcessGroups* groups = nullptr;
    backend::Backend* be = nullptr;
    BackendUse() = default;
    BackendUse(const BackendUse&) = delete;
    BackendUse& operator=(const BackendUse&) = delete;
    ~BackendUse() {
      if (groups) groups->release_backend(*be);
    }
  } backend_use_;
  ParallelOptions opt_;
  ParamTable table_;
  LayerSplit split_;
  // Which layers' activation slots this rank allocates (memory_model.hpp: all on one stage; a
  // pipeline stage only its own layers' and its chunks' input slots).
  std::vector<LayerSlots> layer_slots_;
  ShardPlan plan_;
  int local_batch_, max_len_, local_len_ = 0;
  OverlapOptions ov_;
  // What the model and its parts compute and communicate with (step_context.hpp): the groups,
  // the queue of collectives (q_ below), the backend, the profile and this rank's dimensions.
  StepContext ctx_;
  // Device memory of the model's backend from here on (backend::DeviceArray): the host reaches
  // it only through the queue's copies (docs/backend.md, "Device memory").
  backend::DeviceArray<float> params_;
  // The weights as the compute reads them: gathered slots, prefetch, the bf16 copy
  // (weight_gather.hpp). Declared before q_, whose pending all-gathers write into its slots.
  std::unique_ptr<WeightGatherer> gather_;
  bool bf16_acts_ = false;     // ParallelOptions::bf16_activations in force (with bf16)
  bool wgrad_nn_ = false;      // ... and the NN weight-gradient form (needs the cast-transpose)
  GemmLayoutPlan layouts_;     // every site's GEMM forms (gemm_layouts.hpp)
  std::string layout_summary_;
  // The gradients and their reductions: blocks, Z reduce-scatters, buckets, ZeRO pieces, sparse
  // embedding rows (grad_reduction.hpp). Declared before q_, whose pending reduce-scatters
  // write into its buffers and call back into it.
  std::unique_ptr<GradReducer> reduce_;
  backend::DeviceArray<float> acts_;
  std::unique_ptr<Acts> a_;  // the views of acts_ (activation_layout.hpp)
  // The GEMM and attention precisions (ParallelOptions, resolved).
  backend::Precision precision_ = backend::Precision::FP32;
  backend::Precision attention_precision_ = backend::Precision::FP32;
  // The parts the forward and backward are composed of, each with its own scratch; declared
  // before q_ (its collectives write into their buffers).
  std::unique_ptr<ParallelOps> ops_;        // parallel linear layers and norms
  std::unique_ptr<VocabParallel> vocab_;    // embedding, head, loss, argmax, whole vocabulary
  std::unique_ptr<TransformerBlock> block_;  // the family's block, every layer
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, head_ = -1;
  // kv_decode.cpp: the KV cache, [L][k|v][B][max_len][nkvy*hd] (this rank's kv heads), its
  // batch and next position (-1: no cache started).
  backend::DeviceBuffer kv_cache_;
  int cache_b_ = 0, cache_pos_ = -1;
  // documents.cpp: the registered tokens and their document starts (host), the selected
  // micro-batch's rows on the device.
  const int32_t* doc_tokens_ = nullptr;
  const int32_t* doc_starts_ = nullptr;
  int64_t doc_n_ = 0;
  backend::DeviceBuffer doc_dev_;
  // Declared after every buffer a collective reads or writes, so it is destroyed first: requests
  // still pending when an error unwinds are finished (or abandoned) while their buffers exist.
  // The model's code reaches it through ctx_.
  CommQueue q_;
};

}  // namespace tetrad::parallel
