// Whole-model tests: gradient of the full GPT-2 / Llama model against central finite differences
// in double precision, float vs double agreement, KV-cache decoding vs the full forward,
// determinism, and the tiny model overfitting one batch.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradcheck.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/model/sampling.hpp"
#include "support/model_checks.hpp"
#include "support/transformer.hpp"
#include "tetrad/train/optimizer.hpp"

using namespace tetrad;
using tetrad_test::random_tokens;

namespace {

ModelConfig small_cfg(Family f, int n_kv_head) {
  ModelConfig c;
  c.family = f;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 4;
  c.n_kv_head = n_kv_head;
  c.ffn = 24;
  c.vocab_size = 23;
  c.max_seq = 8;
  c.tie_embeddings = f == Family::GPT2;
  return c;
}

// Perturbs the weights away from the family's init (norm weights 1, biases 0) so every path of
// the gradient is exercised.
template <typename T>
void jitter(Transformer<T>& m, uint64_t seed) {
  Rng r(seed);
  for (int64_t i = 0; i < m.num_params(); ++i) m.params()[i] += T(0.1 * r.normal());
}

void gradcheck_model(const ModelConfig& cfg) {
  const int B = 2, T = 6;
  Transformer<double> m(cfg, B, T);
  m.init_weights(3);
  jitter(m, 4);
  auto x = random_tokens(B * T, cfg.vocab_size, 5);
  auto y = random_tokens(B * T, cfg.vocab_size, 6);
  y[3] = -1;  // a masked target
  m.zero_grads();
  m.forward_backward(x.data(), y.data(), B, T, 1.0);
  std::vector<double> analytic(m.grads(), m.grads() + m.num_params());
  auto loss = [&] { return m.forward_loss(x.data(), y.data(), B, T); };
  // Every tensor, up to 48 evenly spaced elements each (all of the small ones).
  tetrad::testing::GradCheckOptions opt;
  opt.max_checks = 48;
  opt.h = 1e-5;  // the loss sums 11 tokens (~35): a larger step keeps rounding noise well below tol
  for (const auto& s : m.table().specs)
    EXPECT_TRUE(tetrad::testing::gradient_matches(s.name, m.params() + s.offset, s.numel,
                                          analytic.data() + s.offset, loss, opt));
}

}  // namespace

TEST(ModelGradcheck, Gpt2AllParametersMatchFiniteDifferences) {
  gradcheck_model(small_cfg(Family::GPT2, 4));
}
TEST(ModelGradcheck, LlamaAllParametersMatchFiniteDifferences) {
  gradcheck_model(small_cfg(Family::Llama, 4));
}
TEST(ModelGradcheck, LlamaGroupedQueryAttentionMatchesFiniteDifferences) {
  gradcheck_model(small_cfg(Family::Llama, 2));
}
// Qwen2's q, k, v biases (jittered away from 0) with grouped-query attention.
TEST(ModelGradcheck, Qwen2QkvBiasMatchesFiniteDifferences) {
  gradcheck_model(small_cfg(Family::Qwen2, 2));
}

// Qwen3's per-head q/k RMSNorm (weights jittered away from 1) with grouped-query attention and
// heads 6 wide (not n_embd / n_head = 4).
TEST(ModelGradcheck, Qwen3QkNormMatchesFiniteDifferences) {
  ModelConfig c = small_cfg(Family::Qwen3, 2);
  c.explicit_head_dim = 6;
  gradcheck_model(c);
}

TEST(Model, FloatAgreesWithDouble) {
  for (const char* name : {"tiny", "llama-tiny", "qwen2-tiny", "qwen3-tiny"}) {
    ModelConfig cfg = named_model(name);
    const Family f = cfg.family;
    const int B = 2, T = 32;
    Transformer<float> mf(cfg, B, T);
    Transformer<double> md(cfg, B, T);
    mf.init_weights(9);
    md.init_weights(9);
    for (int64_t i = 0; i < mf.num_params(); ++i) ASSERT_EQ(double(mf.params()[i]), double(float(md.params()[i])));
    for (int64_t i = 0; i < mf.num_params(); ++i) md.params()[i] = mf.params()[i];
    auto x = random_tokens(B * T, cfg.vocab_size, 1), y = random_tokens(B * T, cfg.vocab_size, 2);
    mf.zero_grads();
    md.zero_grads();
    const double lf = mf.forward_backward(x.data(), y.data(), B, T, 1.0f / (B * T));
    const double ld = md.forward_backward(x.data(), y.data(), B, T, 1.0 / (B * T));
    EXPECT_NEAR(lf / ld, 1.0, 1e-5);
    double num = 0, den = 0;
    for (int64_t i = 0; i < mf.num_params(); ++i) {
      num += std::pow(double(mf.grads()[i]) - md.grads()[i], 2);
      den += std::pow(md.grads()[i], 2);
    }
    EXPECT_LT(std::sqrt(num / den), 1e-4) << family_name(f);
  }
}

