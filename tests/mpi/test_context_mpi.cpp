// The correctness contract on the context-parallel axis C (issue 28): each sequence cut into
// 2 Gc chunks, rank c holding chunks c and 2 Gc - 1 - c, attention over the keys and values
// all-gathered over C. 20 steps of the tiny model through the trainer's StepRunner give the
// serial losses (relative 1e-5), gradient norms (1e-4) and weights (2e-4) on C = 2 (2 ranks),
// C = 2 with each of X, Y, Z, D and P and C = 4 (4 ranks), C = 2 x X = 2 x D = 2 (8 ranks); GPT-2
// (learned positions, multi-head) and Llama (RoPE, grouped-query heads); recomputation is
// bit-identical to none; ZeRO 1/2 shard over D x C; bad sequence lengths and decoding are
// refused by name.
#include <gtest/gtest.h>

#include <map>

#include "contract.hpp"

using namespace contract;

namespace {

constexpr int kSteps = 20;

std::vector<GridShape> context_grids(int n) {
  using A = Axis;
  static const std::map<int, std::vector<GridShape>> grids = {
      {2, {{{A::C, 2}}}},
      {4,
       {{{A::C, 2}, {A::X, 2}},
        {{A::C, 2}, {A::Y, 2}},
        {{A::C, 2}, {A::Z, 2}},
        {{A::C, 2}, {A::D, 2}},
        {{A::C, 2}, {A::P, 2}},
        {{A::C, 4}}}},
      {8, {{{A::C, 2}, {A::X, 2}, {A::D, 2}}}},
  };
  return grids.at(n);
}

std::string describe(Family f, const GridShape& s, const ParallelOptions& po) {
  return family_name(f) + " grid " + s.to_string() + " zero " + std::to_string(po.zero) +
         " recompute " + recompute_name(po.recompute);
}

void check_family(Family family) {
  const ModelConfig mc = tiny_model(family, 2);
  const Run serial = serial_run(mc, kSteps);
  for (const GridShape& shape : context_grids(world_size())) {
    ProcessGroups g(comm::Communicator::world(), shape);
    const ParallelOptions po;
    expect_matches_serial(parallel_run(mc, g, kSteps, po), serial, mc, describe(family, shape, po));
  }
}

}  // namespace

TEST(ContextContract, Gpt2TrainsLikeOneRank) { check_family(Family::GPT2); }
TEST(ContextContract, LlamaGqaTrainsLikeOneRank) {
  ASSERT_LT(tiny_model(Family::Llama, 2).n_kv_head, tiny_model(Family::Llama, 2).n_head);
  check_family(Family::Llama);
}

// Recomputation gathers the keys and values again: bit-identical to none; ZeRO 1 and 2 deal
// their pieces over D x C and train like one rank. On the first grid of each size.
TEST(ContextContract, RecomputeAndZero) {
  for (Family family : {Family::GPT2, Family::Llama}) {
    const ModelConfig mc = tiny_model(family, 2);
    const GridShape shape = context_grids(world_size()).front();
    ProcessGroups g(comm::Communicator::world(), shape);
    const contract::Run none = parallel_run(mc, g, 10, {Recompute::None, 0});
    for (Recompute mode : {Recompute::Selective, Recompute::Full}) {
      const contract::Run r = parallel_run(mc, g, 10, {mode, 0});
      EXPECT_EQ(r.losses, none.losses) << describe(family, shape, {mode, 0});
      EXPECT_EQ(r.weights, none.weights) << describe(family, shape, {mode, 0});
    }
    const contract::Run serial = serial_run(mc, kSteps);
    for (int zero : {1, 2}) {
      const ParallelOptions po{Recompute::Full, zero};
      expect_matches_serial(parallel_run(mc, g, kSteps, po), serial, mc, describe(family, shape, po));
    }
  }
}

// The ZeRO pieces are dealt over every replica of the shard: Gc x Gd of them.
TEST(ContextContract, ZeroShardsOverDataTimesContext) {
  const ModelConfig mc = tiny_model(Family::GPT2, 2);
  const GridShape shape = context_grids(world_size()).front();
  ProcessGroups g(comm::Communicator::world(), shape);
  EXPECT_EQ(g.replica_count(), shape.c() * shape.d());
  ParallelTransformer m(mc, g, kB / token_slots(shape), kT, {Recompute::None, 1});
  int64_t mine = 0;
  for (int64_t n : m.optimizer_layout().sizes) mine += n;
  g.replicas().allreduce_sum(&mine, 1);
  EXPECT_EQ(mine, m.num_local_params());
}

