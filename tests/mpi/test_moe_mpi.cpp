// The mixture of experts on grids (parallel/moe_block.hpp): the correctness contract of
// 4d-parallelism.md for the Mixtral block. Every grid the block runs on (Z, D, C and P, alone and
// combined) trains 20 fp32 steps like one rank: the same loss at every step (relative 1e-5), the
// same weights at the end. The router's auxiliary loss is not a sum over tokens (E Σ f_e P_e of
// the whole micro-batch), so the ranks that hold a micro-batch's tokens share their routing
// counts: the loss, its gradient and the reported statistics are the micro-batch's, as on one
// rank. Also: the capacity factor's drops (taken in the micro-batch's token order across the
// ranks), every token to one expert (dropless, the other experts empty on every rank), and the
// grid refused by name (a capacity factor with the context axis). X and Y:
// test_moe_tensor_axes_mpi.cpp.
#include <cstdio>

#include "moe_contract.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

using namespace moe_contract;

constexpr int kSteps = 20;

// The x,y,z,d factorisations the model and batch divide without the tensor axes (X and Y:
// test_moe_tensor_axes_mpi.cpp, on fewer grids: 20 steps on each of them all is too long here).
std::vector<GridShape> token_grids(const ModelConfig& mc) {
  std::vector<GridShape> grids;
  for (const GridShape& g : contract_grids(mc))
    if (g.x() == 1 && g.y() == 1) grids.push_back(g);
  return grids;
}

// The grids of this world size the block runs on: token_grids, and those with a pipeline or a
// context axis.
std::vector<GridShape> moe_grids(const ModelConfig& mc) {
  std::vector<GridShape> grids = token_grids(mc);
  const int n = world_size();
  grids.push_back(GridShape{{Axis::P, 2}, {Axis::D, n / 2}});
  grids.push_back(GridShape{{Axis::C, 2}, {Axis::D, n / 2}});
  if (n >= 4) grids.push_back(GridShape{{Axis::Z, 2}, {Axis::P, 2}, {Axis::D, n / 4}});
  return grids;
}

void check_grids(const ModelConfig& mc, const char* what) {
  const contract::Run serial = serial_run(mc, kSteps);
  int tested = 0;
  for (const GridShape& shape : moe_grids(mc)) {
    ProcessGroups g(comm::Communicator::world(), shape);
    const Run par = parallel_run(mc, g, kSteps, ParallelOptions{});
    expect_matches_serial(par, serial, mc, std::string(what) + " grid " + shape.to_string());
    ++tested;
  }
  if (world_rank() == 0)
    std::printf("[ %s ] %d grids of %d ranks tested\n", what, tested, world_size());
  EXPECT_GE(tested, 3);
}

}  // namespace

TEST(MoeMpi, EveryGridTrainsLikeOneRank) { check_grids(moe_model(), "mixtral"); }

// Without renormalising the top k, top 1 of 3 experts, no z-loss.
TEST(MoeMpi, TopOneUnnormalisedTrainsLikeOneRank) {
  ModelConfig mc = moe_model();
  mc.n_experts = 3;
  mc.experts_per_token = 1;
  mc.norm_topk_prob = false;
  mc.router_z_loss_coef = 0;
  mc.validate();
  check_grids(mc, "top-1");
}

// A capacity of ceil(0.5 * N * 2 / 4) rows per expert of a micro-batch's N tokens drops choices;
// which ones depends on the whole micro-batch's token order, so the ranks before this one take
// theirs first. Z and D only (the context axis is refused below).
TEST(MoeMpi, CapacityFactorDropsTheSameChoicesAsOneRank) {
  ModelConfig mc = moe_model();
  mc.moe_capacity_factor = 0.5f;
  const contract::Run serial = serial_run(mc, kSteps);
  for (const GridShape& shape : token_grids(mc)) {
    ProcessGroups g(comm::Communicator::world(), shape);
    expect_matches_serial(parallel_run(mc, g, kSteps, ParallelOptions{}), serial, mc,
                   "capacity 0.5 grid " + shape.to_string());
  }
}

// Every token to experts 0 and 1 (moe_contract.hpp): 2 and 3 receive no token on any rank.
TEST(MoeMpi, EveryTokenToOneExpertDroplessAndEmptyExperts) {
  check_every_token_to_experts_0_and_1(moe_model(), token_grids(moe_model()));
}

TEST(MoeMpi, CapacityWithContextIsRefusedByName) {
  const int n = world_size();
  ModelConfig mc = moe_model();
  mc.moe_capacity_factor = 1.0f;
  try {
    ProcessGroups g(comm::Communicator::world(), GridShape{{Axis::C, 2}, {Axis::D, n / 2}});
    ParallelTransformer m(mc, g, 1, kT);
    FAIL() << "a capacity factor with the context axis was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe_capacity_factor = 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Gc = 2"), std::string::npos) << e.what();
  }
}
