// The parallel linear layers and norms the model's parts compute with (a part of
// ParallelTransformer; the blocks, dense_block.hpp, and the vocabulary-parallel ends,
// vocab_parallel.hpp, call them). Each linear layer's forward collective is paired with its
// adjoint in the backward as linear_layers.hpp declares them (a site names the layer, its kind
// and its widths), so a call site passes only its site, operands and tensors:
//   normal      forward all-reduce over X (normal_fwd, gemm_allreduce); backward dIn over Y.
//   transposed  forward all-reduce over Y (+ bias and residual: transposed_fwd); backward over X.
// The norms are exact over a hidden size split across X: row statistics all-reduced over X.
// Weight gradients dW += dOutᵀ · in stay local; the gradient reducer takes them from there.
//
// It owns its scratch, each used within one call only: the row statistics of the norms, the
// partial sums of a transposed layer before its residual (and a norm's fp32 output before its
// bf16 cast on a backend without the fused form), and, with bf16 activations, the bf16 copies
// of the gradient entering a linear layer's backward (the loss may write the head's first:
// linear_bwd's dout16_ready). The last two are regions of the model's activation buffer (its
// "tmp", "dout16" and "dout16_t" tensors, activation_layout.hpp), counted by the memory formula.
// Not thread-safe.
#pragma once
#include <cstdint>
#include <utility>

#include "tetrad/backend/backend.hpp"
#include "tetrad/model/family.hpp"
#include "tetrad/parallel/gemm_layouts.hpp"
#include "tetrad/parallel/grad_reduction.hpp"
#include "tetrad/parallel/linear_layers.hpp"
#include "tetrad/parallel/step_context.hpp"
#include "tetrad/parallel/weight_gather.hpp"

namespace tetrad::parallel {

// A GEMM operand: the pointer and how it is stored.
struct Operand {
  const void* p = nullptr;
  backend::DType type = backend::DType::F32;
};
inline Operand f32(const float* p) { return {p, backend::DType::F32}; }
// An activation that feeds GEMMs: its bf16 form where the model stores one, else fp32.
inline Operand act(const float* f, const uint16_t* b) {
  return b ? Operand{b, backend::DType::BF16} : f32(f);
}

class ParallelOps {
 public:
  // The scratch of the activation buffer this part owns (activation_layout.hpp's "tmp",
  // "dout16", "dout16_t"; the last two null without bf16 activations).
  struct Scratch {
    float* tmp = nullptr;
    uint16_t *dout16 = nullptr, *dout16_t = nullptr;
    float* dfull = nullptr;  // "dfull": with sequence sharding only
  };
  // layouts: the model's GEMM layout plan (read at every GEMM: set_gemm_layout_plan may change
  // it); tokens: the most tokens of one micro-batch on this rank.
  ParallelOps(const StepContext& ctx, const WeightGatherer& weights, GradReducer& grads,
              const GemmLayoutPlan& layouts, const OverlapOptions& overlap,
              backend::Precision precision, bool bf16_activations, NormKind norm, int64_t n_embd,
              float norm_eps, Scratch scratch, int64_t tokens, bool sequence_shard = false);
  ParallelOps(const ParallelOps&) = delete;
  ParallelOps& operator=(const ParallelOps&) = delete;

  // Tensor i for compute (its gathered block or the local shard), its GEMM operand (the bf16
  // copy or the fp32 weight), and where its gradient accumulates (null for i < 0).
  const float* w(int i) const { return weights_.weight(i); }
  Operand weight_operand(int i) const;
  float* gw(int i) { return grads_.accumulator(i); }

  // The model's GEMM precision, and whether it stores bf16 activations.
  backend::Precision precision() const { return precision_; }
  bool bf16_activations() const { return bf16_acts_; }

  // One GEMM on the model's backend in its precision (pending collectives progress meanwhile).
  void gemm(const char* what, bool ta, bool tb, int64_t M, int64_t N, int64_t K, Operand A,
            int64_t lda, Operand B, int64_t ldb, float beta, float* C, int64_t ldc,
            backend::GemmProduct product = backend::GemmProduct::Default) const;
  // The same in fp32 whatever the model's precision (fp32-stored operands: the router's).
  void gemm_f32(const char* what, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                int64_t ldc) const;

