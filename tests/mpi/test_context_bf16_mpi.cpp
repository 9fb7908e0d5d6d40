// The bf16 contract on the context-parallel axis C (issue 28): bf16 GEMMs, bf16 activations and
// the bf16 weight copy (the run `train.precision = bf16` makes), on C = 2 (2 ranks), C = 2 x D = 2
// (4 ranks) and C = 2 x X = 2 x D = 2 (8 ranks), against the same bf16 model trained on one rank:
// 20 steps through the trainer's StepRunner, every step's loss within the bf16 contract (2% of
// the loss, as Bf16Grid and SequenceShard hold grids to), GPT-2 (learned positions) and Llama
// (RoPE, grouped-query heads), the all-gathered and the ring exchange, recompute none and full,
// ZeRO 2 over D x C. The comparison is not empty: the bf16 runs train and differ from fp32.
// Under mpirun -n 2, 4, 8.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "contract.hpp"

using namespace contract;

namespace {

constexpr int kSteps = 20;
constexpr double kBf16Contract = 0.02;  // relative, on each step's loss

std::vector<GridShape> bf16_context_grids(int n) {
  using A = Axis;
  switch (n) {
    case 2: return {GridShape({{A::C, 2}})};
    case 4: return {GridShape({{A::C, 2}, {A::D, 2}})};
    case 8: return {GridShape({{A::C, 2}, {A::X, 2}, {A::D, 2}})};
    default: return {};
  }
}

ParallelOptions bf16_options(ContextComm comm, Recompute recompute = Recompute::None, int zero = 0) {
  ParallelOptions po;
  po.precision = backend::Precision::BF16;
  po.cp_comm = comm;
  po.recompute = recompute;
  po.zero = zero;
  return po;
}

std::string describe(const ModelConfig& mc, const GridShape& s, const ParallelOptions& po) {
  return family_name(mc.family) + " grid " + s.to_string() + " bf16 cp_comm " +
         (po.cp_comm == ContextComm::Ring ? "ring" : "all-gather") + " recompute " +
         recompute_name(po.recompute) + " zero " + std::to_string(po.zero);
}

// Every step's loss of `grid` within the bf16 contract of `one` (one rank's bf16 run); the
// largest relative difference.
double expect_within_contract(const Run& grid, const Run& one, const std::string& where) {
  EXPECT_EQ(grid.losses.size(), one.losses.size()) << where;
  double worst = 0;
  for (size_t s = 0; s < std::min(grid.losses.size(), one.losses.size()); ++s) {
    EXPECT_TRUE(std::isfinite(grid.losses[s])) << where << " step " << s + 1;
    const double rel = std::abs(grid.losses[s] / one.losses[s] - 1.0);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, kBf16Contract) << where << " step " << s + 1 << ": " << grid.losses[s]
                                  << " against one rank's " << one.losses[s];
  }
  return worst;
}

void check_family(Family family) {
  const ModelConfig mc = tiny_model(family, 2);
  ProcessGroups one;  // this rank alone: the bf16 reference
  const Run one_bf16 = parallel_run(mc, one, kSteps, bf16_options(ContextComm::AllGather));
  // Not an empty comparison: the reference trains (its weights move; the contract's tokens are
  // random, so the loss itself stays near ln V) and it is a bf16 run, not fp32's bits.
  ParallelOptions fp32;
  const Run one_init = parallel_run(mc, one, 0, fp32);
  ASSERT_GT(worst_weight_difference(one_bf16, one_init, mc), 1e-2) << "the bf16 run did not train";
  const Run one_fp32 = parallel_run(mc, one, 3, fp32);
  EXPECT_NE(one_fp32.losses[2], one_bf16.losses[2]) << "bf16 gave fp32's loss: not a bf16 run";
  int tested = 0;
  for (const GridShape& shape : bf16_context_grids(world_size())) {
    ProcessGroups g(comm::Communicator::world(), shape);
    for (ContextComm comm : {ContextComm::AllGather, ContextComm::Ring}) {
      const ParallelOptions po = bf16_options(comm);
      const Run run = parallel_run(mc, g, kSteps, po);
      const double worst = expect_within_contract(run, one_bf16, describe(mc, shape, po));
      if (g.world.rank() == 0)
        std::printf("%s: largest loss difference from one rank's bf16 run %.3g%% over %d steps\n",
                    describe(mc, shape, po).c_str(), 100 * worst, kSteps);
      ++tested;
    }
  }
  if (world_size() >= 2) {
    EXPECT_GT(tested, 0);
  }
}

}  // namespace

TEST(ContextBf16, Gpt2WithinTheBf16ContractOfOneRank) { check_family(Family::GPT2); }
TEST(ContextBf16, LlamaGqaWithinTheBf16ContractOfOneRank) {
  ASSERT_LT(tiny_model(Family::Llama, 2).n_kv_head, tiny_model(Family::Llama, 2).n_head);
  check_family(Family::Llama);
}

// Full recomputation (the keys and values exchanged again in the backward) and ZeRO 2 over
// D x C, on the first grid of the size, the ring exchange.
TEST(ContextBf16, RecomputeAndZeroWithinTheBf16Contract) {
  const std::vector<GridShape> grids = bf16_context_grids(world_size());
  if (grids.empty()) GTEST_SKIP() << "no context grid for " << world_size() << " ranks";
  const ModelConfig mc = tiny_model(Family::Llama, 2);
  ProcessGroups one;
  ProcessGroups g(comm::Communicator::world(), grids.front());
  for (const ParallelOptions& po :
       {bf16_options(ContextComm::Ring, Recompute::Full), bf16_options(ContextComm::Ring, Recompute::None, 2)}) {
    ParallelOptions mine = po;
    mine.zero = 0;  // one rank: nothing to shard
    const contract::Run ref = parallel_run(mc, one, kSteps, mine);
    expect_within_contract(parallel_run(mc, g, kSteps, po), ref, describe(mc, g.shape, po));
  }
}
