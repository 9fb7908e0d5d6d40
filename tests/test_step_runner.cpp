// The step runner's decisions without MPI, data or a device: the non-finite guard (skip a step
// whose loss or gradient is not finite, stop after train.max_bad_steps in a row) and clipping as
// pure functions, then the runner itself on one rank: a skipped step leaves the weights and the
// Adam moments as they were, and the run goes on once the loss is finite again.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tetrad/core/rng.hpp"
#include "tetrad/train/step_runner.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(NonFiniteGuard, FiniteStepsApplyAndResetTheCount) {
  NonFiniteGuard g(3);
  EXPECT_EQ(g.judge(2.5, 0.7), StepVerdict::Apply);
  EXPECT_EQ(g.bad_steps(), 0);
  EXPECT_EQ(g.judge(kNaN, 0.7), StepVerdict::Skip);
  EXPECT_EQ(g.bad_steps(), 1);
  EXPECT_EQ(g.judge(2.5, kInf), StepVerdict::Skip) << "a finite loss with an infinite gradient";
  EXPECT_EQ(g.bad_steps(), 2);
  EXPECT_EQ(g.judge(2.4, 0.6), StepVerdict::Apply) << "one finite step ends the streak";
  EXPECT_EQ(g.bad_steps(), 0);
}

TEST(NonFiniteGuard, StopsAtTheLimitInARow) {
  NonFiniteGuard g(3);
  EXPECT_EQ(g.judge(kInf, kNaN), StepVerdict::Skip);
  EXPECT_EQ(g.judge(-kInf, 1.0), StepVerdict::Skip);
  EXPECT_EQ(g.judge(1.0, kNaN), StepVerdict::Stop);
  EXPECT_EQ(g.bad_steps(), 3);
  NonFiniteGuard once(1);
  EXPECT_EQ(once.judge(kNaN, kNaN), StepVerdict::Stop) << "max_bad_steps = 1: the first one stops";
}

TEST(ClipScale, ScalesOnlyAboveTheClipAndNeverWhenOff) {
  EXPECT_EQ(clip_scale(1.0, 0.5), 1.0);
  EXPECT_EQ(clip_scale(1.0, 1.0), 1.0);
  EXPECT_EQ(clip_scale(1.0, 4.0), 0.25);
  EXPECT_EQ(clip_scale(0.0, 4.0), 1.0) << "grad_clip = 0 disables clipping";
  EXPECT_EQ(clip_scale(-1.0, 4.0), 1.0);
}

ModelConfig tiny() {
  ModelConfig c;
  c.family = Family::GPT2;
  c.n_layer = 1;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_kv_head = 4;
  c.ffn = 64;
  c.vocab_size = 64;
  c.max_seq = 8;
  c.tie_embeddings = true;
  return c;
}

std::vector<float> all(const float* p, int64_t n) { return std::vector<float>(p, p + n); }

TEST(StepRunner, ANonFiniteStepLeavesTheStateAndTheLimitStopsTheRun) {
  constexpr int B = 2, T = 8, M = 2;
  const ModelConfig mc = tiny();
  ProcessGroups g;
  ParallelTransformer model(mc, g, B, T, ParallelOptions{});
  model.init_weights(3);
  TrainConfig tc;
  tc.max_bad_steps = 2;
  const OptimizerLayout& ol = model.optimizer_layout();
  AdamW adam(decay_ranges(model.table(), tc, ol.param_offsets, ol.sizes, ol.state_offsets,
                          ol.grad_offsets),
             ol.state_size, tc);
  StepOptions so;
  so.micro_batches = M;
  so.B = B;
  so.T = T;
  so.max_bad_steps = tc.max_bad_steps;
  StepRunner runner(model, adam, g, so);
  Rng r(5);
  std::vector<int32_t> x(size_t(M) * B * T), y(x.size());
  for (auto& v : x) v = int32_t(r.next_u64() % uint64_t(mc.vocab_size));
  for (auto& v : y) v = int32_t(r.next_u64() % uint64_t(mc.vocab_size));
  const double kept = double(x.size());

  const StepResult first = runner.run(x.data(), y.data(), kept, 1e-3, 0);
  ASSERT_EQ(first.verdict, StepVerdict::Apply);
  EXPECT_TRUE(std::isfinite(first.loss) && first.loss > 0);
  ASSERT_EQ(runner.micro_losses().size(), size_t(M));
  EXPECT_EQ(runner.micro_losses()[0] + runner.micro_losses()[1], first.loss * kept);

  // A NaN in one tensor (the final norm's weight): the loss is NaN, the update is skipped.
  size_t poisoned = 0;
  while (model.table().specs[poisoned].name.find("ln_f") == std::string::npos) ++poisoned;
  std::vector<float> saved(size_t(model.table().specs[poisoned].numel));
  model.get_tensor(poisoned, saved.data());
  std::vector<float> nan(saved.size(), std::numeric_limits<float>::quiet_NaN());
  model.set_tensor(poisoned, nan.data());
  const int64_t np = model.num_local_params();
  const std::vector<float> p0 = all(model.param_data(), np), m0 = all(adam.m(), adam.size()),
                           v0 = all(adam.v(), adam.size());
  const StepResult skipped = runner.run(x.data(), y.data(), kept, 1e-3, 1);
  EXPECT_EQ(skipped.verdict, StepVerdict::Skip);
  EXPECT_EQ(skipped.bad_steps, 1);
  EXPECT_FALSE(std::isfinite(skipped.loss));
  EXPECT_EQ(std::memcmp(p0.data(), model.param_data(), size_t(np) * 4), 0) << "weights changed";
  EXPECT_EQ(std::memcmp(m0.data(), adam.m(), m0.size() * 4), 0) << "first moment changed";
  EXPECT_EQ(std::memcmp(v0.data(), adam.v(), v0.size() * 4), 0) << "second moment changed";
  EXPECT_EQ(runner.run(x.data(), y.data(), kept, 1e-3, 1).verdict, StepVerdict::Stop);

  // Weights finite again: the step applies and the streak is over.
  model.set_tensor(poisoned, saved.data());
  const StepResult again = runner.run(x.data(), y.data(), kept, 1e-3, 1);
  EXPECT_EQ(again.verdict, StepVerdict::Apply);
  EXPECT_EQ(again.bad_steps, 0);
  EXPECT_LT(again.loss, first.loss) << "the same batch after one update";
}

}  // namespace
