// A tiny model trained a few steps with the trainer's own step (train/step_runner.hpp:
// ParallelTransformer, AdamW over its optimizer layout on the model's backend, gradient
// clipping, the non-finite guard), on whatever backend
// ParallelOptions::device names: the harness of the device tests (tests/test_device_model.cpp on
// cpu-strict, tests/gpu/test_gpu_model.cpp on cuda), serial or on a grid (the groups given).
// Returns every step's loss and gradient norm and, at the end, every whole tensor and Adam
// moment, copied to the host through the model's own gathers.
#pragma once

#include <cmath>
#include <vector>

#include "support/train_harness.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/optimizer.hpp"
#include "tetrad/train/step_runner.hpp"

namespace device_model {

using namespace tetrad;
using namespace tetrad::parallel;

constexpr int kB = 4, kT = 16, kAccum = 2, kSteps = 8;

inline ModelConfig tiny_model(Family f) {
  return tetrad_test::small_model(f, {.n_layer = 2, .n_embd = 64, .n_head = 4, .mha_ffn = 256,
                                      .gqa_ffn = 96, .vocab_size = 128, .max_seq = 16});
}

struct Trace {
  std::vector<double> losses, grad_norms;
  std::vector<std::vector<float>> weights, m, v;  // whole tensors
};

// A checkpoint in host memory: whole tensors, moments and the next step.
struct Saved {
  std::vector<std::vector<float>> weights, m, v;
  int step = 0;
};

// Trains steps [from, steps) (from: resume->step, else 0) of the global batch kB x kT, split
// over the groups' Z x D ranks as the trainer splits it; `save` (when given) receives the state
// after the last step.
// The learning-rate schedule runs over `schedule` steps (the same for a run and its resumption).
inline Trace train(const ModelConfig& mc, ProcessGroups& g, const ParallelOptions& po, int steps,
                   const Saved* resume = nullptr, Saved* save = nullptr, int schedule = kSteps) {
  const int replicas = token_slots(g.shape);
  const int Bl = kB / replicas;
  const int slot = token_slot(g.coord, g.shape);
  ParallelTransformer model(mc, g, Bl, kT, po);
  const TrainConfig tc = tetrad_test::train_config(1e-2, schedule);
  AdamW opt = tetrad_test::layout_adamw(model, tc);
  int from = 0;
  if (resume) {
    for (size_t i = 0; i < model.table().specs.size(); ++i) {
      model.set_tensor(i, resume->weights[i].data());
      model.scatter_state_tensor(opt.m(), i, resume->m[i].data());
      model.scatter_state_tensor(opt.v(), i, resume->v[i].data());
    }
    from = resume->step;
  } else {
    model.init_weights(7);
  }
  // host values over MPI where g is NCCL's
  StepRunner runner(model, opt, g.host(), tetrad_test::step_options(tc, kAccum, Bl, kT));
  Trace tr;
  std::vector<int32_t> x(size_t(kAccum) * Bl * kT), y(x.size());
  for (int s = from; s < steps; ++s) {
    for (int mb = 0; mb < kAccum; ++mb) {
      Rng r(1000 + mb);  // the same batches every step: the loss must fall
      std::vector<int32_t> tok(size_t(kB) * (kT + 1));
      for (auto& t : tok) t = int32_t(r.next_u64() % uint64_t(mc.vocab_size));
      tetrad_test::rank_share(tok, kT, Bl, slot, mb, x.data(), y.data());
    }
    const StepResult sr =
        runner.run(x.data(), y.data(), double(kB * kT * kAccum), learning_rate(tc, s), s);
    tr.losses.push_back(sr.loss);
    tr.grad_norms.push_back(sr.grad_norm);
  }
  model.finish_communication();
  for (size_t i = 0; i < model.table().specs.size(); ++i) {
    std::vector<float> full(size_t(model.table().specs[i].numel));
    model.get_tensor(i, full.data());
    tr.weights.push_back(full);
    model.gather_state_tensor(opt.m(), i, full.data());
    tr.m.push_back(full);
    model.gather_state_tensor(opt.v(), i, full.data());
    tr.v.push_back(full);
  }
  if (save) {
    save->weights = tr.weights;
    save->m = tr.m;
    save->v = tr.v;
    save->step = steps;
  }
  return tr;
}

}  // namespace device_model
