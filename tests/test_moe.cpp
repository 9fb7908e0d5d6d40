// The mixture-of-experts block (parallel/moe_block.hpp, Mixtral's): the routing on the host
// (top k, renormalisation, capacity drops, the load-balancing and z losses), the serial oracle's
// gradient against finite differences in double (router, dispatch, experts, combine, the router
// losses; dropless and with drops), the parallel model on one rank against the oracle (losses and
// gradients over training steps, every recompute mode bit for bit), an extreme imbalance (every
// token to one expert, the others empty) training dropless, and the settings refused by name.
// The optional parts: the shared expert with its sigmoid gate (Qwen2-MoE's form) and DeepSeek-V3's
// expert bias (selection only; its update after each step through the step runner, AdamW leaving
// it alone; saved in run checkpoints, refused by export), each against the oracle and finite
// differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "support/train_harness.hpp"
#include "support/transformer.hpp"
#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/hf_config.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/moe_routing.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

// Element by element against a plain array: GCC 12 at -O3 -march=native (AVX-512) built the
// std::vector<int64_t> {1, 1, 1, 0} of an initializer list as {1, 1, 1, 1} here (the constant
// vector broadcast), so expected values are not written as vector literals.
template <typename T, typename U, size_t n>
void expect_values(const std::vector<T>& got, const U (&want)[n], const char* what) {
  ASSERT_EQ(got.size(), n) << what;
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(got[i], T(want[i])) << what << "[" << i << "]";
}

ModelConfig moe_cfg(int experts = 4, int k = 2) {
  ModelConfig c;
  c.family = Family::Mixtral;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn = 12;
  c.vocab_size = 23;
  c.max_seq = 8;
  c.tie_embeddings = false;
  c.n_experts = experts;
  c.experts_per_token = k;
  c.router_aux_loss_coef = 0.05f;
  c.router_z_loss_coef = 0.01f;
  return c;
}

