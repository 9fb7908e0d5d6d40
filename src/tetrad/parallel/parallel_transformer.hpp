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
// The serial Transformer<T> (model/transformer.hpp) is the reference this class is tested
// against: on any grid it must follow the same trajectory within fp32 rounding.
// Not thread-safe. All methods except the accessors are collective over the grid.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tetrad/core/buffer.hpp"
#include "tetrad/core/profile.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/parallel/pipeline_schedule.hpp"
#include "tetrad/parallel/sharding.hpp"

namespace tetrad::parallel {

// Activation recomputation (train.recompute): what the forward keeps for the backward.
//   None       every layer's activations are kept.
//   Selective  the attention internals (attention output and softmax log-sum-exp, per head) are
//              not kept: one layer's worth of scratch; the backward recomputes the attention from
//              the stored q|k|v (no communication, no GEMM: Megatron's "selective").
//   Full       per block only its input is kept (the previous block's output); the backward
//              recomputes the block's forward (GEMMs and their all-reduces included) into one
//              layer's scratch before its backward.
// Every mode gives bit-identical results: the recomputation repeats the same operations on the
// same inputs (deterministic kernels, static OpenMP schedules).
enum class Recompute { None, Selective, Full };
Recompute parse_recompute(const std::string& text);  // "none" | "selective" | "full"
const char* recompute_name(Recompute mode);

// ZeRO over the data axis (parallel.zero), on top of whatever Z already shards:
//   0  every D replica keeps the whole local shard of parameters, gradients and Adam moments;
//      gradients are all-reduced over D.
//   1  the Adam moments are sharded over D: each tensor's local shard is cut into Gd pieces
//      (rank d owns piece d, ceil(n / Gd) elements, the last one shorter); gradients are
//      reduce-scattered over D at the end of the step, each D rank updates its piece, and the
//      updated pieces are all-gathered over D.
//   2  as 1, and the gradients too: only the piece is kept (grads() has optimizer_state_size()
//      elements); each layer's gradient is reduce-scattered over Z then D as soon as its
//      backward is done, every micro-batch.
struct ParallelOptions {
  Recompute recompute = Recompute::None;
  int zero = 0;
  int virtual_stages = 1;  // pipeline chunks per stage (interleaved schedule; Gp > 1 only)
};

// Where the optimizer finds each tensor's part on this rank: parameters and gradients at
// param_offset / grad_offset of params() / grads(), its moments at state_offset of a buffer of
// optimizer_state_size(); numel elements (0 when this D rank's piece is empty).
struct OptimizerLayout {
  std::vector<int64_t> param_offsets, grad_offsets, state_offsets, sizes;
  int64_t state_size = 0;
};

class ParallelTransformer {
 public:
  // local_batch: sequences of this rank per micro-batch (the global micro-batch / (Gz * Gd)).
  ParallelTransformer(const ModelConfig& config, ProcessGroups& groups, int local_batch,
                      int max_len, ParallelOptions options = {});
  ~ParallelTransformer();
  ParallelTransformer(const ParallelTransformer&) = delete;
  ParallelTransformer& operator=(const ParallelTransformer&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  const ShardPlan& plan() const { return plan_; }
  ProcessGroups& groups() { return g_; }
  int64_t num_local_params() const { return plan_.local_total; }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  const ParallelOptions& options() const { return opt_; }
  // Bytes of this rank's activation buffer (the forward's saved tensors and the backward's
  // scratch) as allocated, and what it would be under any recompute mode.
  int64_t activation_bytes() const { return int64_t(acts_.size() * sizeof(float)); }
  int64_t activation_bytes(Recompute mode) const;
  // Bytes this rank holds for parameters, gradients and Adam moments (two of
  // optimizer_state_size()), plus the gather / gradient-staging buffers.
  int64_t state_bytes() const;
  int max_len() const { return max_len_; }
  int local_batch() const { return local_batch_; }

  // The same initial values as Transformer<float>::init_weights(seed); each rank keeps its shard.
  void init_weights(uint64_t seed);
  // Whole tensors (checkpoints): set_tensor keeps this rank's shard of `full` (given on every
  // rank); get_tensor assembles the whole tensor on every rank (collective).
  void set_tensor(size_t index, const float* full) { scatter_tensor(params_.data(), index, full); }
  void get_tensor(size_t index, float* full) { gather_tensor(params_.data(), index, full); }
  // The same for any buffer laid out like the parameters (gradients, optimizer moments).
  void scatter_tensor(float* local, size_t index, const float* full) const;
  void gather_tensor(const float* local, size_t index, float* full);
  // The same for optimizer state (Adam moments) laid out as optimizer_layout() says (pieces over
  // D with ZeRO 1/2; like the parameters otherwise).
  void scatter_state_tensor(float* state, size_t index, const float* full) const;
  void gather_state_tensor(const float* state, size_t index, float* full);

  // The layout the optimizer updates: with ZeRO, this D rank's pieces.
  const OptimizerLayout& optimizer_layout() const { return zl_; }
  int64_t num_local_grads() const { return int64_t(grads_.size()); }
  // After the optimizer step (ZeRO 1/2): all-gather the updated pieces over D so every replica
  // has the whole local shard again. No-op without ZeRO.
  void gather_updated_params();
  void zero_grads() { grads_.zero(); }
  // One micro-batch of this rank's tokens: forward, vocabulary-parallel cross-entropy with
  // d(grad_scale * Σ loss), backward; parameter gradients accumulate (Z-reduced per layer).
  // Returns this rank's Σ loss over kept targets (sum over Z x D for the global figure).
  double forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T,
                          float grad_scale);
  double forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T);
  // Greedy decoding on the grid: forward over this rank's [B, T] tokens, then for each sequence
  // the argmax over the whole vocabulary of its last position's logits (each Y slice's winner
  // compared after an all-gather over Y; ties go to the lowest id, as in the serial decoder).
  // There is no KV cache on the grid: each call recomputes the whole prefix. Collective.
  std::vector<int32_t> greedy_next_tokens(const int32_t* inputs, int B, int T);
  // After the step's last micro-batch: data-parallel and replicated-tensor reductions.
  void reduce_gradients();
  // Σ g² over the whole model (each element counted once, on every rank).
  double grad_sum_squares();
  // AdamW ranges: the local buffer as (offset, numel, decays) runs, by parameter kind.
  void set_profile(StepProfile* p) { prof_ = p; }

