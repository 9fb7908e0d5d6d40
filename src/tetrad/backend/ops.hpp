// The op table: every numeric operation the model, the loss and the optimizer run, as one table
// of function pointers per backend (ggml's backend interface is the model). model/, parallel/ and
// train/ hold wiring, sharding, schedules and communication; their arithmetic is a call through
// this table, so a CUDA or HIP backend fills the same table and the same model runs on it.
//
// Conventions (as llm.c's kernels): row-major; shapes are written next to pointers; `N` = tokens
// of the call (rows). Every pointer is a device pointer of the backend the table belongs to
// (host memory for the CPU backend), except where an argument says "host". Parameter gradients
// (dw, db, dtable, ...) ACCUMULATE (+=); activation gradients are OVERWRITTEN unless the comment
// says +=. Ops run in order on the Queue they are given and return before the work is done on an
// asynchronous backend: results that the host reads (a sum of squares, a loss total) land in
// device memory and are copied back through the queue.
//
// Split statistics. With the hidden size split over X (4d-parallelism.md), a norm's statistics
// are partial row sums [N] in double that the caller all-reduces over X between the ops:
// norm_row_stats (partial) -> all-reduce -> norm_finish_stats -> norm_apply; backward:
// norm_backward_partials -> all-reduce -> norm_backward_apply + norm_param_grads. With one rank
// (X = 1) the same calls give the whole-row norm. The vocabulary-parallel cross-entropy is split
// the same way: ce_row_max -> all-reduce max over Y -> ce_sum_exp_target -> all-reduce sum over Y
// -> ce_loss, ce_grad.
//
// Determinism: every op of a backend must give bit-identical results for identical inputs and
// shapes (the recompute and overlap tests compare bitwise); the CPU backend also for any OpenMP
// thread count.
//
// Optional ops may be null (see Capabilities); callers check `has_*` / the pointer and compose the
// required ops instead. Required ops are never null (backend::check_op_table verifies this).
//
// Not here: collectives (comm/), sampling strategies over host logits (model/sampling), the
// double-precision reference (tests/). GEMM output and accumulation are always fp32.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tetrad/backend/precision.hpp"

namespace tetrad::backend {

class Queue;

// Element types of device memory.
enum class DType : uint8_t { F32, BF16, F64, I32 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);

// GEMM operand precision: Precision (backend/precision.hpp), chosen per call.

// C[M,N] = alpha * op(A) · op(B) + beta * C; op(X) = Xᵀ when trans_x. A is stored [M,K] ([K,M]
// transposed) with leading dimension lda, B [K,N] ([N,K]) with ldb; C is fp32 [M,N] with ldc.
// a_type / b_type: how A and B are stored (F32, or BF16 storage where Capabilities::
// gemm_bf16_storage); precision: the arithmetic (BF16 rounds fp32-stored operands to bf16).
// beta == 0 overwrites C (NaN in C does not propagate). K == 0: no products, C = beta * C.
// BF16 rounds each fp32-stored operand to bf16 (nearest even) and multiplies the rounded values
// exactly, summing in fp32: every backend's bf16 product is that one (no TF32, no other rounding).
// How a bf16 GEMM computes its product (backends with Capabilities::gemm_product_forms; others
// ignore it): Default follows the kernel's own policy (the CPU's TETRAD_GEMM_LAYOUT, "rule" unless
// set); Plain computes C as stored; Transposed computes Cᵀ = op(B)ᵀ·op(A)ᵀ into a scratch added
// into C transposed (docs/precision.md, "Layouts"). The model's per-site plan sets it
// (parallel/gemm_layouts.hpp).
enum class GemmProduct : uint8_t { Default, Plain, Transposed };

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const void* A = nullptr;  // (M, K) or (K, M)
  int64_t lda = 0;
  const void* B = nullptr;  // (K, N) or (N, K)
  int64_t ldb = 0;
  float beta = 0.0f;
  float* C = nullptr;       // (M, N)
  int64_t ldc = 0;
  Precision precision = Precision::FP32;
  DType a_type = DType::F32, b_type = DType::F32;
  GemmProduct product = GemmProduct::Default;
};