std::vector<int32_t> tokens(int n, int V, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = int32_t(r.next_u64() % uint64_t(V));
  return t;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// ---- routing on the host ------------------------------------------------------------------------

TEST(MoeRouting, TopKRenormalisationCapacityAndLosses) {
  ModelConfig c = moe_cfg(4, 2);
  // 3 tokens: expert 3 is nobody's choice.
  const std::vector<float> logits = {2, 1, 0, -5,   // 0, 1
                                     0, 3, 1, -5,   // 1, 2
                                     1, 1, 0, -5};  // tie: 0 before 1
  MoeRouting r;
  route_tokens(logits.data(), 3, c, r);
  const int choice[] = {0, 1, 1, 2, 0, 1};
  expect_values(r.choice, choice, "choice");
  for (int t = 0; t < 3; ++t) EXPECT_NEAR(r.weight[size_t(2 * t)] + r.weight[size_t(2 * t + 1)], 1.0, 1e-6);
  const int rows[] = {2, 3, 1, 0};  // expert 3 computes nothing
  expect_values(r.rows, rows, "rows");
  EXPECT_EQ(r.dropped, 0);
  EXPECT_EQ(r.kept, 6);
  // slots: expert order, tokens in order within an expert.
  const int slots[] = {0, 2, 3, 5, 1, 4};
  expect_values(r.slots, slots, "slots");
  double aux = 0;
  for (int e = 0; e < 4; ++e) {
    double P = 0;
    for (int t = 0; t < 3; ++t) P += r.probs[size_t(t * 4 + e)];
    aux += double(r.routed[size_t(e)]) / 3 * P / 3;
  }
  EXPECT_NEAR(r.aux, 4 * aux, 1e-12);
  // Without renormalisation the weights are the probabilities.
  c.norm_topk_prob = false;
  route_tokens(logits.data(), 3, c, r);
  EXPECT_NEAR(r.weight[0], r.probs[0], 1e-7);
  // Capacity 1 row per expert (factor 0.5: ceil(0.5 * 3 * 2 / 4) = 1): later tokens dropped.
  c.moe_capacity_factor = 0.5f;
  EXPECT_EQ(expert_capacity(c, 3), 1);
  route_tokens(logits.data(), 3, c, r);
  const int capped_rows[] = {1, 1, 1, 0};
  expect_values(r.rows, capped_rows, "rows under capacity");
  EXPECT_EQ(r.dropped, 3);
  const int capped_slots[] = {0, 1, -1, 2, -1, -1};
  expect_values(r.slots, capped_slots, "slots under capacity");
  MoeStats s;
  s.add(r);
  EXPECT_EQ(s.min_rows, 0);
  EXPECT_EQ(s.max_rows, 1);
  EXPECT_EQ(s.dropped, 3);
}

// The expert bias chooses (probability + bias) but does not weigh: the combine weights are the
// chosen experts' unbiased probabilities, renormalised.
TEST(MoeRouting, ExpertBiasChoosesButDoesNotWeigh) {
  ModelConfig c = moe_cfg(4, 2);
  const std::vector<float> logits = {2, 1, 0, -1};  // by probability: 0, 1
  const float bias[] = {0.0f, 0.0f, 0.0f, 0.9f};    // lifts expert 3 over 1 (and over 0)
  MoeRouting r;
  route_tokens(logits.data(), 1, c, r, bias);
  const int choice[] = {3, 0};  // by score: 0.03 + 0.9, then 0.64
  expect_values(r.choice, choice, "choice with the bias");
  const double s = r.probs[0] + r.probs[3];
  EXPECT_NEAR(r.weight[0], r.probs[3] / s, 1e-7);
  EXPECT_NEAR(r.weight[1], r.probs[0] / s, 1e-7);
  const int routed[] = {1, 0, 0, 1};
  expect_values(r.routed, routed, "routed");
  route_tokens(logits.data(), 1, c, r);  // without: the two most probable
  const int plain[] = {0, 1};
  expect_values(r.choice, plain, "choice without the bias");
}

// bias_e += rate * sign(mean load - load_e): the overloaded expert down, the idle ones up, an
// expert exactly at the mean unchanged.
TEST(MoeRouting, ExpertBiasUpdateFollowsTheLoad) {
  float bias[] = {0.25f, 0.0f, -0.5f, 1.0f};
  const int64_t load[] = {6, 0, 3, 3};  // mean 3
  update_expert_bias_values(bias, load, 4, 0.125f);
  EXPECT_EQ(bias[0], 0.125f);
  EXPECT_EQ(bias[1], 0.125f);
  EXPECT_EQ(bias[2], -0.5f);
  EXPECT_EQ(bias[3], 1.0f);
  MoeStats s;
  MoeRouting r;
  r.E = 4;
  r.routed = {1, 0, 2, 0};  // this rank's share: the load is the whole micro-batch's
  r.total_routed = {6, 0, 3, 3};
  s.add_load(1, 2, r);
  EXPECT_EQ(s.load.size(), 8u);
  EXPECT_EQ(s.load[4], 6);
  EXPECT_DOUBLE_EQ(s.load_imbalance(), 2.0);  // 6 of a mean 3
}

TEST(MoeRouting, NonFiniteLogitIsRefusedNamingTheToken) {
  const ModelConfig c = moe_cfg(4, 2);
  std::vector<float> logits(8, 0.0f);
  logits[6] = NAN;
  MoeRouting r;
  const std::string e = error_of([&] { route_tokens(logits.data(), 2, c, r); });
  EXPECT_TRUE(has(e, "token 1") && has(e, "expert 2")) << e;
}

// ---- the oracle against finite differences -----------------------------------------------------

namespace {
// Expert biases that change the selection: expert e of layer l gets 0.04 (e + l) - 0.06 (larger
// than the probabilities' spread of a small random router).
template <typename T>
void set_expert_bias(const ParamSpec& s, T* p) {
  if (s.role != TensorRole::ExpertBias) return;
  for (int64_t e = 0; e < s.numel; ++e) p[e] = T(0.04 * double(e + s.layer) - 0.06);
}

void gradcheck_moe(const ModelConfig& cfg, const char* what) {
  const int B = 2, T = 6;
  Transformer<double> m(cfg, B, T);
  m.init_weights(3);
  Rng r(4);
  for (int64_t i = 0; i < m.num_params(); ++i) m.params()[i] += 0.1 * r.normal();
  for (const auto& s : m.table().specs) set_expert_bias(s, m.params() + s.offset);
  auto x = tokens(B * T, cfg.vocab_size, 5), y = tokens(B * T, cfg.vocab_size, 6);
  y[3] = -1;
  m.zero_grads();
  m.forward_backward(x.data(), y.data(), B, T, 1.0);
  std::vector<double> analytic(m.grads(), m.grads() + m.num_params());
  // The function whose gradient forward_backward computes: the cross-entropy sum and the
  // router losses weighted as the backward weights them.
  auto loss = [&] { return m.forward_loss(x.data(), y.data(), B, T) + m.router_loss(); };
  EXPECT_GT(m.router_loss(), 0.0) << what;
  tetrad::testing::GradCheckOptions opt;
  opt.max_checks = 48;
  opt.h = 1e-5;
  for (const auto& s : m.table().specs) {
    // The expert bias only chooses (a step function of it): no gradient, none computed.
    if (s.kind == ParamKind::Buffer) {
      for (int64_t j = 0; j < s.numel; ++j) EXPECT_EQ(analytic[size_t(s.offset + j)], 0.0) << s.name;
      continue;
    }
    EXPECT_TRUE(tetrad::testing::gradient_matches(std::string(what) + " " + s.name,
                                                  m.params() + s.offset, s.numel,
                                                  analytic.data() + s.offset, loss, opt));
  }
}
}  // namespace

TEST(MoeGradcheck, DroplessRenormalisedWithAuxAndZLoss) { gradcheck_moe(moe_cfg(4, 2), "dropless"); }

TEST(MoeGradcheck, WithoutRenormalisationTopOne) {
  ModelConfig c = moe_cfg(3, 1);
  c.norm_topk_prob = false;
  gradcheck_moe(c, "top-1 unnormalised");
}

TEST(MoeGradcheck, CapacityFactorDropsChoices) {
  ModelConfig c = moe_cfg(4, 2);
  c.moe_capacity_factor = 0.5f;  // each expert takes at most 3 of 12 tokens' 24 choices
  gradcheck_moe(c, "capacity 0.5");
}

TEST(MoeGradcheck, SharedExpertWithItsGate) {
  ModelConfig c = moe_cfg(4, 2);
  c.shared_expert_ffn = 10;
  gradcheck_moe(c, "shared expert");
}

// Both balancing methods: the aux loss's gradient with the bias's selection.
TEST(MoeGradcheck, ExpertBiasWithAuxLossAndSharedExpert) {
  ModelConfig c = moe_cfg(4, 2);
  c.moe_balance = "both";
  c.shared_expert_ffn = 6;
  gradcheck_moe(c, "expert bias + aux loss + shared expert");
}

TEST(MoeGradcheck, NoBalancingLoss) {
  ModelConfig c = moe_cfg(4, 2);
  c.moe_balance = "none";
  c.router_z_loss_coef = 0;
  c.router_aux_loss_coef = 0.05f;  // ignored: no balancing
  const int B = 1, T = 4;
  Transformer<double> m(c, B, T);
  m.init_weights(1);
  auto x = tokens(B * T, c.vocab_size, 2);
  m.forward_loss(x.data(), x.data(), B, T);
  EXPECT_EQ(m.router_loss(), 0.0);
  EXPECT_GT(m.mean_aux_loss(), 0.0);  // measured, not trained on
}

// ---- the parallel model on one rank against the oracle -----------------------------------------

namespace {
struct Trace {
  std::vector<double> losses;
  std::vector<float> grads;  // the last step's, in table order
  MoeStats first;            // the first step's routing statistics
};

// `steps` SGD steps (lr 0.05) of the parallel model on one rank; every step's loss, the last
// step's gradient in table order.
Trace run_parallel(const ModelConfig& cfg, const ParallelOptions& po, int steps,
                   bool zero_router = false) {
  const int B = 2, T = 8;
  ProcessGroups g;
  ParallelTransformer m(cfg, g, B, T, po);
  m.init_weights(7);
  const ParamTable& table = m.table();
  for (size_t i = 0; i < table.specs.size(); ++i) {
    const ParamSpec& s = table.specs[i];
    if ((zero_router && s.role == TensorRole::Router) || s.role == TensorRole::ExpertBias) {
      std::vector<float> v(size_t(s.numel), 0.0f);
      set_expert_bias(s, v.data());
      m.set_tensor(i, v.data());
    }
  }
  Trace tr;
  for (int s = 0; s < steps; ++s) {
    auto x = tokens(B * T, cfg.vocab_size, 100 + uint64_t(s)), y = tokens(B * T, cfg.vocab_size, 200 + uint64_t(s));
    m.zero_grads();
    tr.losses.push_back(m.forward_backward(x.data(), y.data(), B, T, 1.0f / (B * T)));
    m.reduce_gradients();
    const MoeStats st = m.take_moe_stats();
    if (s == 0) tr.first = st;
    std::vector<float> grads_full(size_t(table.total));
    for (size_t i = 0; i < table.specs.size(); ++i)
      m.gather_tensor(m.grads(), i, grads_full.data() + table.specs[i].offset);
    if (s + 1 == steps) tr.grads = grads_full;
    std::vector<float> p(size_t(table.total));
    for (size_t i = 0; i < table.specs.size(); ++i) m.get_tensor(i, p.data() + table.specs[i].offset);
    for (int64_t i = 0; i < table.total; ++i) p[size_t(i)] -= 0.05f * grads_full[size_t(i)];
    for (size_t i = 0; i < table.specs.size(); ++i) m.set_tensor(i, p.data() + table.specs[i].offset);
  }
  return tr;
}

Trace run_parallel(const ModelConfig& cfg, Recompute rc, int steps, bool zero_router = false) {
  ParallelOptions po;
  po.recompute = rc;
  return run_parallel(cfg, po, steps, zero_router);
}

Trace run_oracle(const ModelConfig& cfg, int steps, bool zero_router = false) {
  const int B = 2, T = 8;
  Transformer<float> m(cfg, B, T);
  m.init_weights(7);
  for (const ParamSpec& s : m.table().specs) {
    if (zero_router && s.role == TensorRole::Router) std::fill(m.params() + s.offset, m.params() + s.offset + s.numel, 0.0f);
    set_expert_bias(s, m.params() + s.offset);
  }
  Trace tr;
  for (int s = 0; s < steps; ++s) {
    auto x = tokens(B * T, cfg.vocab_size, 100 + uint64_t(s)), y = tokens(B * T, cfg.vocab_size, 200 + uint64_t(s));
    m.zero_grads();
    tr.losses.push_back(m.forward_backward(x.data(), y.data(), B, T, 1.0f / (B * T)));
    if (s + 1 == steps) tr.grads.assign(m.grads(), m.grads() + m.num_params());
    for (int64_t i = 0; i < m.num_params(); ++i) m.params()[i] -= 0.05f * m.grads()[i];
  }
  return tr;
}

void expect_follows_oracle(const ModelConfig& cfg, const char* what, bool zero_router = false,
                           int steps = 4) {
  const Trace p = run_parallel(cfg, Recompute::None, steps, zero_router);
  const Trace o = run_oracle(cfg, steps, zero_router);
  for (int s = 0; s < steps; ++s)
    EXPECT_NEAR(p.losses[size_t(s)] / o.losses[size_t(s)], 1.0, 1e-5) << what << " step " << s;
  double num = 0, den = 0;
  for (size_t i = 0; i < p.grads.size(); ++i) {
    num += std::pow(double(p.grads[i]) - o.grads[i], 2);
    den += std::pow(double(o.grads[i]), 2);
  }
  EXPECT_LT(std::sqrt(num / den), 1e-4) << what;
}
}  // namespace

TEST(MoeParallel, FollowsTheOracleDropless) { expect_follows_oracle(moe_cfg(4, 2), "dropless"); }

TEST(MoeParallel, FollowsTheOracleWithDrops) {
  ModelConfig c = moe_cfg(4, 2);
  c.moe_capacity_factor = 0.75f;
  expect_follows_oracle(c, "capacity 0.75");
}

TEST(MoeParallel, FollowsTheOracleWithTheSharedExpert) {
  ModelConfig c = moe_cfg(4, 2);
  c.shared_expert_ffn = 20;
  expect_follows_oracle(c, "shared expert");
}

// The bias changes the selection (the same tokens' choices differ from the plain router's), and
// the parallel model chooses as the oracle does.
TEST(MoeParallel, FollowsTheOracleWithTheExpertBias) {
  ModelConfig c = moe_cfg(4, 2);
  c.moe_balance = "expert_bias";
  const Trace biased = run_parallel(c, Recompute::None, 1);
  c.moe_balance = "none";
  const Trace plain = run_parallel(c, Recompute::None, 1);
  EXPECT_NE(biased.losses[0], plain.losses[0]) << "the bias chose no other expert";
  c.moe_balance = "expert_bias";
  expect_follows_oracle(c, "expert bias");
  c.moe_balance = "both";
  c.moe_capacity_factor = 0.75f;
  expect_follows_oracle(c, "expert bias, aux loss and drops");
}

TEST(MoeParallel, EveryRecomputeModeIsBitIdenticalWithSharedExpertAndBias) {
  ModelConfig c = moe_cfg(4, 2);
  c.shared_expert_ffn = 8;
  c.moe_balance = "both";
  const Trace none = run_parallel(c, Recompute::None, 3);
  for (Recompute rc : {Recompute::Selective, Recompute::Full}) {
    const Trace r = run_parallel(c, rc, 3);
    EXPECT_EQ(r.losses, none.losses) << recompute_name(rc);
    EXPECT_EQ(r.grads, none.grads) << recompute_name(rc);
  }
}

TEST(MoeParallel, EveryRecomputeModeIsBitIdentical) {
  const ModelConfig c = moe_cfg(4, 2);
  const Trace none = run_parallel(c, Recompute::None, 3);
  for (Recompute rc : {Recompute::Selective, Recompute::Full}) {
    const Trace r = run_parallel(c, rc, 3);
    EXPECT_EQ(r.losses, none.losses) << recompute_name(rc);
    EXPECT_EQ(r.grads, none.grads) << recompute_name(rc);
    EXPECT_EQ(r.first.layers, none.first.layers) << "recomputation counted twice";
  }
}

// A router of zeros ties every expert: every token goes to expert 0 (top-1, lowest index on
// ties), the other experts receive no token. Dropless, expert 0 computes all N rows; the model
// follows the oracle and trains (the router learns to spread the load).
TEST(MoeParallel, ExtremeImbalanceTrainsDropless) {
  ModelConfig c = moe_cfg(4, 1);
  const Trace p = run_parallel(c, Recompute::None, 6, /*zero_router=*/true);
  EXPECT_EQ(p.first.layers, c.n_layer);
  EXPECT_EQ(p.first.max_rows, 2 * 8);  // every token of the micro-batch
  EXPECT_EQ(p.first.min_rows, 0);      // experts without tokens
  EXPECT_EQ(p.first.dropped, 0);
  for (double l : p.losses) EXPECT_TRUE(std::isfinite(l));
  // The first step against the oracle (afterwards experts 1..3 stay exactly tied, and which one a
  // tie picks would hang on the last bit of their router rows).
  expect_follows_oracle(c, "every token to expert 0", /*zero_router=*/true, /*steps=*/1);
}

TEST(MoeParallel, ActiveParametersCountInTheFlops) {
  ModelConfig c = moe_cfg(8, 2);
  const double moe = flops_per_token(c, 8);
  c.n_experts = 2;
  c.experts_per_token = 2;
  EXPECT_NEAR(flops_per_token(c, 8), moe - 6.0 * c.n_layer * (8 - 2) * c.n_embd, 1e-6)
      << "only the router grows with the experts when k stays 2";
}

// ---- settings refused by name --------------------------------------------------------------------

TEST(MoeConfig, SettingsNotImplementedAreRefusedByName) {
  ModelConfig c = moe_cfg(4, 2);
  c.experts_per_token = 5;
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "experts_per_token (top-k) = 5 is larger than model.n_experts = 4"));
  c = moe_cfg(4, 2);
  c.moe_balance = "sinkhorn";
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "\"sinkhorn\": expected \"aux_loss\", \"expert_bias\""));
  c = moe_cfg(4, 2);
  c.expert_bias_rate = -1;
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "model.expert_bias_rate"));
  c = moe_cfg(4, 2);
  c.shared_expert_ffn = -2;
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "model.shared_expert_ffn must be >= 0"));
  c = moe_cfg(4, 2);
  c.shared_expert_ffn = 8;
  EXPECT_TRUE(has(error_of([&] { require_hf_exportable(c); }), "no shared expert"));
  c = moe_cfg(4, 2);
  c.moe_balance = "both";
  EXPECT_TRUE(has(error_of([&] { require_hf_exportable(c); }), "no expert bias"));
  ModelConfig dense_shared;
  dense_shared.family = Family::Llama;
  dense_shared.shared_expert_ffn = 8;
  EXPECT_TRUE(has(error_of([&] { dense_shared.validate(); }), "dense model"));
  c = moe_cfg(4, 2);
  c.n_experts = 0;
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "model.n_experts must be positive"));
  ModelConfig dense;
  dense.family = Family::Llama;
  dense.n_experts = 4;
  EXPECT_TRUE(has(error_of([&] { dense.validate(); }), "dense model"));
  // The experts run on X and Y (docs/moe.md, "On the tensor axes X and Y"; MoeTensorAxesMpi);
  // the shared expert does not yet.
  const GridShape x2{2, 1, 1, 1};
  EXPECT_EQ(error_of([&] { validate_grid_for_model(moe_cfg(4, 2), x2); }), "");
  ModelConfig shared = moe_cfg(4, 2);
  shared.shared_expert_ffn = 8;
  EXPECT_TRUE(has(error_of([&] { validate_grid_for_model(shared, x2); }),
                  "shared expert (model.shared_expert_ffn = 8) split over the tensor axes (Gx = 2"));
  ProcessGroups g;
  ParallelOptions o;
  o.precision = backend::Precision::BF16;
  EXPECT_TRUE(has(error_of([&] { ParallelTransformer m(shared, g, 1, 8, o); }),
                  "the shared expert (model.shared_expert_ffn = 8) in bf16 is not implemented"));
}

