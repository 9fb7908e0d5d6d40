// The correctness contract on the context-parallel axis C (issue 28): each sequence cut into
// 2 Gc chunks, rank c holding chunks c and 2 Gc - 1 - c, attention over the keys and values
// all-gathered over C. 20 steps of the tiny model through the trainer's StepRunner give the
// serial losses (relative 1e-5), gradient norms (1e-4) and weights (2e-4) on C = 2 (2 ranks),
// C = 2 with each of X, Y, Z, D and P and C = 4 (4 ranks), C = 2 x X = 2 x D = 2 (8 ranks); GPT-2
// (learned positions, multi-head), Llama (RoPE, grouped-query heads) and Qwen3 (q/k norms);
// recomputation is bit-identical to none; ZeRO 1/2 shard over D x C; bad sequence lengths and
// decoding are refused by name.
#include <gtest/gtest.h>

#include <map>

#include "contract.hpp"
#include "support/parallel_options.hpp"

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

using tetrad_test::parallel_options;

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
// Qwen3's per-head q/k norms on each rank's chunks of the tokens (norm weights replicated).
TEST(ContextContract, Qwen3TrainsLikeOneRank) { check_family(Family::Qwen3); }

// Recomputation gathers the keys and values again: bit-identical to none; ZeRO 1 and 2 deal
// their pieces over D x C and train like one rank. On the first grid of each size.
TEST(ContextContract, RecomputeAndZero) {
  for (Family family : {Family::GPT2, Family::Llama}) {
    const ModelConfig mc = tiny_model(family, 2);
    const GridShape shape = context_grids(world_size()).front();
    ProcessGroups g(comm::Communicator::world(), shape);
    const contract::Run none = parallel_run(mc, g, 10, parallel_options(Recompute::None, 0));
    for (Recompute mode : {Recompute::Selective, Recompute::Full}) {
      const contract::Run r = parallel_run(mc, g, 10, parallel_options(mode, 0));
      EXPECT_EQ(r.losses, none.losses) << describe(family, shape, parallel_options(mode, 0));
      EXPECT_EQ(r.weights, none.weights) << describe(family, shape, parallel_options(mode, 0));
    }
    const contract::Run serial = serial_run(mc, kSteps);
    for (int zero : {1, 2}) {
      const ParallelOptions po = parallel_options(Recompute::Full, zero);
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
  ParallelTransformer m(mc, g, kB / token_slots(shape), kT, parallel_options(Recompute::None, 1));
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
    ParallelOptions none = parallel_options(Recompute::None, 0);
    ParallelOptions full = parallel_options(Recompute::Full, 2);
    none.cp_comm = full.cp_comm = ContextComm::Ring;
    const contract::Run rn = parallel_run(mc, g, 10, none), rf = parallel_run(mc, g, 10, full);
    ParallelOptions full0 = parallel_options(Recompute::Full, 0);
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

// The ring moves what the other ranks need and nothing more: each step's block is the K|V rows
// of a rank's two chunks (2 x n_kv_head x hd per token of this rank's heads, the queries stay
// home) and, in the backward, their dK|dV in the same layout; in the trace every "K/V ring" and
// "dK/dV ring" transfer is B x T x 2 x n_kv_head x hd floats, Gc - 1 K/V sends per layer and pass
// and Gc dK/dV sends per layer. Llama with grouped-query heads: a third of the q|k|v row.
TEST(ContextContract, RingSendsKeysAndValuesOnly) {
  const ModelConfig mc = tiny_model(Family::Llama, 2);
  const GridShape shape = context_grids(world_size()).front();
  ProcessGroups g(comm::Communicator::world(), shape);
  ParallelOptions po;
  po.cp_comm = ContextComm::Ring;
  const int Bl = kB / token_slots(shape), Tl = kT / shape.c();
  ParallelTransformer m(mc, g, Bl, kT, po);
  m.init_weights(7);
  StepProfile prof;
  TraceLog log;
  log.recording = true;
  prof.trace = &log;
  m.set_profile(&prof);
  std::vector<int32_t> x(size_t(Bl) * Tl), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t(i % 7), y[i] = int32_t(i % 5);
  m.zero_grads();
  m.forward_backward(x.data(), y.data(), Bl, Tl, 1.0f);
  m.reduce_gradients();
  m.finish_communication();
  const int64_t hd = mc.n_embd / mc.n_head, kv_heads = mc.n_kv_head / shape.y();
  const int64_t kv_bytes = int64_t(Bl) * Tl * 2 * kv_heads * hd * int64_t(sizeof(float));
  const int64_t qkv_bytes = int64_t(Bl) * Tl * (mc.n_head / shape.y() + 2 * kv_heads) * hd *
                            int64_t(sizeof(float));
  ASSERT_LT(kv_bytes, qkv_bytes) << "the test model has grouped-query heads";
  int kv_sends = 0, dkv_sends = 0;
  for (const TraceEvent& e : log.events) {
    const bool kv = e.name.find("K/V ring") != std::string::npos && e.name.find("dK/dV") == std::string::npos;
    const bool dkv = e.name.find("dK/dV ring") != std::string::npos;
    if (!kv && !dkv) continue;
    EXPECT_NE(e.args.find("\"bytes\":" + std::to_string(kv_bytes) + ","), std::string::npos)
        << e.name << ": " << e.args << " (expected " << kv_bytes << " bytes of K|V rows, not the "
        << qkv_bytes << " of whole q|k|v rows)";
    if (e.name.rfind("send", 0) == 0) (kv ? kv_sends : dkv_sends) += 1;
  }
  const int G = shape.c(), layers = mc.n_layer;
  EXPECT_EQ(kv_sends, 2 * layers * (G - 1)) << "K|V sends: forward and backward, Gc - 1 per layer";
  EXPECT_EQ(dkv_sends, layers * G) << "dK|dV sends: Gc per layer";

  // The all-gathered method moves the same K|V rows: Gc blocks per all-gather (forward and
  // backward) and per reduce-scatter of dK|dV.
  po.cp_comm = ContextComm::AllGather;
  ParallelTransformer ma(mc, g, Bl, kT, po);
  ma.init_weights(7);
  TraceLog alog;
  alog.recording = true;
  StepProfile aprof;
  aprof.trace = &alog;
  ma.set_profile(&aprof);
  ma.zero_grads();
  ma.forward_backward(x.data(), y.data(), Bl, Tl, 1.0f);
  ma.reduce_gradients();
  ma.finish_communication();
  int gathers = 0, scatters = 0;
  for (const TraceEvent& e : alog.events) {
    const bool gather = e.name.rfind("allgather keys/values over C", 0) == 0;
    const bool scatter = e.name.rfind("reduce_scatter dK/dV over C", 0) == 0;
    if (!gather && !scatter) continue;
    EXPECT_NE(e.args.find("\"bytes\":" + std::to_string(G * kv_bytes) + ","), std::string::npos)
        << e.name << ": " << e.args << " (expected Gc x " << kv_bytes << " bytes of K|V rows)";
    (gather ? gathers : scatters) += 1;
  }
  EXPECT_EQ(gathers, 2 * layers) << "one all-gather per layer and pass";
  EXPECT_EQ(scatters, layers) << "one reduce-scatter per layer";
}
