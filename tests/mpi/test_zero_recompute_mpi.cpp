// The correctness contract extended to ZeRO over the data axis and activation recomputation
// (issue 9): 20 steps (10 for recomputation) of the tiny model on grids with Gd = 2, 4 (alone and with x, y, z), with
// ZeRO 1 and 2, give the serial losses (relative 1e-5), gradient norms (clipping stays global
// and exact) and, gathered, the serial weights; every recomputation mode gives bit-identical
// losses and weights to no recomputation on the same grid, with and without ZeRO.
// Runs under mpirun -n 2, 4, 8; a representative subset of the grids of each size (8
// oversubscribed ranks on 2 cores are slow).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "contract.hpp"
#include "support/parallel_options.hpp"
#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/core/error.hpp"

using namespace contract;
using tetrad::comm::MpiEnvironment;

namespace {

using tetrad_test::parallel_options;

constexpr int kSteps = 20;

// Grids with a data axis of 2 or 4, alone and combined with x, y and z.
std::vector<GridShape> zero_grids(int n) {
  static const std::map<int, std::vector<GridShape>> grids = {
      {2, {{1, 1, 1, 2}}},
      {4, {{1, 1, 1, 4}, {1, 1, 2, 2}, {2, 1, 1, 2}}},
      {8, {{1, 1, 2, 4}}},
  };
  return grids.at(n);
}

std::vector<GridShape> recompute_grids(int n) {
  static const std::map<int, std::vector<GridShape>> grids = {
      {2, {{2, 1, 1, 1}, {1, 1, 2, 1}}},
      {4, {{1, 1, 2, 2}, {2, 2, 1, 1}}},
      {8, {{2, 2, 2, 1}}},
  };
  return grids.at(n);
}

std::string describe(Family f, const GridShape& s, const ParallelOptions& po) {
  return family_name(f) + " grid " + s.to_string() + " zero " + std::to_string(po.zero) +
         " recompute " + recompute_name(po.recompute);
}

// Llama (no tied embedding, no biases) on the first grid of 2 and 4 ranks only: CI time.
void check_zero(Family family) {
  const ModelConfig mc = tiny_model(family, 2);
  const Run serial = serial_run(mc, kSteps);
  std::vector<GridShape> grids = zero_grids(world_size());
  if (family == Family::Llama) grids.resize(world_size() == 8 ? 0 : 1);
  for (const GridShape& shape : grids) {
    ProcessGroups g(comm::Communicator::world(), shape);
    for (int zero : {1, 2}) {
      ParallelOptions po;
      po.zero = zero;
      expect_matches_serial(parallel_run(mc, g, kSteps, po), serial, mc, describe(family, shape, po));
    }
  }
}

// The optimizer state and (ZeRO 2) the gradients shrink by Gd: each rank's moments are its
// pieces, ceil(shard / Gd) per tensor.
TEST(Zero, StateIsShardedOverTheDataAxis) {
  const ModelConfig mc = tiny_model(Family::GPT2, 2);
  for (const GridShape& shape : zero_grids(world_size())) {
    ProcessGroups g(comm::Communicator::world(), shape);
    ParallelTransformer m0(mc, g, kB / token_slots(shape), kT,
                            parallel_options(Recompute::None, 0));
    ParallelTransformer m1(mc, g, kB / token_slots(shape), kT,
                            parallel_options(Recompute::None, 1));
    ParallelTransformer m2(mc, g, kB / token_slots(shape), kT,
                            parallel_options(Recompute::None, 2));
    const int64_t local = m0.num_local_params();
    EXPECT_EQ(m0.optimizer_layout().state_size, local);
    EXPECT_EQ(m0.num_local_grads(), local);
    // Padding: at most one element per tensor and rank.
    const int64_t pad = int64_t(m0.table().specs.size());
    EXPECT_GE(m1.optimizer_layout().state_size * shape.d(), local);
    EXPECT_LE(m1.optimizer_layout().state_size * shape.d(), local + pad * shape.d());
    EXPECT_EQ(m1.num_local_grads(), local);
    EXPECT_EQ(m2.num_local_grads(), m2.optimizer_layout().state_size);
    // Every element of the local shard is updated by exactly one D rank.
    int64_t mine = 0;
    for (int64_t n : m1.optimizer_layout().sizes) mine += n;
    g.d().allreduce_sum(&mine, 1);
    EXPECT_EQ(mine, local) << shape.to_string();
  }
}

// Checkpoints hold whole moments whatever the sharding: gathered from ZeRO 1/2 pieces they are
// those of ZeRO 0 (fp32 rounding of the different summation order), and cutting whole moments
// into pieces and gathering them back is exact.
TEST(Zero, MomentsGatherLikeWithoutZeroAndScatterBackExactly) {
  const ModelConfig mc = tiny_model(Family::GPT2, 2);
  const GridShape shape = zero_grids(world_size()).front();
  ProcessGroups g(comm::Communicator::world(), shape);
  const contract::Run base = parallel_run(mc, g, 3, parallel_options(Recompute::None, 0));
  for (int zero : {1, 2}) {
    const contract::Run r = parallel_run(mc, g, 3, parallel_options(Recompute::None, zero));
    for (size_t i = 0; i < base.m.size(); ++i) {
      double num = 0, den = 0;
      for (size_t j = 0; j < base.m[i].size(); ++j) {
        num += std::pow(double(r.m[i][j]) - base.m[i][j], 2) + std::pow(double(r.v[i][j]) - base.v[i][j], 2);
        den += std::pow(double(base.m[i][j]), 2) + std::pow(double(base.v[i][j]), 2);
      }
      EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-4) << "zero " << zero << " tensor " << i;
    }
    ParallelTransformer m(mc, g, kB / token_slots(shape), kT,
                          parallel_options(Recompute::None, zero));
    std::vector<float> state(size_t(m.optimizer_layout().state_size));
    for (size_t i = 0; i < base.m.size(); ++i) {
      m.scatter_state_tensor(state.data(), i, base.m[i].data());
      std::vector<float> back(base.m[i].size());
      m.gather_state_tensor(state.data(), i, back.data());
      EXPECT_EQ(back, base.m[i]) << "zero " << zero << " tensor " << i;
    }
  }
}

