// CPU kernels of the pieces the sharded model composes between its collectives: norms with
// split statistics, bias and residual adds, bias gradients, the vocabulary-parallel embedding and
// cross-entropy, greedy argmax (backend/ops.hpp documents each op; these are its CPU bodies).
//
// They were the inline OpenMP loops of parallel/parallel_transformer.cpp and are kept
// operation for operation (same types, same order of summation, same static schedules), so the
// model's results are bit-identical to before the move. Multithreaded with OpenMP over rows (or
// over column blocks where rows accumulate into one vector); deterministic for any thread count.
#pragma once
#include <cstdint>

#include "tetrad/backend/ops.hpp"

namespace tetrad::backend::cpu {

void bias_add(float* out, const float* b, int64_t N, int64_t n);
void residual_add(float* out, const float* resid, const float* y, const float* b, int64_t N,
                  int64_t C);
void bias_grad(float* db, const float* dout, int64_t N, int64_t n);

void norm_row_stats(RowStat stat, double* stats, int64_t stride, const float* x,
                    const float* mean, int64_t N, int64_t C);
void norm_finish_stats(StatFinish f, float* out, const double* stats, int64_t N, int64_t C_full,
                       float eps);
void norm_apply(float* out, const float* x, const float* mean, const float* rstd, const float* w,
                const float* b, int64_t N, int64_t C);
// norm_apply's result rounded to bf16 (the same arithmetic: bit for bit the rounded fp32 output).
void norm_apply_bf16(uint16_t* out, const float* x, const float* mean, const float* rstd,
                     const float* w, const float* b, int64_t N, int64_t C);
// out (rows, cols) = bf16(x) and out_t (cols, rows) = bf16(x)ᵀ in one pass over x (rows, cols);
// either may be null.
void cast_transpose_to_bf16(uint16_t* out, uint16_t* out_t, const float* x, int64_t rows,
                            int64_t cols);
void norm_backward_partials(double* partials, const float* dout, const float* x,
                            const float* mean, const float* rstd, const float* w, int64_t N,
                            int64_t C);
void norm_backward_apply(float* dx, const float* dout, const float* x, const float* mean,
                         const float* rstd, const float* w, const double* partials, int64_t N,
                         int64_t C, int64_t C_full);
void norm_param_grads(float* dw, float* db, const float* dout, const float* x, const float* mean,
                      const float* rstd, int64_t N, int64_t C);

void embedding_gather(float* out, const int32_t* tokens, const float* table, int64_t v0,
                      int64_t Vs, int64_t N, int64_t C);
void position_add(float* out, const float* pos, int64_t N, int64_t T_seq, int64_t C);
void embedding_scatter_add(float* dshard, int64_t s0, int64_t s1, const float* dout,
                           const int32_t* tokens, int64_t v0, int64_t Vs, int64_t N, int64_t C);
void position_grad(float* dpos, const float* dout, int64_t N, int64_t T_seq, int64_t C);

void ce_row_max(float* mx, const float* logits, int64_t N, int64_t Vs);
void ce_sum_exp_target(double* stats, const float* logits, const float* mx,
                       const int32_t* targets, int64_t v0, int64_t Vs, int64_t N);
void ce_row_max_sum_exp_target(float* mx, double* stats, const float* logits,
                               const int32_t* targets, int64_t v0, int64_t Vs, int64_t N);
void ce_loss(float* losses, double* total, const double* stats, const float* mx,
             const int32_t* targets, int64_t N);
void ce_grad(float* logits, const float* mx, const double* stats, const int32_t* targets,
             int64_t v0, int64_t Vs, int64_t N, float grad_scale);
void ce_grad_bf16(uint16_t* out, uint16_t* out_t, const float* logits, const float* mx,
                  const double* stats, const int32_t* targets, int64_t v0, int64_t Vs, int64_t N,
                  float grad_scale);
void transpose_bf16(uint16_t* out_t, const uint16_t* x, int64_t rows, int64_t cols);
void row_argmax(int32_t* idx, float* val, const float* logits, int64_t N, int64_t Vs, int64_t ld);

}  // namespace tetrad::backend::cpu