// Many GEMMs in one call (the experts of a mixture of experts, each with its own row count):
// for every group g, C_g = alpha * op(A_g) · op(B_g) + beta * C_g under GemmArgs' rules (beta 0
// overwrites, K_g = 0 gives C_g = beta * C_g, M_g = 0 or N_g = 0 does nothing), with the shapes
// M[g], N[g], K[g] and the operands A[g], B[g], C[g] from HOST arrays (of device pointers), and
// the transposes, leading dimensions, alpha, beta, precision and storage types of the call. The
// groups' C blocks must not overlap. Each group's result is bit for bit what one gemm call with
// its shape gives (so a group of an expert computes what a dense layer of its shape would).
struct GroupedGemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t groups = 0;
  const int64_t* M = nullptr;  // host (groups)
  const int64_t* N = nullptr;  // host (groups)
  const int64_t* K = nullptr;  // host (groups)
  float alpha = 1.0f, beta = 0.0f;
  const void* const* A = nullptr;  // host (groups) of device pointers
  int64_t lda = 0;
  const void* const* B = nullptr;  // host (groups) of device pointers
  int64_t ldb = 0;
  float* const* C = nullptr;       // host (groups) of device pointers
  int64_t ldc = 0;
  Precision precision = Precision::FP32;
  DType a_type = DType::F32, b_type = DType::F32;
  GemmProduct product = GemmProduct::Default;
};

// Causal scaled-dot-product attention with grouped-query heads, per sequence. Positions: key j of
// the block sits at k_offset + j, query i at q_offset + i (q_offset = -1: k_offset + Tk - Tq, the
// queries are the block's last Tq positions: the training and KV-cache case); query i attends
// the block's keys at positions <= its own. Any pair of blocks works, so a sequence's keys may
// be split into blocks attended one by one (context parallelism): a block entirely before the
// queries is fully visible, one that overlaps them is partially visible, one after them is
// invisible. The kernels take the relative offset q_offset - k_offset (any sign; needs
// Capabilities::attention_any_q_offset unless it is Tk - Tq). A query row that sees no key of the
// block gets out = 0 and lse = -inf (what attention_merge treats as "nothing seen").
// Query head h uses kv head h / (n_head / n_kv_head). Rows: element (b, t, head h, d) at
// b*batch_stride + t*stride + h*hd + d.
// lse: [B, n_head, Tq] contiguous fp32 log-sum-exp of each query row's scaled scores (forward
// output, backward input; may be null in the forward). dtype: of q, k, v, out (F32; BF16 where
// Capabilities::attention_bf16). precision: the arithmetic of the products QKᵀ and PV (and the
// backward's): FP32, or BF16 where Capabilities::attention_bf16_products (operands rounded to
// bf16, P and dS included, fp32 accumulation; softmax statistics and lse in fp32). A backward
// runs in the precision of the forward whose lse it reads.
//
// Document mask (data.document_mask; Capabilities::attention_document_mask): doc_start null, or
// for query i of sequence b, doc_start[b * doc_batch_stride + i] is the position (counted as
// q_offset and k_offset are) of the first token of the document the query belongs to; the query
// then attends only keys at positions doc_start..its own (block-diagonal causal: a packed
// sequence's documents do not see each other). Per query row, so a query block at any offset (a context-parallel chunk)
// carries its own rows of it. Device memory of the backend (int32). A query row that sees no key
// gets out = 0 and lse = -inf.
//
// Partial results (flash attention's log-sum-exp): for key blocks K_1..K_n of the same queries,
// attention_forward on each block gives (out_b, lse_b); attention_merge folds them into the
// attention over all the keys, in any order. The backward given the FINAL out and lse (of all
// the keys) and one block's k, v computes exactly that block's share: dq its contribution (sum
// it over the blocks), dk and dv the block's gradients from these queries (sum them over query
// blocks). attention_backward with k_offset is that block backward.
struct AttentionArgs {
  int B = 0, Tq = 0, Tk = 0, n_head = 0, n_kv_head = 0, head_dim = 0;
  int64_t q_offset = -1;  // position of query 0; -1: k_offset + Tk - Tq
  int64_t k_offset = 0;   // position of key 0
  int64_t q_stride = 0, kv_stride = 0, out_stride = 0;
  int64_t q_batch_stride = 0, kv_batch_stride = 0, out_batch_stride = 0;
  DType dtype = DType::F32;
  Precision precision = Precision::FP32;
  const int32_t* doc_start = nullptr;  // document mask (see above); null: none
  int64_t doc_batch_stride = 0;        // elements between sequences of doc_start
  // The sequence count the kernels choose their split of the work for (0: B). A caller that runs
  // a part of a batch's sequences (the X axis's share, dense_block.cpp) passes the whole batch's
  // count, so each sequence's result has the bits it has in the call on the whole batch.
  int chunk_B = 0;
  // Backward with dtype F32 and precision BF16 (Capabilities::attention_bf16_saved): q, k, v and
  // out are bf16 copies of the forward's tensors (same rows and strides; dout, dq, dk, dv fp32),
  // the same bits as the backward on their fp32 widenings (a model's bf16-stored block tensors
  // read without widening them first).
  bool saved_bf16 = false;
  int64_t resolved_q_offset() const {
    return q_offset < 0 ? k_offset + int64_t(Tk) - Tq : q_offset;
  }
  // Query 0's position counted from key 0 (what the kernels take): any sign.
  int64_t relative_q_offset() const { return resolved_q_offset() - k_offset; }
};

