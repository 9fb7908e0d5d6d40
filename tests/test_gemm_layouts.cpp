// The per-site GEMM layouts of the parallel model (parallel/gemm_layouts.hpp, issue 19): every
// form of the input and weight gradients at the op table's seam (GemmArgs::product, the bf16
// operand copies the model reads) against the plain product, plans as text, every forced plan
// of the tiny model against the rule, and tune's fallbacks where it cannot apply. The 4-rank
// cases are in mpi/test_precision_mpi.cpp (Bf16Grid.*GemmLayout*).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "tetrad/backend/backend.hpp"
#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/parallel/gemm_layouts.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

// EXPECT_ERROR(expression, "part of the message"): the expression throws tetrad::Error naming it.
#define EXPECT_ERROR(expr, part) tetrad_test::expect_error([&] { (void)(expr); }, {part})

namespace {

std::vector<float> uniform(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(r.normal());
  return v;
}
std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = kernels::float_to_bf16(x[i]);
  return y;
}
// y[c * rows + r] = x[r * cols + c]
std::vector<uint16_t> transpose(const std::vector<uint16_t>& x, int64_t rows, int64_t cols) {
  std::vector<uint16_t> y(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return y;
}
double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
  double e = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    s += b[i] * b[i];
  }
  return std::sqrt(e / s);
}

struct EmulationGuard {
  ~EmulationGuard() { kernels::set_bf16_emulation_forced(false); }
};

backend::GemmProduct product(bool tr) {
  return tr ? backend::GemmProduct::Transposed : backend::GemmProduct::Plain;
}

}  // namespace

// dX[N, k] = dY[N, n]·W[n, k] as NN (dY16) and TN (dY16ᵀ stored), dW[n, k] += dYᵀ·X[N, k] as NN
// (dY16ᵀ stored) and TN (dY16), each plain and as its transposed product, through the CPU
// backend's op table as the model calls it: against the double product of the same bf16 values
// (only fp32 summation error may remain), on fresh random operands per form, shapes large enough
// for the transposed product's parallel pass (2 threads), native and emulated paths.
TEST(GemmLayouts, EveryDxAndDwFormMatchesThePlainProduct) {
  EmulationGuard guard;
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(2);
  const int64_t N = 203, k = 190, n = 257;
  const backend::OpTable& ops = backend::cpu_backend().ops();
  backend::Queue& q = backend::cpu_backend().queue();
  uint64_t seed = 100;
  for (int emulate = 0; emulate < 2; ++emulate) {
    if (!emulate && !kernels::native_bf16_matmul()) continue;
    kernels::set_bf16_emulation_forced(emulate == 1);
    for (int kind = 0; kind < 2; ++kind)  // 0: dx, 1: dw
      for (int ta = 0; ta < 2; ++ta)
        for (int tr = 0; tr < 2; ++tr) {
          const std::string where = std::string(kind ? "dw " : "dx ") +
                                    gemm_form_name(false, {ta == 1, tr == 1}) +
                                    (emulate ? " emulated" : " native");
          const auto dy = to_bf16(uniform(size_t(N * n), ++seed));
          const auto dyt = transpose(dy, N, n);
          const auto w = to_bf16(uniform(size_t(n * k), ++seed));
          const auto x = to_bf16(uniform(size_t(N * k), ++seed));
          const auto c0 = uniform(size_t(kind ? n * k : N * k), ++seed);
          std::vector<double> ref(c0.size());
          backend::GemmArgs g;
          g.precision = backend::Precision::BF16;
          g.a_type = g.b_type = backend::DType::BF16;
          g.product = product(tr == 1);
          g.trans_a = ta == 1;
          std::vector<float> c = c0;
          if (kind == 0) {
            for (int64_t i = 0; i < N; ++i)
              for (int64_t j = 0; j < k; ++j) {
                double s = 0;
                for (int64_t l = 0; l < n; ++l)
                  s += double(kernels::bf16_to_float(dy[size_t(i * n + l)])) *
                       double(kernels::bf16_to_float(w[size_t(l * k + j)]));
                ref[size_t(i * k + j)] = s;  // beta 0: C's old values are overwritten
              }
            g.M = N, g.N = k, g.K = n;
            g.A = ta ? dyt.data() : dy.data();
            g.lda = ta ? N : n;
            g.B = w.data(), g.ldb = k;
            g.beta = 0.0f;
          } else {
            for (int64_t i = 0; i < n; ++i)
              for (int64_t j = 0; j < k; ++j) {
                double s = 0;
                for (int64_t l = 0; l < N; ++l)
                  s += double(kernels::bf16_to_float(dy[size_t(l * n + i)])) *
                       double(kernels::bf16_to_float(x[size_t(l * k + j)]));
                ref[size_t(i * k + j)] = s + double(c0[size_t(i * k + j)]);  // accumulates
              }
            g.M = n, g.N = k, g.K = N;
            g.A = ta ? dy.data() : dyt.data();  // TN reads dY16 transposed, NN dY16ᵀ as stored
            g.lda = ta ? n : N;
            g.B = x.data(), g.ldb = k;
            g.beta = 1.0f;
          }
          g.C = c.data(), g.ldc = k;
          ops.gemm(q, g);
          q.synchronize();
          for (float v : c) ASSERT_FALSE(std::isnan(v)) << where;
          EXPECT_LT(rel_l2(c, ref), 1e-5) << where;
        }
  }
  omp_set_num_threads(saved_threads);
}

