// The Goldfish loss mask and its baselines (train/loss_mask.hpp).
#include <gtest/gtest.h>

#include <vector>

#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/train/config.hpp"
#include "tetrad/train/loss_mask.hpp"

using namespace tetrad;

namespace {
std::vector<int32_t> random_tokens(size_t n, uint64_t seed, int V = 8192) {
  Rng r(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(r.next_u64() % uint64_t(V));
  return t;
}
}  // namespace

TEST(Goldfish, DropRateIsAboutOneInK) {
  for (int k : {3, 4, 8}) {
    LossMask m{LossMaskMode::Goldfish, k, 13, 0};
    const int B = 50, T = 4096;
    auto y = random_tokens(size_t(B) * T, 7 + k);
    const int64_t dropped = apply_loss_mask(m, y.data(), B, T, 0, 0);
    const double eligible = double(B) * (T - 12);
    EXPECT_NEAR(dropped / eligible, 1.0 / k, 0.01) << "k = " << k;
    int64_t marked = 0;
    for (int32_t v : y) marked += v == -1;
    EXPECT_EQ(marked, dropped);
  }
}

TEST(Goldfish, FirstHMinusOnePositionsAreKept) {
  LossMask m{LossMaskMode::Goldfish, 2, 13, 0};
  const int B = 200, T = 40;
  auto y = random_tokens(size_t(B) * T, 3);
  apply_loss_mask(m, y.data(), B, T, 0, 0);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < 12; ++i) EXPECT_GE(y[size_t(b) * T + i], 0) << "row " << b << " pos " << i;
}

TEST(Goldfish, RepeatedPassageIsMaskedIdentically) {
  // The same 300-token passage at offsets 100 and 1000 of one sequence, and at offset 5 of another
  // row: after its first h-1 tokens, the mask inside every copy is the same.
  const int T = 2000, h = 13;
  auto passage = random_tokens(300, 11);
  auto y = random_tokens(size_t(2) * T, 12);
  std::copy(passage.begin(), passage.end(), y.begin() + 100);
  std::copy(passage.begin(), passage.end(), y.begin() + 1000);
  std::copy(passage.begin(), passage.end(), y.begin() + T + 5);
  LossMask m{LossMaskMode::Goldfish, 4, h, 0};
  apply_loss_mask(m, y.data(), 2, T, 0, 0);
  int dropped_in_copy = 0;
  for (int j = h - 1; j < 300; ++j) {
    const bool a = y[100 + j] < 0, b = y[1000 + j] < 0, c = y[T + 5 + j] < 0;
    EXPECT_EQ(a, b) << j;
    EXPECT_EQ(a, c) << j;
    dropped_in_copy += a;
  }
  EXPECT_GT(dropped_in_copy, 40);  // about (300 - 12) / 4
  // A per-position random mask does not have this property.
  auto z = random_tokens(size_t(2) * T, 12);
  std::copy(passage.begin(), passage.end(), z.begin() + 100);
  std::copy(passage.begin(), passage.end(), z.begin() + 1000);
  apply_loss_mask(LossMask{LossMaskMode::Random, 4, h, 5}, z.data(), 2, T, 0, 0);
  int differ = 0;
  for (int j = h - 1; j < 300; ++j) differ += (z[100 + j] < 0) != (z[1000 + j] < 0);
  EXPECT_GT(differ, 50);
}

TEST(Goldfish, MaskDependsOnlyOnTokensNotOnRowOrStep) {
  auto y = random_tokens(3 * 256, 21);
  auto a = y, b = y;
  LossMask m{LossMaskMode::Goldfish, 4, 13, 0};
  apply_loss_mask(m, a.data(), 3, 256, 0, 0, 1, 0);
  apply_loss_mask(m, b.data(), 3, 256, 99, 3, 4, 2);  // another step, micro-batch and row layout
  EXPECT_EQ(a, b);
}

TEST(LossMask, StaticDropsEveryKthAndRandomIsKeyedByGlobalRow) {
  std::vector<int32_t> y(2 * 12, 5);
  apply_loss_mask(LossMask{LossMaskMode::Static, 3, 13, 0}, y.data(), 2, 12, 0, 0);
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 12; ++i) EXPECT_EQ(y[b * 12 + i] < 0, (i + 1) % 3 == 0);
  // Random: rows laid out as on 2 replicas give the same mask as the one-replica batch.
  auto whole = random_tokens(4 * 64, 8);
  auto serial = whole;
  LossMask r{LossMaskMode::Random, 4, 13, 9};
  apply_loss_mask(r, serial.data(), 4, 64, 3, 1);
  for (int slot = 0; slot < 2; ++slot) {
    std::vector<int32_t> part;  // replica `slot` holds global rows slot, slot + 2
    for (int b = 0; b < 2; ++b)
      part.insert(part.end(), whole.begin() + (b * 2 + slot) * 64, whole.begin() + (b * 2 + slot + 1) * 64);
    apply_loss_mask(r, part.data(), 2, 64, 3, 1, 2, slot);
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < 64; ++i) EXPECT_EQ(part[b * 64 + i], serial[(b * 2 + slot) * 64 + i]);
  }
}

TEST(LossMask, NoneLeavesTargetsAloneAndKOneIsRejected) {
  auto y = random_tokens(512, 4);
  auto before = y;
  EXPECT_EQ(apply_loss_mask(LossMask{}, y.data(), 2, 256, 0, 0), 0);
  EXPECT_EQ(y, before);
  try {
    load_run_config("", {"train.loss_mask=goldfish", "train.goldfish_k=1"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.goldfish_k must be at least 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_run_config("", {"train.loss_mask=fish"}), Error);
}