TEST(ZeroContract, Gpt2ShardedOptimizerTrainsLikeOneRank) { check_zero(Family::GPT2); }
TEST(ZeroContract, LlamaShardedOptimizerTrainsLikeOneRank) { check_zero(Family::Llama); }

// Recomputation repeats the same operations on the same inputs: bit-identical, on any grid.
// 10 steps (bit-identity does not need more; CI time); Llama on the first grid of 2 and 4 ranks.
void check_recompute(Family family) {
  const ModelConfig mc = tiny_model(family, 2);
  const int steps = 10;
  const Run serial = serial_run(mc, steps);
  std::vector<GridShape> grids = recompute_grids(world_size());
  if (family == Family::Llama) grids.resize(world_size() == 8 ? 0 : 1);
  for (const GridShape& shape : grids) {
    ProcessGroups g(comm::Communicator::world(), shape);
    for (int zero : {0, 2}) {
      if (zero > 0 && shape.d() == 1) continue;
      ParallelOptions base = parallel_options(Recompute::None, zero);
      const Run none = parallel_run(mc, g, steps, base);
      expect_matches_serial(none, serial, mc, describe(family, shape, base));
      for (Recompute rc : {Recompute::Selective, Recompute::Full}) {
        ParallelOptions po = parallel_options(rc, zero);
        const Run r = parallel_run(mc, g, steps, po);
        const std::string where = describe(family, shape, po);
        for (int s = 0; s < steps; ++s) {
          EXPECT_EQ(r.losses[s], none.losses[s]) << where << " step " << s + 1;
          EXPECT_EQ(r.grad_norms[s], none.grad_norms[s]) << where << " step " << s + 1;
        }
        EXPECT_EQ(worst_weight_difference(r, none, mc), 0.0) << where;
      }
    }
  }
}

// ZeRO 1/2 with recomputation and every overlap switch that does not split GEMMs: bit-identical
// to the same run with the switches off (the model drops dp_overlap with ZeRO).
TEST(ZeroOverlap, OverlapOnIsBitIdenticalToOff) {
  const int steps = 3;
  const ModelConfig mc = tiny_model(Family::GPT2, 2);
  for (const GridShape& shape : zero_grids(world_size())) {
    ProcessGroups g(comm::Communicator::world(), shape);
    for (int zero : {1, 2}) {
      ParallelOptions po = parallel_options(Recompute::Full, zero);
      const contract::Run off = parallel_run(mc, g, steps, po);
      po.overlap.backward_allreduce = true;
      po.overlap.reduce_scatter = true;
      po.overlap.prefetch_depth = 1;
      po.overlap.dp_overlap = true;
      po.overlap.progress_thread = true;
      const contract::Run with = parallel_run(mc, g, steps, po);
      const std::string where = describe(Family::GPT2, shape, po);
      for (int s = 0; s < steps; ++s) EXPECT_EQ(off.losses[s], with.losses[s]) << where;
      for (size_t i = 0; i < off.weights.size(); ++i)
        EXPECT_TRUE(off.weights[i] == with.weights[i]) << where << ": tensor " << i;
    }
  }
}

// ZeRO's reduce-scatters over D go in chunks of ParallelOptions::reduce_scatter_chunk_bytes (to
// bound Open MPI's temporaries); a chunk of 3 floats per rank cuts every piece of the tiny model
// into many chunks, with a short last one: bit-identical to the default (one call per tensor).
TEST(ZeroChunks, ChunkedReduceScatterIsBitIdentical) {
  const int steps = 3;
  const ModelConfig mc = tiny_model(Family::GPT2, 2);
  for (const GridShape& shape : zero_grids(world_size())) {
    ProcessGroups g(comm::Communicator::world(), shape);
    for (int zero : {1, 2}) {
      ParallelOptions po = parallel_options(Recompute::None, zero);
      const contract::Run whole = parallel_run(mc, g, steps, po);
      po.reduce_scatter_chunk_bytes = int64_t(3 * sizeof(float)) * shape.d();
      const contract::Run chunked = parallel_run(mc, g, steps, po);
      const std::string where = describe(Family::GPT2, shape, po) + " chunked";
      for (int s = 0; s < steps; ++s) {
        EXPECT_EQ(whole.losses[s], chunked.losses[s]) << where << " step " << s + 1;
        EXPECT_EQ(whole.grad_norms[s], chunked.grad_norms[s]) << where << " step " << s + 1;
      }
      EXPECT_EQ(worst_weight_difference(chunked, whole, mc), 0.0) << where;
    }
  }
}

TEST(RecomputeContract, Gpt2EveryModeIsBitIdentical) { check_recompute(Family::GPT2); }
TEST(RecomputeContract, LlamaEveryModeIsBitIdentical) { check_recompute(Family::Llama); }

}  // namespace
