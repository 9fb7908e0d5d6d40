// One memory formula: parallel::model_memory (what the planner's memory_per_rank, the trainer's
// memory fit check and `tetrad bench`'s memory lines call) against what the parallel model itself
// allocates, on every rank of every grid of this world size the tiny models divide over (X, Y, Z,
// D and their mixtures) and on pipeline grids (1F1B and interleaved), in fp32 and bf16 (bf16
// weight copy, bf16 activations), with recomputation, ZeRO 1 and 2, the Z gather slots of
// prefetching and of cached gathered weights, and staged data-parallel buckets:
//   - state (every buffer ParallelTransformer::state_bytes counts), activations
//     (activation_bytes), the pipeline's stash (PipelineDriver::stash_peak_bytes) and the
//     context axis's exchange buffers (context_bytes: C = 2 with each other axis, C = 4, both
//     exchange methods), each equal to the byte on this rank;
//   - the planner's memory_per_rank equal to the largest rank's total.
// Constructing is enough: no step runs. Under mpirun -n 2, 4, 8.
#include <gtest/gtest.h>

#include <mpi.h>

#include <string>
#include <vector>

#include "contract.hpp"
#include "tetrad/parallel/memory_model.hpp"
#include "tetrad/parallel/pipeline.hpp"
#include "tetrad/planner/planner.hpp"

using namespace contract;

