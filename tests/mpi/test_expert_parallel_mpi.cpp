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
  const ModelConfig mc = moe_model();
  const int n = world_size();
  std::vector<int> folds = {1, 2};
  if (n >= 4) folds.push_back(4);
  std::vector<std::vector<float>> saved;
  double first_loss = 0;
  for (int e : folds) {
    ProcessGroups g(comm::Communicator::world(), with_e(GridShape{{Axis::D, n}}, e));
    const int Bl = kB / token_slots(g.shape), slot = token_slot(g.coord, g.shape);
    ParallelTransformer m(mc, g, Bl, kT);
    if (saved.empty()) {
      m.init_weights(5);
      for (size_t i = 0; i < m.table().specs.size(); ++i) {
        saved.emplace_back(size_t(m.table().specs[i].numel));
        m.get_tensor(i, saved.back().data());
      }
    } else {
      for (size_t i = 0; i < saved.size(); ++i) m.set_tensor(i, saved[i].data());
    }
    std::vector<int32_t> x(size_t(Bl) * kT), y(x.size());
    tetrad_test::rank_share(batch_tokens(3, 0, mc.vocab_size), kT, Bl, slot, 0, x.data(), y.data());
    m.zero_grads();
    double loss = m.forward_backward(x.data(), y.data(), Bl, kT, 1.0f / (kB * kT));
    if (g.tokens().size() > 1) g.tokens().allreduce_sum(&loss, 1);
    if (e == 1) first_loss = loss;
    EXPECT_NEAR(loss / first_loss, 1.0, 1e-6) << "E = " << e;
    for (size_t i = 0; i < saved.size(); ++i) {  // read back whole, bit for bit
      std::vector<float> back(saved[i].size());
      m.get_tensor(i, back.data());
      ASSERT_EQ(back, saved[i]) << "E = " << e << " tensor " << m.table().specs[i].name;
    }
  }
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
