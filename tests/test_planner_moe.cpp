// The planner's mixture of experts (planner.hpp, issue 32): active FLOPs against a hand
// count, the experts' memory per rank at E = 1, 2, 4 against a hand computation, the all-to-all's
// bytes and cost, and E in the grid search (chosen where memory needs it, not where it costs).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "support/test_machine.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/memory_model.hpp"
#include "tetrad/planner/planner.hpp"
#include "tetrad/planner/report.hpp"
#include "tetrad/planner/validate.hpp"
#include "tetrad/train/auto_grid.hpp"

using namespace tetrad;
using namespace tetrad::planner;

namespace {

PlanInput input(const std::string& model, int ranks, int64_t batch, int64_t micro, int seq) {
  PlanInput in;
  in.model = planner_model(model);
  in.model_name = model;
  in.seq = seq;
  in.global_batch = batch;
  in.micro_batch = micro;
  in.ranks = ranks;
  return in;
}

GridShape grid(int z, int d, int c = 1) {
  GridShape g;
  g[parallel::Axis::Z] = z;
  g[parallel::Axis::D] = d;
  g[parallel::Axis::C] = c;
  return g;
}

// Mixtral 8x7B by hand: per layer q|k|v (32 + 2 x 8) x 128 x 4096, output 4096 x 4096, router
// 8 x 4096, one SwiGLU expert 3 x 14336 x 4096; 32 layers; head 32000 x 4096 (untied).
constexpr double kQkv = 48.0 * 128 * 4096, kOut = 4096.0 * 4096, kRouter = 8.0 * 4096;
constexpr double kExpert = 3.0 * 14336 * 4096, kHead = 32000.0 * 4096;

}  // namespace

TEST(PlannerMoe, ActiveFlopsOfMixtral8x7bByHand) {
  const ModelConfig m = planner_model("mixtral-8x7b");
  // Active: the 2 experts a token is routed to and the router, not all 8.
  const double n_active = 32 * (kQkv + kOut + kRouter + 2 * kExpert) + kHead;
  EXPECT_DOUBLE_EQ(n_active, 12748587008.0);  // 12.7B in GEMMs (+ 0.13B embedding = 12.9B active)
  const double n_all = 32 * (kQkv + kOut + kRouter + 8 * kExpert) + kHead;
  EXPECT_NEAR(double(count_parameters(m)), n_all + kHead + 32 * 2 * 4096 + 4096, 0.5);  // 46.7B
  const int S = 4096, B = 2;
  const double attn_full = 12.0 * 32 * 4096 * S;  // 12 L A S per token
  EXPECT_DOUBLE_EQ(model_flops_per_step(m, B, S, AttentionFlops::Full), (6 * n_active + attn_full) * B * S);
  EXPECT_DOUBLE_EQ(model_flops_per_step(m, B, S, AttentionFlops::Causal),
                   (6 * n_active + attn_full / 2) * B * S);
  // The trainer's count (model/params.cpp, active_numel) agrees.
  EXPECT_DOUBLE_EQ(flops_per_token(m, S, AttentionFlops::Full) * B * S,
                   model_flops_per_step(m, B, S, AttentionFlops::Full));
  EXPECT_DOUBLE_EQ(flops_per_token(m, S, AttentionFlops::Causal) * B * S,
                   model_flops_per_step(m, B, S, AttentionFlops::Causal));
  // Full recomputation: one more forward of every block's active weights.
  EXPECT_DOUBLE_EQ(hardware_flops_per_step(m, B, S, Recompute::Full, AttentionFlops::Full) -
                       model_flops_per_step(m, B, S, AttentionFlops::Full),
                   (2 * 32 * (kQkv + kOut + kRouter + 2 * kExpert) + 4.0 * 32 * 4096 * S) * B * S);
}

