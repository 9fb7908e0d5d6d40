// The expert-parallel fold E (GridShape::e(), parallel/expert_parallel.hpp): the experts of the
// Mixtral block split over E of the data (and context) ranks, the rows dispatched to their experts'
// ranks by a variable all-to-all and combined back. The correctness contract of 4d-parallelism.md:
// E = 2 with D = 2, E = 2 and 4 with D = 4, E over C x D, E = 2 and 4 with Z and with P: 20 fp32
// steps like one rank (loss relative 1e-5, weights at the end); ZeRO 1 and 2 (expert state sharded
// over the expert-data group) and full recomputation: 10 steps. Every token to experts 0 and 1 (a
// router of zeros): dropless, the other experts' ranks receive no row. The whole tensors move
// between E = 1, 2 and 4 unchanged (what checkpoints store). Bad input refused by name: E not
// dividing the experts or D x C, E on a dense model. E with X and Y: test_moe_tensor_axes_mpi.cpp.
#include <cstdio>

#include "moe_contract.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

using namespace moe_contract;

constexpr int kSteps = 20;

GridShape with_e(GridShape g, int e) { return g.set_e(e); }

// The expert-parallel grids of this world size: E = every divisor > 1 of n over D; E over C x D,
// E = 2 with Z and with P where the ranks allow, E = 4 with Z and with P on 8 ranks (X and Y:
// test_moe_tensor_axes_mpi.cpp).
std::vector<GridShape> expert_grids() {
  const int n = world_size();
  std::vector<GridShape> g;
  for (int e = 2; e <= n; e *= 2)
    if (n % e == 0 && 4 % e == 0) g.push_back(with_e(GridShape{{Axis::D, n}}, e));
  if (n >= 4) {
    g.push_back(with_e(GridShape{{Axis::C, 2}, {Axis::D, n / 2}}, 4 <= n ? 4 : 2));
    g.push_back(with_e(GridShape{{Axis::Z, 2}, {Axis::D, n / 2}}, 2));
    g.push_back(with_e(GridShape{{Axis::P, 2}, {Axis::D, n / 2}}, 2));
  }
  if (n >= 8) {  // E = 4 with Z and with P
    g.push_back(with_e(GridShape{{Axis::Z, 2}, {Axis::D, n / 2}}, 4));
    g.push_back(with_e(GridShape{{Axis::P, 2}, {Axis::D, n / 2}}, 4));
  }
  return g;
}

}  // namespace

TEST(ExpertParallelMpi, EveryFoldTrainsLikeOneRank) {
  const ModelConfig mc = moe_model();
  const contract::Run serial = serial_run(mc, kSteps);
  int tested = 0;
  for (const GridShape& shape : expert_grids()) {
    ProcessGroups g(comm::Communicator::world(), shape);
    EXPECT_EQ(g.experts().size(), shape.e());
    EXPECT_EQ(g.expert_replicas().size(), shape.size(replica_axes()) / shape.e());
    expect_matches_serial(parallel_run(mc, g, kSteps, ParallelOptions{}), serial, mc,
                   "grid " + shape.to_string());
    ++tested;
  }
  if (world_rank() == 0)
    std::printf("[ expert parallel ] %d grids of %d ranks tested\n", tested, world_size());
  EXPECT_GE(tested, 1);
}

// ZeRO shards each expert tensor's optimizer state (and with ZeRO 2 its gradient) over the
// expert-data group; recomputation reruns the dispatch. 10 steps each (the fold's 20-step
// contract is above); ZeRO 1's and 2's Adam moments agree.
TEST(ExpertParallelMpi, ZeroAndRecomputeTrainLikeOneRank) {
  constexpr int kShort = 10;
  const ModelConfig mc = moe_model();
  const contract::Run serial = serial_run(mc, kShort);
  const int n = world_size();
  const GridShape shape = with_e(GridShape{{Axis::D, n}}, n >= 4 ? 2 : n);  // E < D at n >= 4
  ProcessGroups g(comm::Communicator::world(), shape);
  std::vector<contract::Run> zero;
  for (int z : {1, 2}) {
    ParallelOptions po;
    po.zero = z;
    zero.push_back(parallel_run(mc, g, kShort, po));
    expect_matches_serial(zero.back(), serial, mc, "zero " + std::to_string(z) + " grid " + shape.to_string());
  }
  for (size_t i = 0; i < zero[0].m.size(); ++i)
    for (size_t j = 0; j < zero[0].m[i].size(); ++j) {
      ASSERT_NEAR(zero[1].m[i][j], zero[0].m[i][j], 1e-6 + 1e-4 * std::abs(zero[0].m[i][j])) << "m of tensor " << i;
      ASSERT_NEAR(zero[1].v[i][j], zero[0].v[i][j], 1e-9 + 1e-4 * std::abs(zero[0].v[i][j])) << "v of tensor " << i;
    }
  ParallelOptions po;
  po.recompute = Recompute::Full;
  expect_matches_serial(parallel_run(mc, g, kShort, po), serial, mc, "recompute full " + shape.to_string());
}

