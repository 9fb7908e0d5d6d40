// The ParallelTransformer's activation views (its Acts) into its one activation buffer, laid out
// by the constructor (parallel_transformer.cpp). An implementation header of the
// ParallelTransformer's source files only; nothing outside src/tetrad/parallel/ includes it.
#pragma once
#include <vector>

namespace tetrad::parallel {

// Activation views, local sizes: N tokens of this rank, Cx = C/Gx hidden slice, QKVy = q|k|v of
// this rank's heads, Ay = C/Gy attention output slice, FWy/Fy = MLP slices, Vy = vocabulary slice.
struct ParallelActivations {
  struct PerLayer {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *resid_mid, *ln2, *ln2_mean, *ln2_rstd,
        *fc, *fc_act, *resid_out;
  };
  std::vector<PerLayer> layer;
  float *emb, *lnf, *lnf_mean, *lnf_rstd, *logits, *losses, *tmp;
  float *dresid, *dln, *dqkv, *datty, *dfc, *dfc_act;
};

}  // namespace tetrad::parallel
