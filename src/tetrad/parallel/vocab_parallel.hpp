// The vocabulary-parallel ends of the model (a part of ParallelTransformer), Megatron's scheme
// over Y: the token embedding, the output head and the logits are split by vocabulary rows over Y
// (Vy = V/Gy rows per rank, [Vy, Cx] blocks). The lookup sums every Y rank's slice; the head is a
// normal linear layer (ParallelOps); the cross-entropy combines per-slice maxima, Σ exp and the
// target logit with all-reduces over Y; greedy decoding compares each slice's best logit after an
// all-gather over Y; whole-vocabulary logits are the slices all-gathered over Y.
//
// It reads and writes the model's activation views emb (the embedding's output), dresid (its
// gradient, in the backward), lnf / lnf16 (the head's input), logits and losses, and owns its
// own scratch: token ids and targets on the device, the loss's row maxima and sums, decoding's
// per-row winners and the host copies of whole-vocabulary logits. It also owns where the loss
// left d(loss)/d logits: cross_entropy writes it, head_backward consumes it. Collective over Y
// (and X for the head); not thread-safe.
#pragma once
#include <cstdint>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/parallel/activation_layout.hpp"
#include "tetrad/parallel/grad_reduction.hpp"
#include "tetrad/parallel/parallel_ops.hpp"
#include "tetrad/parallel/step_context.hpp"

namespace tetrad::parallel {

class VocabParallel {
 public:
  // The tensors of the ends (parameter table indices; position -1 without a position table).
  struct Tensors {
    int token_embedding = -1, position_embedding = -1, head = -1;
  };
  // vocab: the whole vocabulary V; tokens: the most tokens of one micro-batch on this rank,
  // sequences its most sequences. bf16_loss_grad: the loss writes d(loss)/d logits straight into
  // the head's bf16 dY copies (bf16 activations, no pipeline, a backend with ce_grad_bf16).
  VocabParallel(const StepContext& ctx, ParallelOps& ops, GradReducer& grads,
                const ParallelActivations& acts, Tensors tensors, int64_t vocab, int64_t tokens,
                int sequences, bool bf16_loss_grad);
  VocabParallel(const VocabParallel&) = delete;
  VocabParallel& operator=(const VocabParallel&) = delete;

  // The lookup of N tokens (sequences of T) into emb [N, Cx]; pos0: the position of each
  // sequence's first token (decoding; 0 in training). Refuses ids outside the vocabulary. With
  // sequence sharding emb gets this rank's rows: the slices are reduce-scattered over Y.
  void embedding_forward(const int32_t* inputs, int64_t N, int T, int pos0 = 0);
  // From demb (the gradient of emb, all N rows): the token table's rows of this rank's slice (not
  // with the sparse embedding gradient: the reducer's rows) and the position table accumulate.
  void embedding_backward(const float* demb, const int32_t* inputs, int64_t N, int T);
  // The sparse embedding gradient's token ids, handed to the reducer at the backward's start.
  void start_embedding_ids(const int32_t* inputs, int64_t N);

  // The head: logits [N, Vy] from the final norm's output (lnf / lnf16). whole: every row on
  // every X rank (whole_vocabulary, greedy_last read them); otherwise, where the loss reads only
  // this X rank's share of the rows (loss_row_share), only those rows are written.
  void head_forward(int64_t N, bool whole = true);
  // Its backward from the loss's gradient: din [N, Cx] (all-reduced over Y), the head's
  // gradient block accumulates. Consumes what cross_entropy left. Returns where the summed
  // input gradient is (ParallelOps::linear_bwd: this rank's rows with sequence sharding).
  const float* head_backward(float* din, int64_t N);
  // The loss of N rows of logits against targets (ids >= V refused; < 0 masked): Σ loss over
  // kept targets on this rank. with_grad: the logits become d(grad_scale · Σ loss)/d logits (or
  // its bf16 copies, bf16_loss_grad), for head_backward.
  double cross_entropy(const int32_t* targets, int64_t N, float grad_scale, bool with_grad);

  // Greedy decoding: the argmax over the whole vocabulary of each of B sequences' last position
  // (row T-1 of each) of the logits; ties go to the lowest id.
  std::vector<int32_t> greedy_last(int B, int T);
  // The logits of rows [0, rows) over the whole vocabulary, [rows, V] in host memory, the same
  // on every rank of the Y group; valid until the next call.
  const float* whole_vocabulary(int64_t rows);
  // Decoding: the head on each of B sequences' last new row (row Tq-1 of the final norm's output
  // of each) only, over the whole vocabulary ([B, V], as whole_vocabulary).
  const float* last_row_logits(int B, int Tq);

 private:
  // The rows [r0, r0 + n) of N the loss reads and writes on this rank: its 1/Gx share of them
  // where Gx > 1 divides N, else all. share: the loss reads no other row of the logits (not
  // where the head's backward reads the transposed bf16 dlogits, which the loss writes whole).
  struct RowShare {
    int64_t r0 = 0, n = 0;
    bool split = false, share = false;
  };
  RowShare loss_rows(int64_t N) const;
  // `host` (n ids) as a device pointer: itself on a host-visible backend, else copied to slot.
  const int32_t* device_ids(const int32_t* host, int64_t n, int slot);
  template <class F>
  void for_each_document(int64_t N, int T, F&& f) const;
  void add_positions(float* x, int64_t N, int T, int pos0);
  double read_scalar(const double* dev);

  const StepContext& ctx_;
  ParallelOps& ops_;
  GradReducer& grads_;
  const ParallelActivations& a_;
  Tensors t_;
  int64_t vocab_;
  bool bf16_loss_grad_;
  // Where the last cross_entropy with a gradient left it: in the head's bf16 dY copies
  // (ParallelOps::dy16_copies) rather than in the logits. Read and cleared by head_backward.
  bool dlogits16_ = false;
  // The last head_forward wrote only this X rank's rows of the logits (whole = false).
  bool logit_rows_only_ = false;
  backend::DeviceBuffer ids_dev_[2], row_max_, sums_, scalar_, argmax_idx_, argmax_val_;
  std::vector<float> host_logits_, gathered_logits_;
};

}  // namespace tetrad::parallel
