// Activation recomputation on one rank (no MPI): every mode gives bit-identical losses, gradients
// and weights, and keeps less activation memory (the accounting matches what is allocated).
#include <gtest/gtest.h>

#include <vector>

#include "support/parallel_options.hpp"
#include "support/train_harness.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/train/optimizer.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

ModelConfig model(Family f) {
  return tetrad_test::small_model(f, {.n_layer = 3, .n_embd = 64, .n_head = 4, .mha_ffn = 256,
                                      .gqa_ffn = 96, .vocab_size = 128, .max_seq = 16});
}

using tetrad_test::parallel_options;

struct Trace {
  std::vector<double> losses;
  std::vector<float> params, grads;
};

Trace train(Family f, Recompute rc) {
  constexpr int B = 4, T = 16, steps = 4, accum = 2;
  ProcessGroups g;
  ParallelTransformer m(model(f), g, B, T, parallel_options(rc));
  m.init_weights(11);
  TrainConfig tc;
  tc.lr = 1e-2;
  tc.warmup_steps = 1;
  tc.max_steps = steps;
  const OptimizerLayout& ol = m.optimizer_layout();
  AdamW opt(decay_ranges(m.table(), tc, ol.param_offsets, ol.sizes), ol.state_size, tc);
  Trace tr;
  std::vector<int32_t> x(B * T), y(B * T);
  for (int s = 0; s < steps; ++s) {
    m.zero_grads();
    double loss = 0;
    for (int mb = 0; mb < accum; ++mb) {
      Rng r(100 * s + mb);
      for (auto& v : x) v = int32_t(r.next_u64() % 128);
      for (auto& v : y) v = int32_t(r.next_u64() % 128);
      loss += m.forward_backward(x.data(), y.data(), B, T, 1.0f / (B * T * accum));
    }
    m.reduce_gradients();
    tr.losses.push_back(loss);
    if (s + 1 == steps) tr.grads.assign(m.grads(), m.grads() + m.num_local_grads());
    opt.update(m.params(), m.grads(), learning_rate(tc, s), 1.0, s + 1);
  }
  tr.params.assign(m.params(), m.params() + m.num_local_params());
  return tr;
}

}  // namespace

TEST(Recompute, EveryModeIsBitIdenticalToKeepingEverything) {
  for (Family f : {Family::GPT2, Family::Llama}) {
    const Trace none = train(f, Recompute::None);
    for (Recompute rc : {Recompute::Selective, Recompute::Full}) {
      const Trace r = train(f, rc);
      const std::string where = family_name(f) + " " + recompute_name(rc);
      EXPECT_EQ(r.losses, none.losses) << where;
      EXPECT_EQ(r.grads, none.grads) << where;
      EXPECT_EQ(r.params, none.params) << where;
    }
  }
}

TEST(Recompute, KeepsLessActivationMemory) {
  ProcessGroups g;
  const ModelConfig c = model(Family::GPT2);
  ParallelTransformer none(c, g, 4, 16, parallel_options(Recompute::None));
  ParallelTransformer sel(c, g, 4, 16, parallel_options(Recompute::Selective));
  ParallelTransformer full(c, g, 4, 16, parallel_options(Recompute::Full));
  // What each allocates is what activation_bytes(mode) says it would.
  EXPECT_EQ(none.activation_bytes(), none.activation_bytes(Recompute::None));
  EXPECT_EQ(sel.activation_bytes(), none.activation_bytes(Recompute::Selective));
  EXPECT_EQ(full.activation_bytes(), none.activation_bytes(Recompute::Full));
  // Selective drops the attention output and log-sum-exp of all layers but one:
  // (L - 1) * N * (C + heads) floats.
  const int64_t N = 4 * 16, L = c.n_layer;
  EXPECT_EQ(none.activation_bytes() - sel.activation_bytes(),
            int64_t(sizeof(float)) * (L - 1) * N * (c.n_embd + c.n_head));
  // Full keeps one block's input per layer plus one layer's activations.
  EXPECT_LT(full.activation_bytes(), sel.activation_bytes());
  EXPECT_EQ(parse_recompute("selective"), Recompute::Selective);
  try {
    parse_recompute("partial");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"none\", \"selective\" or \"full\""), std::string::npos);
  }
}
