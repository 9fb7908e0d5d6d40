// CUDA kernels of the transformer, as forward/backward pairs over device pointers, each enqueued
// on the given stream (asynchronous; nothing here synchronises).
//
// The same conventions as the CPU kernels (backend/cpu/ops.hpp): shapes written next to pointers,
// row-major, `ntok` = tokens in the micro-batch; parameter gradients ACCUMULATE (+=), activation
// gradients are overwritten unless the comment says +=. Activations and master weights are fp32;
// bf16 appears as GEMM operand storage (casts below, gemm.hpp) and inside the tensor-core
// attention path. Every kernel is deterministic: no floating-point atomics; reductions over rows
// or columns go through fixed-order two-stage sums, so a run repeats bit for bit.
//
// Scratch: kernels that reduce over tokens (weight/bias gradients of norms and biases, the
// embedding's per-bucket sums need none) take a `float* scratch` of scratch_elements(...) floats
// from the backend's workspace, planned up front (no allocation inside a step).
#pragma once
#include <cstdint>

#include "tetrad/backend/cuda/gpu_api.hpp"

namespace tetrad::gpu {

// ---- elementwise --------------------------------------------------------------------------------
// GELU, tanh approximation (GPT-2's gelu_new), n elements.
void gelu_forward(float* out, const float* x, int64_t n, gpuStream_t s);
void gelu_backward(float* dx, const float* dout, const float* x, int64_t n, gpuStream_t s);
// SwiGLU: gu[ntok, 2F] = gate | up; out[ntok, F] = silu(gate) * up.
void swiglu_forward(float* out, const float* gu, int64_t ntok, int64_t F, gpuStream_t s);
void swiglu_backward(float* dgu, const float* dout, const float* gu, int64_t ntok, int64_t F,
                     gpuStream_t s);
// x += y (residual adds), n elements.
void add_inplace(float* x, const float* y, int64_t n, gpuStream_t s);
// out[ntok, OC] += bias[OC] (row stride ld).
void add_bias(float* out, const float* bias, int64_t ntok, int64_t OC, int64_t ld, gpuStream_t s);
// dbias[OC] += Σ_t dout[t, :] (row stride ld); scratch: column_sum_scratch(ntok, OC) floats.
void bias_backward(float* dbias, const float* dout, int64_t ntok, int64_t OC, int64_t ld,
                   float* scratch, gpuStream_t s);
int64_t column_sum_scratch(int64_t ntok, int64_t cols);
// A GEMM with K = 0 (no products): C[M, N] (row stride ldc) = beta C (+ bias[N] on every row);
// beta 0 overwrites C, NaN included (the op table's GEMM contract).
void gemm_empty_product(float* C, int64_t ldc, int64_t M, int64_t N, float beta,
                        const float* bias, gpuStream_t s);

// Casts: bf16 is stored as uint16_t (round to nearest even, NaN kept quiet, as the CPU's
// float_to_bf16). out[r * ldo + c] = cast(in[r * ldi + c]).
void cast_f32_to_bf16(uint16_t* out, int64_t ldo, const float* in, int64_t ldi, int64_t rows,
                      int64_t cols, gpuStream_t s);
void cast_bf16_to_f32(float* out, int64_t ldo, const uint16_t* in, int64_t ldi, int64_t rows,
                      int64_t cols, gpuStream_t s);

// ---- norms with split statistics ----------------------------------------------------------------
// A row of C = Cx * Gx columns may be split over X ranks; each rank holds Cx columns. The
// statistics are sums over the rank's columns (double), all-reduced over X by the caller, then
// applied. With Gx = 1 these are the whole-row norms.
//
// stat[t] = Σ_c x[t, c]                    (mean == nullptr, square == false)
//         = Σ_c x[t, c]²                   (mean == nullptr, square == true: RMSNorm)
//         = Σ_c (x[t, c] - mean[t])²       (mean != nullptr: LayerNorm's centred variance)
void norm_row_sums(double* stat, int64_t stride, const float* x, const float* mean, bool square,
                   int64_t ntok, int64_t Cx, gpuStream_t s);  // stat[t * stride]
// mean[t] = stat[t] / C (mean_out != nullptr) or rstd[t] = 1 / sqrt(stat[t] / C + eps).
void norm_finish_mean(float* mean, const double* stat, int64_t ntok, int64_t C, gpuStream_t s);
void norm_finish_rstd(float* rstd, const double* stat, int64_t ntok, int64_t C, float eps,
                      gpuStream_t s);
// out = (x - mean) * rstd * w (+ b); mean == nullptr for RMSNorm, b may be nullptr.
void norm_apply(float* out, const float* x, const float* mean, const float* rstd, const float* w,
                const float* b, int64_t ntok, int64_t Cx, gpuStream_t s);
// Backward partials: st[2t] = Σ_c dout*w, st[2t+1] = Σ_c dout*w*n (n = normalised x).
void norm_backward_partials(double* st, const float* dout, const float* x, const float* mean,
                            const float* rstd, const float* w, int64_t ntok, int64_t Cx,
                            gpuStream_t s);
// dx += (dout*w - st0/C [LayerNorm only] - n*st1/C) * rstd, from the all-reduced st.
void norm_backward_apply(float* dx, const float* dout, const float* x, const float* mean,
                         const float* rstd, const float* w, const double* st, int64_t ntok,
                         int64_t Cx, int64_t C, gpuStream_t s);
// dw += Σ_t dout*n, db += Σ_t dout (db may be nullptr); scratch: 2 * column_sum_scratch(ntok, Cx).
void norm_weight_grad(float* dw, float* db, const float* dout, const float* x, const float* mean,
                      const float* rstd, int64_t ntok, int64_t Cx, float* scratch, gpuStream_t s);
// Whole-row fused forms (Gx = 1): one block per row, x read from device memory once per pass.
// LayerNorm: mean, rstd [ntok] saved; RMSNorm: rstd.
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t ntok, int64_t C, float eps, gpuStream_t s);
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t ntok,
                     int64_t C, float eps, gpuStream_t s);