TEST(GemmLayouts, PlansAsTextRoundTripAndBadOnesAreRefused) {
  GemmLayoutPlan p;
  p.site[0] = {1024, 768, 2304, {false, true}, {true, false}, {false, true}};
  p.site[4] = {1024, 768, 50257, {}, {true, true}, {true, false}};
  const std::string s = p.to_string();
  EXPECT_NE(s.find("qkv:1024:768:2304:NT/tr:TN:NN/tr"), std::string::npos) << s;
  EXPECT_NE(s.find("proj:*:*:*:NT:NN:NN"), std::string::npos) << s;
  const GemmLayoutPlan back = GemmLayoutPlan::parse(s, "given");
  EXPECT_EQ(back.site, p.site);
  EXPECT_EQ(back.to_string(), s);
  EXPECT_TRUE(back.same_shapes(p));
  GemmLayoutPlan other = p;
  other.site[0].N = 512;
  EXPECT_FALSE(other.same_shapes(p));
  EXPECT_ERROR(GemmLayoutPlan::parse("qkv:*:*:*:NT:NN:NN", "given"), "lacks site \"proj\"");
  EXPECT_ERROR(GemmLayoutPlan::parse("mlp:*:*:*:NT:NN:NN", "given"), "unknown site \"mlp\"");
  EXPECT_ERROR(GemmLayoutPlan::parse("qkv:*:*:NT:NN:NN", "given"), "site:N:k_in:n_out:fwd:dx:dw");
  EXPECT_ERROR(GemmLayoutPlan::parse(std::string("qkv:*:*:*:NN:NN:NN") + s.substr(s.find(' ')), "given"),
               "the forward is \"NT\" or \"NT/tr\"");
  EXPECT_ERROR(GemmLayoutPlan::parse(std::string("qkv:*:*:*:NT:TT:NN") + s.substr(s.find(' ')), "given"),
               "expected \"NN\", \"TN\", \"NN/tr\" or \"TN/tr\"");
  EXPECT_ERROR(GemmLayoutPlan::parse(std::string("qkv:0:*:*:NT:NN:NN") + s.substr(s.find(' ')), "given"),
               "expected a positive size");
  EXPECT_ERROR(GemmLayoutPlan::parse(s + " qkv:*:*:*:NT:NN:NN", "given"), "given twice");
  EXPECT_EQ(parse_gemm_layouts("tune"), GemmLayouts::Tune);
  EXPECT_ERROR(parse_gemm_layouts("fast"), "expected \"rule\" or \"tune\"");
  std::string why;
  EXPECT_ERROR(resolve_gemm_layouts("fastest", backend::Precision::BF16, backend::cpu_backend(), &why),
               "expected \"auto\", \"rule\" or \"tune\"");
}

