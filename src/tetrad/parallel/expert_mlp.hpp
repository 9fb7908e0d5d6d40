// The experts' SwiGLU MLPs of a mixture-of-experts block (moe_block.hpp) over rows grouped by
// expert: expert e takes rows [first[e], first[e] + rows[e]) of every row buffer, its gate|up
// weights at w13 + e 2F C ([2F, C], gate rows then up rows) and its down weights at w2 + e C F
// ([C, F]). Each GEMM is one grouped GEMM over the experts (each with its own row count, empty
// ones included): on one rank every expert of the model; with the expert-parallel axis
// (expert_parallel.hpp) this rank's experts over the rows the other ranks sent them.
// On the tensor axes C and F are this rank's widths (Cx = n_embd / Gx, Fy = ffn / Gy) and each
// expert is the dense MLP's pair of parallel layers (linear_layers.hpp): gate|up a normal layer
// (its partial sums all-reduced over X), down a transposed one (over Y); the backward's input
// gradients over the adjoint axes (down's over X, gate|up's over Y). One rank: no message.
//
// Precision: the model's (ExpertGemms). In bf16 the GEMMs read the weights from the bf16 copy
// where the model keeps one, the SwiGLU output from its bf16 form where the caller stores one
// (act16), and round the fp32 rows and gradients to bf16 inside the product (fp32 accumulation;
// the gradients stay fp32). With bf16 gradient copies (ExpertGrad16: bf16 activations and
// ParallelOptions::bf16_weight_grad_nn, as the dense layers) the backward instead rounds each
// gradient to bf16 once per layer, as stored and transposed in one pass
// (OpTable::cast_transpose_f32_to_bf16), and runs the weight gradients as NN products on the
// transposed copy (dW = (dYᵀ)·X: oneDNN's TN form is its slowest); the same bf16 operands, the
// sums in another order.
#pragma once
#include <cstdint>
#include <vector>

#include "tetrad/parallel/parallel_ops.hpp"
#include "tetrad/parallel/step_context.hpp"

namespace tetrad::parallel {

// The experts' weights as the GEMMs read them (gate|up [E 2F, C] and down [E C, F], stacked;
// fp32 or the bf16 copy) and the precision of their products.
struct ExpertGemms {
  Operand w13, w2;
  backend::Precision precision = backend::Precision::FP32;
};

// Each group's GEMM C_g (= beta C_g) + op(A_g) op(B_g), shapes per group, operands stored as
// a_type / b_type, in one grouped_gemm call of the backend in `precision` (under the queue's
// progress scope).
void grouped_gemm(const StepContext& ctx, const char* what, backend::Precision precision, bool ta,
                  bool tb, const std::vector<int64_t>& M, const std::vector<int64_t>& N,
                  const std::vector<int64_t>& K, const std::vector<const void*>& A,
                  backend::DType a_type, int64_t lda, const std::vector<const void*>& B,
                  backend::DType b_type, int64_t ldb, float beta, const std::vector<float*>& Cp,
                  int64_t ldc);

// The rows of each expert: rows[e] from first[e]; kept = Σ rows.
struct ExpertRows {
  const std::vector<int64_t>& rows;
  const std::vector<int64_t>& first;
  int64_t kept;
};

// The SwiGLU output [kept, F]: fp32 (f32), or bf16 only (b16: what the down GEMMs read) with
// f32 then fp32 scratch of the same size for a backend without the bf16 producer (or null).
struct ExpertAct {
  float* f32 = nullptr;
  uint16_t* b16 = nullptr;
};

// out = down(SwiGLU(in · W13ᵀ)) per expert; gu [kept, 2F] and act [kept, F] are the stored
// intermediates (out null: only they, a recomputation). C: the hidden size, F: the expert width.
void experts_forward(const StepContext& ctx, int64_t C, int64_t F, const ExpertRows& x,
                     const float* in, const ExpertGemms& w, float* gu, ExpertAct act, float* out);

// The bf16 copies of the backward's NN form: plain and transposed scratch of at least kept x C
// bf16 elements each (the rows' gradient dout, then the rows `in`); null: the per-call form.
struct ExpertGrad16 {
  uint16_t* plain = nullptr;
  uint16_t* transposed = nullptr;
};

// From dout [kept, C] (the gradient of out): gw2 += doutᵀ · act, gw13 += dguᵀ · in, and
// din [kept, C] = dgu · W13 (din may be dout: it is written after dout's last read); dact
// [kept, F] and dgu [kept, 2F] are scratch (act's fp32 scratch may be dact). With g16 (bf16
// GEMMs only) gu's memory, free after the SwiGLU's backward, holds dgu's two bf16 copies
// ([kept, 2F] and [2F, kept]): gu is overwritten.
void experts_backward(const StepContext& ctx, int64_t C, int64_t F, const ExpertRows& x,
                      const float* in, float* gu, ExpertAct act, const float* dout,
                      const ExpertGemms& w, float* gw13, float* gw2, float* dact, float* dgu,
                      float* din, ExpertGrad16 g16 = {});

}  // namespace tetrad::parallel
