// The attention core's time in the planner (docs/planner.md, "The attention kernel").
//
// Fused (FlashAttention; tetrad's own kernel): the scores stay on chip, a causal kernel computes
// the half at or below the diagonal: 0.5·4·T·S·A/Gy FLOPs forward (Q·Kᵀ and P·V), twice that
// backward, at the machine's attention_efficiency of peak (FlashAttention-2 measured rates).
//
// Materialized (Megatron-LM's attention before FlashAttention, e.g. its SC21 runs): the scores are
// a tensor in memory, [heads/Gy, S, S] per sequence, and every step is a kernel of its own:
//   forward   Q·Kᵀ (batched GEMM, m = n = S, k = d)      writes the scores
//             scale + causal mask + softmax (fused)      reads and writes them
//             dropout of the probabilities               reads them, writes them and a 1-byte mask
//             P·V (batched GEMM, m = S, n = d, k = S)     reads them
//   backward  dP = dO·Vᵀ, dV = Pᵀ·dO                      writes dP, reads P
//             dropout backward                           reads dP and the mask, writes
//             softmax backward (fused)                   reads the output and the gradient, writes
//             dQ = dS·K, dK = dSᵀ·Q                       read dS
// The GEMMs compute every score (the mask is applied after Q·Kᵀ, not skipped): 4·T·S·A/Gy FLOPs
// forward, twice that backward. A head's GEMM reads its two operands and writes its output once:
// arithmetic intensity 2·S·S·d / (b·(S·S + 2·S·d)), about 88 FLOP/byte for d = 96 in bf16, so on
// an A100 (2039 GB/s, 312 TFLOP/s) the GEMMs run at the memory's pace (179 TFLOP/s), below the
// large GEMMs' gemm_efficiency. The softmax's and dropout's passes are pure memory traffic:
// forward (2b + 2b + 1) bytes per score, backward (2b + 1 + 3b); with recomputation the forward's
// run again in the backward (the caller adds it). The batch of heads x sequences fills the
// machine's units, so no wave quantization applies.
#include "tetrad/planner/planner.hpp"

#include <algorithm>

#include "tetrad/core/error.hpp"

namespace tetrad::planner {

AttentionSeconds attention_core_seconds(const PlanInput& in, const Machine& mach, double T, int gy) {
  const bool bf16 = in.precision == Precision::BF16;
  const double S = in.seq, d = in.model.head_dim(), heads = double(in.model.n_head) / gy;
  const double A = heads * d;  // the attention width on this rank
  const double pk = mach.peak(bf16);
  AttentionSeconds a;
  if (in.attention_kernel == AttentionKernel::Fused) {
    a.fwd = 0.5 * 4 * T * S * A / (pk * mach.attention_eff());
    a.bwd = 2 * a.fwd;
    return a;
  }
  const double b = bf16 ? 2.0 : 4.0;
  const double gemm_flops = 4 * T * S * A;  // Q·Kᵀ and P·V over every score
  const double intensity = 2 * S * S * d / (b * (S * S + 2 * S * d));
  double eff = mach.gemm_efficiency;
  if (mach.memory_bandwidth > 0) eff = std::min(eff, intensity * mach.memory_bandwidth / pk);
  const double scores = T * S * heads;  // (T / S) sequences x heads x S x S
  const double fwd_bytes = scores * (4 * b + 1), bwd_bytes = scores * (5 * b + 1);
  const double bw = mach.memory_bandwidth > 0 ? mach.memory_bandwidth : 1e300;
  a.fwd = gemm_flops / (pk * eff) + fwd_bytes / bw;
  a.bwd = 2 * gemm_flops / (pk * eff) + bwd_bytes / bw;
  return a;
}

}  // namespace tetrad::planner