  // parallel_linear.cpp. `in`: the layer's input activation [N, k_in], fp32 or bf16-stored.
  // out[N, n_out] = in · Wᵀ all-reduced over the site's forward group (no bias).
  void gemm_allreduce(GemmSite site, float* out, Operand in, int wi, int64_t N);
  // Normal layer: gemm_allreduce + bias bi.
  void normal_fwd(GemmSite site, float* out, Operand in, int wi, int bi, int64_t N);
  // Normal layer of which this rank reads only rows [r0, r0 + rows) of the output (the X ranks'
  // shares of attention's sequences: r0 = rows · the group rank, rows · the group size = N):
  // the partial GEMM of all N rows into `partial` [N, n_out], then a reduce-scatter of the rows
  // over the forward group into those rows of out, + bias on them; out's other rows are left
  // unwritten. On 2 ranks half the bytes of the all-reduce and the same bits (each element is
  // a + b either way). Elsewhere (other group sizes: a sum of more values, in another order
  // than the all-reduce's; chunked forwards) it is normal_fwd, every row.
  void normal_fwd_rows(GemmSite site, float* out, float* partial, Operand in, int wi, int bi,
                       int64_t N, int64_t r0, int64_t rows);
  // Transposed layer + residual: out = resid + all-reduce_Y(in · Wᵀ) + bias bi. With sequence
  // sharding out and resid are this rank's rows of the stream and the sum over Y is a
  // reduce-scatter of the rows.
  void transposed_fwd(GemmSite site, float* out, const float* resid, Operand in, int wi, int bi,
                      int64_t N);
  // din = all-reduce over the adjoint's group of dout · W; dW += doutᵀ · in; bias. dout16_ready:
  // dout's bf16 copies the site's layout reads are already in place (dy16_copies; the loss wrote
  // them), so no cast runs and dout is read only for the bias.
  // Returns where the summed input gradient is: din, or with sequence sharding and a normal
  // layer (whose dIn is summed over Y) this rank's rows of it, reduce-scattered over Y into the
  // "dfull" scratch (din then holds only the partial sums).
  const float* linear_bwd(GemmSite site, float* din, const float* dout, Operand in, int wi, int bi,
                          int64_t N, bool dout16_ready = false);
  // Sequence sharding: the stream's gradient d (this rank's rows) all-gathered over Y into the
  // "dfull" scratch, all N rows (the input of a transposed layer's backward and of the
  // embedding's); d itself without sharding.
  const float* stream_grad(const float* d, int64_t N);
  // The rows of the residual stream this rank holds of N tokens (N / Gy with sequence sharding),
  // and the first of them.
  int64_t stream_rows(int64_t N) const { return N / shard_; }
  int64_t stream_row0(int64_t N) const { return stream_rows(N) * shard_index_; }
  bool sequence_sharded() const { return shard_ > 1; }
  // With bf16 activations, the bf16 copies of a site's dY its backward GEMMs read: as stored
  // and / or transposed; null where its layout reads none.
  std::pair<uint16_t*, uint16_t*> dy16_copies(GemmSite site) const;

  // parallel_norm.cpp: LayerNorm / RMSNorm of x [N, Cx] with weight wi and bias bi. out16 (not
  // null): the normalised output in bf16 only (out unused). With sequence sharding x, mean and
  // rstd are this rank's rows of the stream (stream_rows(N)) and the output, all N rows, is
  // all-gathered over Y; in the backward dx, dout, x and the statistics are the rank's rows and
  // the weight gradients are summed over Y.
  void norm_fwd(float* out, float* mean, float* rstd, const float* x, int wi, int bi, int64_t N,
                uint16_t* out16 = nullptr);
  // dx += the norm's backward of dout; the weight and bias gradients accumulate.
  void norm_bwd(float* dx, const float* dout, const float* x, const float* mean,
                const float* rstd, int wi, int bi, int64_t N);

 private:
  backend::GemmProduct product_of(GemmForm f) const {
    return !layouts_.explicit_forms() ? backend::GemmProduct::Default
           : f.transposed             ? backend::GemmProduct::Transposed
                                      : backend::GemmProduct::Plain;
  }
  void bias_bwd(float* db, const float* dout, int64_t width, int64_t N);
  void gemm_in(backend::Precision precision, const char* what, bool ta, bool tb, int64_t M,
               int64_t N, int64_t K, Operand A, int64_t lda, Operand B, int64_t ldb, float beta,
               float* C, int64_t ldc, backend::GemmProduct product) const;

  const StepContext& ctx_;
  const WeightGatherer& weights_;
  GradReducer& grads_;
  const GemmLayoutPlan& layouts_;
  int64_t forward_chunks_;
  bool backward_allreduce_;
  backend::Precision precision_;
  bool bf16_acts_;
  NormKind norm_;
  int64_t n_embd_;
  float eps_;
  Scratch scratch_;
  int shard_ = 1, shard_index_ = 0;  // sequence sharding: Gy and y (1 and 0 without)
  backend::DeviceArray<double> stats_;  // [N, 2] row statistics for the norms' all-reduces
  backend::DeviceArray<float> norm_grads_;  // sequence sharding: [2, Cx] partial weight grads
};

}  // namespace tetrad::parallel
