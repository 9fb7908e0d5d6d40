// The correctness contract's harness (4d-parallelism.md), shared by the MPI tests that extend it
// (ZeRO, recomputation, pipeline): the same 20 steps of a tiny model, serially with
// Transformer<float> and on a grid with ParallelTransformer, recording the loss and gradient norm
// of every step and, at the end, every whole tensor.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "support/train_harness.hpp"
#include "support/transformer.hpp"
#include "tetrad/parallel/context_split.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/optimizer.hpp"
#include "tetrad/train/step_runner.hpp"

namespace contract {

using namespace tetrad;
using namespace tetrad::parallel;

using mpi_test::world_rank;
using mpi_test::world_size;

// Grouped-query attention where the family has it (4 key/value heads of 8).
inline ModelConfig tiny_model(Family f, int n_layer) {
  return tetrad_test::small_model(f, {.n_layer = n_layer, .n_embd = 64, .n_head = 8,
                                      .mha_ffn = 128, .gqa_ffn = 96, .vocab_size = 256,
                                      .max_seq = 32});
}

struct Run {
  std::vector<double> losses, grad_norms;
  std::vector<std::vector<float>> weights;  // every tensor, whole
  std::vector<std::vector<float>> m, v;     // Adam moments, whole (parallel runs)
};

constexpr int kB = 8, kT = 16, kAccum = 2;

// The grids of this world size a test can run: the model divides over them and the batch of
// `batch` sequences over Z x D.
inline std::vector<GridShape> contract_grids(const ModelConfig& mc, int batch = kB) {
  std::vector<GridShape> out;
  for (const GridShape& shape : factorizations(world_size())) {
    try {
      validate_grid_for_model(mc, shape);
    } catch (const Error&) {
      continue;
    }
    if (batch % token_slots(shape) == 0) out.push_back(shape);
  }
  return out;
}

inline std::vector<int32_t> batch_tokens(int step, int micro, int V) {
  Rng r(1000 + 31 * step + micro);
  std::vector<int32_t> t(size_t(kB) * (kT + 1));
  for (auto& x : t) x = int32_t(r.next_u64() % uint64_t(V));
  return t;
}

inline TrainConfig train_config(int steps) { return tetrad_test::train_config(3e-3, steps); }

inline Run serial_run(const ModelConfig& mc, int steps) {
  Transformer<float> m(mc, kB, kT);
  m.init_weights(7);
  const TrainConfig tc = train_config(steps);
  AdamW opt(m.table(), tc);
  Run r;
  std::vector<int32_t> x(size_t(kB) * kT), y(x.size());
  const bool bias = mc.moe() && mc.moe_expert_bias();
  std::vector<int64_t> load;  // the step's choices per expert of each layer (expert bias)
  for (int s = 0; s < steps; ++s) {
    m.zero_grads();
    load.assign(size_t(mc.n_layer) * size_t(mc.n_experts), 0);
    double loss = 0;
    for (int mb = 0; mb < kAccum; ++mb) {
      tetrad_test::rank_share(batch_tokens(s, mb, mc.vocab_size), kT, kB, 0, 0, x.data(), y.data());
      loss += m.forward_backward(x.data(), y.data(), kB, kT, 1.0f / (kB * kT * kAccum));
      if (bias)
        for (size_t i = 0; i < load.size(); ++i) load[i] += m.expert_load()[i];
    }
    const double gn = grad_norm(m.grads(), m.num_params());
    opt.update(m.params(), m.grads(), learning_rate(tc, s),
               gn > tc.grad_clip ? tc.grad_clip / gn : 1.0, s + 1);
    // DeepSeek-V3's update after the step, written out here: b_e += rate sign(mean - load_e).
    for (const ParamSpec& t : m.table().specs) {
      if (!bias || t.role != TensorRole::ExpertBias) continue;
      const int64_t* ld = load.data() + size_t(t.layer) * size_t(mc.n_experts);
      int64_t total = 0;  // load_e against the mean total / E, as E load_e against total
      for (int e = 0; e < mc.n_experts; ++e) total += ld[e];
      for (int e = 0; e < mc.n_experts; ++e) {
        float& b = m.params()[t.offset + e];
        if (mc.n_experts * ld[e] < total) b += mc.expert_bias_rate;
        if (mc.n_experts * ld[e] > total) b -= mc.expert_bias_rate;
      }
    }
    r.losses.push_back(loss / (kB * kT * kAccum));
    r.grad_norms.push_back(gn);
  }
  for (const auto& s : m.table().specs)
    r.weights.emplace_back(m.params() + s.offset, m.params() + s.offset + s.numel);
  return r;
}

// The trainer's own step (train/step_runner.hpp: begin_step, forward/backward or the pipeline's
// step, reductions, norm, guard, clipping, AdamW through apply_update with ZeRO's all-gather) on
// a grid, on the backend ParallelOptions::device names (the CPU's when null;
// test_device_model_mpi.cpp runs it on cpu-strict). Gp > 1: the micro-batches go through the
// runner's PipelineDriver with `schedule`.
inline Run parallel_run(const ModelConfig& mc, ProcessGroups& g, int steps, ParallelOptions po,
                        PipelineSchedule schedule = PipelineSchedule::OneFOneB) {
  const int replicas = token_slots(g.shape);
  const int Bl = kB / replicas;
  const int slot = token_slot(g.coord, g.shape);  // this rank's slice of the sequences
  // With a context axis, of each sequence this rank's two chunks (context_split.hpp).
  const ContextSplit cs = ContextSplit::of(g.shape, g.coord);
  const int Tl = cs.local_len(kT);
  ParallelTransformer m(mc, g, Bl, kT, po);
  m.init_weights(7);
  const TrainConfig tc = train_config(steps);
  AdamW opt = tetrad_test::layout_adamw(m, tc);  // the moments live with the model
  StepOptions so = tetrad_test::step_options(tc, kAccum, Bl, Tl);
  so.schedule = schedule;
  StepRunner runner(m, opt, g, so);
  Run r;
  std::vector<int32_t> x(size_t(kAccum) * Bl * kT), y(x.size());
  std::vector<int32_t> xl(size_t(kAccum) * Bl * Tl), yl(xl.size());
  for (int s = 0; s < steps; ++s) {
    for (int mb = 0; mb < kAccum; ++mb)
      tetrad_test::rank_share(batch_tokens(s, mb, mc.vocab_size), kT, Bl, slot, mb, x.data(),
                              y.data());
    if (cs.active()) {
      cs.take(x.data(), kT, kAccum * Bl, kT, xl.data());
      cs.take(y.data(), kT, kAccum * Bl, kT, yl.data());
    }
    int32_t* xs = cs.active() ? xl.data() : x.data();
    int32_t* ys = cs.active() ? yl.data() : y.data();
    const StepResult sr =
        runner.run(xs, ys, double(kB * kT * kAccum), learning_rate(tc, s), s);
    EXPECT_EQ(sr.verdict, StepVerdict::Apply) << "step " << s + 1 << " is not finite";
    r.losses.push_back(sr.loss);
    r.grad_norms.push_back(sr.grad_norm);
  }
  m.finish_communication();  // the next step's gathers the last update started
  for (size_t i = 0; i < m.table().specs.size(); ++i) {
    std::vector<float> full(m.table().specs[i].numel);
    m.get_tensor(i, full.data());
    r.weights.push_back(full);
    m.gather_state_tensor(opt.m(), i, full.data());
    r.m.push_back(full);
    m.gather_state_tensor(opt.v(), i, full.data());
    r.v.push_back(full);
  }
  return r;
}

// Largest absolute difference over every weight, and the tensor it is in.
inline double worst_weight_difference(const Run& a, const Run& b, const ModelConfig& mc,
                                      std::string* where = nullptr) {
  double worst = 0;
  const ParamTable table = build_param_table(mc);
  for (size_t i = 0; i < a.weights.size(); ++i)
    for (size_t j = 0; j < a.weights[i].size(); ++j) {
      const double d = std::abs(double(a.weights[i][j]) - b.weights[i][j]);
      if (d > worst) {
        worst = d;
        if (where) *where = table.specs[i].name;
      }
    }
  return worst;
}

// A grid's run against the serial run, the contract's tolerances (fp32): the loss of every step
// within relative 1e-5, the gradient norm within 1e-4, every weight at the end within 2e-4.
inline void expect_matches_serial(const Run& par, const Run& serial, const ModelConfig& mc,
                                  const std::string& where) {
  ASSERT_EQ(par.losses.size(), serial.losses.size()) << where;
  for (size_t s = 0; s < serial.losses.size(); ++s) {
    EXPECT_NEAR(par.losses[s] / serial.losses[s], 1.0, 1e-5) << where << " step " << s + 1;
    EXPECT_NEAR(par.grad_norms[s] / serial.grad_norms[s], 1.0, 1e-4) << where << " step " << s + 1;
  }
  std::string worst_name;
  const double worst = worst_weight_difference(par, serial, mc, &worst_name);
  EXPECT_LT(worst, 2e-4) << where << ": largest weight difference in " << worst_name;
}

// Documents of the global batch of step `step`, micro-batch `micro`: row b's documents begin
// at places drawn from (seed, step, micro, b), each place starting one with probability
// 1 / one_in; every fourth row is one document.
struct DocumentDraw {
  int seed, one_in;
};
inline std::vector<int32_t> batch_docs(DocumentDraw draw, int step, int micro) {
  Rng r(draw.seed + 31 * step + micro);
  std::vector<int32_t> d(size_t(kB) * kT);
  for (int b = 0; b < kB; ++b) {
    int start = 0;
    for (int t = 0; t < kT; ++t) {
      if (b % 4 != 3 && t > 0 && r.next_u64() % uint64_t(draw.one_in) == 0) start = t;
      d[size_t(b) * kT + t] = start;
    }
  }
  return d;
}

// `steps` steps of the trainer's own step (StepRunner) with documents (po.document_mask /
// document_positions; batch_docs(draw)) on the grid of `g`, each rank given its rows and, over
// the context axis C, its chunks of them: every step's loss and gradient norm, the weights after.
inline Run documents_run(const ModelConfig& mc, ProcessGroups& g, ParallelOptions po, int steps,
                         DocumentDraw draw) {
  const int replicas = token_slots(g.shape);
  const int Bl = kB / replicas;
  const int slot = token_slot(g.coord, g.shape);
  const ContextSplit cs = ContextSplit::of(g.shape, g.coord);
  const int Tl = cs.local_len(kT);
  ParallelTransformer m(mc, g, Bl, kT, po);
  m.init_weights(7);
  const TrainConfig tc = train_config(steps);
  AdamW opt = tetrad_test::layout_adamw(m, tc);
  StepRunner runner(m, opt, g, tetrad_test::step_options(tc, kAccum, Bl, Tl));
  Run r;
  std::vector<int32_t> x(size_t(kAccum) * Bl * kT), y(x.size()), docs(x.size());
  std::vector<int32_t> xl(size_t(kAccum) * Bl * Tl), yl(xl.size()), dl(xl.size());
  for (int s = 0; s < steps; ++s) {
    for (int mb = 0; mb < kAccum; ++mb) {
      tetrad_test::rank_share(batch_tokens(s, mb, mc.vocab_size), kT, Bl, slot, mb, x.data(),
                              y.data());
      const std::vector<int32_t> all = batch_docs(draw, s, mb);  // this rank's rows, as rank_share's
      std::copy(all.begin() + size_t(slot) * Bl * kT, all.begin() + size_t(slot + 1) * Bl * kT,
                docs.begin() + size_t(mb) * Bl * kT);
    }
    cs.take(x.data(), kT, kAccum * Bl, kT, xl.data());
    cs.take(y.data(), kT, kAccum * Bl, kT, yl.data());
    cs.take(docs.data(), kT, kAccum * Bl, kT, dl.data());
    m.set_documents(xl.data(), dl.data(), int64_t(xl.size()));
    const StepResult sr =
        runner.run(xl.data(), yl.data(), double(kB * kT * kAccum), learning_rate(tc, s), s);
    EXPECT_EQ(sr.verdict, StepVerdict::Apply) << "step " << s + 1 << " is not finite";
    r.losses.push_back(sr.loss);
    r.grad_norms.push_back(sr.grad_norm);
  }
  m.finish_communication();
  for (size_t i = 0; i < m.table().specs.size(); ++i) {
    std::vector<float> full(m.table().specs[i].numel);
    m.get_tensor(i, full.data());
    r.weights.push_back(full);
  }
  return r;
}

}  // namespace contract