// ---- bf16 ---------------------------------------------------------------------------------------

namespace {
ParallelOptions bf16_options(bool activations = true, bool weight_copy = true,
                             Recompute rc = Recompute::None) {
  ParallelOptions po;
  po.precision = backend::Precision::BF16;
  po.bf16_activations = activations;
  po.bf16_weight_copy = weight_copy;
  po.recompute = rc;
  return po;
}

// Relative L2 distance of two gradients.
double grad_distance(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += std::pow(double(a[i]) - b[i], 2);
    den += std::pow(double(b[i]), 2);
  }
  return std::sqrt(num / den);
}
}  // namespace

// Precision bf16 on a mixture of experts (the experts' GEMMs in bf16 from the bf16 weight copy,
// the SwiGLU stored in bf16; the router, its input and the routing in fp32; master weights and
// gradients fp32), with and without bf16 activations and the weight copy: 8 SGD steps close to
// fp32's within bf16's tolerance: every step's loss within 2% (the bf16 contract the grid tests
// hold: Bf16Grid, ContextBf16Mpi) and the last step's gradient within 2% (relative L2; bf16's
// rounding is 2^-9 = 0.2% per operand). Not fp32's bits: the losses differ.
TEST(MoeBf16, StepsCloseToFp32) {
  ModelConfig c = moe_cfg(4, 2);
  c.n_embd = 32;
  c.ffn = 48;
  const int steps = 8;
  const Trace fp32 = run_parallel(c, Recompute::None, steps);
  for (int form = 0; form < 4; ++form) {
    const bool acts = form & 1, copy = form & 2;
    const std::string what = std::string("bf16 activations ") + (acts ? "on" : "off") +
                             ", weight copy " + (copy ? "on" : "off");
    const Trace bf16 = run_parallel(c, bf16_options(acts, copy), steps);
    double worst = 0;
    for (int s = 0; s < steps; ++s) {
      const double rel = std::abs(bf16.losses[size_t(s)] / fp32.losses[size_t(s)] - 1.0);
      worst = std::max(worst, rel);
      EXPECT_LT(rel, 0.02) << what << " step " << s;
    }
    EXPECT_GT(worst, 0.0) << what << ": bf16 gave fp32's losses bit for bit";
    const double g = grad_distance(bf16.grads, fp32.grads);
    EXPECT_LT(g, 0.02) << what << ": the last step's gradient";
    std::printf("[ moe bf16 ] %s: losses within %.2e of fp32, gradient %.2e\n", what.c_str(),
                worst, g);
  }
}

