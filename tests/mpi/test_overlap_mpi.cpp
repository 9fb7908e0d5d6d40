// Overlap changes when collectives run, never what they compute: on every grid of the world size,
// training with any combination of the overlap switches gives bit-identical losses and weights to
// the same grid with every switch off (tiny model, 2 steps of 2 micro-batches, an evaluation
// between them); forward chunks,
// which split GEMMs, within fp32 rounding. Switches that
// cannot act on a grid (the reduce-scatter, prefetch and cache without Z, the backward all-reduce
// and forward chunks without X or Y, data-parallel buckets without Z x D) are held off there, since
// they run the same code as off. Also: the trace file of a run is valid JSON with one process per
// rank, a compute track and one track per communication group, and named events.
// Runs under mpirun -n 2, 4, 8; the sweep runs on 2 and 4 ranks (8 oversubscribed ranks on two
// cores would take minutes), the trace test on every size.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "contract.hpp"
#include "mpi_test.hpp"
#include "support/train_harness.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/profile.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/parallel/comm_schedule.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/optimizer.hpp"
#include "tetrad/train/step_runner.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

using mpi_test::world_rank;
using mpi_test::world_size;

// Three layers: prefetch depth 2 needs them to differ from depth 1.
ModelConfig tiny_model(Family f) {
  return tetrad_test::small_model(f, {.n_layer = 3, .n_embd = 32, .n_head = 4, .mha_ffn = 64,
                                      .gqa_ffn = 48, .vocab_size = 64, .max_seq = 8});
}

constexpr int kB = 4, kT = 8, kAccum = 2, kSteps = 2;

struct Result {
  std::vector<double> losses;  // this rank's loss sums, per micro-batch
  std::vector<float> params;   // this rank's shard after training
};

Result train(const ModelConfig& mc, ProcessGroups& g, const OverlapOptions& ov,
             StepProfile* prof = nullptr) {
  const GridShape& s = g.shape;
  const int Bl = kB / token_slots(s);
  const int slot = token_slot(g.coord, s);
  ParallelTransformer m(mc, g, Bl, kT, ov);
  m.init_weights(11);
  m.set_profile(prof);
  TrainConfig tc;
  tc.lr = 1e-2;
  tc.warmup_steps = 1;
  std::vector<int64_t> off, size;
  for (const auto& t : m.plan().tensors) {
    off.push_back(t.offset);
    size.push_back(t.shard_numel);
  }
  AdamW opt(decay_ranges(m.table(), tc, off, size), m.num_local_params(), tc);
  // The trainer's own step (train/step_runner.hpp); its per-micro-batch losses are compared.
  StepOptions so = tetrad_test::step_options(tc, kAccum, Bl, kT);
  so.profile = prof;
  StepRunner runner(m, opt, g, so);
  Result r;
  std::vector<int32_t> in(size_t(kAccum) * Bl * kT), tg(in.size());
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < kAccum; ++micro) {
      Rng rng(500 + 17 * step + micro);
      std::vector<int32_t> tok(size_t(kB) * (kT + 1));
      for (auto& x : tok) x = int32_t(rng.next_u64() % uint64_t(mc.vocab_size));
      tetrad_test::rank_share(tok, kT, Bl, slot, micro, in.data(), tg.data());
    }
    runner.run(in.data(), tg.data(), double(kB * kT * kAccum), learning_rate(tc, step), step);
    for (double l : runner.micro_losses()) r.losses.push_back(l);
    if (step == 0) {
      // An evaluation between steps (as the trainer's validation) runs on the gathers the
      // update started (prefetch_across_steps): it must see the updated weights.
      std::vector<int32_t> tok(size_t(Bl) * kT);
      for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((7 * i + slot) % size_t(mc.vocab_size));
      r.losses.push_back(m.forward_loss(tok.data(), tok.data(), Bl, kT));
    }
  }
  const float* p = m.param_data();
  r.params.assign(p, p + m.num_local_params());
  return r;
}

// Every combination of the switches that act on this grid.
std::vector<OverlapOptions> combinations(const GridShape& s) {
  const bool tp = s.x() > 1 || s.y() > 1, z = s.z() > 1, dp = token_slots(s) > 1;
  std::vector<OverlapOptions> out;
  for (int bar = 0; bar <= int(tp); ++bar)
    for (int fc : tp ? std::vector<int>{1, 3} : std::vector<int>{1})
      for (int rs = 0; rs <= int(z); ++rs)
        // Depth 1 on 2 ranks only: 4-rank grids have many more combinations (test time).
        for (int pf : z ? (world_size() == 2 ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 2})
                        : std::vector<int>{0})
          for (int cache = 0; cache <= int(z); ++cache)
            for (int dpo = 0; dpo <= int(dp); ++dpo) {
              OverlapOptions o;
              o.backward_allreduce = bar;
              o.forward_chunks = fc;
              o.reduce_scatter = rs;
              o.prefetch_depth = pf;
              // The next step's first gathers during the optimizer: on in two of three.
              o.prefetch_across_steps = pf > 0 && out.size() % 3 != 0;
              o.cache_gathered_weights = cache;
              o.dp_overlap = dpo;
              // Progress by thread or by polling: half the combinations each.
              o.progress_thread = out.size() % 2 == 1;
              out.push_back(o);
            }
  return out;
}