TEST(PlannerMoe, IssueBenchmarkModelIsAbout157MflopPerToken) {
  // Issue 32's benchmark model: 8 experts top 2, hidden 512, expert width 1408, 4 layers, 8 heads
  // (2 KV), vocabulary 8192, sequence 512: "about 157 MFLOP per token" (attention in full).
  ModelConfig m = named_model("mixtral-tiny");
  m.n_layer = 4, m.n_embd = 512, m.n_head = 8, m.n_kv_head = 2, m.ffn = 1408, m.vocab_size = 8192;
  m.n_experts = 8, m.max_seq = 512;
  const double block = (8 + 4) * 64.0 * 512 + 512.0 * 512 + 8.0 * 512 + 2 * 3.0 * 1408 * 512;
  const double per_token = 6 * (4 * block + 8192.0 * 512) + 12.0 * 4 * 512 * 512;
  EXPECT_NEAR(per_token / 1e6, 157.4, 0.05);
  EXPECT_DOUBLE_EQ(model_flops_per_step(m, 1, 512, AttentionFlops::Full), per_token * 512);
}

TEST(PlannerMoe, ExpertMemoryPerRankAtE1E2E4ByHand) {
  // Mixtral 8x7B, fp32, Z = 1, D = 4: every rank holds all dense weights and 8 / E experts of
  // each layer. tetrad's layout: 4 bytes of weights, 4 of gradients, 8 of Adam's moments per
  // parameter; ZeRO 1 shards the moments over the expert-data group (4 / E ranks) for experts.
  PlanInput in = input("mixtral-8x7b", 4, 4, 4, 1024);
  const double experts_all = 32 * 8 * kExpert;
  const double dense = double(count_parameters(in.model)) - experts_all;
  const GridShape g = grid(1, 4);
  for (int zero : {0, 1}) {
    in.zero = zero;
    for (int ep : {1, 2, 4}) {
      in.expert_parallel = ep;
      ASSERT_EQ(divisibility_problem(in, g), "") << "E = " << ep;
      const MemoryBreakdown mb = memory_per_rank(in, g);
      const double local = dense + experts_all / ep;
      EXPECT_DOUBLE_EQ(mb.weights, 4 * local) << "E = " << ep;
      EXPECT_DOUBLE_EQ(mb.grads, 4 * local) << "E = " << ep;
      // ZeRO 1: the dense moments over 4 ranks (pieces of ceil(n / 4): every tensor divides),
      // the experts' 1/E over the 4 / E ranks of the expert-data group: 1/4 of all whatever E.
      const double opt = zero == 0 ? 8 * local : 8 * (dense / 4 + experts_all / ep / (4.0 / ep));
      EXPECT_DOUBLE_EQ(mb.optimizer, opt) << "E = " << ep << ", ZeRO " << zero;
      // Staging does not depend on E here. The activations gain the expert exchange's scratch
      // at its dropless worst case: E ranks' 1024 tokens each, min(k = 2, 8 / E) choices of
      // each on this rank's experts (every token to them), each row's staging, input, output
      // (3 x 4096), gate|up and its gradient (4 x 14336), SwiGLU and its gradient (2 x 14336)
      // in fp32.
      in.expert_parallel = 1;
      const MemoryBreakdown one = memory_per_rank(in, g);
      const double rows = ep == 1 ? 0 : ep * 1024.0 * std::min(2, 8 / ep);
      EXPECT_DOUBLE_EQ(mb.activations, one.activations + rows * (3 * 4096 + 6 * 14336) * 4)
          << "E = " << ep;
      EXPECT_DOUBLE_EQ(mb.staging, one.staging);
    }
  }
  // Every E is the trainer's own formula on the grid with that fold.
  in.zero = 0;
  for (int ep : {1, 2, 4}) {
    in.expert_parallel = ep;
    GridShape ge = g;
    const parallel::ModelMemory mm = parallel::model_memory(in.model, ge.set_e(ep), parallel::GridCoord{}, 1,
                                                            1024, model_options(in), in.schedule, 1);
    EXPECT_DOUBLE_EQ(memory_per_rank(in, g).total(), memory_breakdown(mm).total()) << "E = " << ep;
    EXPECT_EQ(mm.expert_exchange > 0, ep > 1);
  }
  // With Z = 2 as well, the experts are split over Z too and the Z gather slots hold 1/E of them.
  in.expert_parallel = 2;
  const GridShape gz = grid(2, 2);
  const MemoryBreakdown two = memory_per_rank(in, gz);
  in.expert_parallel = 1;
  const MemoryBreakdown one = memory_per_rank(in, gz);
  EXPECT_DOUBLE_EQ(one.weights - two.weights, 4 * experts_all / 2 / 2);
  EXPECT_DOUBLE_EQ(one.gathered - two.gathered, 4 * 8 * kExpert / 2);  // prefetch 0: one slot
}

