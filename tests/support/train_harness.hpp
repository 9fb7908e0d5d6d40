// What the tests' training harnesses share (tests/device_model_harness.hpp, tests/mpi/contract.hpp,
// the overlap, precision and recompute tests): a small model of either family, a rank's share of
// a global micro-batch, and the trainer's step runner options from a TrainConfig. Header only.
#pragma once
#include <cstdint>
#include <vector>

#include "tetrad/model/model_config.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/train/config.hpp"
#include "tetrad/train/optimizer.hpp"
#include "tetrad/train/step_runner.hpp"

namespace tetrad_test {

// The sizes of a small test model; the family gives the rest: grouped-query attention (half as
// many key/value heads, MLP width gqa_ffn) where it has it, else mha_ffn; embeddings tied for
// GPT-2, untied for the others.
struct SmallModel {
  int n_layer, n_embd, n_head, mha_ffn, gqa_ffn, vocab_size, max_seq;
};

inline tetrad::ModelConfig small_model(tetrad::Family f, const SmallModel& s) {
  using tetrad::Family;
  tetrad::ModelConfig c;
  c.family = f;
  c.n_layer = s.n_layer;
  c.n_embd = s.n_embd;
  c.n_head = s.n_head;
  const bool gqa = tetrad::family_desc(f).grouped_query_attention;
  c.n_kv_head = gqa ? s.n_head / 2 : s.n_head;
  c.ffn = gqa ? s.gqa_ffn : s.mha_ffn;
  c.vocab_size = s.vocab_size;
  c.max_seq = s.max_seq;
  c.tie_embeddings = f == Family::GPT2;
  return c;
}

// A rank's sequences of a global micro-batch: `tok` holds the batch's sequences of T + 1 tokens;
// the Bl of token slot `slot` (sequences slot*Bl ...) become inputs x and targets y (shifted by
// one) of micro-batch `micro` in the step's buffers (Bl x T tokens per micro-batch).
inline void rank_share(const std::vector<int32_t>& tok, int T, int Bl, int slot, int micro,
                       int32_t* x, int32_t* y) {
  for (int b = 0; b < Bl; ++b)
    for (int t = 0; t < T; ++t) {
      x[size_t(micro * Bl + b) * T + t] = tok[size_t(slot * Bl + b) * (T + 1) + t];
      y[size_t(micro * Bl + b) * T + t] = tok[size_t(slot * Bl + b) * (T + 1) + t + 1];
    }
}

// The optimizer settings of the grid contract and the device tests: AdamW at peak `lr` with
// weight decay 0.1, clipping at norm 1, 2 warm-up steps of a schedule of `max_steps`.
inline tetrad::TrainConfig train_config(double lr, int max_steps) {
  tetrad::TrainConfig t;
  t.lr = lr;
  t.weight_decay = 0.1;
  t.grad_clip = 1.0;
  t.warmup_steps = 2;
  t.max_steps = max_steps;
  return t;
}

// AdamW over the model's optimizer layout (ZeRO's pieces where sharded), its moments on `be`
// (nullptr: the model's backend, as the trainer sets it up).
inline tetrad::AdamW layout_adamw(tetrad::parallel::ParallelTransformer& m,
                                  const tetrad::TrainConfig& tc,
                                  tetrad::backend::Backend* be = nullptr) {
  const tetrad::parallel::OptimizerLayout& ol = m.optimizer_layout();
  return tetrad::AdamW(tetrad::decay_ranges(m.table(), tc, ol.param_offsets, ol.sizes,
                                            ol.state_offsets, ol.grad_offsets),
                       ol.state_size, tc, be ? *be : m.compute_backend());
}

// The step runner's options as the trainer sets them from its config: `micro_batches` passes of
// B x T tokens per rank, clipping and the non-finite guard from tc.
inline tetrad::StepOptions step_options(const tetrad::TrainConfig& tc, int micro_batches, int B,
                                        int T) {
  tetrad::StepOptions so;
  so.micro_batches = micro_batches;
  so.B = B;
  so.T = T;
  so.grad_clip = tc.grad_clip;
  so.max_bad_steps = tc.max_bad_steps;
  return so;
}

}  // namespace tetrad_test