// Rotary embedding (Hugging Face's rotate_half: element i of a head pairs with i + hd/2), in
// place on the first n_heads heads of each row of x (row stride `stride`); row r is token
// r % T_seq of its sequence, at position pos0 + r % T_seq. cos/sin: [max_pos, hd/2] device tables
// the model builds once (its scaling rules live with the table, not here). doc_start (per-document
// positions, data.document_positions; null: none): row r's position is then
// pos0 + r % T_seq - doc_start[r] (doc_start[r] <= pos0 + r % T_seq: where its document begins,
// device memory, int32), so positions restart at 0 at each document's first token.
struct RopeArgs {
  float* x = nullptr;  // (N, stride), rotated in place
  int64_t N = 0, T_seq = 0, pos0 = 0, n_heads = 0, head_dim = 0, stride = 0;
  const float* cos = nullptr;  // (max_pos, hd/2)
  const float* sin = nullptr;  // (max_pos, hd/2)
  const int32_t* doc_start = nullptr;  // (N) per-document positions, or null
};

// Per-head RMSNorm (Qwen3's q_norm / k_norm): each of the first n_heads heads of every row (row
// stride `stride`) is normalised over its head_dim elements and scaled by w, one weight vector
// every head shares: y = x * rstd * w with rstd = 1 / sqrt(Σ x² / head_dim + eps) (the sum in
// double). Heads never mix, so a rank holding some of the heads needs no communication.
//   forward:  x (the heads) normalised in place; rstd (N, n_heads) written; saved (not null):
//             (N, n_heads * head_dim) compact, the input before normalisation (the backward's x).
//   backward: x holds dy and becomes dx in place (OVERWRITTEN): dx = (dy w - x̂ Σ(dy w x̂) /
//             head_dim) rstd with x̂ = saved * rstd; dw (head_dim) += Σ over rows and heads of
//             dy x̂ (ACCUMULATES); saved and rstd as the forward wrote them.
struct HeadNormArgs {
  float* x = nullptr;  // (N, stride)
  int64_t N = 0, n_heads = 0, head_dim = 0, stride = 0;
  const float* w = nullptr;  // (head_dim)
  float* rstd = nullptr;     // (N, n_heads)
  float* saved = nullptr;    // (N, n_heads * head_dim)
  float* dw = nullptr;       // (head_dim), backward only
  float eps = 1e-6f;
};

// AdamW (decoupled weight decay) on the interval of n elements the pointers start at:
// g' = grad_scale * g; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'²;
// p -= lr * (m / (1-b1^step) / (sqrt(v / (1-b2^step)) + eps) + weight_decay * p).
struct AdamWArgs {
  float* p = nullptr;        // (n)
  const float* g = nullptr;  // (n)
  float* m = nullptr;        // (n)
  float* v = nullptr;        // (n)
  int64_t n = 0;
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0, grad_scale = 1;
  int64_t step = 1;  // 1-based
  // Optional (bf16 mixed precision): also write the updated p rounded to bf16 here (n), the
  // weight copy the next step's GEMMs read, in the same pass. Backends without it refuse it
  // (Capabilities::adamw_bf16_copy).
  uint16_t* p16 = nullptr;
};

