#include "tetrad/train/loss_mask.hpp"

#include <vector>

#include "tetrad/core/error.hpp"
#include "tetrad/core/hash.hpp"
#include "tetrad/core/rng.hpp"

namespace tetrad {

LossMaskMode parse_loss_mask(const std::string& s) {
  if (s == "none") return LossMaskMode::None;
  if (s == "goldfish") return LossMaskMode::Goldfish;
  if (s == "static") return LossMaskMode::Static;
  if (s == "random") return LossMaskMode::Random;
  fail("train.loss_mask: unknown mask '", s, "'; expected \"none\", \"goldfish\", \"static\" or \"random\"");
}

std::string loss_mask_name(LossMaskMode m) {
  switch (m) {
    case LossMaskMode::None: return "none";
    case LossMaskMode::Goldfish: return "goldfish";
    case LossMaskMode::Static: return "static";
    case LossMaskMode::Random: return "random";
  }
  return "?";
}

void LossMask::validate() const {
  if (mode == LossMaskMode::None) return;
  if (k < 2)
    fail("train.goldfish_k must be at least 2 (it drops 1 in k targets; k = ", k,
         " would drop every target)");
  if (mode == LossMaskMode::Goldfish && h < 1)
    fail("train.goldfish_h (context width) must be at least 1, got ", h);
}

double goldfish_uniform(const int32_t* ctx, int h) {
  const uint64_t x = hash64(ctx, sizeof(int32_t) * size_t(h), 0x60D1F15Bull);
  return double(x >> 11) * 0x1.0p-53;
}

int64_t apply_loss_mask(const LossMask& m, int32_t* targets, int B, int T, int64_t step,
                        int micro, int rows_stride, int row_offset) {
  if (m.mode == LossMaskMode::None) return 0;
  const double p = 1.0 / m.k;
  int64_t dropped = 0;
  std::vector<int32_t> row(T);
  for (int b = 0; b < B; ++b) {
    int32_t* y = targets + int64_t(b) * T;
    std::copy(y, y + T, row.begin());  // decide on the original tokens, then mark
    for (int i = 0; i < T; ++i) {
      bool drop = false;
      switch (m.mode) {
        case LossMaskMode::Goldfish:
          drop = i >= m.h - 1 && goldfish_uniform(row.data() + i - (m.h - 1), m.h) < p;
          break;
        case LossMaskMode::Static:
          drop = (i + 1) % m.k == 0;
          break;
        case LossMaskMode::Random: {
          const uint64_t key[5] = {m.seed, uint64_t(step), uint64_t(micro),
                                   uint64_t(int64_t(b) * rows_stride + row_offset), uint64_t(i)};
          drop = double(hash64(key, sizeof key) >> 11) * 0x1.0p-53 < p;
          break;
        }
        case LossMaskMode::None:
          break;
      }
      if (drop && y[i] >= 0) {
        y[i] = -1;
        ++dropped;
      }
    }
  }
  return dropped;
}

}  // namespace tetrad