TEST(Model, KvCacheDecodingMatchesFullForward) {
  for (const char* name : {"tiny", "llama-tiny", "qwen3-tiny"}) {
    ModelConfig cfg = named_model(name);
    Transformer<float> m(cfg, 2, cfg.max_seq);
    m.init_weights(11);
    tetrad_test::expect_kv_cache_decoding_matches_full_forward(m, cfg.vocab_size, name);
  }
}

TEST(Model, SequenceLongerThanTheModelIsRefused) {
  ModelConfig cfg = named_model("tiny");
  EXPECT_THROW(Transformer<float>(cfg, 1, cfg.max_seq + 1), Error);
  Transformer<float> m(cfg, 1, cfg.max_seq);
  std::vector<int32_t> x(cfg.max_seq + 1, 1);
  try {
    m.forward_logits(x.data(), 1, cfg.max_seq + 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("longer than the model's maximum"), std::string::npos) << e.what();
  }
}

TEST(Model, TrainingIsDeterministic) {
  auto run = [] {
    ModelConfig cfg = named_model("tiny");
    Transformer<float> m(cfg, 4, 64);
    m.init_weights(1);
    TrainConfig tc;
    AdamW opt(m.table(), tc);
    auto x = random_tokens(4 * 65, cfg.vocab_size, 1);
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      m.zero_grads();
      losses.push_back(m.forward_backward(x.data(), x.data() + 1, 4, 64, 1.0f / 256));
      opt.update(m.params(), m.grads(), 1e-3, 1.0, s + 1);
    }
    return std::make_pair(losses, std::vector<float>(m.params(), m.params() + m.num_params()));
  };
  auto a = run(), b = run();
  EXPECT_EQ(a.first, b.first);
  EXPECT_TRUE(a.second == b.second);
}

TEST(Model, TinyModelOverfitsOneBatch) {
  for (const char* name : {"tiny", "llama-tiny"}) {
    ModelConfig cfg = named_model(name);
    const int B = 4, T = 64;
    Transformer<float> m(cfg, B, T);
    m.init_weights(1);
    TrainConfig tc;
    tc.weight_decay = 0;
    AdamW opt(m.table(), tc);
    auto x = random_tokens(B * T + 1, cfg.vocab_size, 42);
    double first = 0, last = 0;
    for (int s = 0; s < 300; ++s) {
      m.zero_grads();
      last = m.forward_backward(x.data(), x.data() + 1, B, T, 1.0f / (B * T)) / (B * T);
      if (s == 0) first = last;
      const double gn = grad_norm(m.grads(), m.num_params());
      opt.update(m.params(), m.grads(), 1e-2, gn > 1 ? 1 / gn : 1, s + 1);
      if (last < first / 10) break;
    }
    EXPECT_NEAR(first, std::log(double(cfg.vocab_size)), 0.3) << name;
    EXPECT_LT(last, first / 10) << name << ": loss went from " << first << " to " << last;
  }
}

TEST(Sampling, GreedyTopKTopP) {
  std::vector<float> logits = {0.f, 3.f, 1.f, 2.9f};
  Rng rng(1);
  SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(sample_token(logits.data(), 4, greedy, rng), 1);
  SamplingOptions top2;
  top2.top_k = 2;
  for (int i = 0; i < 200; ++i) {
    int t = sample_token(logits.data(), 4, top2, rng);
    EXPECT_TRUE(t == 1 || t == 3);
  }
  SamplingOptions nucleus;
  nucleus.top_p = 0.3;  // the top token alone holds ~0.5 of the mass
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits.data(), 4, nucleus, rng), 1);
  // With temperature 1 and no filter every token appears with its softmax probability.
  std::vector<int> counts(4);
  SamplingOptions plain;
  for (int i = 0; i < 20000; ++i) counts[sample_token(logits.data(), 4, plain, rng)]++;
  double z = std::exp(0.) + std::exp(3.) + std::exp(1.) + std::exp(2.9);
  EXPECT_NEAR(counts[1] / 20000.0, std::exp(3.) / z, 0.02);
  EXPECT_NEAR(counts[0] / 20000.0, 1 / z, 0.01);
  SamplingOptions bad;
  bad.top_p = 0;
  EXPECT_THROW(sample_token(logits.data(), 4, bad, rng), Error);
}
