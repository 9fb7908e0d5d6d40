// The one model's inference paths on the trivial grid (1x1x1x1, one process): whole-vocabulary
// logits against the serial oracle, KV-cache decoding against the full forward, generation
// through the model-generic sampling templates, and the decoding interface's errors. The grids
// are covered by MemorizationMpi (extraction on every grid of 2, 4, 8 ranks against the serial
// decoder) and CliParallel (`generate` on 2-rank grids: the tokens of one rank).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/model/sampling.hpp"
#include "support/model_checks.hpp"
#include "support/transformer.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"

using namespace tetrad;
using tetrad_test::random_tokens;

namespace {

parallel::ParallelOptions fp32() {
  parallel::ParallelOptions po;
  po.precision = backend::Precision::FP32;
  return po;
}

}  // namespace

TEST(ParallelDecode, WholeVocabularyLogitsMatchTheSerialOracle) {
  for (const char* name : {"tiny", "llama-tiny"}) {
    const ModelConfig cfg = named_model(name);
    const int T = 20, V = cfg.vocab_size;
    parallel::ProcessGroups g;
    parallel::ParallelTransformer m(cfg, g, 2, cfg.max_seq, fp32());
    m.init_weights(11);
    Transformer<float> s(cfg, 2, cfg.max_seq);
    s.init_weights(11);
    const auto x = random_tokens(2 * T, V, 3);
    const float* got = m.forward_logits(x.data(), 2, T);
    const float* want = s.forward_logits(x.data(), 2, T);
    double num = 0, den = 0;
    for (size_t i = 0; i < size_t(2) * T * V; ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << name << " i=" << i;
      num += std::pow(double(got[i]) - want[i], 2);
      den += std::pow(double(want[i]), 2);
    }
    EXPECT_LT(std::sqrt(num / den), 1e-5) << name;
  }
}

TEST(ParallelDecode, KvCacheDecodingMatchesFullForward) {
  for (const char* name : {"tiny", "llama-tiny"}) {
    const ModelConfig cfg = named_model(name);
    parallel::ProcessGroups g;
    parallel::ParallelTransformer m(cfg, g, 2, cfg.max_seq, fp32());
    m.init_weights(11);
    tetrad_test::expect_kv_cache_decoding_matches_full_forward(m, cfg.vocab_size, name);
  }
}

// generate() on the one model and on the serial oracle: the same greedy continuation, and the
// same batched greedy continuation (generate_greedy_batch).
TEST(ParallelDecode, GreedyGenerationMatchesTheSerialOracle) {
  const ModelConfig cfg = named_model("llama-tiny");
  parallel::ProcessGroups g;
  parallel::ParallelTransformer m(cfg, g, 3, 48, fp32());
  m.init_weights(5);
  Transformer<float> s(cfg, 3, 48);
  s.init_weights(5);
  const auto prompt = random_tokens(9, cfg.vocab_size, 8);
  SamplingOptions greedy;
  greedy.temperature = 0;
  Rng r1(1), r2(1);
  const auto a = generate(m, prompt, 20, greedy, r1);
  const auto b = generate(s, prompt, 20, greedy, r2);
  EXPECT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(random_tokens(7, cfg.vocab_size, 20 + i));
  EXPECT_EQ(generate_greedy_batch(m, prompts, 12), generate_greedy_batch(s, prompts, 12));
}

TEST(ParallelDecode, MisuseIsRefusedWithAClearError) {
  const ModelConfig cfg = named_model("tiny");
  parallel::ProcessGroups g;
  parallel::ParallelTransformer m(cfg, g, 2, 16, fp32());
  m.init_weights(1);
  const int32_t tok[32] = {};
  EXPECT_THROW(m.decode(tok, 1, 1), Error);  // no start_cache
  EXPECT_THROW(m.start_cache(3), Error);     // more sequences than the local batch
  m.start_cache(1);
  EXPECT_THROW(m.decode(tok, 2, 1), Error);  // another batch than the cache's
  m.decode(tok, 1, 10);
  EXPECT_THROW(m.decode(tok, 1, 7), Error);  // past max_len (10 + 7 > 16)
  EXPECT_EQ(m.cache_position(), 10);
  m.decode(tok, 1, 6);
  EXPECT_EQ(m.cache_position(), 16);
}