// dx += ..., dw += ..., db += ... (mean == nullptr: RMSNorm); scratch as norm_weight_grad.
void norm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                   const float* w, const float* mean, const float* rstd, int64_t ntok, int64_t C,
                   float* scratch, gpuStream_t s);

// ---- rotary embedding ---------------------------------------------------------------------------
// In place on the first n_rot_heads heads of each row (stride), HF rotate_half pairing (i with
// i + hd/2), the token of row r sitting at position pos0 + r % T (minus doc_start[r] where
// doc_start, device memory, is not null: per-document positions). cos/sin tables [max_pos, hd/2]
// on the device, made on the host by the CPU backend's rope_tables (so llama3 frequency scaling
// and any later change of the tables is the same function on both backends) and uploaded once.
// backward = rotation by -angle (the adjoint), in place on the gradient.
void rope_forward(float* x, int64_t ntok, int64_t T, int64_t pos0, int64_t n_rot_heads,
                  int64_t hd, int64_t stride, const float* cos_table, const float* sin_table,
                  const int32_t* doc_start, gpuStream_t s);
void rope_backward(float* dx, int64_t ntok, int64_t T, int64_t pos0, int64_t n_rot_heads,
                   int64_t hd, int64_t stride, const float* cos_table, const float* sin_table,
                   const int32_t* doc_start, gpuStream_t s);

// ---- per-head RMSNorm (q_norm / k_norm; ops.hpp's HeadNormArgs) --------------------------------
// In place on the first n_heads heads of each row (stride); rstd [ntok, n_heads]; saved (may be
// nullptr) [ntok, n_heads * hd], the input. Backward: x holds dy, becomes dx; dw += Σ dy x̂.
void head_norm_forward(float* x, float* rstd, float* saved, const float* w, int64_t ntok,
                       int64_t n_heads, int64_t hd, int64_t stride, float eps, gpuStream_t s);
void head_norm_backward(float* x, float* dw, const float* saved, const float* rstd,
                        const float* w, int64_t ntok, int64_t n_heads, int64_t hd, int64_t stride,
                        gpuStream_t s);

// ---- vocabulary-parallel embedding ---------------------------------------------------------------
// This rank holds wte rows [v0, v0 + Vl) of a vocabulary of V. out[t] = wte[tok - v0] if the token
// is in the range, else 0, plus wpe[t % T] when wpe != nullptr (added by one rank: the caller
// passes wpe on one rank only). Any token outside [0, V) sets *bad (device int) to 1; the caller
// checks it once per step.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t ntok, int64_t T, int64_t C, int64_t v0, int64_t Vl, int64_t V,
                       int* bad, gpuStream_t s);
