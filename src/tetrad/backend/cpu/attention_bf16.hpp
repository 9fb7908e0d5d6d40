// Causal grouped-query attention with its products, QKᵀ and PV (and the backward's dP = dO·Vᵀ,
// dS·K, dSᵀ·Q, Pᵀ·dO), on bf16 operands with fp32 accumulation on the CPU's matrix units, and
// the softmax statistics (row maxima, sums, log-sum-exp) in fp32: what flash attention does in
// bf16 on a GPU.
//
// The contract of attention_forward / attention_backward (attention.hpp: rows, strides, causal
// positions, GQA, lse) with q, k, v, out and the gradients stored in fp32; they are rounded to
// bf16 where they enter a product (q, k, v, dout, and the probabilities P and dS the kernel makes
// itself), so results differ from the fp32 kernel by bf16 rounding (relative error 1e-3..1e-2).
// Query i sits at key position q_offset + i (any sign; Tk - Tq in training; a query that sees no
// key gets out = 0, lse = -inf).
//
// How it runs. One OpenMP region per call. q, k, v (and dout) are first packed (in parallel, by
// rows) into bf16 in the layouts the products read: rows padded to 32 head columns and sequences
// to 32 rows with zeros, and the second operand of a product in the pair-interleaved ("VNNI")
// panels of 16 columns that AMX and vdpbf16ps take. Then:
//   forward, per (sequence, head, 32-query block): S = Q_i·Kᵀ over every key the block sees, an
//     exact softmax of each row in fp32 (base 2; no online rescaling), P rounded to bf16,
//     out = P·V / l, lse;
//   backward, per (sequence, kv head), for each chunk of up to 512 keys, for each query head of
//     the group: for each 32-key block of the chunk, against every query that sees the block at
//     once, in the transposed orientation (keys as rows): Sᵀ = K_j·Qᵀ, dPᵀ = V_j·dOᵀ,
//     Pᵀ = 2^(Sᵀ - L), dSᵀ = Pᵀ (dPᵀ - D) / sqrt(hd) (D = rowsum(dO ∘ O), from the fp32 out),
//     dV_j += Pᵀ·dO, dK_j += dSᵀ·Q, and dSᵀ kept for the chunk; then dQᵀ (+)= Kᵀ·dSᵀ per
//     32-query block over all the chunk's keys it sees (the accumulators stay in the tiles
//     across the chunk). dK, dV of the chunk and dQᵀ of the group's heads stay in the task's
//     scratch; the head's dq rows are written from its dQᵀ after the last chunk. Threads
//     share out the (sequence, kv head) pairs only, so a head's results do not depend on how
//     many heads or sequences a call holds: grids that split heads or the batch match one rank
//     bit for bit (a sequence with one kv head runs on one thread).
// Each task writes only its own rows: no reduction crosses threads.
//
// Paths, one source (the block products are one routine per path, C (+)= A·B on the packed
// operands; the elementwise code is compiled for each path's instruction set):
//   amx          AMX-BF16 tiles (_tile_dpbf16ps; 16 x 16 fp32 accumulators, 2 x 2 of them per
//                32 x 32 output block), AVX-512 elementwise;
//   avx512_bf16  vdpbf16ps on zmm registers (8 rows x 32 columns of accumulators);
//   emulated-avx2, emulated  the same bf16 operands widened to fp32 (exact) and multiplied in
//                fp32 (AVX2+FMA, or SSE2): the same arithmetic up to summation order, for CPUs
//                without bf16 units (AMD Zen 3), slower than the fp32 kernel there.
// The default is the widest the CPU allows (cpu_features(): TETRAD_MAX_CPU_ISA caps it), and an
// emulated one where bf16 GEMMs are emulated (TETRAD_BF16=emulate, set_bf16_emulation_forced).
//
// Memory per call: the packed operands (bf16, about 3 (forward) or 7 (backward) copies of q's
// size); per thread a 32 x T block of scores (fp32) and probabilities (bf16) (the backward: two
// of each), and in the backward the chunk's dSᵀ (bf16, 32⌈Tq/32⌉ x min(512, 32⌈Tk/32⌉)), dK and
// dV of the chunk and the group's dQᵀ (fp32, group x 32⌈hd/32⌉ x (32⌈Tq/32⌉ + 16)); thread_local
// arenas kept between calls (they grow to the largest call, never shrink).
// Determinism: every output element is computed by one task in an order fixed by the shapes:
// bit-identical between runs and for any thread count (for a given path).
// Speed: docs/precision.md ("bf16 attention").
#pragma once
#include <cstdint>

#include "tetrad/backend/cpu/attention.hpp"

namespace tetrad::kernels {

enum class AttentionBf16Path { kEmulated, kEmulatedAvx2, kAvx512Bf16, kAmx };
const char* attention_bf16_path_name(AttentionBf16Path p);  // "emulated", ..., "amx"
bool attention_bf16_path_supported(AttentionBf16Path p);
// The path the calls without one take (see above).
AttentionBf16Path attention_bf16_default_path();
// The kernels' head_dim limit; their checks of d's shape and strides and of the path (every
// entry runs them: an Error naming what is wrong).
inline constexpr int kAttentionBf16MaxHeadDim = 1024;
void attention_bf16_check(const AttentionDims& d, AttentionBf16Path p);

void attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                            const float* v, const AttentionDims& d, int64_t q_offset);
void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* q,
                             const float* k, const float* v, const float* out, const float* lse,
                             const AttentionDims& d, int64_t q_offset);
// A given path (it must be supported; tests and benchmarks force each).
void attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                            const float* v, const AttentionDims& d, int64_t q_offset,
                            AttentionBf16Path path);
void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* q,
                             const float* k, const float* v, const float* out, const float* lse,
                             const AttentionDims& d, int64_t q_offset, AttentionBf16Path path);

// The backward with the forward's q, k, v and out read from bf16 copies of them (the rows and
// strides of the fp32 ones; dout, dq, dk, dv fp32): the same bits as attention_backward_bf16 on
// their fp32 widenings (a model's stored bf16 tensors, parallel/activation_layout.hpp's
// Bf16Stash, read without a pass widening them).
void attention_backward_bf16_saved(float* dq, float* dk, float* dv, const float* dout,
                                   const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const uint16_t* out, const float* lse, const AttentionDims& d,
                                   int64_t q_offset);
void attention_backward_bf16_saved(float* dq, float* dk, float* dv, const float* dout,
                                   const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const uint16_t* out, const float* lse, const AttentionDims& d,
                                   int64_t q_offset, AttentionBf16Path path);

// "amx (AMX-BF16 tiles)" etc.: the path the default calls take here (for benchmarks and the
// backend's description).
const char* attention_bf16_path();

}  // namespace tetrad::kernels