TEST(ContextContract, BadInputIsRefusedByName) {
  const ModelConfig mc = tiny_model(Family::Llama, 2);
  const GridShape shape = context_grids(world_size()).front();
  ProcessGroups g(comm::Communicator::world(), shape);
  const int twoC = 2 * shape.c();
  // A sequence that does not cut into 2 Gc chunks.
  try {
    ParallelTransformer m(mc, g, 1, kT + 2, ParallelOptions{});
    ADD_FAILURE() << "sequence " << kT + 2 << " accepted on c=" << shape.c();
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("not divisible by " + std::to_string(twoC)), std::string::npos) << w;
    EXPECT_NE(w.find("train.seq_len"), std::string::npos) << w;
  }
  // Decoding with a KV cache is refused by name.
  ParallelTransformer m(mc, g, 1, kT, ParallelOptions{});
  try {
    m.start_cache(1);
    ADD_FAILURE() << "KV cache accepted on c=" << shape.c();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context-parallel"), std::string::npos) << e.what();
  }
  // A forward of an odd local length (not two chunks).
  std::vector<int32_t> x(size_t(kT), 1);
  EXPECT_THROW(m.forward_loss(x.data(), x.data(), 1, 3), Error);
}

// The ring exchange (parallel.cp_comm = "ring": key/value blocks passed peer to peer round the C
// group, partial results merged by their log-sum-exp, dK/dV returned round the ring) trains like
// one rank on every grid, both families, and like the all-gathered method within the contract's
// tolerance; recomputation and the progress thread repeat the ring's arithmetic bit for bit.
TEST(ContextContract, RingTrainsLikeOneRankAndLikeAllGather) {
  for (Family family : {Family::GPT2, Family::Llama}) {
    const ModelConfig mc = tiny_model(family, 2);
    const contract::Run serial = serial_run(mc, kSteps);
    for (const GridShape& shape : context_grids(world_size())) {
      ProcessGroups g(comm::Communicator::world(), shape);
      ParallelOptions ring;
      ring.cp_comm = ContextComm::Ring;
      const contract::Run r = parallel_run(mc, g, kSteps, ring);
      const std::string where = describe(family, shape, ring) + " ring";
      expect_matches_serial(r, serial, mc, where);
      const contract::Run a = parallel_run(mc, g, kSteps, ParallelOptions{});
      for (size_t s = 0; s < a.losses.size(); ++s)
        EXPECT_NEAR(r.losses[s] / a.losses[s], 1.0, 1e-5) << where << " vs allgather, step " << s + 1;
    }
    const GridShape shape = context_grids(world_size()).front();
    ProcessGroups g(comm::Communicator::world(), shape);
    ParallelOptions none{Recompute::None, 0}, full{Recompute::Full, 2};
    none.cp_comm = full.cp_comm = ContextComm::Ring;
    const contract::Run rn = parallel_run(mc, g, 10, none), rf = parallel_run(mc, g, 10, full);
    ParallelOptions full0{Recompute::Full, 0};
    full0.cp_comm = ContextComm::Ring;
    const contract::Run rf0 = parallel_run(mc, g, 10, full0);
    EXPECT_EQ(rf0.losses, rn.losses) << describe(family, shape, full0) << " ring";
    EXPECT_EQ(rf0.weights, rn.weights) << describe(family, shape, full0) << " ring";
    // The progress thread moving the transfers during the kernels changes no arithmetic.
    ParallelOptions threaded = none;
    threaded.overlap.progress_thread = true;
    const contract::Run rt = parallel_run(mc, g, 10, threaded);
    EXPECT_EQ(rt.losses, rn.losses) << describe(family, shape, threaded) << " ring, progress thread";
    EXPECT_EQ(rt.weights, rn.weights) << describe(family, shape, threaded) << " ring, progress thread";
    expect_matches_serial(rf, serial_run(mc, 10), mc, describe(family, shape, full) + " ring");
  }
}