namespace {

// One forward_backward of the model under `po` on a fixed batch: the loss and the gradients.
struct Result {
  double loss = 0;
  std::vector<float> grads;
  GemmLayoutPlan plan;
  std::string summary;
};
Result run(const ModelConfig& mc, ParallelOptions po) {
  constexpr int B = 2, T = 32;
  ProcessGroups one;
  ParallelTransformer m(mc, one, B, T, po);
  m.init_weights(5);
  std::vector<int32_t> x(size_t(B) * T), y(x.size());
  Rng r(8);
  for (auto& v : x) v = int32_t(r.next_u64() % uint64_t(mc.vocab_size));
  for (auto& v : y) v = int32_t(r.next_u64() % uint64_t(mc.vocab_size));
  m.zero_grads();
  Result res;
  res.loss = m.forward_backward(x.data(), y.data(), B, T, 1.0f / (B * T));
  res.grads.assign(m.grads(), m.grads() + m.num_local_params());
  res.plan = m.gemm_layout_plan();
  res.summary = m.gemm_layout_summary();
  return res;
}

// Every site in one form: "qkv:*:*:*:<fwd>:<dx>:<dw> proj:... ".
std::string uniform_plan(GemmForm fwd, GemmForm dx, GemmForm dw) {
  std::string s;
  for (const char* site : kGemmSiteNames)
    s += std::string(s.empty() ? "" : " ") + site + ":*:*:*:" + gemm_form_name(true, fwd) + ":" +
         gemm_form_name(false, dx) + ":" + gemm_form_name(false, dw);
  return s;
}

}  // namespace

// Every forced plan (all 2 x 4 x 4 combinations of the forward's, dx's and dw's forms, every site
// alike, and one with a different form per site) of GPT-2 tiny and Llama tiny against the rule:
// the same loss and gradients within fp32 summation error (the operands are the same bf16 values
// in every form; only the order of the fp32 sums differs, and through the forward's output a
// few bf16 roundings downstream), never NaN; on the native and the emulated path.
TEST(GemmLayouts, EveryForcedPlanMatchesTheRuleOnTheTinyModel) {
  EmulationGuard guard;
  for (int emulate = 0; emulate < 2; ++emulate) {
    if (!emulate && !kernels::native_bf16_matmul()) continue;
    kernels::set_bf16_emulation_forced(emulate == 1);
    for (const char* name : {"tiny", "llama-tiny"}) {
      const ModelConfig mc = named_model(name);
      ParallelOptions po;
      po.precision = backend::Precision::BF16;
      po.attention_precision = backend::Precision::FP32;
      const Result rule = run(mc, po);
      EXPECT_EQ(rule.plan.source, "rule");
      std::vector<std::string> plans;
      for (int f = 0; f < 2; ++f)
        for (int dx = 0; dx < 4; ++dx)
          for (int dw = 0; dw < 4; ++dw)
            plans.push_back(uniform_plan({false, f == 1}, {(dx & 1) != 0, (dx & 2) != 0},
                                         {(dw & 1) != 0, (dw & 2) != 0}));
      plans.push_back(
          "qkv:*:*:*:NT:TN:NN proj:*:*:*:NT/tr:NN/tr:TN fc:*:*:*:NT:TN/tr:TN/tr "
          "fcproj:*:*:*:NT/tr:NN:NN/tr head:*:*:*:NT:TN:TN");
      for (const std::string& plan : plans) {
        SCOPED_TRACE(std::string(name) + (emulate ? " emulated: " : " native: ") + plan);
        ParallelOptions forced = po;
        forced.gemm_layout_plan = plan;
        const Result got = run(mc, forced);
        EXPECT_EQ(got.plan.source, "given");
        EXPECT_NEAR(got.loss, rule.loss, 1e-5 * std::fabs(rule.loss));
        double e = 0, s = 0;
        for (size_t i = 0; i < got.grads.size(); ++i) {
          ASSERT_FALSE(std::isnan(got.grads[i])) << i;
          e += std::pow(double(got.grads[i]) - rule.grads[i], 2);
          s += double(rule.grads[i]) * rule.grads[i];
        }
        EXPECT_LT(std::sqrt(e / s), 1e-4);
      }
    }
  }
}

