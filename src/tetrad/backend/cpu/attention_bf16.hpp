// Causal grouped-query attention with its two products, QKᵀ and PV (and the backward's five),
// on bf16 operands with fp32 accumulation, on the matrix units (AMX / AVX512-BF16 through
// oneDNN's matmul), and the softmax statistics (row maxima, sums, log-sum-exp) in fp32: what
// flash attention does in bf16 on a GPU.
//
// The contract of attention_forward / attention_backward (attention.hpp: rows, strides, causal
// positions, GQA, lse) with q, k, v, out and the gradients stored in fp32; they are rounded to
// bf16 where they enter a product (q, k, v, dout, and the probabilities P and dS the kernel makes
// itself), so results differ from the fp32 kernel by bf16 rounding (relative error 1e-3..1e-2).
// Query i sits at key position q_offset + i (q_offset >= 0; Tk - Tq in training).
//
// How it runs. q, k, v (and dout) are packed once per call into compact per-head rows in the
// stored type, sequences padded to whole 128-row blocks. One OpenMP region; each task runs its
// products as oneDNN matmuls on its own thread (oneDNN runs sequentially inside a parallel
// region), the second operand stored transposed where the layout allows ("NT", the fast one):
//   forward, per (sequence, head, query block): S = Q_i·Kᵀ over every key the block sees, an
//     exact softmax per row in fp32 (base 2), P rounded, out = P·V / l, lse;
//   backward pass 1, per (sequence, kv head, key block), for each query head of its group:
//     Sᵀ = K_j·Qᵀ and dPᵀ = V_j·dOᵀ over every query that sees the block, Pᵀ = 2^(Sᵀ - L),
//     dSᵀ = Pᵀ (dPᵀ - D) / sqrt(hd) with D = rowsum(dO ∘ O), dV_j += Pᵀ·dO, dK_j += dSᵀ·Q;
//   pass 2, per (sequence, head, query block): S, dP and dS again, dQ_i = dS·K.
// Each task writes only its own rows, so no reduction crosses threads.
// Paths: native (bf16 operands, oneDNN's bf16 matmul) where kernels::native_bf16_matmul(), else
// emulated (the same rounded operands held in fp32, oneDNN's fp32 matmul): the same arithmetic
// up to summation order, on any CPU, slower than the fp32 kernel (for tests and AVX2 machines;
// precision "auto" is fp32 there). TETRAD_BF16=emulate and TETRAD_MAX_CPU_ISA force the emulated
// one like every bf16 GEMM.
//
// Memory per call: packed copies of q, k, v (and dout) in the stored type; per thread a 128 x T
// fp32 score tile, the probabilities and small accumulators; thread_local arenas kept between
// calls (they grow to the largest call).
// Determinism: every output row is computed by one task in a fixed order: bit-identical between
// runs and for any thread count.
// Speed: see docs/precision.md (not yet faster than the fp32 kernel on the CPU).
#pragma once
#include <cstdint>

#include "tetrad/backend/cpu/attention.hpp"

namespace tetrad::kernels {

void attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                            const float* v, const AttentionDims& d, int64_t q_offset);
void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* q,
                             const float* k, const float* v, const float* out, const float* lse,
                             const AttentionDims& d, int64_t q_offset);

// "native (oneDNN bf16 matmul 'brg:avx512_core_amx')" or "emulated (...)": what the last call
// ran its products with (for benchmarks and tests).
const char* attention_bf16_path();

}  // namespace tetrad::kernels