  // Pipeline (Gp > 1; parallel/pipeline.hpp drives these). Every stage keeps every tensor (its
  // own layers are the ones it computes and reports; see docs/parallel.md). A chunk is the layers
  // [l0, l1) of one virtual stage, with the embedding first (embed) and the final norm, head and
  // loss last (head). forward_chunk reads its input from chunk_input(l0) (write the previous
  // stage's output there; the embedding computes it) and leaves its output at chunk_output(l1).
  void forward_chunk(int l0, int l1, bool embed, bool head, const int32_t* inputs, int B, int T);
  // Head chunk, after forward_chunk: the cross-entropy as forward_backward does it.
  double chunk_loss(const int32_t* targets, int B, int T, float grad_scale, bool with_grad) {
    return cross_entropy(targets, int64_t(B) * T, grad_scale, with_grad);
  }
  // dout: gradient of the chunk's output (ignored with head); afterwards input_grad() holds the
  // gradient of its input. Parameter gradients accumulate as in forward_backward.
  void backward_chunk(int l0, int l1, bool embed, bool head, const int32_t* inputs,
                      const float* dout, int B, int T);
  float* chunk_input(int l0);
  const float* chunk_output(int l1) const;
  const float* input_grad() const;
  // The activations a chunk's backward needs, copied out after its forward and back before its
  // backward, so several micro-batches can be in flight on one activation buffer.
  std::vector<float> stash(int l0, int l1, bool embed, bool head);
  void restore(int l0, int l1, bool embed, bool head, const std::vector<float>& saved);
  // The stage (0..Gp-1) whose chunk holds layer l.
  int layer_stage(int l) const;

 private:
  struct Layer {
    int ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, k_w = -1, v_w = -1, proj_w = -1,
        proj_b = -1, ln2_w = -1, ln2_b = -1, fc_w = -1, fc_b = -1, up_w = -1, fcproj_w = -1,
        fcproj_b = -1;
  };
  struct Acts;
  const float* w(int i) const;  // weight for compute: gathered block or local shard
  float* gw(int i);             // where its gradient block accumulates
  void gather_layer(int layer);          // all-gather Z shards of a layer (-1: embedding/head)
  void scatter_layer_grads(int layer);   // reduce-scatter the layer's gradient blocks over Z
  void zero_layer_grad_blocks(int layer);
  bool staged(const TensorShard& t) const;
  bool owns(const TensorShard& t) const;  // this pipeline stage computes (and reports) it
  std::vector<std::pair<float*, size_t>> chunk_regions(int l0, int l1, bool embed, bool head);
  void gather_shard(const float* shard, size_t index, float* full);
  std::vector<float> shard_of(size_t index, const float* full) const;  // gradient accumulates in a layer block buffer
  void reduce_scatter_d(size_t tensor, const float* shard, float* piece);
  void forward(const int32_t* inputs, int B, int T);
  void layer_forward(int l, const float* x, int B, int T);
  void attention_forward(int l, int B, int T);
  void norm_fwd(float* out, float* mean, float* rstd, const float* x, int wi, int bi, int64_t N);
  void normal_fwd(float* out, const float* in, int wi, int bi, int64_t k_in, int64_t n_out, int64_t N);
  void transposed_fwd(float* out, const float* resid, const float* in, int wi, int bi, int64_t k_in, int64_t N);
  void backward(const int32_t* inputs, int B, int T);
  double cross_entropy(const int32_t* targets, int64_t N, float grad_scale, bool with_grad);
  template <typename T>
  void sum_over(const comm::Communicator& group, T* data, int64_t n);
  template <typename F>
  void timed(Phase ph, F&& f) {
    ScopedPhase s(prof_, ph);
    f();
  }

  ModelConfig cfg_;
  ProcessGroups& g_;
  ParallelOptions opt_;
  OptimizerLayout zl_;
  std::vector<int64_t> piece_;  // ZeRO piece length of each tensor: ceil(shard_numel / Gd)
  Buffer<float> zero_tmp_;      // Gd pieces: reduce-scatter input / all-gather output
  int scratch_layer_ = -1;      // layer whose recomputable activations the scratch holds
  std::vector<float*> layer_begin_;  // start of each layer's activations; [n_layer]: globals
  ParamTable table_;
  ShardPlan plan_;
  int local_batch_, max_len_;
  bool gpt2_;
  int64_t Cx_, Ay_, QKVy_, Fy_, FWy_, Vy_, nhy_, nkvy_, hd_;
  Buffer<float> params_, grads_;
  Buffer<float> gathered_, gathered_top_, gblock_, gblock_top_, scatter_tmp_;
  Buffer<float> acts_, rope_cos_, rope_sin_;
  Buffer<double> stats_;  // [N, 2] row statistics for the all-reduces
  std::vector<Layer> layers_;
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, head_ = -1;
  std::unique_ptr<Acts> a_;
  StepProfile* prof_ = nullptr;
};

}  // namespace tetrad::parallel
