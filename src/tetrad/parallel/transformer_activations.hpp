// The ParallelTransformer's activation views (its Acts) into its one activation buffer, laid out
// by the constructor (parallel_transformer.cpp). An implementation header of the
// ParallelTransformer's source files only; nothing outside src/tetrad/parallel/ includes it.
#pragma once
#include <cstdint>
#include <vector>

namespace tetrad::parallel {

// Activation views, local sizes: N tokens of this rank, Cx = C/Gx hidden slice, QKVy = q|k|v of
// this rank's heads, Ay = C/Gy attention output slice, FWy/Fy = MLP slices, Vy = vocabulary slice.
// With bf16 activations (ParallelOptions::bf16_activations) ln1, ln2, fc_act and lnf are stored in
// bf16 only (the *16 views; the fp32 ones are null), and dout16 / dout16_t hold the bf16 copy of
// the gradient entering a linear layer's backward, as stored and transposed ([N, n_out] and
// [n_out, N], n_out up to the largest layer output).
struct ParallelActivations {
  struct PerLayer {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *resid_mid, *ln2, *ln2_mean, *ln2_rstd,
        *fc, *fc_act, *resid_out;
    uint16_t *ln1_16 = nullptr, *ln2_16 = nullptr, *fc_act16 = nullptr;
  };
  std::vector<PerLayer> layer;
  float *emb, *lnf, *lnf_mean, *lnf_rstd, *logits, *losses, *tmp;
  float *dresid, *dln, *dqkv, *datty, *dfc, *dfc_act;
  uint16_t *lnf16 = nullptr, *dout16 = nullptr, *dout16_t = nullptr;
};

}  // namespace tetrad::parallel
