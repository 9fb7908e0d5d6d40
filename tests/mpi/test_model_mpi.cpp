// The correctness contract of 4d-parallelism.md: on every factorisation (x, y, z, d) of the world
// size, training the model in parallel follows the serial run: the same loss at every step
// (relative 1e-5) and, gathered at the end, the same weights (within fp32 rounding).
// Runs under mpirun -n 2, 4, 8 (oversubscribed on small machines).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "contract.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "support/transformer.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/optimizer.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

using namespace contract;

constexpr int kSteps = 20;

ModelConfig test_model(Family f) { return tiny_model(f, 2); }

// Heads of their own width (12, with n_embd / n_head = 8): q|k|v and the attention output are
// n_head * 12 wide on every grid, the model's hidden size still 64.
ModelConfig own_head_dim_model() {
  ModelConfig mc = test_model(Family::Llama);
  mc.explicit_head_dim = 12;
  mc.validate();
  return mc;
}

// Qwen3: per-head q/k norms on heads 12 wide, grouped-query attention (8 heads, 4 key/value
// heads): Y splits the heads, each rank normalises its own, the norms' gradients summed over Y.
ModelConfig qwen3_model() {
  ModelConfig mc = test_model(Family::Qwen3);
  mc.explicit_head_dim = 12;
  mc.validate();
  return mc;
}

void check_all_grids(const ModelConfig& mc) {
  const Family family = mc.family;
  const Run serial = serial_run(mc, kSteps);
  const std::vector<GridShape> grids = contract_grids(mc);
  const int skipped = int(factorizations(world_size()).size() - grids.size());
  int tested = 0;
  for (const GridShape& shape : grids) {
    ProcessGroups g(comm::Communicator::world(), shape);
    const Run par = parallel_run(mc, g, kSteps, ParallelOptions{});
    ++tested;
    expect_matches_serial(par, serial, mc, family_name(family) + " grid " + shape.to_string());
  }
  if (world_rank() == 0)
    std::printf("[ %s ] %d grids of %d ranks tested, %d skipped (model or batch does not divide)\n",
                family_name(family).c_str(), tested, world_size(), skipped);
  EXPECT_GT(tested, 0);
}

// One micro-batch, no optimizer: the loss and the gradient of every tensor (every layer's forward
// and backward, both layouts, the embedding, head and loss) against the serial model.
void check_gradients_all_grids(const ModelConfig& mc) {
  const Family family = mc.family;
  Transformer<float> serial(mc, kB, kT);
  serial.init_weights(3);
  auto tok = batch_tokens(0, 0, mc.vocab_size);
  std::vector<int32_t> x(size_t(kB) * kT), y(x.size());
  for (int b = 0; b < kB; ++b)
    for (int t = 0; t < kT; ++t) {
      x[b * kT + t] = tok[b * (kT + 1) + t];
      y[b * kT + t] = t % 5 == 0 ? -1 : tok[b * (kT + 1) + t + 1];  // some masked targets
    }
  int kept = 0;
  for (int32_t v : y) kept += v >= 0;
  serial.zero_grads();
  const double serial_loss = serial.forward_backward(x.data(), y.data(), kB, kT, 1.0f / kept);
  for (const GridShape& shape : contract_grids(mc)) {
    ProcessGroups g(comm::Communicator::world(), shape);
    const int Bl = kB / token_slots(shape), slot = token_slot(g.coord, shape);
    ParallelTransformer m(mc, g, Bl, kT);
    m.init_weights(3);
    m.zero_grads();
    double loss = m.forward_backward(x.data() + size_t(slot) * Bl * kT, y.data() + size_t(slot) * Bl * kT,
                                     Bl, kT, 1.0f / kept);
    m.reduce_gradients();
    if (g.tokens().size() > 1) g.tokens().allreduce_sum(&loss, 1);
    const std::string where = family_name(family) + " grid " + shape.to_string();
    EXPECT_NEAR(loss / serial_loss, 1.0, 1e-5) << where;
    for (size_t i = 0; i < m.table().specs.size(); ++i) {
      const ParamSpec& s = m.table().specs[i];
      std::vector<float> full(s.numel);
      m.gather_tensor(m.grads(), i, full.data());
      double num = 0, den = 0;
      for (int64_t j = 0; j < s.numel; ++j) {
        const double a = full[j], b = serial.grads()[s.offset + j];
        num += (a - b) * (a - b);
        den += b * b;
      }
      EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-4) << where << ": gradient of " << s.name;
    }
  }
}

}  // namespace

TEST(ParallelLayers, Gpt2GradientOfEveryTensorMatchesSerialOnEveryGrid) {
  check_gradients_all_grids(test_model(Family::GPT2));
}
TEST(ParallelLayers, LlamaGradientOfEveryTensorMatchesSerialOnEveryGrid) {
  check_gradients_all_grids(test_model(Family::Llama));
}
// Qwen2's q, k, v biases (each split over Y with its heads, one bias of the fused GEMM).
TEST(ParallelLayers, Qwen2GradientOfEveryTensorMatchesSerialOnEveryGrid) {
  check_gradients_all_grids(test_model(Family::Qwen2));
}