// Which statistic norm_row_stats sums over each row's (local slice of) features.
enum class RowStat : uint8_t {
  Sum,             // Σ x                (LayerNorm, first pass)
  CenteredSquares, // Σ (x - mean)²      (LayerNorm, second pass; mean from norm_finish_stats)
  Squares,         // Σ x²               (RMSNorm)
};
// What norm_finish_stats turns a full-row sum into.
enum class StatFinish : uint8_t {
  Mean,  // out = sum / C
  Rstd,  // out = 1 / sqrt(sum / C + eps)
};

struct OpTable {
  // ---- matrix multiply ------------------------------------------------------------------------
  void (*gemm)(Queue& q, const GemmArgs& a) = nullptr;

  // Each group's GEMM of GroupedGemmArgs (a loop of gemm calls on one queue, or the backend's
  // grouped kernel when it gives the same values).
  void (*grouped_gemm)(Queue& q, const GroupedGemmArgs& a) = nullptr;

  // ---- elementwise and bias ------------------------------------------------------------------
  // out[N, n] += b[n]
  void (*bias_add)(Queue& q, float* out, const float* b, int64_t N, int64_t n) = nullptr;
  // out[N, C] = resid[N, C] + y[N, C] (+ b[C] when b is not null)
  void (*residual_add)(Queue& q, float* out, const float* resid, const float* y, const float* b,
                       int64_t N, int64_t C) = nullptr;
  // x[n] += y[n]
  void (*add)(Queue& q, float* x, const float* y, int64_t n) = nullptr;
  // db[n] += Σ_t dout[t, n]  (dout: (N, n))
  void (*bias_grad)(Queue& q, float* db, const float* dout, int64_t N, int64_t n) = nullptr;

  // ---- norms with split statistics (see the file comment) ------------------------------------
  // stats[t * stride] = Σ_c stat(x[t, c]) over the C local features, in double. mean (N) only for
  // CenteredSquares.
  void (*norm_row_stats)(Queue& q, RowStat stat, double* stats, int64_t stride, const float* x,
                         const float* mean, int64_t N, int64_t C) = nullptr;
  // out[t] = finish(stats[t]) with the FULL row width C_full (fp32 out).
  void (*norm_finish_stats)(Queue& q, StatFinish f, float* out, const double* stats, int64_t N,
                            int64_t C_full, float eps) = nullptr;
  // out[t, c] = (x[t, c] - mean[t]) * rstd[t] * w[c] (+ b[c]); mean null: RMSNorm (no centring),
  // b null: no bias. x, out: (N, C); w, b: (C).
  void (*norm_apply)(Queue& q, float* out, const float* x, const float* mean, const float* rstd,
                     const float* w, const float* b, int64_t N, int64_t C) = nullptr;
  // partials[2t] = Σ_c dout·w, partials[2t+1] = Σ_c dout·w·n̂ (n̂ = (x - mean) * rstd), over the
  // local features, in double: to be all-reduced before norm_backward_apply.
  void (*norm_backward_partials)(Queue& q, double* partials, const float* dout, const float* x,
                                 const float* mean, const float* rstd, const float* w, int64_t N,
                                 int64_t C) = nullptr;
  // dx[t, c] += (dout·w - Σdn/C_full - n̂ · Σdn·n̂/C_full) * rstd; mean null: RMSNorm (the Σdn
  // term is dropped).
  void (*norm_backward_apply)(Queue& q, float* dx, const float* dout, const float* x,
                              const float* mean, const float* rstd, const float* w,
                              const double* partials, int64_t N, int64_t C,
                              int64_t C_full) = nullptr;
  // dw[c] += Σ_t dout·n̂; db[c] += Σ_t dout (db may be null).
  void (*norm_param_grads)(Queue& q, float* dw, float* db, const float* dout, const float* x,
                           const float* mean, const float* rstd, int64_t N, int64_t C) = nullptr;