// A plan with forms this model cannot run is refused, naming what is needed; one for other
// shapes too.
TEST(GemmLayouts, PlansThatCannotRunAreRefused) {
  const ModelConfig mc = named_model("tiny");
  ParallelOptions po;
  po.precision = backend::Precision::BF16;
  po.bf16_activations = false;  // no bf16 gradient copies: dY16ᵀ does not exist
  po.gemm_layout_plan = uniform_plan({}, {true, false}, {true, false});
  ProcessGroups one;
  EXPECT_ERROR(ParallelTransformer(mc, one, 2, 32, po), "reads the transposed bf16 copy of dY");
  po.bf16_activations = true;
  po.precision = backend::Precision::FP32;
  po.gemm_layout_plan = uniform_plan({false, true}, {}, {true, false});
  EXPECT_ERROR(ParallelTransformer(mc, one, 2, 32, po), "computes a product transposed");
  po.precision = backend::Precision::BF16;
  po.gemm_layout_plan = "qkv:9:*:*:NT:NN:NN" + uniform_plan({}, {}, {}).substr(18);
  EXPECT_ERROR(ParallelTransformer(mc, one, 2, 32, po), "its sizes are not this model's");
}

// tune where bf16 GEMMs are native: a tuned plan (the rule's forms left only for 5% faster ones)
// and its log line; where they are emulated (forced here), the rule, saying why; auto follows
// the same and fp32 is always the rule. A tuned model's gradients match the rule's, and its
// plan given to a fresh model gives the same bits (tuning leaves nothing behind in the model).
TEST(GemmLayouts, TuneRunsWhereBf16IsNativeElseTheRuleSaysWhy) {
  EmulationGuard guard;
  const ModelConfig mc = named_model("tiny");
  const backend::Backend& cpu = backend::cpu_backend();
  std::string why;
  EXPECT_EQ(resolve_gemm_layouts("auto", backend::Precision::FP32, cpu, &why), GemmLayouts::Rule);
  EXPECT_NE(why.find("fp32"), std::string::npos) << why;
  EXPECT_EQ(resolve_gemm_layouts("rule", backend::Precision::BF16, cpu, &why), GemmLayouts::Rule);
  for (int emulate = 0; emulate < 2; ++emulate) {
    if (!emulate && !kernels::native_bf16_matmul()) continue;
    kernels::set_bf16_emulation_forced(emulate == 1);
    ParallelOptions po;
    po.precision = backend::Precision::BF16;
    po.attention_precision = backend::Precision::FP32;
    const Result rule = run(mc, po);
    const GemmLayouts mode = resolve_gemm_layouts("auto", backend::Precision::BF16, cpu, &why);
    po.gemm_layouts = GemmLayouts::Tune;
    const Result tuned = run(mc, po);
    if (emulate) {
      EXPECT_EQ(mode, GemmLayouts::Rule);
      EXPECT_NE(why.find("emulated"), std::string::npos) << why;
      EXPECT_EQ(tuned.plan.source, "rule");
      EXPECT_NE(tuned.summary.find("rule (tune: bf16 GEMMs are emulated"), std::string::npos)
          << tuned.summary;
    } else {
      EXPECT_EQ(mode, GemmLayouts::Tune) << why;
      EXPECT_EQ(tuned.plan.source, "tuned");
      EXPECT_NE(tuned.summary.find("gemm layouts (tuned in "), std::string::npos) << tuned.summary;
      EXPECT_NE(tuned.summary.find("head.dx"), std::string::npos) << tuned.summary;
      EXPECT_TRUE(tuned.plan.same_shapes(rule.plan));
    }
    EXPECT_NEAR(tuned.loss, rule.loss, 1e-5 * std::fabs(rule.loss));
    double e = 0, s = 0;
    for (size_t i = 0; i < tuned.grads.size(); ++i) {
      ASSERT_FALSE(std::isnan(tuned.grads[i]));
      e += std::pow(double(tuned.grads[i]) - rule.grads[i], 2);
      s += double(rule.grads[i]) * rule.grads[i];
    }
    EXPECT_LT(std::sqrt(e / s), 1e-4) << tuned.plan.to_string() << "\n" << tuned.summary;
    ParallelOptions same = po;
    same.gemm_layout_plan = tuned.plan.to_string();
    const Result again = run(mc, same);
    for (size_t i = 0; i < again.grads.size(); ++i)  // tuning leaves nothing behind
      ASSERT_EQ(again.grads[i], tuned.grads[i]) << "the tuned plan given again, element " << i;
    EXPECT_EQ(again.loss, tuned.loss);
  }
}