// bf16 stores the SwiGLU in bf16 and recomputes it under recomputation: every mode bit for bit.
TEST(MoeBf16, EveryRecomputeModeIsBitIdentical) {
  const ModelConfig c = moe_cfg(4, 2);
  const Trace none = run_parallel(c, bf16_options(), 3);
  for (Recompute rc : {Recompute::Selective, Recompute::Full}) {
    const Trace r = run_parallel(c, bf16_options(true, true, rc), 3);
    EXPECT_EQ(r.losses, none.losses) << recompute_name(rc);
    EXPECT_EQ(r.grads, none.grads) << recompute_name(rc);
  }
}

// The experts' backward with bf16 activations rounds dY and the SwiGLU's gradient to bf16 once
// per layer, as stored and transposed, and runs the weight gradients as NN products on the
// transposed copies (ParallelOptions::bf16_weight_grad_nn, as the dense layers); the per-call
// form (off) rounds the same values inside each product and runs them TN. The same bf16
// operands summed in another order: the forward (step 0's loss) bit for bit, the gradient
// within fp32 rounding, on an even load and with every token on one expert (the others empty).
TEST(MoeBf16, NnWeightGradientsSumThePerCallFormsOperands) {
  for (const bool one_expert : {false, true}) {
    const ModelConfig c = moe_cfg(4, one_expert ? 1 : 2);
    ParallelOptions per_call = bf16_options();
    per_call.bf16_weight_grad_nn = false;
    const Trace nn = run_parallel(c, bf16_options(), 1, one_expert);
    const Trace tn = run_parallel(c, per_call, 1, one_expert);
    EXPECT_EQ(nn.losses[0], tn.losses[0]) << "one expert " << one_expert;
    const double g = grad_distance(nn.grads, tn.grads);
    EXPECT_LT(g, 1e-5) << "one expert " << one_expert;
    std::printf("[ moe bf16 ] NN weight gradients%s: gradient within %.2e of the per-call form\n",
                one_expert ? " (one expert)" : "", g);
  }
}