  // ---- attention ------------------------------------------------------------------------------
  // out (and lse when not null) from q, k, v; out must not overlap q, k, v.
  void (*attention_forward)(Queue& q, const AttentionArgs& d, void* out, float* lse,
                            const void* qp, const void* kp, const void* vp) = nullptr;
  // dq, dk, dv OVERWRITTEN (strides of q / k / v; may point into one fused buffer).
  void (*attention_backward)(Queue& q, const AttentionArgs& d, void* dq, void* dk, void* dv,
                             const void* dout, const void* qp, const void* kp, const void* vp,
                             const void* out, const float* lse) = nullptr;
  // Folds a second partial result of the same queries over other keys into (out, lse), in
  // place: with m = max(lse, lse_b), s = e^(lse - m) + e^(lse_b - m): out = (e^(lse - m) out +
  // e^(lse_b - m) out_b) / s, lse = m + log s. Rows where lse_b = -inf keep out and lse bit for
  // bit; rows where only lse is -inf take out_b and lse_b as they are. Uses d's B, Tq, n_head,
  // head_dim, out_stride and out_batch_stride (dtype F32); out_b has out's layout, lse_b lse's
  // ([B, n_head, Tq]). Deterministic; merging blocks in another order differs by fp32 rounding.
  void (*attention_merge)(Queue& q, const AttentionArgs& d, void* out, float* lse,
                          const void* out_b, const float* lse_b) = nullptr;
  void (*rope_forward)(Queue& q, const RopeArgs& r) = nullptr;
  // The adjoint (rotation by -angle), in place on the gradient.
  void (*rope_backward)(Queue& q, const RopeArgs& r) = nullptr;
  // Per-head RMSNorm (HeadNormArgs), in place.
  void (*head_norm_forward)(Queue& q, const HeadNormArgs& a) = nullptr;
  void (*head_norm_backward)(Queue& q, const HeadNormArgs& a) = nullptr;

  // ---- activations ----------------------------------------------------------------------------
  // GELU, tanh approximation (GPT-2's gelu_new), n elements.
  void (*gelu_forward)(Queue& q, float* out, const float* x, int64_t n) = nullptr;
  void (*gelu_backward)(Queue& q, float* dx, const float* dout, const float* x, int64_t n) = nullptr;
  // gu[N, 2F]: gate (first F) and up (last F) of each row; out[N, F] = silu(gate) * up.
  void (*swiglu_forward)(Queue& q, float* out, const float* gu, int64_t N, int64_t F) = nullptr;
  void (*swiglu_backward)(Queue& q, float* dgu, const float* dout, const float* gu, int64_t N,
                          int64_t F) = nullptr;

  // ---- vocabulary-parallel embedding ------------------------------------------------------------
  // out[t, :] = table[tokens[t] - v0, :] when v0 <= tokens[t] < v0 + Vs, else zeros (the rows of
  // the other vocabulary slices come from the all-reduce over Y). table: (Vs, C); tokens: (N)
  // device int32, already validated against the full vocabulary by the caller.
  void (*embedding_gather)(Queue& q, float* out, const int32_t* tokens, const float* table,
                           int64_t v0, int64_t Vs, int64_t N, int64_t C) = nullptr;
  // out[t, :] += pos[t % T_seq, :]  (pos: (max_pos, C))
  void (*position_add)(Queue& q, float* out, const float* pos, int64_t N, int64_t T_seq,
                       int64_t C) = nullptr;
  // The adjoint of embedding_gather restricted to a shard: with e = (tokens[t] - v0) * C + c the
  // element of the flattened (Vs, C) block, dshard[e - s0] += dout[t, c] for s0 <= e < s1 and
  // tokens in the slice (dense: s0 = 0, s1 = Vs * C). Accumulates in token order per element.
  void (*embedding_scatter_add)(Queue& q, float* dshard, int64_t s0, int64_t s1,
                                const float* dout, const int32_t* tokens, int64_t v0, int64_t Vs,
                                int64_t N, int64_t C) = nullptr;
  // dpos[t % T_seq, :] += dout[t, :]
  void (*position_grad)(Queue& q, float* dpos, const float* dout, int64_t N, int64_t T_seq,
                        int64_t C) = nullptr;