// A router of zeros sends every token to experts 0 and 1, both on expert rank 0: it receives
// every row of its expert group (E times its own), the other ranks' experts none, dropless
// (moe_contract.hpp: the loss, statistics and every gradient against one rank).
TEST(ExpertParallelMpi, EveryTokenToOneRanksExpertsDropless) {
  std::vector<GridShape> grids;
  for (const GridShape& shape : expert_grids())
    if (shape.p() == 1 && shape.c() == 1) grids.push_back(shape);  // one micro-batch by hand
  check_every_token_to_experts_0_and_1(moe_model(), grids);
}

// What a checkpoint stores is every tensor whole (gather_tensor / set_tensor): the weights of a
// model trained at one E load into every other E and give the same next steps.
TEST(ExpertParallelMpi, WholeTensorsMoveBetweenFolds) {
  std::vector<int> folds = {1, 2};
  if (world_size() >= 4) folds.push_back(4);
  check_tensors_move_between_folds(moe_model(), folds);
}

TEST(ExpertParallelMpi, BadFoldsAreRefusedNamingTheNumbers) {
  const int n = world_size();
  auto error_of = [&](const ModelConfig& mc, GridShape shape) -> std::string {
    try {
      ProcessGroups g(comm::Communicator::world(), shape);
      ParallelTransformer m(mc, g, 1, kT);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  auto has = [](const std::string& s, const char* part) { return s.find(part) != std::string::npos; };
  // 3 experts over E = 2
  std::string e = error_of(moe_model(3), with_e(GridShape{{Axis::D, n}}, 2));
  EXPECT_TRUE(has(e, "model.n_experts (3) is not divisible by E = 2")) << e;
  // E = 2n over D = n
  e = error_of(moe_model(), with_e(GridShape{{Axis::D, n}}, 2 * n));
  EXPECT_TRUE(has(e, ("E = " + std::to_string(2 * n) + " must divide").c_str())) << e;
  // A dense model
  e = error_of(tiny_model(Family::Llama, 2), with_e(GridShape{{Axis::D, n}}, 2));
  EXPECT_TRUE(has(e, "needs a mixture-of-experts model")) << e;
}

// Precision bf16 (the experts' GEMMs in bf16 from the bf16 weight copy, the SwiGLU stored in
// bf16, the router in fp32: moe_block.hpp) on the fold: E = 2 with D, with X (experts split over
// X), with Z (the router's fp32 weight gathered beside the others' bf16 copy) and under full
// recomputation, 20 steps
// against the same bf16 model on one rank, every step's loss within the bf16 contract (2% of the
// loss, as Bf16Grid and ContextBf16Mpi hold grids to). The reference is a bf16 run that trains
// and is not fp32's bits, and is itself within the contract of fp32 on one rank.
TEST(ExpertParallelMpi, Bf16FoldsTrainLikeOneRankInBf16) {
  constexpr double kBf16Contract = 0.02;
  const ModelConfig mc = moe_model();
  ParallelOptions bf16;
  bf16.precision = backend::Precision::BF16;
  ProcessGroups one;  // this rank alone
  const contract::Run ref = parallel_run(mc, one, kSteps, bf16);
  const contract::Run fp32 = parallel_run(mc, one, kSteps, ParallelOptions{});
  const contract::Run init = parallel_run(mc, one, 0, ParallelOptions{});
  ASSERT_GT(worst_weight_difference(ref, init, mc), 1e-2) << "the bf16 run did not train";
  EXPECT_NE(ref.losses.back(), fp32.losses.back()) << "bf16 gave fp32's loss: not a bf16 run";
  auto within = [&](const contract::Run& run, const contract::Run& to, const std::string& where) {
    ASSERT_EQ(run.losses.size(), to.losses.size()) << where;
    double worst = 0;
    for (size_t s = 0; s < run.losses.size(); ++s) {
      const double rel = std::abs(run.losses[s] / to.losses[s] - 1.0);
      worst = std::max(worst, rel);
      EXPECT_LT(rel, kBf16Contract) << where << " step " << s + 1 << ": " << run.losses[s]
                                    << " against " << to.losses[s];
    }
    if (world_rank() == 0) std::printf("[ expert parallel bf16 ] %s: losses within %.2e\n", where.c_str(), worst);
  };
  within(ref, fp32, "bf16 against fp32 on one rank");
  const int n = world_size();
  std::vector<std::pair<GridShape, Recompute>> runs = {
      {with_e(GridShape{{Axis::D, n}}, 2), Recompute::None},
      {with_e(GridShape{{Axis::D, n}}, 2), Recompute::Full}};
  // The experts split over X as well (the router's logits summed over X), with E where D allows.
  runs.push_back({with_e(GridShape{{Axis::X, 2}, {Axis::D, n / 2}}, n >= 4 ? 2 : 1), Recompute::None});
  if (n >= 4) runs.push_back({with_e(GridShape{{Axis::Z, 2}, {Axis::D, n / 2}}, 2), Recompute::None});
  for (const auto& [shape, rc] : runs) {
    ProcessGroups g(comm::Communicator::world(), shape);
    ParallelOptions po = bf16;
    po.recompute = rc;
    within(parallel_run(mc, g, kSteps, po), ref,
           "bf16 grid " + shape.to_string() + " recompute " + recompute_name(rc) + " against one rank");
  }
}