// dwte[tok - v0] += dout[t] for tokens in range; dwpe[t % T] += dout[t] (dwpe may be nullptr).
// Deterministic: each (column, vocabulary bucket) is owned by one thread that walks the tokens
// in order; no atomics.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t ntok, int64_t T, int64_t C, int64_t v0, int64_t Vl,
                        gpuStream_t s);

// ---- vocabulary-parallel cross-entropy ----------------------------------------------------------
// logits [ntok, Vl] (row stride ld) are this rank's columns [v0, v0 + Vl). Forward, ONE read of
// the logits: online max and Σ exp per row (rmax, rsum: relative to rmax) and the target's logit
// (tgt: 0 when the target is not in this rank's range or is masked, target < 0).
void xent_partials(float* rmax, float* rsum, float* tgt, const float* logits, int64_t ld,
                   const int32_t* targets, int64_t ntok, int64_t v0, int64_t Vl, gpuStream_t s);
// After the caller all-reduced gmax = max over ranks of rmax: rsum *= exp(rmax - gmax) (so the
// sums can be all-reduced), in place.
void xent_rescale(float* rsum, const float* rmax, const float* gmax, int64_t ntok, gpuStream_t s);
// losses[t] = log(gsum) + gmax - gtgt for targets >= 0, else 0; *loss_sum (device double) =
// Σ losses in a fixed order. Any target >= V sets *bad.
void xent_losses(float* losses, double* loss_sum, const float* gmax, const float* gsum,
                 const float* gtgt, const int32_t* targets, int64_t ntok, int64_t V, int* bad,
                 gpuStream_t s);
// Backward, ONE read and one write, in place: d = grad_scale * (exp(x - gmax) / gsum - onehot);
// masked rows get 0. No second copy of the softmax is ever stored.
void xent_backward(float* logits_to_dlogits, int64_t ld, const float* gmax, const float* gsum,
                   const int32_t* targets, int64_t ntok, int64_t v0, int64_t Vl, float grad_scale,
                   gpuStream_t s);

// ---- reductions and the optimizer ----------------------------------------------------------------
// One tensor of a multi-tensor launch.
struct TensorSpan {
  float* p;         // parameter (fp32 master)
  const float* g;   // gradient
  float* m;         // Adam first moment
  float* v;         // Adam second moment
  uint16_t* p_bf16; // bf16 copy of p written in the same pass, or nullptr
  int64_t n;
  float weight_decay;  // per tensor (0 for norms and biases where the config says so)
};
// The descriptor table lives on the device (uploaded once: the parameters never move); offsets
// [count + 1] are the running element counts. Fused: reads g, m, v, p once, writes m, v, p and the
// bf16 copy once. Step and bias corrections as the CPU's adamw_update.
void adamw_multi(const TensorSpan* spans_dev, const int64_t* offsets_dev, int count,
                 int64_t total, float lr, float beta1, float beta2, float eps, float grad_scale,
                 int64_t step, gpuStream_t s);
// *out (device double) = Σ_i Σ x_i², over `count` tensors (descriptor arrays on the device,
// offsets as above). scratch: sum_squares_scratch(total) doubles. Fixed order: deterministic.
void sum_squares_multi(double* out, const float* const* ptrs_dev, const int64_t* offsets_dev,
                       int count, int64_t total, double* scratch, gpuStream_t s);
int64_t sum_squares_scratch(int64_t total);

// ---- the op table's remaining pieces (backend/ops.hpp states each contract) -----------------------
// out = resid + y (+ b[c]) over (N, C).
void residual_add(float* out, const float* resid, const float* y, const float* b, int64_t N,
                  int64_t C, gpuStream_t s);
// out[t] += pos[t % T]; dpos[t % T] += dout[t] (fixed order over sequences, no atomics).
void position_add(float* out, const float* pos, int64_t N, int64_t T, int64_t C, gpuStream_t s);
void position_grad(float* dpos, const float* dout, int64_t N, int64_t T, int64_t C, gpuStream_t s);
// dshard[e - s0] += dout[t, c] for e = (tokens[t] - v0) * C + c in [s0, s1), in token order.
void embedding_scatter_add(float* dshard, int64_t s0, int64_t s1, const float* dout,
                           const int32_t* tokens, int64_t v0, int64_t Vs, int64_t N, int64_t C,
                           gpuStream_t s);