  // ---- vocabulary-parallel cross-entropy (see the file comment) ---------------------------------
  // mx[t] = max_j logits[t, j] over the local Vs columns.
  void (*ce_row_max)(Queue& q, float* mx, const float* logits, int64_t N, int64_t Vs) = nullptr;
  // stats[2t] = Σ_j exp(logits[t, j] - mx[t]) (local columns); stats[2t+1] = logits[t, target -
  // v0] when this slice owns targets[t] (>= 0), else 0.
  void (*ce_sum_exp_target)(Queue& q, double* stats, const float* logits, const float* mx,
                            const int32_t* targets, int64_t v0, int64_t Vs, int64_t N) = nullptr;
  // losses[t] = log(stats[2t]) + mx[t] - stats[2t+1] for targets[t] >= 0, else 0; total[0] =
  // Σ_t losses[t] in double, summed in row order.
  void (*ce_loss)(Queue& q, float* losses, double* total, const double* stats, const float* mx,
                  const int32_t* targets, int64_t N) = nullptr;
  // In place: logits[t, j] = grad_scale * (exp(logits - mx) / stats[2t] - [j is the target]);
  // rows with targets[t] < 0 become 0.
  void (*ce_grad)(Queue& q, float* logits, const float* mx, const double* stats,
                  const int32_t* targets, int64_t v0, int64_t Vs, int64_t N,
                  float grad_scale) = nullptr;
  // Index (among the Vs local columns, lowest on ties) and value of each row's maximum
  // (greedy decoding); idx, val: (N). NaN counts as larger than any number: a row holding NaN
  // gives its first NaN's index and NaN, so a broken row is seen, never skipped.
  void (*row_argmax)(Queue& q, int32_t* idx, float* val, const float* logits, int64_t N,
                     int64_t Vs, int64_t ld) = nullptr;

  // ---- mixture of experts: tokens to their experts and back ------------------------------------
  // slots (N * k, device int32): slots[t * k + j] is the row of the expert-ordered buffer (R rows,
  // the experts' rows one expert after the other) that token t's j-th expert choice occupies, or
  // -1 where that choice was dropped (over capacity). Every row 0..R-1 is the slot of exactly one
  // (t, j). Rows are of C features, contiguous.
  // out[slots[t*k+j], :] = x[t, :] for every kept choice (out: (R, C), x: (N, C)).
  void (*moe_permute)(Queue& q, float* out, const float* x, const int32_t* slots, int64_t N,
                      int64_t k, int64_t C) = nullptr;
  // Its adjoint: dx[t, :] += Σ_j dout[slots[t*k+j], :] over the kept choices, in j order.
  void (*moe_permute_backward)(Queue& q, float* dx, const float* dout, const int32_t* slots,
                               int64_t N, int64_t k, int64_t C) = nullptr;
  // The weighted combine: y[t, :] = Σ_j w[t*k+j] * e[slots[t*k+j], :] over the kept choices, in j
  // order, fp32 (a token whose choices were all dropped gets 0). y: (N, C) OVERWRITTEN; e: (R, C);
  // w: (N * k).
  void (*moe_unpermute)(Queue& q, float* y, const float* e, const float* w, const int32_t* slots,
                        int64_t N, int64_t k, int64_t C) = nullptr;
  // Its backward: de[slots[t*k+j], :] = w[t*k+j] * dy[t, :] (every row of de OVERWRITTEN);
  // dw[t*k+j] = Σ_c dy[t, c] * e[slots[t*k+j], c] summed in double in c order (0 for a dropped
  // choice; OVERWRITTEN: the weights are activations of the router).
  void (*moe_unpermute_backward)(Queue& q, float* de, float* dw, const float* dy, const float* e,
                                 const float* w, const int32_t* slots, int64_t N, int64_t k,
                                 int64_t C) = nullptr;

  // ---- reductions, casts, optimizer -----------------------------------------------------------
  // out[0] = Σ x² in double (fixed summation order for a given n).
  void (*sum_squares)(Queue& q, double* out, const float* x, int64_t n) = nullptr;
  // out = bf16(x) (round to nearest even, NaN stays NaN), n elements.
  void (*cast_f32_to_bf16)(Queue& q, uint16_t* out, const float* x, int64_t n) = nullptr;
  void (*cast_bf16_to_f32)(Queue& q, float* out, const uint16_t* x, int64_t n) = nullptr;
  // x[n] = float(bf16(x)) in place.
  void (*round_to_bf16)(Queue& q, float* x, int64_t n) = nullptr;
  void (*adamw)(Queue& q, const AdamWArgs& a) = nullptr;

