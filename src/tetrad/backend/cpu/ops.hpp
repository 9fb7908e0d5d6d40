// CPU kernels of the transformer, as forward/backward pairs over plain pointers.
//
// Conventions (as llm.c): shapes are written next to pointers; row-major; `ntok` = tokens in the
// micro-batch (B*T). Parameter gradients are ACCUMULATED (+=) so micro-batches accumulate;
// activation gradients are OVERWRITTEN unless the comment says +=. Templated on float (training)
// and double (the finite-difference gradient checks). Multithreaded with OpenMP over rows;
// deterministic for a given thread count (no atomics, fixed reduction order).
//
// What is deliberately not here: attention (backend/cpu/attention.hpp) and parallel collectives
// (comm/). Norm statistics are computed over the full row; the 3D-parallel layers split that into
// partial sums + all-reduce.
#pragma once
#include <cstdint>
#include <vector>

#include "tetrad/backend/rope_tables.hpp"

namespace tetrad::kernels {

// C[M,N] = alpha * op(A) · op(B) + beta * C, row-major; op(X) = Xᵀ when the flag is set.
// float: oneDNN sgemm in fp32 (measured fastest on the model's shapes; the bf16 product is
// gemm_bf16, backend/cpu/precision.hpp, chosen per call by whoever owns the precision); double:
// a straightforward blocked loop (tests only).
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// out[ntok, OC] = in[ntok, IC] · W[OC, IC]ᵀ (+ bias[OC]); with accumulate, out += instead.
template <typename T>
void linear_forward(T* out, const T* in, const T* W, const T* bias, int64_t ntok, int64_t IC,
                    int64_t OC, bool accumulate = false);
// din[ntok, IC] = dout · W (skipped when din is null); dW[OC, IC] += doutᵀ · in; dbias[OC] += Σ dout.
template <typename T>
void linear_backward(T* din, T* dW, T* dbias, const T* dout, const T* in, const T* W,
                     int64_t ntok, int64_t IC, int64_t OC);

// GPT-2: out[t] = wte[tok[t]] + wpe[t % T]; Llama (wpe null): out[t] = wte[tok[t]].
// Throws Error when a token id is outside [0, V).
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t ntok,
                       int64_t T_seq, int64_t C, int64_t V);
// dwte[tok] += dout[t]; dwpe[t % T] += dout[t].
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t ntok,
                        int64_t T_seq, int64_t C);

// LayerNorm over C with weight and bias; saves mean and rstd [ntok] for backward.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b,
                       int64_t ntok, int64_t C, T eps);
// dx += ..., dw += ..., db += ...
template <typename T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w,
                        const T* mean, const T* rstd, int64_t ntok, int64_t C);

// RMSNorm (Llama): out = x * rstd * w, rstd = 1/sqrt(mean(x²) + eps).
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int64_t ntok, int64_t C, T eps);
// dx += ..., dw += ...
template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                      int64_t ntok, int64_t C);

// GELU, tanh approximation (GPT-2's "gelu_new"). n elements.
template <typename T>
void gelu_forward(T* out, const T* x, int64_t n);
template <typename T>
void gelu_backward(T* dx, const T* dout, const T* x, int64_t n);

// SwiGLU (Llama): gu[ntok, 2F] holds gate (first F) and up (last F) of each row;
// out[ntok, F] = silu(gate) * up.
template <typename T>
void swiglu_forward(T* out, const T* gu, int64_t ntok, int64_t F);
template <typename T>
void swiglu_backward(T* dgu, const T* dout, const T* gu, int64_t ntok, int64_t F);

// Rotary position embedding, Hugging Face's rotate_half convention: within each head, element i
// pairs with i + hd/2. Applied in place to the first n_rot_heads heads of each row of x
// (row stride `stride`), the token of row r of sequence b sitting at position pos0 + r % T
// (minus doc_start[r] when doc_start is given: per-document positions, RopeArgs::doc_start).
// cos/sin tables: [max_pos, hd/2] from rope_tables().
//
// The frequencies and tables (RopeFrequencies, rope_inv_freq, rope_tables):
// backend/rope_tables.hpp.
template <typename T>
void rope_forward(T* x, int64_t ntok, int64_t T_seq, int64_t pos0, int64_t n_rot_heads,
                  int64_t hd, int64_t stride, const T* cos_table, const T* sin_table,
                  const int32_t* doc_start = nullptr);
// The adjoint (rotation by -angle), in place on the gradient.
template <typename T>
void rope_backward(T* dx, int64_t ntok, int64_t T_seq, int64_t pos0, int64_t n_rot_heads,
                   int64_t hd, int64_t stride, const T* cos_table, const T* sin_table,
                   const int32_t* doc_start = nullptr);

