// A transformer block of the parallel model as a forward/backward pair (llm.c's pairs): the part
// ParallelTransformer runs once per layer between the vocabulary-parallel ends. A family's block
// is one implementation of this interface (dense_block.hpp: GPT-2's and Llama's); a block of
// another shape (q/k norms and a qkv bias, a mixture of experts) is another implementation that
// make_block chooses by the family description, not a branch inside an existing one.
//
// The model gathers the layer's weights before a call and zeroes / reduces its gradient blocks
// around the backward; the block reads its input and writes its output in the activation views
// of its layer (activation_layout.hpp). Collective over the grid; not thread-safe.
#pragma once
#include <cstdint>
#include <memory>

#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/activation_layout.hpp"
#include "tetrad/parallel/moe_routing.hpp"
#include "tetrad/parallel/options.hpp"
#include "tetrad/parallel/parallel_ops.hpp"
#include "tetrad/parallel/step_context.hpp"

namespace tetrad::parallel {

// Decoding with a key/value cache: where layer l's keys and values are cached (each
// [B][max_len][this rank's kv heads x head dim]) and the position of the first new token.
struct CachedKv {
  float* k = nullptr;
  float* v = nullptr;
  int pos0 = 0;
};

class TransformerBlock {
 public:
  virtual ~TransformerBlock() = default;
  // Layer l from its input x [B*T, Cx]: every activation of its layer views, its output at
  // resid_out. kv (decoding): the T new tokens of each sequence are at positions kv->pos0..,
  // their keys and values are appended to the cache first and attention reads the cache.
  virtual void forward(int l, const float* x, int B, int T, const CachedKv* kv = nullptr) = 0;
  // Its backward from dresid (the gradient of its output), which becomes the gradient of its
  // input x_in; its parameter gradients accumulate. Recomputes first what the forward did not
  // keep (Recompute).
  virtual void backward(int l, const float* x_in, int B, int T) = 0;
  // The layer whose recomputable activations the shared recompute scratch holds (-1: none), and
  // the statement that the scratch no longer holds it (a pipeline restored another
  // micro-batch's activations around it).
  virtual int scratch_layer() const = 0;
  virtual void scratch_lost() = 0;
  // Whether the block runs with its input, output and residual sums as this rank's rows of the
  // stream (ParallelOptions::sequence_shard; the model refuses the setting for a block without).
  virtual bool sequence_shardable() const { return false; }
  // The loss gradient's scale of the coming backward passes (forward_backward's grad_scale): a
  // block with losses of its own (a mixture of experts' router losses) weights them by it.
  virtual void set_grad_scale(float) {}
  // The router's losses and the experts' load since the last call (a mixture of experts; empty
  // for a dense block).
  virtual MoeStats take_moe_stats() { return {}; }
  // Bytes of the work buffers the block owns beside the model's activation buffer: the context
  // axis's exchange (ContextAttention::bytes(), 0 without one).
  virtual int64_t scratch_bytes() const { return 0; }
  // Bytes of the expert-parallel exchange's scratch as allocated now (a mixture of experts with
  // GridShape::e() > 1: ExpertParallel::bytes(), grown to the largest exchange so far; 0 else).
  virtual int64_t expert_exchange_bytes() const { return 0; }
};

// What a block is built from: the model, the parts it computes with (the step context, the
// parallel linear layers and norms, which read the gathered weights and the GEMM layout plan and
// accumulate into the gradient reducer's blocks) and its activation views.
struct BlockParts {
  const ModelConfig& config;
  const ParamTable& table;
  const StepContext& ctx;
  ParallelOps& ops;
  const ParallelActivations& acts;
  Recompute recompute;
  backend::Precision attention_precision;
  int max_len;  // the longest sequence (the KV cache's stride per sequence)
  int local_batch = 1;  // sequences of a micro-batch on this rank (the context axis's scratch)
  ContextComm cp_comm = ContextComm::AllGather;  // the context axis's exchange (Gc > 1)
  bool cp_skip_masked_pairs = true;  // ParallelOptions::cp_skip_masked_pairs
  // bf16 activations with ParallelOptions::bf16_weight_grad_nn on a backend with the
  // cast-transpose: weight gradients as NN products on bf16 copies of dY made once per GEMM pair.
  bool bf16_weight_grad_nn = false;
};

// The block of the model's family (its FamilyDesc): binds the table's per-layer tensors by role,
// failing naming a tensor no block of it binds.
std::unique_ptr<TransformerBlock> make_block(const BlockParts& parts);

}  // namespace tetrad::parallel