  // ---- optional (null when absent; see Capabilities) --------------------------------------------
  // The cross-entropy pieces above fused for one rank holding the whole vocabulary (V): losses,
  // logits -> dlogits in place, total[0] = Σ losses. A target >= V is an Error naming the first
  // such position and id, raised before anything is written; targets < 0 are masked rows.
  void (*cross_entropy_fused)(Queue& q, float* logits, float* losses, double* total,
                              const int32_t* targets, int64_t N, int64_t V,
                              float grad_scale) = nullptr;

  // bf16 producers (Capabilities::bf16_producers): for activations that only feed GEMMs, the
  // fp32 op's output rounded to bf16 (nearest even), bit for bit round(fp32 op), written in bf16
  // only (no fp32 tensor, no separate cast pass). Shapes as the fp32 ops'.
  void (*norm_apply_bf16)(Queue& q, uint16_t* out, const float* x, const float* mean,
                          const float* rstd, const float* w, const float* b, int64_t N,
                          int64_t C) = nullptr;
  void (*gelu_forward_bf16)(Queue& q, uint16_t* out, const float* x, int64_t n) = nullptr;
  void (*swiglu_forward_bf16)(Queue& q, uint16_t* out, const float* gu, int64_t N,
                              int64_t F) = nullptr;
  // The block's stashed MLP input projection (ActStore::Bf16Stash, parallel/activation_layout.hpp)
  // without a pass of its own (Capabilities::bf16_stash_fused): the producers above also write
  // their input x (gate|up) rounded to bf16 into x16 (gu16), in the same pass; the backward
  // reads x from that bf16 copy (dx fp32), the same bits as gelu_backward / swiglu_backward on
  // the copy widened to fp32.
  void (*gelu_forward_bf16_x)(Queue& q, uint16_t* out, uint16_t* x16, const float* x,
                              int64_t n) = nullptr;
  void (*swiglu_forward_bf16_x)(Queue& q, uint16_t* out, uint16_t* gu16, const float* gu,
                                int64_t N, int64_t F) = nullptr;
  void (*gelu_backward_x16)(Queue& q, float* dx, const float* dout, const uint16_t* x16,
                            int64_t n) = nullptr;
  void (*swiglu_backward_x16)(Queue& q, float* dgu, const float* dout, const uint16_t* gu16,
                              int64_t N, int64_t F) = nullptr;
  // One read of x (rows, cols, compact): out (rows, cols) = bf16(x) and out_t (cols, rows) =
  // bf16(x)ᵀ (either may be null). A gradient's two GEMM operands in one pass: the input
  // gradient reads it as stored, the weight gradient transposed, which makes dW = dYᵀ·X an NN
  // product (faster than TN on oneDNN's AMX kernels, docs/precision.md).
  void (*cast_transpose_f32_to_bf16)(Queue& q, uint16_t* out, uint16_t* out_t, const float* x,
                                     int64_t rows, int64_t cols) = nullptr;
  // ce_row_max then ce_sum_exp_target row by row (Capabilities::ce_row_stats_fused), the same
  // values bit for bit: where one rank holds the whole vocabulary (no max to all-reduce between
  // them), each row is read from memory once, its second sweep from cache.
  void (*ce_row_max_sum_exp_target)(Queue& q, float* mx, double* stats, const float* logits,
                                    const int32_t* targets, int64_t v0, int64_t Vs,
                                    int64_t N) = nullptr;
  // ce_grad written in bf16 only (Capabilities::bf16_loss_grad): out (N, Vs) as stored and / or
  // out_t (Vs, N) transposed (either may be null), each element bit for bit the bf16 rounding of
  // ce_grad's fp32 value; logits are only read. The head's backward GEMM operands straight from
  // the loss, instead of ce_grad writing fp32 dlogits that cast_transpose_f32_to_bf16 reads back.
  void (*ce_grad_bf16)(Queue& q, uint16_t* out, uint16_t* out_t, const float* logits,
                       const float* mx, const double* stats, const int32_t* targets, int64_t v0,
                       int64_t Vs, int64_t N, float grad_scale) = nullptr;
};

// Throws tetrad::Error naming the first required entry that is null ("backend 'cuda': op table
// has no norm_apply").
void check_op_table(const OpTable& t, const char* backend_name);

}  // namespace tetrad::backend
