// bf16 gradient communication (train.grad_comm_precision = "bf16", parallel/bf16_grad_comm.hpp).
// The collectives, on 2, 4 and 8 ranks: on random data the bf16 reduce-scatter and all-reduce
// give exactly the documented formula (each contribution rounded to bf16 once, fp32 sums in rank
// order; the all-reduce rounds each sum once more), stay within bf16 tolerance of the fp32
// collective, never NaN, and are bitwise the same on a second run. The training: the tiny model
// 200 steps in bf16 on Z = 2 x D = 2 (4 ranks only), bf16 gradient communication against fp32
// gradient communication (ZeRO 0: Z reduce-scatters and data-parallel buckets; ZeRO 2: the
// per-layer reduce-scatters over Z then D): mean loss of the last 10 steps within 2%.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "contract.hpp"
#include "learnable_stream.hpp"
#include "mpi_test.hpp"
#include "tetrad/backend/backend.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/parallel/bf16_grad_comm.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/optimizer.hpp"
#include "tetrad/train/step_runner.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

using mpi_test::world_rank;
using mpi_test::world_size;

// Rank r's data: normal values of mixed magnitudes (a gradient's spread), seeded by r.
std::vector<float> data_of(int r, size_t n) {
  Rng g(900 + uint64_t(r));
  std::vector<float> v(n);
  for (auto& x : v) x = float(g.normal() * std::exp2(double(int(g.next_u64() % 12)) - 6));
  return v;
}

std::vector<float> bf16_round(const std::vector<float>& x) {
  backend::Backend& be = backend::cpu_backend();
  std::vector<uint16_t> b(x.size());
  std::vector<float> y(x.size());
  be.ops().cast_f32_to_bf16(be.queue(), b.data(), x.data(), int64_t(x.size()));
  be.ops().cast_bf16_to_f32(be.queue(), y.data(), b.data(), int64_t(x.size()));
  return y;
}

// Σ over ranks of |x| per element of block `blk` (the scale of the rounding error).
void check_close(const std::vector<float>& got, const std::vector<float>& fp32,
                 const std::vector<double>& abs_sum, double rel, const char* what) {
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
    ASSERT_LE(std::abs(double(got[i]) - double(fp32[i])), rel * abs_sum[i] + 1e-30)
        << what << " element " << i << ": bf16 " << got[i] << ", fp32 " << fp32[i];
  }
}

}  // namespace

TEST(Bf16GradComm, ReduceScatterIsTheFp32SumOfRoundedContributions) {
  const int G = world_size(), me = world_rank();
  backend::Backend& be = backend::cpu_backend();
  comm::Communicator w = comm::Communicator::world("w");
  for (size_t n : {size_t(1), size_t(37), size_t(4099)}) {
    const auto mine = data_of(me, size_t(G) * n);
    std::vector<float> got(n, -1), again(n, -2), fp32(n);
    reduce_scatter_sum_bf16(be, w, mine.data(), got.data(), int64_t(n));
    reduce_scatter_sum_bf16(be, w, mine.data(), again.data(), int64_t(n));
    w.reduce_scatter_sum(mine.data(), fp32.data(), n);
    // The formula, from every rank's data (each rank can make it).
    std::vector<float> want(n, 0.0f);
    std::vector<double> abs_sum(n, 0.0);
    for (int r = 0; r < G; ++r) {
      const auto all = data_of(r, size_t(G) * n);
      const std::vector<float> block(all.begin() + long(me * n), all.begin() + long((me + 1) * n));
      const auto rounded = bf16_round(block);
      for (size_t i = 0; i < n; ++i) {
        want[i] = r == 0 ? rounded[i] : want[i] + rounded[i];
        abs_sum[i] += std::abs(double(block[i]));
      }
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], want[i]) << "n " << n << " element " << i;
      ASSERT_EQ(std::memcmp(&got[i], &again[i], sizeof(float)), 0) << "second run, element " << i;
    }
    // One rounding per contribution (relative error at most 2^-8: 8 significant bits, nearest
    // even) plus fp32 sums.
    check_close(got, fp32, abs_sum, std::exp2(-8) + 1e-6, "reduce-scatter");
  }
}