// An extreme imbalance in bf16: every token to expert 0 (a router of zeros, top 1), the other
// experts empty, trains dropless and stays close to fp32.
TEST(MoeBf16, ExtremeImbalanceTrainsDropless) {
  const ModelConfig c = moe_cfg(4, 1);
  const Trace fp32 = run_parallel(c, Recompute::None, 1, /*zero_router=*/true);
  const Trace bf16 = run_parallel(c, bf16_options(), 1, /*zero_router=*/true);
  EXPECT_EQ(bf16.first.max_rows, 2 * 8);
  EXPECT_EQ(bf16.first.min_rows, 0);
  EXPECT_LT(std::abs(bf16.losses[0] / fp32.losses[0] - 1.0), 0.02);
  EXPECT_LT(grad_distance(bf16.grads, fp32.grads), 0.05);
}

TEST(MoeConfig, ConfigJsonRoundTrip) {
  ModelConfig c = moe_cfg(8, 2);
  c.router_z_loss_coef = 0.001f;
  c.moe_capacity_factor = 1.25f;
  const nlohmann::json j = hf_config_json(c);
  EXPECT_EQ(j["model_type"], "mixtral");
  EXPECT_EQ(j["num_local_experts"], 8);
  EXPECT_EQ(j["num_experts_per_tok"], 2);
  const ModelConfig r = parse_hf_config(j, "config.json");
  EXPECT_EQ(r.family, Family::Mixtral);
  EXPECT_EQ(r.n_experts, 8);
  EXPECT_EQ(r.experts_per_token, 2);
  EXPECT_EQ(r.router_aux_loss_coef, c.router_aux_loss_coef);
  EXPECT_EQ(r.router_z_loss_coef, c.router_z_loss_coef);
  EXPECT_EQ(r.moe_capacity_factor, c.moe_capacity_factor);
  nlohmann::json bad = j;
  bad["num_experts_per_tok"] = 9;
  EXPECT_TRUE(has(error_of([&] { parse_hf_config(bad, "config.json"); }), "num_experts_per_tok = 9"));
  bad = j;
  bad["router_jitter_noise"] = 0.1;
  EXPECT_TRUE(has(error_of([&] { parse_hf_config(bad, "config.json"); }), "router_jitter_noise"));
}

