// Extraction on a process grid (issue 8: `tetrad memorization` runs on any grid): on every
// factorisation of the world size, measure_extraction on a ParallelTransformer holding the same
// weights as a serial Transformer gives the same per-document results as the serial decoder with
// its KV cache — one memorised sequence extracted exactly, random sequences not — and documents
// that do not divide evenly over the Z x data slots are still all evaluated once.
// Runs under mpirun -n 2, 4, 8 (oversubscribed on small machines).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "contract.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "support/extraction.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/tools/memorization.hpp"
#include "tetrad/train/optimizer.hpp"

using namespace tetrad;
using namespace tetrad::parallel;
using Ids = std::vector<int32_t>;

namespace {

using contract::world_size;

// The contract's tiny model, with room for a 40-token prefix and suffix.
ModelConfig test_model(Family f) {
  ModelConfig c = contract::tiny_model(f, 2);
  c.max_seq = 40;
  return c;
}

Ids random_tokens(int n, int V, uint64_t seed) {
  Rng r(seed);
  Ids t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(r.next_u64() % uint64_t(V));
  return t;
}

// Every rank trains the same serial model on one sequence (deterministic), so all hold the same
// weights without any communication.
void memorise(Transformer<float>& m, const Ids& seq) {
  TrainConfig tc;
  tc.weight_decay = 0;
  AdamW opt(m.table(), tc);
  const int T = int(seq.size()) - 1;
  for (int s = 0; s < 300; ++s) {
    m.zero_grads();
    const double loss = m.forward_backward(seq.data(), seq.data() + 1, 1, T, 1.0f / T) / T;
    if (loss < 0.02) break;
    const double gn = grad_norm(m.grads(), m.num_params());
    opt.update(m.params(), m.grads(), 1e-2, gn > 1 ? 1 / gn : 1, s + 1);
  }
}

void check_every_grid(Family family) {
  const ModelConfig mc = test_model(family);
  ExtractionOptions opt;
  opt.prefix_len = 8;
  opt.suffix_len = 16;
  opt.batch = 2;
  Transformer<float> serial(mc, 8, mc.max_seq);
  serial.init_weights(11);
  const Ids seen = random_tokens(opt.prefix_len + opt.suffix_len + 4, mc.vocab_size, 5);
  memorise(serial, seen);
  // 5 documents (odd, so slots get unequal shares), one too short.
  std::vector<Ids> docs = {random_tokens(30, mc.vocab_size, 1), seen,
                           random_tokens(30, mc.vocab_size, 2), Ids(10, 3),
                           random_tokens(30, mc.vocab_size, 4)};
  const ExtractionReport want = measure_extraction(serial, docs, {}, opt);
  ASSERT_TRUE(want.docs[1].exact) << "the serial model did not memorise its sequence";
  ASSERT_EQ(want.evaluated, 4);

  int tested = 0;
  for (const GridShape& shape : factorizations(world_size())) {
    try {
      validate_grid_for_model(mc, shape);
    } catch (const Error&) {
      continue;
    }
    ProcessGroups g(comm::Communicator::world(), shape);
    ParallelTransformer par(mc, g, opt.batch, opt.prefix_len + opt.suffix_len);
    for (size_t i = 0; i < serial.table().specs.size(); ++i)
      par.set_tensor(i, serial.params() + serial.table().specs[i].offset);
    const ExtractionReport got = measure_extraction(par, docs, {}, opt);
    ++tested;
    const std::string where = family_name(family) + " grid " + shape.to_string();
    ASSERT_EQ(got.docs.size(), want.docs.size()) << where;
    EXPECT_EQ(got.evaluated, want.evaluated) << where;
    EXPECT_EQ(got.skipped, want.skipped) << where;
    for (size_t i = 0; i < docs.size(); ++i) {
      EXPECT_EQ(got.docs[i].skipped, want.docs[i].skipped) << where << " doc " << i;
      EXPECT_EQ(got.docs[i].exact, want.docs[i].exact) << where << " doc " << i;
      EXPECT_DOUBLE_EQ(got.docs[i].token_match, want.docs[i].token_match) << where << " doc " << i;
      EXPECT_DOUBLE_EQ(got.docs[i].rouge_l, want.docs[i].rouge_l) << where << " doc " << i;
    }
  }
  EXPECT_GT(tested, 1);
}

}  // namespace

TEST(ParallelExtraction, Gpt2EveryGridMatchesTheSerialDecoder) { check_every_grid(Family::GPT2); }
TEST(ParallelExtraction, LlamaEveryGridMatchesTheSerialDecoder) { check_every_grid(Family::Llama); }