namespace {

constexpr int kLocalB = 2, kLen = 16, kMicro = 4;

std::string describe(const ModelConfig& mc, const GridShape& s, const ParallelOptions& po,
                     PipelineSchedule sched) {
  return family_name(mc.family) + " grid " + s.to_string() + " " +
         (po.precision == backend::Precision::BF16 ? "bf16" : "fp32") + " zero " +
         std::to_string(po.zero) + " recompute " + recompute_name(po.recompute) + " prefetch " +
         std::to_string(po.overlap.prefetch_depth) + (po.overlap.cache_gathered_weights ? " cached" : "") +
         " buckets " + std::to_string(po.overlap.dp_bucket_mb) + " MB" +
         (po.sequence_shard ? " sequence-sharded" : "") +
         (s.c() > 1 ? std::string(" cp_comm ") + (po.cp_comm == ContextComm::Ring ? "ring" : "all-gather") : "") +
         (s.p() > 1 ? std::string(" ") + schedule_name(sched) + " v " + std::to_string(po.virtual_stages) : "");
}

// Builds the model on g and compares its own counts with the formula, on this rank and (the
// planner) over the world.
void check(const ModelConfig& mc, ProcessGroups& g, const ParallelOptions& po,
           PipelineSchedule sched) {
  const std::string where = describe(mc, g.shape, po, sched) + " rank " + std::to_string(world_rank());
  ParallelTransformer model(mc, g, kLocalB, kLen, po);
  int64_t stash = 0;
  if (g.shape.p() > 1) {
    PipelineDriver pipe(model, sched, kMicro);
    stash = pipe.stash_peak_bytes(kLocalB, model.local_len());  // this rank's tokens (C)
  }
  const ModelMemory mm = model_memory(mc, g.shape, g.coord, kLocalB, kLen, po, sched, kMicro);
  EXPECT_EQ(mm.state(), model.state_bytes()) << where;
  EXPECT_EQ(mm.activations, model.activation_bytes()) << where;
  EXPECT_EQ(mm.pipeline, stash) << where;
  EXPECT_EQ(mm.context, model.context_bytes()) << where;
  EXPECT_EQ(mm.context > 0, g.shape.c() > 1) << where;
  EXPECT_EQ(mm.params16 > 0, model.bf16_weights()) << where;
  // The expert exchange's scratch grows with the exchanges (none before a step): its bound is
  // checked against a step in CountsTheExpertFold.
  EXPECT_EQ(model.expert_exchange_bytes(), 0) << where;
  EXPECT_EQ(mm.expert_exchange > 0, g.shape.e() > 1) << where;

  // The planner: the largest rank's total, from the plan's own input.
  double total = double(model.state_bytes() + model.activation_bytes() + stash +
                        model.context_bytes() + mm.expert_exchange);
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  planner::PlanInput in;
  in.model = mc;
  in.micro_batch = int64_t(kLocalB) * token_slots(g.shape);
  in.global_batch = in.micro_batch * (g.shape.p() > 1 ? kMicro : 1);
  in.seq = kLen;
  in.ranks = world_size();
  in.precision = po.precision == backend::Precision::BF16 ? planner::Precision::BF16
                                                           : planner::Precision::FP32;
  in.recompute = po.recompute;
  in.zero = po.zero;
  in.schedule = sched;
  in.virtual_stages = po.virtual_stages;
  in.pipeline_layers = po.pipeline_layers;
  in.overlap_switches = po.overlap;
  in.sparse_embedding_grad = po.sparse_embedding_grad;
  in.sequence_shard = po.sequence_shard;
  in.cp_comm = po.cp_comm == ContextComm::Ring ? planner::CpComm::Ring : planner::CpComm::AllGather;
  EXPECT_EQ(planner::memory_per_rank(in, g.shape).total(), total) << where;
  // The planner's exchange bytes are the model's (one formula: context_exchange_bytes).
  EXPECT_EQ(planner::context_gather_bytes(in, g.shape, kLocalB, kLen / g.shape.c()),
            double(model.context_bytes())) << where;
}

// po with the stream split over Y (sequence_shard), recompute none and full: 2 checks.
int check_sequence_sharded(const ModelConfig& mc, ProcessGroups& g, ParallelOptions po) {
  po.sequence_shard = true;
  po.recompute = Recompute::None;
  check(mc, g, po, PipelineSchedule::OneFOneB);
  po.recompute = Recompute::Full;
  check(mc, g, po, PipelineSchedule::OneFOneB);
  return 2;
}

std::vector<ParallelOptions> option_sets(const GridShape& s) {
  std::vector<ParallelOptions> out;
  for (auto prec : {backend::Precision::FP32, backend::Precision::BF16}) {
    ParallelOptions po;
    po.precision = prec;
    out.push_back(po);
    po.recompute = prec == backend::Precision::FP32 ? Recompute::Selective : Recompute::Full;
    out.push_back(po);
    po.recompute = Recompute::None;
    if (s.y() > 1) {  // the stream split over Y: its tensors N/Gy rows, dfull added
      po.sequence_shard = true;
      out.push_back(po);
      po.recompute = Recompute::Full;
      out.push_back(po);
      po.recompute = Recompute::None;
      po.sequence_shard = false;
    }
    if (s.z() > 1) {
      po.overlap.prefetch_depth = 1;
      out.push_back(po);
      po.overlap.cache_gathered_weights = true;
      out.push_back(po);
      po.overlap = OverlapOptions::all_off();
    }
    if (s.d() > 1) {
      po.overlap.dp_bucket_mb = 0.01;  // several tensors per bucket: staged
      out.push_back(po);
      po.overlap = OverlapOptions::all_off();
      for (int zero : {1, 2}) {
        po.zero = zero;
        out.push_back(po);
      }
      po.zero = 0;
    }
  }
  return out;
}

TEST(MemoryFormula, EqualsWhatTheModelAllocatesOnEveryGrid) {
  int checked = 0;
  for (Family f : {Family::GPT2, Family::Llama}) {
    const ModelConfig mc = tiny_model(f, 4);
    std::vector<GridShape> grids = contract_grids(mc, kLocalB * world_size());
    // 8 oversubscribed ranks on 2 cores: a representative part (CI time).
    if (world_size() == 8 && grids.size() > 6) grids.resize(6);
    if (f == Family::Llama && grids.size() > 3) grids.resize(3);
    for (const GridShape& shape : grids) {
      ProcessGroups g(comm::Communicator::world(), shape);
      for (const ParallelOptions& po : option_sets(shape)) {
        check(mc, g, po, PipelineSchedule::OneFOneB);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 10);
}

TEST(MemoryFormula, EqualsWhatThePipelineHolds) {
  // Stage counts of this world size, the rest over D (and Z where there is room).
  std::vector<GridShape> grids;
  const int n = world_size();
  for (int p : {2, 4}) {
    if (n % p) continue;
    GridShape s;
    s[Axis::P] = p;
    s[Axis::D] = n / p;
    grids.push_back(s);
    if (n / p == 2) {  // Y = 2 instead of D: the sequence-sharded stash and transfers
      s[Axis::D] = 1;
      s[Axis::Y] = 2;
      grids.push_back(s);
      s[Axis::Y] = 1;
      s[Axis::D] = n / p;
    }
    if (n / p >= 2 && n == 8) {
      s[Axis::D] = n / p / 2;
      s[Axis::Z] = 2;
      grids.push_back(s);
    }
  }
  int checked = 0;
  for (Family f : {Family::GPT2, Family::Llama}) {
    const ModelConfig mc = tiny_model(f, 4);
    for (const GridShape& shape : grids) {
      ProcessGroups g(comm::Communicator::world(), shape);
      for (auto prec : {backend::Precision::FP32, backend::Precision::BF16}) {
        ParallelOptions po;
        po.precision = prec;
        check(mc, g, po, PipelineSchedule::OneFOneB);
        po.recompute = Recompute::Full;
        check(mc, g, po, PipelineSchedule::OneFOneB);
        po.recompute = Recompute::None;
        if (shape.y() > 1) checked += check_sequence_sharded(mc, g, po);
        if (shape.p() == 2) {  // 4 layers: 2 chunks per stage over 2 stages
          po.virtual_stages = 2;
          check(mc, g, po, PipelineSchedule::Interleaved);
          po.virtual_stages = 1;
          po.pipeline_layers = "3,1";  // uneven: the fuller stage decides
          check(mc, g, po, PipelineSchedule::OneFOneB);
        }
        checked += 4;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(MemoryFormula, CountsTheContextExchange) {
  // The context axis (issue 28): S / Gc tokens of each sequence per rank in the activation
  // buffer, ZeRO's pieces over C x D, and the exchange's buffers (context_exchange_bytes) as
  // ContextAttention allocates them. C = 2 (2 ranks), C = 2 with each of X, Y, Z, D and P and
  // C = 4 (4 ranks), C = 2 x X = 2 x D = 2 (8 ranks); recompute none, selective and full, ZeRO 2;
  // with Y, sequence sharding too.
  using A = Axis;
  std::vector<GridShape> grids;
  switch (world_size()) {
    case 2: grids = {GridShape({{A::C, 2}})}; break;
    case 4:
      grids = {GridShape({{A::C, 2}, {A::X, 2}}), GridShape({{A::C, 2}, {A::Y, 2}}),
               GridShape({{A::C, 2}, {A::Z, 2}}), GridShape({{A::C, 2}, {A::D, 2}}),
               GridShape({{A::C, 2}, {A::P, 2}}), GridShape({{A::C, 4}})};
      break;
    case 8: grids = {GridShape({{A::C, 2}, {A::X, 2}, {A::D, 2}})}; break;
    default: GTEST_SKIP() << "no context grids for " << world_size() << " ranks";
  }
  int checked = 0;
  for (Family f : {Family::GPT2, Family::Llama}) {
    const ModelConfig mc = tiny_model(f, 4);
    for (const GridShape& shape : grids) {
      ProcessGroups g(comm::Communicator::world(), shape);
      for (auto prec : {backend::Precision::FP32, backend::Precision::BF16})
        for (ContextComm comm : {ContextComm::AllGather, ContextComm::Ring}) {
          ParallelOptions po;
          po.precision = prec;
          po.cp_comm = comm;
          check(mc, g, po, PipelineSchedule::OneFOneB);
          po.recompute = Recompute::Full;
          check(mc, g, po, PipelineSchedule::OneFOneB);
          po.recompute = Recompute::Selective;  // bf16: the attention output not stashed
          check(mc, g, po, PipelineSchedule::OneFOneB);
          po.recompute = Recompute::None;
          po.zero = 2;  // pieces over C x D
          check(mc, g, po, PipelineSchedule::OneFOneB);
          po.zero = 0;
          checked += 4;
          // Sequence sharding over Y with C: the stream's rows / Gy.
          if (shape.y() > 1) checked += check_sequence_sharded(mc, g, po);
        }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(MemoryFormula, CountsTheExpertFold) {
  // The expert fold E (issue 32; parallel/expert_parallel.hpp) on every grid the world size
  // gives it (E over D, over C x D, with Z, P, X and Y): n_experts / E experts per rank, ZeRO 1
  // and 2 pieces over the expert-data group, the experts' own data-parallel buckets, with and
  // without full recomputation, equal to what the model allocates; and the exchange's scratch,
  // sized for the dropless worst case (ExpertParallel::max_rows: E x the rank's tokens x
  // min(k, n_e / E) rows), is what a step with every token routed to experts 0 and 1 (a router
  // of zeros) grows it to on the ranks holding them, and more than any rank holds after it.
  using A = Axis;
  const int n = world_size();
  std::vector<GridShape> grids;
  for (int e = 2; e <= std::min(n, 4); e *= 2) grids.push_back(GridShape({{A::D, n}}).set_e(e));
  if (n >= 4) {
    grids.push_back(GridShape({{A::C, 2}, {A::D, n / 2}}).set_e(4));
    grids.push_back(GridShape({{A::Z, 2}, {A::D, n / 2}}).set_e(2));
    grids.push_back(GridShape({{A::P, 2}, {A::D, n / 2}}).set_e(2));
    grids.push_back(GridShape({{A::X, 2}, {A::D, n / 2}}).set_e(2));  // the rows' Cx columns
    grids.push_back(GridShape({{A::Y, 2}, {A::D, n / 2}}).set_e(2));  // the experts' Fy
  }
  ModelConfig mc = tiny_model(Family::Mixtral, 2);
  mc.n_experts = 4;
  mc.experts_per_token = 2;
  mc.validate();
  int checked = 0, stepped = 0;
  for (const GridShape& shape : grids) {
    ProcessGroups g(comm::Communicator::world(), shape);
    ParallelOptions po;
    po.precision = backend::Precision::FP32;  // a mixture of experts runs in fp32
    std::vector<ParallelOptions> sets{po};
    po.overlap.dp_bucket_mb = 0.001;  // several tensors per bucket: staged (the experts' apart)
    sets.push_back(po);
    po.overlap = OverlapOptions::all_off();
    for (int zero : {1, 2}) {
      po.zero = zero;
      sets.push_back(po);
    }
    po.zero = 0;
    po.recompute = Recompute::Full;
    sets.push_back(po);
    for (const ParallelOptions& o : sets) {
      check(mc, g, o, PipelineSchedule::OneFOneB);
      ++checked;
    }
    if (shape.p() > 1 || shape.c() > 1) continue;  // the step below is one micro-batch by hand
    ParallelTransformer model(mc, g, kLocalB, kLen, ParallelOptions{});
    model.init_weights(5);
    for (size_t i = 0; i < model.table().specs.size(); ++i)
      if (model.table().specs[i].role == TensorRole::Router) {
        std::vector<float> zeros(size_t(model.table().specs[i].numel), 0.0f);
        model.set_tensor(i, zeros.data());
      }
    std::vector<int32_t> x(size_t(kLocalB) * kLen), y(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((7 * i + 3) % 256), y[i] = int32_t((5 * i + 1) % 256);
    model.zero_grads();
    model.forward_backward(x.data(), y.data(), kLocalB, kLen, 1.0f);
    const ModelMemory mm = model_memory(mc, shape, g.coord, kLocalB, kLen, ParallelOptions{});
    const int El = mc.n_experts / shape.e(), er = expert_rank(g.coord, shape);
    const bool holds_0_or_1 = er * El < 2;  // experts [er El, (er + 1) El)
    const std::string where = "grid " + shape.to_string() + " rank " + std::to_string(world_rank());
    EXPECT_EQ(mm.expert_exchange, int64_t(shape.e()) * kLocalB * kLen * std::min(2, El) *
                                      (3 * 64 / shape.x() + 6 * mc.ffn / shape.y()) * 4) << where;
    EXPECT_EQ(model.expert_exchange_bytes(), holds_0_or_1 ? mm.expert_exchange : 0) << where;
    EXPECT_EQ(model.expert_exchange_bound(), mm.expert_exchange) << where;  // the per-rank line's
    ++stepped;
  }
  EXPECT_GT(checked, 0);
  EXPECT_GT(stepped, 0);
}

}  // namespace