// ---- the expert bias through the step runner -----------------------------------------------------

namespace {
// `steps` AdamW steps (weight decay 0.1) of top-1 routing whose bias starts at 0.1 on expert 0
// (every token to it); returns each step's load imbalance and the biases after step 1 and last.
struct BiasRun {
  std::vector<double> imbalance;
  std::vector<float> after_first, last;
};
BiasRun run_bias(const std::string& balance, int steps) {
  ModelConfig c = moe_cfg(4, 1);
  c.moe_balance = balance;
  c.expert_bias_rate = 0.005f;
  const int B = 2, T = 8;
  ProcessGroups g;
  ParallelTransformer m(c, g, B, T, ParallelOptions{});
  m.init_weights(7);
  const ParamTable& table = m.table();
  const ParamSpec* bias = nullptr;
  size_t bias_index = 0;
  for (size_t i = 0; i < table.specs.size(); ++i)
    if (table.specs[i].role == TensorRole::ExpertBias && table.specs[i].layer == 0) {
      bias = &table.specs[i];
      bias_index = i;
    }
  BiasRun out;
  if (bias) {
    for (size_t i = 0; i < table.specs.size(); ++i)
      if (table.specs[i].role == TensorRole::ExpertBias) {
        const float start[] = {0.1f, 0.0f, 0.0f, 0.0f};
        m.set_tensor(i, start);
      }
  }
  const TrainConfig tc = tetrad_test::train_config(1e-3, steps);
  AdamW adam = tetrad_test::layout_adamw(m, tc);
  StepRunner runner(m, adam, g, tetrad_test::step_options(tc, 1, B, T));
  for (int s = 0; s < steps; ++s) {
    auto x = tokens(B * T, c.vocab_size, 300 + uint64_t(s)), y = tokens(B * T, c.vocab_size, 400 + uint64_t(s));
    const StepResult r = runner.run(x.data(), y.data(), double(B * T), learning_rate(tc, s), s);
    EXPECT_EQ(r.verdict, StepVerdict::Apply);
    out.imbalance.push_back(r.moe.load_imbalance());
    if (bias) {
      std::vector<float> v(4);
      m.get_tensor(bias_index, v.data());
      if (s == 0) out.after_first = v;
      out.last = v;
    }
  }
  return out;
}
}  // namespace

