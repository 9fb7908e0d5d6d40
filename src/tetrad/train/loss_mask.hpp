// Dropping targets from the loss: the Goldfish loss (Hans et al., NeurIPS 2024; see
// ../shared/design/memorization.md) and two baselines to compare it with.
//
//   goldfish  target i is dropped when the hash of the h target tokens ending at i, mapped to
//             u in [0, 1), is below 1/k; the first h-1 targets of a sequence are never dropped.
//             The mask depends only on local context, so every copy of a repeated passage is
//             masked the same way, on any grid.
//   static    every k-th target of a sequence (positions k-1, 2k-1, ...).
//   random    each target independently with probability 1/k, keyed by (seed, step,
//             micro-batch, global row, position): a per-position random mask (it does not stop
//             memorisation of duplicated text, which is the point of comparing).
// A dropped target is set to -1, which the loss ignores; the loss is then averaged over the kept
// targets of the global batch.
#pragma once
#include <cstdint>
#include <string>

namespace tetrad {

enum class LossMaskMode { None, Goldfish, Static, Random };

LossMaskMode parse_loss_mask(const std::string& s);  // Error names the accepted values
std::string loss_mask_name(LossMaskMode m);

struct LossMask {
  LossMaskMode mode = LossMaskMode::None;
  int k = 4;   // drop about 1 in k targets (>= 2)
  int h = 13;  // Goldfish context width
  uint64_t seed = 0;
  void validate() const;  // Error for k < 2 or h < 1 when a mask is on
};

// u in [0, 1) of the h tokens ctx[0..h-1] (XXH64, 53 bits).
double goldfish_uniform(const int32_t* ctx, int h);

// Applies the mask to targets [B, T] in place (dropped -> -1; targets already < 0 stay so).
// Row b of this rank is global row b * rows_stride + row_offset of the micro-batch (the data
// loader's replica layout), which keys the random mode. Returns the number of targets dropped.
int64_t apply_loss_mask(const LossMask& m, int32_t* targets, int B, int T, int64_t step,
                        int micro, int rows_stride = 1, int row_offset = 0);

}  // namespace tetrad