void round_to_bf16(float* x, int64_t n, gpuStream_t s);
// The cross-entropy pieces of the op table (two reads of the logits forward: the table's split
// into a max all-reduce and a sum all-reduce needs the global max first; the one-rank fused path,
// xent_partials & co above, reads them once).
void ce_row_max(float* mx, const float* logits, int64_t ld, int64_t N, int64_t Vs, gpuStream_t s);
void ce_sum_exp_target(double* st, const float* logits, const float* mx, const int32_t* targets,
                       int64_t v0, int64_t Vs, int64_t N, gpuStream_t s);
void ce_loss(float* losses, double* total, const double* st, const float* mx,
             const int32_t* targets, int64_t N, gpuStream_t s);
// *total = Σ losses[t] in row order (the op table's order).
void ce_loss_total_in_order(double* total, const float* losses, int64_t N, gpuStream_t s);
void ce_grad(float* logits, const float* mx, const double* st, const int32_t* targets, int64_t v0,
             int64_t Vs, int64_t N, float grad_scale, gpuStream_t s);
// *first (device) = the lowest t with targets[t] >= V, or N when there is none: the fused
// cross-entropy's check, made before it writes anything (the CPU refuses such a target).
void first_target_at_or_above(int64_t* first, const int32_t* targets, int64_t N, int64_t V,
                              gpuStream_t s);
// idx[t], val[t]: the lowest column index of each row's maximum; NaN counts as the largest value
// (the first NaN of a row wins), as on the CPU.
void row_argmax(int32_t* idx, float* val, const float* logits, int64_t N, int64_t Vs, int64_t ld,
                gpuStream_t s);
// One tensor (an interval) of AdamW, p_bf16 written in the same pass when not null.
void adamw(const TensorSpan& sp, float lr, float beta1, float beta2, float eps, float grad_scale,
           int64_t step, gpuStream_t s);
// *out (device) = Σ x² in double; scratch: sum_squares_scratch(n) doubles.
void sum_squares(double* out, const float* x, int64_t n, double* scratch, gpuStream_t s);

// ---- attention ----------------------------------------------------------------------------------
// Causal scaled-dot-product attention with GQA, flash style: never a [T, T] matrix in memory;
// query tiles stream over key tiles with an online softmax. Layout and meaning exactly as the
// op table's AttentionArgs (backend/ops.hpp): query i sits at key position q_offset + i, any
// sign (AttentionArgs::relative_q_offset()); a query that sees no key gets out 0, lse -inf.
struct AttnDims {
  int B, Tq, Tk, n_head, n_kv_head, head_dim;
  int64_t q_offset;  // query i sits at key position q_offset + i (any sign, no sentinel)
  int64_t q_stride, kv_stride, out_stride;
  int64_t q_batch_stride, kv_batch_stride, out_batch_stride;
  // Document mask (AttentionArgs::doc_start, device memory): null, or query i of sequence b sees
  // only keys at or after doc_start[b * doc_batch_stride + i] - doc_shift.
  const int32_t* doc_start = nullptr;
  int64_t doc_batch_stride = 0, doc_shift = 0;
};
// Kernels' arithmetic: kF32 (fp32 FMA on shared-memory tiles: the exact path) or kBf16 (q, k, v,
// P and dS rounded to bf16 in shared memory, products on the tensor cores through WMMA with
// fp32 accumulation; softmax statistics, O, dQ, dK, dV accumulate in fp32).
enum class AttnPath { kF32, kBf16 };
// lse [B, n_head, Tq] (may be nullptr in evaluation). out must not overlap q, k, v.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttnDims& d, AttnPath path, gpuStream_t s);
// (out, lse) folded with a second partial result (out_b in out's layout, lse_b in lse's) of the
// same queries over other keys, in place: the op table's attention_merge. Uses B, Tq, n_head,
// head_dim, out_stride, out_batch_stride of d.
void attention_merge(float* out, float* lse, const float* out_b, const float* lse_b,
                     const AttnDims& d, gpuStream_t s);
// dq, dk, dv overwritten (may point into one fused dqkv buffer); deterministic: dQ in one kernel
// (per query tile, over key tiles), dK/dV in another (per key tile, over the GQA group's query
// heads and query tiles); each recomputes P, nothing is accumulated across blocks.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttnDims& d, AttnPath path, gpuStream_t s);

}  // namespace tetrad::gpu