// The bias moves by exactly rate * sign(mean - load) after each step (AdamW's decay and update
// leave it alone), and evens the load out: every token on expert 0 at first (imbalance 4 = E for
// top 1), spread over the experts once the bias has come down.
TEST(MoeExpertBias, TheStepRunnerUpdatesItAndTheLoadEvensOut) {
  const BiasRun b = run_bias("expert_bias", 24);
  ASSERT_EQ(b.after_first.size(), 4u);
  EXPECT_DOUBLE_EQ(b.imbalance[0], 4.0);
  EXPECT_EQ(b.after_first[0], 0.1f - 0.005f);
  for (int e = 1; e < 4; ++e) EXPECT_EQ(b.after_first[size_t(e)], 0.005f) << "expert " << e;
  double late = 0;
  for (size_t s = b.imbalance.size() - 6; s < b.imbalance.size(); ++s) late += b.imbalance[s] / 6;
  EXPECT_LT(late, 2.0) << "mean imbalance of the last 6 steps";
  const BiasRun a = run_bias("aux_loss", 2);
  EXPECT_TRUE(a.after_first.empty()) << "no bias tensor without the expert bias";
}

// Saved with the weights in a run checkpoint's folder (config.json's tetrad_* fields and the
// bias and shared expert tensors), read back as they were.
TEST(MoeExpertBias, RunCheckpointFolderKeepsTheBiasAndTheSharedExpert) {
  ModelConfig c = moe_cfg(4, 2);
  c.moe_balance = "both";
  c.expert_bias_rate = 0.0025f;
  c.shared_expert_ffn = 6;
  const ParamTable table = build_param_table(c);
  std::vector<float> p(size_t(table.total));
  Rng r(9);
  for (auto& v : p) v = float(r.normal());
  const std::string dir = ::testing::TempDir() + "moe_bias_ckpt";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write_hf_files(dir, c, table, p.data());
  const ModelConfig back = read_hf_config(dir);
  EXPECT_EQ(back.moe_balance, "both");
  EXPECT_EQ(back.expert_bias_rate, 0.0025f);
  EXPECT_EQ(back.shared_expert_ffn, 6);
  std::vector<float> q(size_t(table.total), 0.0f);
  load_hf_params(dir, back, build_param_table(back), q.data());
  EXPECT_EQ(q, p);
  int bias_tensors = 0, shared_tensors = 0;
  for (const ParamSpec& s : table.specs) {
    bias_tensors += s.role == TensorRole::ExpertBias;
    shared_tensors += s.role == TensorRole::SharedGate || s.role == TensorRole::SharedUp ||
                      s.role == TensorRole::SharedDown || s.role == TensorRole::SharedExpertGate;
  }
  EXPECT_EQ(bias_tensors, c.n_layer);
  EXPECT_EQ(shared_tensors, 4 * c.n_layer);
  std::filesystem::remove_all(dir);
}