void expect_identical(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    ASSERT_EQ(std::memcmp(&a.losses[i], &b.losses[i], sizeof(double)), 0)
        << what << ": loss of micro-batch " << i << " " << a.losses[i] << " vs " << b.losses[i];
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i)
    ASSERT_EQ(std::memcmp(&a.params[i], &b.params[i], sizeof(float)), 0)
        << what << ": parameter " << i << " of rank " << world_rank() << ": " << a.params[i]
        << " vs " << b.params[i];
}

// forward_chunks > 1 computes its GEMMs on row chunks, which oneDNN rounds differently from
// one GEMM of the whole: identical within fp32 rounding, not bit for bit.
void expect_close(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    ASSERT_NEAR(a.losses[i], b.losses[i], 1e-5 * std::abs(a.losses[i])) << what;
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i)
    // Adam divides by sqrt(v): a rounding difference in a near-zero gradient moves its weight by
    // up to a fraction of the learning rate (1e-2 here), so weights get 1% of one step.
    ASSERT_NEAR(a.params[i], b.params[i], 1e-4 + 1e-5 * std::abs(a.params[i]))
        << what << ": parameter " << i;
}

void sweep(Family f) {
  if (world_size() > 4) GTEST_SKIP() << "the sweep runs on 2 and 4 ranks";
  const ModelConfig mc = tiny_model(f);
  comm::Communicator world = comm::Communicator::world();
  int runs = 0;
  for (const GridShape& s : contract::contract_grids(mc, kB)) {
    ProcessGroups g(world, s);
    const Result base = train(mc, g, OverlapOptions::all_off());
    for (const OverlapOptions& o : combinations(s)) {
      const std::string what = "grid " + s.to_string() + ", " + o.summary();
      if (o.forward_chunks == 1) expect_identical(base, train(mc, g, o), what);
      else expect_close(base, train(mc, g, o), what);
      ++runs;
    }
    // Data-parallel buckets of several tensors: staged messages, the same with and without overlap.
    if (token_slots(s) > 1) {
      OverlapOptions bucketed = OverlapOptions::all_off();
      bucketed.dp_bucket_mb = 0.002;  // a few tensors of the tiny model per bucket
      const Result b_off = train(mc, g, bucketed);
      bucketed.dp_overlap = true;
      bucketed.reduce_scatter = true;
      expect_identical(b_off, train(mc, g, bucketed), "grid " + s.to_string() + ", buckets");
    }
  }
  if (world_rank() == 0) std::printf("%d overlap combinations checked against overlap off\n", runs);
}

TEST(OverlapMpi, EveryCombinationIsBitIdenticalToOverlapOffGpt2) { sweep(Family::GPT2); }

TEST(OverlapMpi, EveryCombinationIsBitIdenticalToOverlapOffLlama) { sweep(Family::Llama); }

TEST(OverlapMpi, TraceIsValidJsonWithATrackPerGroupAndNamedEvents) {
  const ModelConfig mc = tiny_model(Family::GPT2);
  comm::Communicator world = comm::Communicator::world();
  // The grid with every axis the world size allows: x first, then z, then d.
  GridShape s;
  int n = world_size();
  s[Axis::X] = 2; n /= 2;
  if (n >= 2) { s[Axis::Z] = 2; n /= 2; }
  s[Axis::D] = n;
  ProcessGroups g(world, s);
  StepProfile prof;
  TraceLog log;
  log.recording = true;
  prof.trace = &log;
  OverlapOptions on;
  on.backward_allreduce = on.reduce_scatter = on.dp_overlap = true;
  on.prefetch_depth = 1;
  train(mc, g, on, &prof);
  const std::string path = std::string(TETRAD_BINARY_DIR) + "/overlap_trace_n" +
                           std::to_string(world_size()) + ".json";
  write_trace(g.world, log, path);
  if (world_rank() != 0) return;
  std::ifstream f(path);
  nlohmann::json j;
  ASSERT_NO_THROW(f >> j) << path << " is not valid JSON";
  ASSERT_TRUE(j.contains("traceEvents"));
  std::set<int> pids;
  std::set<std::string> threads;
  int gemm_named = 0, comm_events = 0, compute_events = 0;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e.at("ph");
    pids.insert(e.at("pid").get<int>());
    if (ph == "M" && e.at("name") == "thread_name") threads.insert(e["args"]["name"].get<std::string>());
    if (ph != "X") continue;
    ASSERT_TRUE(e.contains("ts") && e.contains("dur") && e.contains("tid"));
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    const std::string name = e.at("name");
    if (e["tid"].get<int>() == 0) {
      ++compute_events;
      if (name.rfind("gemm ", 0) == 0 && name.find(" L") != std::string::npos &&
          e.contains("args") && e["args"].contains("m"))
        ++gemm_named;
    } else {
      ++comm_events;
      EXPECT_TRUE(e["args"].contains("bytes")) << name;
    }
  }
  EXPECT_EQ(int(pids.size()), world_size());
  EXPECT_TRUE(threads.count("compute"));
  EXPECT_TRUE(threads.count("comm x")) << "X all-reduces get their own track";
  if (s.z() > 1) {
    EXPECT_TRUE(threads.count("comm z"));
  }
  if (token_slots(s) > 1) {
    EXPECT_TRUE(threads.count("comm zd"));
  }
  EXPECT_GT(gemm_named, 0) << "GEMMs are named with their layer and sizes";
  EXPECT_GT(comm_events, 0);
  EXPECT_GT(compute_events, 0);
}

}  // namespace