// Llama 3.1's rope scaling (rope type "llama3"; the frequencies of test_kernels' Rope tests, one
// in each band for head_dim 8): forward and backward on every grid as serially.
TEST(ParallelLayers, LlamaWithLlama3RopeGradientOfEveryTensorMatchesSerialOnEveryGrid) {
  ModelConfig mc = test_model(Family::Llama);
  mc.rope_theta = 100;
  mc.rope_type = "llama3";
  mc.rope_factor = 8;
  mc.rope_low_freq_factor = 2;
  mc.rope_high_freq_factor = 8;
  mc.rope_original_max_position = 64;
  ASSERT_EQ(mc.head_dim(), 8);
  // The scaling changes the model (else this test could not tell whether a grid applied it).
  auto serial_loss = [](const ModelConfig& c) {
    Transformer<float> m(c, kB, kT);
    m.init_weights(3);
    auto tok = batch_tokens(0, 0, c.vocab_size);
    std::vector<int32_t> x(size_t(kB) * kT), y(x.size());
    for (int b = 0; b < kB; ++b)
      for (int t = 0; t < kT; ++t) {
        x[b * kT + t] = tok[b * (kT + 1) + t];
        y[b * kT + t] = tok[b * (kT + 1) + t + 1];
      }
    m.zero_grads();
    return m.forward_backward(x.data(), y.data(), kB, kT, 1.0f / (kB * kT));
  };
  ModelConfig plain = mc;
  plain.rope_type = "default";
  EXPECT_GT(std::abs(serial_loss(mc) - serial_loss(plain)), 1e-6);
  check_gradients_all_grids(mc);
}

TEST(ParallelContract, Gpt2EveryGridTrainsLikeOneRank) { check_all_grids(test_model(Family::GPT2)); }
TEST(ParallelContract, LlamaEveryGridTrainsLikeOneRank) { check_all_grids(test_model(Family::Llama)); }
TEST(ParallelContract, Qwen2EveryGridTrainsLikeOneRank) { check_all_grids(test_model(Family::Qwen2)); }
TEST(ParallelContract, OwnHeadDimEveryGridTrainsLikeOneRank) { check_all_grids(own_head_dim_model()); }
TEST(ParallelContract, Qwen3EveryGridTrainsLikeOneRank) { check_all_grids(qwen3_model()); }
TEST(ParallelLayers, Qwen3GradientOfEveryTensorMatchesSerialOnEveryGrid) {
  check_gradients_all_grids(qwen3_model());
}
TEST(ParallelLayers, OwnHeadDimGradientOfEveryTensorMatchesSerialOnEveryGrid) {
  check_gradients_all_grids(own_head_dim_model());
}

// The token embedding's gradient exchanged over Z as the rows the batch touched (tied GPT-2: the
// head's dense part reduce-scattered early; untied Llama: rows only) trains like the dense
// reduce-scatter of the whole block, within fp32 rounding (the additions come in another order).
void check_sparse_embedding(Family family) {
  const ModelConfig mc = test_model(family);
  int sparse_grids = 0;
  for (const GridShape& shape : contract_grids(mc)) {
    if (shape.z() == 1) continue;
    ProcessGroups g(comm::Communicator::world(), shape);
    ParallelOptions sparse, dense;
    dense.sparse_embedding_grad = false;
    {
      ParallelTransformer probe(mc, g, kB / token_slots(shape), kT, sparse);
      if (!probe.sparse_embedding_grad()) continue;  // more rows than the block: dense is chosen
      ParallelTransformer off(mc, g, kB / token_slots(shape), kT, dense);
      EXPECT_FALSE(off.sparse_embedding_grad());
    }
    ++sparse_grids;
    const Run a = parallel_run(mc, g, 5, sparse), b = parallel_run(mc, g, 5, dense);
    const std::string where = family_name(family) + " grid " + shape.to_string();
    for (int s = 0; s < 5; ++s) EXPECT_NEAR(a.losses[s] / b.losses[s], 1.0, 1e-5) << where;
    std::string worst_name;
    EXPECT_LT(worst_weight_difference(a, b, mc, &worst_name), 2e-4) << where << ": " << worst_name;
  }
  if (world_size() >= 2) {
    EXPECT_GT(sparse_grids, 0) << "no grid of this size took the sparse path";
  }
}

TEST(ParallelContract, Gpt2SparseEmbeddingGradientTrainsLikeTheDenseOne) {
  check_sparse_embedding(Family::GPT2);
}
TEST(ParallelContract, LlamaSparseEmbeddingGradientTrainsLikeTheDenseOne) {
  check_sparse_embedding(Family::Llama);
}

TEST(ParallelContract, GridThatDoesNotDivideTheModelIsRefused) {
  ModelConfig mc = test_model(Family::GPT2);
  GridShape g{1, 3, 1, 1};
  try {
    validate_grid_for_model(mc, g);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_embd (64) is not divisible by Gy = 3"), std::string::npos) << e.what();
  }
}