TEST(PlannerMoe, ExpertAxisMustDivideDataTimesContextAndTheExperts) {
  PlanInput in = input("mixtral-tiny", 8, 8, 8, 64);
  EXPECT_EQ(expert_parallel_candidates(in, grid(1, 8)), (std::vector<int>{1, 2, 4}));  // 4 experts
  EXPECT_EQ(expert_parallel_candidates(in, grid(2, 4)), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(expert_parallel_candidates(in, grid(4, 2)), (std::vector<int>{1, 2}));
  EXPECT_EQ(expert_parallel_candidates(in, grid(1, 2, 2)), (std::vector<int>{1, 2, 4}));  // C x D
  EXPECT_EQ(expert_parallel_candidates(in, grid(8, 1)), (std::vector<int>{1}));
  in.expert_parallel = 4;
  EXPECT_NE(divisibility_problem(in, grid(4, 2)).find("does not divide Gc x Gd = 2"), std::string::npos);
  PlanInput three = input("mixtral-tiny", 3, 3, 3, 64);
  three.expert_parallel = 3;
  EXPECT_NE(divisibility_problem(three, grid(1, 3)).find("does not divide model.n_experts = 4"), std::string::npos);
  PlanInput dense = input("llama-tiny", 2, 2, 2, 64);
  EXPECT_EQ(expert_parallel_candidates(dense, grid(1, 2)), (std::vector<int>{1}));
  dense.expert_parallel = 2;
  EXPECT_NE(divisibility_problem(dense, grid(1, 2)).find("needs a mixture of experts"), std::string::npos);
  // Folding: rank j of the C x D group is expert rank j mod E, expert-data rank j / E.
  EXPECT_EQ(expert_group_ranks(grid(1, 8), 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(expert_data_group_ranks(grid(1, 8), 2), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(expert_group_ranks(grid(2, 4), 4), (std::vector<int>{0, 2, 4, 6}));  // z fastest
}

TEST(PlannerMoe, AllToAllBytesCallsAndLinkModel) {
  // Inside one node: (g - 1)/g of the buffer at the intra bandwidth, g - 1 latencies.
  const Machine m = tetrad_test::test_machine(4);
  const double n = 1e6;
  EXPECT_DOUBLE_EQ(alltoall_seconds(n, {0, 1, 2, 3}, 4, m), 0.75 * n / 200e9 + 3 * 5e-6);
  // Two nodes of 2 members each (8 ranks, 4 per node): half the buffer leaves the node through
  // NICs the node's 4 ranks share (100 GB/s / 4), a quarter stays inside; inter-node latencies.
  EXPECT_DOUBLE_EQ(alltoall_seconds(n, {0, 1, 4, 5}, 8, m), 0.5 * n / 25e9 + 3 * 10e-6);
  // The plan: T x k x H x 4 bytes per call per rank, 5 calls per layer per micro-batch as the
  // trainer runs them (forward: dispatch, combine; backward: the dispatch recomputed, the
  // gradients' dispatch and combine), 7 with full recomputation; before each pass the row counts
  // (E_n int64 per rank).
  PlanInput in = input("mixtral-tiny", 2, 4, 2, 64);  // T = 64 tokens per rank per micro-batch
  in.expert_parallel = 2;
  for (Recompute rc : {Recompute::None, Recompute::Full}) {
    in.recompute = rc;
    const Estimate e = estimate(in, grid(1, 2), m);
    ASSERT_TRUE(e.valid) << e.reject;
    int found = 0;
    for (const auto& c : e.collectives)
      if (c.op == Op::AllToAll) {
        ++found;
        const bool rows = c.what == "all-to-all of expert dispatch/combine";
        EXPECT_TRUE(rows || c.what == "all-to-all of expert row counts") << c.what;
        EXPECT_EQ(c.group_name(), "e");
        EXPECT_DOUBLE_EQ(c.bytes, rows ? 64.0 * 2 * 64 * 4 : 4.0 * 8);
        const double per_layer = rows ? (rc == Recompute::Full ? 7 : 5) : (rc == Recompute::Full ? 3 : 2);
        EXPECT_DOUBLE_EQ(c.calls, per_layer * 2.0 * 2);  // x L x micro-batches
        EXPECT_DOUBLE_EQ(c.seconds, c.calls * alltoall_seconds(c.bytes, {0, 1}, 2, m));
        EXPECT_DOUBLE_EQ(c.exposed, c.seconds) << c.what << ": not overlapped";
        EXPECT_FALSE(c.inter_node);
      }
    EXPECT_EQ(found, 2);
    EXPECT_EQ(e.expert_parallel, 2);
    EXPECT_NE(why_text(in, m, e).find("all-to-all"), std::string::npos);
    EXPECT_NE(why_text(in, m, e).find("train it with: tetrad train --grid d=2,e=2\n"), std::string::npos);
    EXPECT_EQ(e.to_json()["trainer_grid"].get<std::string>(), "d=2,e=2");
  }
}

TEST(PlannerMoe, ExpertAxisChosenWhenMemoryNeedsIt) {
  // Mixtral 8x7B in bf16 on 16 H100s (2 nodes), 256 x 4096 tokens, full recomputation, ZeRO 1,
  // overlap all, the micro-batch searched, no pipeline: 841 GB of state. E = 8 folded over D
  // stores one expert per rank (the exchange's scratch sized for its dropless worst case) and
  // comes first, trainable; at E = 1 the grids that fit split every expert over all 16 ranks
  // (X, Y and Z), slower; the first choice's grid at E = 1 does not fit.
  PlanInput in = input("mixtral-8x7b", 16, 256, 0, 4096);
  in.search_micro_batch = true;
  in.precision = Precision::BF16;
  in.recompute = Recompute::Full;
  in.zero = 1;
  in.overlap = Overlap::All;
  in.allow_pipeline = false;
  const Machine m = load_machine("h100-ib");
  const auto rows = plan(in, m);
  ASSERT_FALSE(rows.empty());
  ASSERT_TRUE(rows.front().valid);
  EXPECT_EQ(rows.front().expert_parallel, 8) << plan_label(rows.front());
  EXPECT_TRUE(rows.front().trainable);
  EXPECT_EQ(rows.front().grid.e(), 8);  // the grid the trainer gets
  int e1 = 0;
  for (const Estimate& e : rows)
    if (e.valid && e.expert_parallel == 1) {
      ++e1;
      EXPECT_EQ(e.grid.x() * e.grid.y() * e.grid.z(), 16) << plan_label(e);
      EXPECT_GT(e.step, rows.front().step) << plan_label(e);
    }
  EXPECT_GT(e1, 0);
  PlanInput one = in;
  one.expert_parallel = 1;
  const Estimate first1 = estimate(one, GridShape(rows.front().grid).set_e(1), m);
  EXPECT_FALSE(first1.valid);
  EXPECT_NE(first1.reject.find("does not fit"), std::string::npos) << first1.reject;
  // The text says MFU is on active FLOPs and names the expert axis, trainable.
  const std::string text = plan_text(in, m, rows, 5, 5);
  EXPECT_NE(text.find("MFU is on active FLOPs"), std::string::npos);
  EXPECT_NE(text.find(" e8 "), std::string::npos);
  EXPECT_EQ(text.find("not trainable"), std::string::npos);
  // With the pipeline allowed, a pipeline over 8 stages with Y = 2 fits at E = 1 and comes first
  // (the E rows pay five exposed all-to-alls a layer and a worst-case scratch).
  in.allow_pipeline = true;
  const auto rows_p = plan(in, m);
  ASSERT_TRUE(rows_p.front().valid);
  EXPECT_EQ(rows_p.front().expert_parallel, 1) << plan_label(rows_p.front());
  EXPECT_GT(rows_p.front().grid.p(), 1) << plan_label(rows_p.front());
}

TEST(PlannerMoe, ExpertAxisNotChosenWhenTheAllToAllCostsMore) {
  // One rank per node on a slow network, plenty of memory, many micro-batches: every layer's
  // all-to-all crosses nodes on every micro-batch while the step's gradient all-reduce is done
  // once; E = 1 (experts replicated, no all-to-all) is faster and the plan keeps it.
  Machine m = tetrad_test::test_machine(1);
  m.inter_bandwidth = 1e9;
  m.memory_bytes = 1e12;
  PlanInput in = input("mixtral-tiny", 2, 512, 2, 64);
  in.allow_pipeline = false;  // grids of D = 2 (or Z = 2): E = 1 or 2
  const auto rows = plan(in, m);
  ASSERT_TRUE(rows.front().valid);
  EXPECT_EQ(rows.front().expert_parallel, 1) << plan_label(rows.front());
  in.expert_parallel = 2;
  const Estimate e2 = estimate(in, grid(1, 2), m);
  in.expert_parallel = 1;
  const Estimate e1 = estimate(in, grid(1, 2), m);
  ASSERT_TRUE(e1.valid && e2.valid);
  EXPECT_GT(e2.step, e1.step);
  EXPECT_EQ(e2.dominant, "comm e");
  // The same model with one micro-batch of few tokens: on D = 2 the gradient all-reduce of every
  // expert dominates and E = 2 (half the experts' gradients, over a group of 1) pays. The plan's
  // first row has no expert gradients over D at all: E = 2, or the experts split over the tensor
  // axes X or Y instead of replicated over D.
  PlanInput small = input("mixtral-tiny", 2, 2, 2, 64);
  small.allow_pipeline = false;
  const auto rows_small = plan(small, m);
  ASSERT_TRUE(rows_small.front().valid);
  const Estimate& first = rows_small.front();
  EXPECT_TRUE(first.expert_parallel == 2 || first.grid.x() * first.grid.y() == 2)
      << plan_label(first);
  small.expert_parallel = 2;
  const Estimate s2 = estimate(small, grid(1, 2), m);
  small.expert_parallel = 1;
  const Estimate s1 = estimate(small, grid(1, 2), m);
  ASSERT_TRUE(s1.valid && s2.valid);
  EXPECT_LT(s2.step, s1.step);
}

TEST(PlannerMoe, GridAutoChoosesTheFoldAndTheTrainersFormulaIsThePlans) {
  // `--grid auto` for mixtral-tiny (4 experts, top 2; 4 x 32 tokens, fp32) on 2 ranks of the
  // shipped local machine: the planner's first choice folds E = 2 over D = 2 (the experts'
  // gradient all-reduce at E = 1 costs more than the all-to-all of 64 tokens' rows), and the
  // grid the trainer builds from the printed string is that grid.
  RunConfig cfg = load_run_config("", {"model.name=mixtral-tiny", "train.seq_len=32", "train.micro_batch=4",
                                       "train.precision=fp32", "parallel.machine=local"});
  const AutoGrid a = choose_grid(cfg, 2, 2, backend::cpu_backend());
  EXPECT_EQ(a.grid.e(), 2) << a.why;
  EXPECT_EQ(a.grid.size(), 2);
  EXPECT_NE(a.why.find("grid auto: " + a.grid.to_arg() + " "), std::string::npos) << a.why;
  EXPECT_EQ(parallel::parse_grid(trainer_grid_string(a.grid)), a.grid);
  EXPECT_EQ(trainer_grid_string(GridShape(grid(1, 2)).set_e(2)), "d=2,e=2");
  EXPECT_EQ(resolve_grid(cfg, 2, 2, backend::cpu_backend()).grid, a.grid);
  // The trainer's memory check (train/memory_check.cpp: memory_per_rank of plan_input_of on the
  // run's grid) gives the plan's row for that grid, byte for byte, and both are the model's own
  // arithmetic on rank 0 (model_memory): 1/E of the experts' weights, gradients and moments,
  // and the exchange's scratch for 2 ranks x 64 tokens x min(k, 4 / E) = 256 rows.
  const PlanInput in = plan_input_of(cfg, 2, backend::cpu_backend());
  Machine m = load_machine("local");
  m.ranks_per_node = 2;
  const MemoryBreakdown trainer = memory_per_rank(in, a.grid);
  int found = 0;
  for (const Estimate& e : plan(in, m))
    if (e.grid == a.grid) {
      ++found;
      EXPECT_TRUE(e.valid && e.trainable) << e.reject;
      EXPECT_EQ(e.expert_parallel, 2);
      EXPECT_DOUBLE_EQ(e.memory.total(), trainer.total());
      EXPECT_DOUBLE_EQ(e.memory.activations, trainer.activations);
    }
  EXPECT_EQ(found, 1);
  const parallel::ModelMemory mm =
      parallel::model_memory(cfg.model, a.grid, parallel::GridCoord{}, 4 / parallel::token_slots(a.grid), 32,
                             model_options(in));
  EXPECT_DOUBLE_EQ(trainer.total(), memory_breakdown(mm).total());
  const MemoryBreakdown one = memory_per_rank(in, GridShape(a.grid).set_e(1));
  const double experts = 2.0 * 4 * 3 * 96 * 64;  // L x n_e x (gate, up, down) x F x C
  EXPECT_DOUBLE_EQ(one.weights - trainer.weights, 4 * experts / 2);
  EXPECT_DOUBLE_EQ(one.optimizer - trainer.optimizer, 8 * experts / 2);
  EXPECT_DOUBLE_EQ(trainer.activations - one.activations, 256.0 * (3 * 64 + 6 * 96) * 4);
  // parallel.expert_parallel = 2 fixes the fold: --grid auto chooses among E = 2 grids only.
  RunConfig fixed = cfg;
  fixed.expert_parallel = 2;
  fixed.train.micro_batch = 64;  // E = 1 would be first here
  for (const Estimate& e : plan(plan_input_of(fixed, 2, backend::cpu_backend()), m))
    EXPECT_EQ(e.expert_parallel, 2) << plan_label(e);
  EXPECT_EQ(choose_grid(fixed, 2, 2, backend::cpu_backend()).grid.e(), 2);
}

TEST(PlannerMoe, ExpertsOnXAndYSumTheirRowsAndTheSharedExpertCounts) {
  // The trainer's experts on X and Y (parallel/expert_mlp.cpp, moe_block.cpp): per layer the
  // router's logits [T, n_e] over X, the experts' gate|up rows [T k, 2F/Gy] over X and down rows
  // [T k, H/Gx] over Y; backward the combine weights' gradient [T, k] over X, down's dx
  // [T k, F/Gy] over X, gate|up's dx [T k, H/Gx] over Y; fp32 buffers (4 bytes) in bf16 too.
  // The dense MLP's collectives are not priced for a mixture.
  Machine m = tetrad_test::test_machine(4);
  m.memory_bytes = 1e15;  // the terms, not the fit
  PlanInput in = input("mixtral-8x7b", 4, 4, 4, 512);
  in.precision = Precision::BF16;
  const double H = 4096, F = 14336, T = 4 * 512, k = 2, ne = 8;
  auto bytes_of = [&](const Estimate& e, const std::string& what) {
    for (const auto& c : e.collectives)
      if (c.what == what) return c.bytes;
    return -1.0;
  };
  const Estimate xy = estimate(in, GridShape::xyzpd(2, 2, 1, 1, 1), m);
  ASSERT_TRUE(xy.valid) << xy.reject;
  EXPECT_DOUBLE_EQ(bytes_of(xy, "fwd all-reduce of router logits"), T * ne * 4);
  EXPECT_DOUBLE_EQ(bytes_of(xy, "fwd all-reduce of experts' gate|up"), T * k * 2 * F / 2 * 4);
  EXPECT_DOUBLE_EQ(bytes_of(xy, "fwd all-reduce of experts' down"), T * k * H / 2 * 4);
  EXPECT_DOUBLE_EQ(bytes_of(xy, "bwd all-reduce of combine weights' gradient"), T * k * 4);
  EXPECT_DOUBLE_EQ(bytes_of(xy, "bwd all-reduce of experts' down dx"), T * k * F / 2 * 4);
  EXPECT_DOUBLE_EQ(bytes_of(xy, "bwd all-reduce of experts' gate|up dx"), T * k * H / 2 * 4);
  EXPECT_EQ(bytes_of(xy, "fwd all-reduce of MLP-up output"), -1.0);
  EXPECT_EQ(bytes_of(xy, "fwd all-reduce of MLP-down output"), -1.0);
  // Their cost grows with the grid's X and Y: a plan on X x Y has more exposed communication
  // than the dense MLP's pricing would have given (k = 2 rows a token, fp32).
  double fwd = 0;
  for (const auto& c : xy.collectives)
    if (c.what.find("experts'") != std::string::npos || c.what.find("router") != std::string::npos) fwd += c.seconds;
  EXPECT_GT(fwd, 0.0);

  // The shared expert (Qwen2-MoE's form, model.shared_expert_ffn = Fs): every token's FLOPs, its
  // GEMMs' seconds and the block the Z ranks gather, as the trainer counts them.
  ModelConfig sm = planner_model("mixtral-8x7b");
  sm.shared_expert_ffn = 2048;
  sm.validate();
  const ModelConfig plain = planner_model("mixtral-8x7b");
  const int S = 512;
  const double shared = 3.0 * 2048 * H + H;  // gate|up, down, the sigmoid gate's [1, H]
  EXPECT_DOUBLE_EQ(model_flops_per_step(sm, 1, S, AttentionFlops::Full) -
                       model_flops_per_step(plain, 1, S, AttentionFlops::Full),
                   6 * 32 * shared * S);
  EXPECT_DOUBLE_EQ(flops_per_token(sm, S, AttentionFlops::Full) * S,
                   model_flops_per_step(sm, 1, S, AttentionFlops::Full));  // the trainer's count
  PlanInput with = input("mixtral-8x7b", 4, 4, 4, S);
  with.model = sm;
  PlanInput without = input("mixtral-8x7b", 4, 4, 4, S);
  const GridShape z = GridShape::xyzpd(1, 1, 2, 1, 2);
  const Estimate ew = estimate(with, z, m), eo = estimate(without, z, m);
  ASSERT_TRUE(ew.valid) << ew.reject;
  ASSERT_TRUE(eo.valid) << eo.reject;
  EXPECT_GT(ew.compute_gemm, eo.compute_gemm);
  EXPECT_DOUBLE_EQ(bytes_of(ew, "all-gather of layer weights (fwd)") - bytes_of(eo, "all-gather of layer weights (fwd)"),
                   shared * 4);  // fp32, Gx = Gy = 1
  // The grid refuses the shared expert on X or Y, naming it.
  const Estimate bad = estimate(with, GridShape::xyzpd(2, 1, 1, 1, 2), m);
  EXPECT_FALSE(bad.valid);
  EXPECT_NE(bad.reject.find("shared expert"), std::string::npos) << bad.reject;
}