TEST(Bf16GradComm, AllReduceIsWithinBf16OfTheFp32OneAndTheSameOnEveryRank) {
  const int G = world_size(), me = world_rank();
  backend::Backend& be = backend::cpu_backend();
  comm::Communicator w = comm::Communicator::world("w");
  for (size_t n : {size_t(1), size_t(5), size_t(1001), size_t(65536)}) {
    const auto mine = data_of(me, n);
    std::vector<float> got = mine, again = mine, fp32 = mine;
    allreduce_sum_bf16(be, w, got.data(), int64_t(n));
    allreduce_sum_bf16(be, w, again.data(), int64_t(n));
    w.allreduce_sum(fp32.data(), n);
    std::vector<double> abs_sum(n, 0.0);
    for (int r = 0; r < G; ++r) {
      const auto x = data_of(r, n);
      for (size_t i = 0; i < n; ++i) abs_sum[i] += std::abs(double(x[i]));
    }
    // Contributions rounded once (2^-8 each) and the sum once more (2^-8 of |sum| <= Σ|x|).
    check_close(got, fp32, abs_sum, std::exp2(-7) + 1e-6, "all-reduce");
    ASSERT_EQ(std::memcmp(got.data(), again.data(), n * sizeof(float)), 0) << "second run, n " << n;
    // Every rank holds the same bits: compare with rank 0's.
    std::vector<float> zero = got;
    w.broadcast(zero.data(), n, 0);
    ASSERT_EQ(std::memcmp(got.data(), zero.data(), n * sizeof(float)), 0) << "n " << n;
    // And the bf16 result is not the fp32 one (the test would be empty otherwise), for n > 1.
    if (n > 100) {
      ASSERT_NE(std::memcmp(got.data(), fp32.data(), n * sizeof(float)), 0);
    }
  }
}

namespace {

using namespace learnable_stream;  // the stream of tests/mpi/test_precision_mpi.cpp

std::vector<double> train_bf16(const ModelConfig& mc, ProcessGroups& g, bool grad_comm_bf16, int zero) {
  const int Bl = kB / token_slots(g.shape);
  const int slot = token_slot(g.coord, g.shape);
  ParallelOptions po;
  po.precision = backend::Precision::BF16;
  po.attention_precision = backend::Precision::FP32;
  po.grad_comm_bf16 = grad_comm_bf16;
  po.zero = zero;
  ParallelTransformer m(mc, g, Bl, kT, po);
  m.init_weights(7);
  const TrainConfig tc = train_config();
  // Through apply_update, as the trainer runs it (with ZeRO the optimizer updates pieces).
  AdamW opt = tetrad_test::layout_adamw(m, tc, &backend::cpu_backend());
  // The trainer's own step (train/step_runner.hpp), one micro-batch, clipped at norm 1.
  StepRunner runner(m, opt, g, tetrad_test::step_options(tc, 1, Bl, kT));
  std::vector<double> losses;
  std::vector<int32_t> x(size_t(Bl) * kT), y(x.size());
  for (int s = 0; s < kSteps; ++s) {
    tetrad_test::rank_share(batch(s, mc.vocab_size), kT, Bl, slot, 0, x.data(), y.data());
    losses.push_back(runner.run(x.data(), y.data(), double(kB * kT), learning_rate(tc, s), s).loss);
  }
  m.finish_communication();
  return losses;
}

double last10(const std::vector<double>& l) {
  double s = 0;
  for (int i = kSteps - 10; i < kSteps; ++i) s += l[size_t(i)] / 10;
  return s;
}

}  // namespace

TEST(Bf16GradComm, TrainingOnZ2D2TracksFp32GradientCommunication) {
  if (world_size() != 4) GTEST_SKIP() << "runs on 4 ranks only";
  const ModelConfig mc = contract::tiny_model(Family::GPT2, 2);
  ProcessGroups g(comm::Communicator::world(), GridShape{1, 1, 2, 2});
  for (int zero : {0, 2}) {
    const auto f32 = train_bf16(mc, g, false, zero);
    const auto b16 = train_bf16(mc, g, true, zero);
    const double l32 = last10(f32), l16 = last10(b16);
    if (g.world.rank() == 0)
      std::printf("ZeRO %d, bf16 GEMMs on 1x1x2x2, final loss (mean of last 10 of %d steps): fp32 "
                  "grad comm %.4f, bf16 grad comm %.4f (%+.3f%%); first step %.4f\n",
                  zero, kSteps, l32, l16, 100 * (l16 / l32 - 1), f32[0]);
    EXPECT_LT(l32, 0.6 * f32[0]) << "the fp32 run did not learn; the comparison would be empty";
    EXPECT_NEAR(l16 / l32, 1.0, 0.02) << "ZeRO " << zero << ": fp32 comm " << l32 << ", bf16 " << l16;
    for (double l : b16) ASSERT_TRUE(std::isfinite(l));
    // bf16 communication did change the arithmetic (else the comparison is empty).
    EXPECT_NE(f32.back(), b16.back());
  }
}