// Fused softmax cross-entropy. For each row with target >= 0: losses[t] = logsumexp(row) -
// row[target] and the row is overwritten IN PLACE with d(grad_scale * Σ losses)/d logits =
// grad_scale * (softmax - onehot). Rows with target < 0 (masked) get loss 0 and gradient 0.
// Returns Σ losses (double). Throws Error for target >= V.
template <typename T>
double cross_entropy_fused(T* logits_to_dlogits, T* losses, const int32_t* targets,
                           int64_t ntok, int64_t V, T grad_scale);
// Forward only (evaluation): losses[t], returns Σ over rows with target >= 0.
template <typename T>
double cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t ntok,
                             int64_t V);

// x += y, n elements.
template <typename T>
void add_inplace(T* x, const T* y, int64_t n);

// Σ x² in double, for the global gradient norm.
template <typename T>
double sum_squares(const T* x, int64_t n);

// One AdamW step (decoupled weight decay, Loshchilov & Hutter) on n elements:
// g' = grad_scale * g; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'²;
// p -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + weight_decay * p).
template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, T lr, T beta1, T beta2, T eps,
                  T weight_decay, T grad_scale, int64_t step);

// ---------------------------------------------------------------------------------------------
// bf16 mixed precision (docs/precision.md): the same kernels writing their output in bf16 where
// that output only feeds GEMMs, so the cast is fused into the producer (one write of 2 bytes
// instead of a 4-byte write, a 4-byte read and a 2-byte write in a separate pass). Arithmetic is
// fp32; only the stored result is rounded (to nearest even).

// linear_forward with the input and the weight stored in bf16 (W [OC, IC], the optimizer's bf16
// copy); out, bias and accumulation fp32.
void linear_forward_bf16(float* out, const uint16_t* in, const uint16_t* W, const float* bias,
                         int64_t ntok, int64_t IC, int64_t OC, bool accumulate = false);
// linear_backward with dout, the saved input and the weight in bf16; din (overwritten), dW and
// dbias (accumulated) fp32. dbias sums dout_f32 when given (the fp32 gradient), else the bf16 one.
void linear_backward_bf16(float* din, float* dW, float* dbias, const uint16_t* dout,
                          const float* dout_f32, const uint16_t* in, const uint16_t* W,
                          int64_t ntok, int64_t IC, int64_t OC);

// layernorm_forward with out in bf16; mean and rstd fp32.
void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x,
                            const float* w, const float* b, int64_t ntok, int64_t C, float eps);
void rmsnorm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* w,
                          int64_t ntok, int64_t C, float eps);
void gelu_forward_bf16(uint16_t* out, const float* x, int64_t n);
// dx in bf16 (it feeds the up projection's input- and weight-gradient GEMMs only).
void gelu_backward_bf16(uint16_t* dx, const float* dout, const float* x, int64_t n);
void swiglu_forward_bf16(uint16_t* out, const float* gu, int64_t ntok, int64_t F);
void swiglu_backward_bf16(uint16_t* dgu, const float* dout, const float* gu, int64_t ntok,
                          int64_t F);
// The stashed MLP input projection (ActStore::Bf16Stash): the bf16 producers above writing x
// (gate|up) rounded to bf16 too, in the same pass (x16 / gu16); the fp32 backward reading it from
// that bf16 copy (dx fp32).
void gelu_forward_bf16_x(uint16_t* out, uint16_t* x16, const float* x, int64_t n);
void swiglu_forward_bf16_x(uint16_t* out, uint16_t* gu16, const float* gu, int64_t ntok,
                           int64_t F);
void gelu_backward_x16(float* dx, const float* dout, const uint16_t* x16, int64_t n);
void swiglu_backward_x16(float* dgu, const float* dout, const uint16_t* gu16, int64_t ntok,
                         int64_t F);
// cross_entropy_fused writing d(loss)/d logits in bf16 to dlogits[ntok, V] instead of in place
// (logits are left holding intermediate values). Returns Σ losses.
double cross_entropy_fused_bf16(float* logits, uint16_t* dlogits, float* losses,
                                const int32_t* targets, int64_t ntok, int64_t V,
                                float grad_scale);
// adamw_update that also writes the updated parameters rounded to bf16 into p16 (the weight
// copy the next step's GEMMs read): one pass over the parameters per step.
void adamw_update_bf16(float* p, uint16_t* p16, const float* g, float* m, float* v, int64_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int64_t step);

}  // namespace tetrad::kernels
