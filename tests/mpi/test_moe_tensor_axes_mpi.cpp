// The mixture of experts on the tensor axes X and Y (docs/moe.md, "On the tensor axes"): the
// router's logits summed over X (the routing sees the whole hidden vector), each expert split
// over X and Y like the dense MLP, with and without the expert fold E. The correctness contract of
// 4d-parallelism.md through the trainer's step (contract.hpp's parallel_run: StepRunner):
// 20 fp32 steps like one rank (loss relative 1e-5, gradient norm 1e-4, weights at the end).
//   2 ranks: X = 2 and Y = 2 (E = 1).
//   4 ranks: E = 2 with D = 2 and X = 2, Y = 2 or C = 2 (Z and P with E = 2: ExpertParallelMpi);
//            X = 2 with Y = 2 (E = 1).
// ZeRO 2 with full recomputation on X = 2 (E = 2 from 4 ranks): 10 steps.
//   8 ranks: E = 2 with X, Y and D; with X, Z and D; with Y, P and D; E = 4 with X over C x D and
//            with Y over D = 4.
// Every token to experts 0 and 1 (the others empty on every rank) on the X and Y grids; a capacity
// factor, the shared expert and the expert bias on two of them; and what
// stays refused by name with the tensor axes (sequence sharding).
#include <cstdio>

#include "moe_contract.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

using namespace moe_contract;

constexpr int kSteps = 20;

GridShape grid(std::initializer_list<std::pair<Axis, int>> extents, int e = 1) {
  GridShape g;
  for (const auto& [a, n] : extents) g[a] = n;
  return g.set_e(e);
}

// This world size's grids (see the header).
std::vector<GridShape> tensor_axis_grids() {
  switch (world_size()) {
    case 2: return {grid({{Axis::X, 2}}), grid({{Axis::Y, 2}})};
    case 4:
      return {grid({{Axis::X, 2}, {Axis::D, 2}}, 2), grid({{Axis::Y, 2}, {Axis::D, 2}}, 2),
              grid({{Axis::C, 2}, {Axis::D, 2}}, 2), grid({{Axis::X, 2}, {Axis::Y, 2}})};
    case 8:
      return {grid({{Axis::X, 2}, {Axis::Y, 2}, {Axis::D, 2}}, 2),
              grid({{Axis::X, 2}, {Axis::Z, 2}, {Axis::D, 2}}, 2),
              grid({{Axis::Y, 2}, {Axis::P, 2}, {Axis::D, 2}}, 2),
              grid({{Axis::X, 2}, {Axis::C, 2}, {Axis::D, 2}}, 4),
              grid({{Axis::Y, 2}, {Axis::D, 4}}, 4)};
    default: return {};
  }
}

}  // namespace

TEST(MoeTensorAxesMpi, EveryGridTrainsLikeOneRank) {
  const ModelConfig mc = moe_model();
  const contract::Run serial = serial_run(mc, kSteps);
  int tested = 0;
  for (const GridShape& shape : tensor_axis_grids()) {
    ProcessGroups g(comm::Communicator::world(), shape);
    expect_matches_serial(parallel_run(mc, g, kSteps, ParallelOptions{}), serial, mc,
                          "grid " + shape.to_string());
    ++tested;
  }
  if (world_rank() == 0)
    std::printf("[ moe tensor axes ] %d grids of %d ranks tested\n", tested, world_size());
  EXPECT_GE(tested, 2);
}

// The shared expert (Qwen2-MoE's form: model.shared_expert_ffn) is the dense MLP's pair on X and
// Y, its gate by columns over X like the router; the expert bias (with the auxiliary loss:
// "both") whole on every rank, moved by the same load on each: the first two grids of this world
// size.
TEST(MoeTensorAxesMpi, SharedExpertAndExpertBiasTrainLikeOneRank) {
  ModelConfig mc = moe_model();
  mc.shared_expert_ffn = 64;
  mc.moe_balance = "both";
  mc.expert_bias_rate = 0.01f;
  mc.validate();
  const contract::Run serial = serial_run(mc, kSteps);
  std::vector<GridShape> grids = tensor_axis_grids();
  grids.resize(std::min<size_t>(grids.size(), 2));
  for (const GridShape& shape : grids) {
    ProcessGroups g(comm::Communicator::world(), shape);
    expect_matches_serial(parallel_run(mc, g, kSteps, ParallelOptions{}), serial, mc,
                          "shared expert and bias, grid " + shape.to_string());
  }
}

// ZeRO 2 (each expert tensor's X/Y block sharded over its expert-data group; E = 1 on 2 ranks)
// with full recomputation (the router's sum over X and the experts' over X and Y rerun): 10 steps.
TEST(MoeTensorAxesMpi, ZeroAndRecomputeOnXTrainLikeOneRank) {
  const int n = world_size();
  constexpr int kShort = 10;
  const ModelConfig mc = moe_model();
  const GridShape shape = grid({{Axis::X, 2}, {Axis::D, n / 2}}, n >= 4 ? 2 : 1);
  ProcessGroups g(comm::Communicator::world(), shape);
  ParallelOptions po;
  po.zero = 2;
  po.recompute = Recompute::Full;
  expect_matches_serial(parallel_run(mc, g, kShort, po), serial_run(mc, kShort), mc,
                        "zero 2, recompute full, grid " + shape.to_string());
}

// A capacity factor drops the micro-batch's choices in token order: the same on every X and Y
// rank (their routing is the same). The first two grids without the context axis (a capacity
// with it is refused: MoeMpi).
TEST(MoeTensorAxesMpi, CapacityFactorDropsTheSameChoicesAsOneRank) {
  ModelConfig mc = moe_model();
  mc.moe_capacity_factor = 0.5f;
  const contract::Run serial = serial_run(mc, kSteps);
  std::vector<GridShape> grids;
  for (const GridShape& shape : tensor_axis_grids())
    if (shape.c() == 1 && grids.size() < 2) grids.push_back(shape);
  for (const GridShape& shape : grids) {
    ProcessGroups g(comm::Communicator::world(), shape);
    expect_matches_serial(parallel_run(mc, g, kSteps, ParallelOptions{}), serial, mc,
                          "capacity 0.5 grid " + shape.to_string());
  }
}

// A router of zeros: experts 0 and 1 take every token, 2 and 3 none, on every X and Y rank
// (moe_contract.hpp: the loss, the statistics and every gradient against one rank).
TEST(MoeTensorAxesMpi, EveryTokenToOneExpertDroplessAndEmptyExperts) {
  std::vector<GridShape> grids;
  for (const GridShape& shape : tensor_axis_grids())
    if (shape.p() == 1 && shape.c() == 1) grids.push_back(shape);  // one micro-batch by hand
  check_every_token_to_experts_0_and_1(moe_model(), grids);
}

// Sequence sharding (parallel.sequence_shard, over Y) is not implemented for the mixture of
// experts: refused by name, never ignored.
TEST(MoeTensorAxesMpi, SequenceShardingIsRefusedByName) {
  const int n = world_size();
  ProcessGroups g(comm::Communicator::world(), grid({{Axis::Y, 2}, {Axis::D, n / 2}}));
  ParallelOptions po;
  po.sequence_shard = true;
  try {
    ParallelTransformer m(moe_model(), g, kB / token_slots(g.shape), kT, po);
    FAIL() << "sequence sharding of a mixture of experts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.sequence_shard is not implemented"),
              std::string::npos)
        << e.what();
  }
}
