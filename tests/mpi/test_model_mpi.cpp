// The correctness contract of 4d-parallelism.md: on every factorisation (x, y, z, d) of the world
// size, training the model in parallel follows the serial run: the same loss at every step
// (relative 1e-5) and, gathered at the end, the same weights (within fp32 rounding).
// Runs under mpirun -n 2, 4, 8 (oversubscribed on small machines).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/model/transformer.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/optimizer.hpp"

using namespace tetrad;
using namespace tetrad::parallel;
using tetrad::comm::MpiEnvironment;

namespace {

int world_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

ModelConfig test_model(Family f) {
  ModelConfig c;
  c.family = f;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 8;
  c.n_kv_head = f == Family::Llama ? 4 : 8;  // grouped-query attention for Llama
  c.ffn = f == Family::Llama ? 96 : 128;
  c.vocab_size = 256;
  c.max_seq = 32;
  c.tie_embeddings = f == Family::GPT2;
  return c;
}

struct Run {
  std::vector<double> losses, grad_norms;
  std::vector<std::vector<float>> weights;  // every tensor, whole
};

constexpr int kB = 8, kT = 16, kAccum = 2, kSteps = 20;

std::vector<int32_t> batch_tokens(int step, int micro, int V) {
  Rng r(1000 + 31 * step + micro);
  std::vector<int32_t> t(size_t(kB) * (kT + 1));
  for (auto& x : t) x = int32_t(r.next_u64() % uint64_t(V));
  return t;
}

TrainConfig train_config() {
  TrainConfig t;
  t.lr = 3e-3;
  t.weight_decay = 0.1;
  t.grad_clip = 1.0;
  t.warmup_steps = 2;
  t.max_steps = kSteps;
  return t;
}

Run serial_run(const ModelConfig& mc) {
  Transformer<float> m(mc, kB, kT);
  m.init_weights(7);
  const TrainConfig tc = train_config();
  AdamW opt(m.table(), tc);
  Run r;
  std::vector<int32_t> x(size_t(kB) * kT), y(x.size());
  for (int s = 0; s < kSteps; ++s) {
    m.zero_grads();
    double loss = 0;
    for (int mb = 0; mb < kAccum; ++mb) {
      auto tok = batch_tokens(s, mb, mc.vocab_size);
      for (int b = 0; b < kB; ++b)
        for (int t = 0; t < kT; ++t) {
          x[b * kT + t] = tok[b * (kT + 1) + t];
          y[b * kT + t] = tok[b * (kT + 1) + t + 1];
        }
      loss += m.forward_backward(x.data(), y.data(), kB, kT, 1.0f / (kB * kT * kAccum));
    }
    const double gn = grad_norm(m.grads(), m.num_params());
    opt.update(m.params(), m.grads(), learning_rate(tc, s), gn > tc.grad_clip ? tc.grad_clip / gn : 1.0, s + 1);
    r.losses.push_back(loss / (kB * kT * kAccum));
    r.grad_norms.push_back(gn);
  }
  for (const auto& s : m.table().specs)
    r.weights.emplace_back(m.params() + s.offset, m.params() + s.offset + s.numel);
  return r;
}

Run parallel_run(const ModelConfig& mc, ProcessGroups& g) {
  const int replicas = g.shape.z * g.shape.d;
  const int Bl = kB / replicas;
  const int slot = g.coord.z + g.shape.z * g.coord.d;  // this rank's slice of the sequences
  ParallelTransformer m(mc, g, Bl, kT);
  m.init_weights(7);
  const TrainConfig tc = train_config();
  std::vector<int64_t> off, size;
  for (const auto& t : m.plan().tensors) {
    off.push_back(t.offset);
    size.push_back(t.shard_numel);
  }
  AdamW opt(decay_ranges(m.table(), tc, off, size), m.num_local_params(), tc);
  Run r;
  std::vector<int32_t> x(size_t(Bl) * kT), y(x.size());
  for (int s = 0; s < kSteps; ++s) {
    m.zero_grads();
    double loss = 0;
    for (int mb = 0; mb < kAccum; ++mb) {
      auto tok = batch_tokens(s, mb, mc.vocab_size);
      for (int b = 0; b < Bl; ++b)
        for (int t = 0; t < kT; ++t) {
          x[b * kT + t] = tok[(slot * Bl + b) * (kT + 1) + t];
          y[b * kT + t] = tok[(slot * Bl + b) * (kT + 1) + t + 1];
        }
      loss += m.forward_backward(x.data(), y.data(), Bl, kT, 1.0f / (kB * kT * kAccum));
    }
    m.reduce_gradients();
    if (g.zd.size() > 1) g.zd.allreduce_sum(&loss, 1);
    const double gn = std::sqrt(m.grad_sum_squares());
    opt.update(m.params(), m.grads(), learning_rate(tc, s), gn > tc.grad_clip ? tc.grad_clip / gn : 1.0, s + 1);
    r.losses.push_back(loss / (kB * kT * kAccum));
    r.grad_norms.push_back(gn);
  }
  for (size_t i = 0; i < m.table().specs.size(); ++i) {
    std::vector<float> full(m.table().specs[i].numel);
    m.get_tensor(i, full.data());
    r.weights.push_back(std::move(full));
  }
  return r;
}

void check_all_grids(Family family) {
  const ModelConfig mc = test_model(family);
  const Run serial = serial_run(mc);
  int tested = 0, skipped = 0;
  for (const GridShape& shape : factorizations(world_size())) {
    try {
      validate_grid_for_model(mc, shape);
      if (kB % (shape.z * shape.d) != 0) throw Error("batch does not divide");
    } catch (const Error&) {
      ++skipped;
      continue;
    }
    ProcessGroups g(comm::Communicator::world(), shape);
    const Run par = parallel_run(mc, g);
    ++tested;
    const std::string where = family_name(family) + " grid " + shape.to_string();
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(par.losses[s] / serial.losses[s], 1.0, 1e-5) << where << " step " << s + 1;
      EXPECT_NEAR(par.grad_norms[s] / serial.grad_norms[s], 1.0, 1e-4) << where << " step " << s + 1;
    }
    double worst = 0;
    std::string worst_name;
    for (size_t i = 0; i < serial.weights.size(); ++i)
      for (size_t j = 0; j < serial.weights[i].size(); ++j) {
        const double d = std::abs(double(par.weights[i][j]) - serial.weights[i][j]);
        if (d > worst) {
          worst = d;
          worst_name = build_param_table(mc).specs[i].name;
        }
      }
    EXPECT_LT(worst, 2e-4) << where << ": largest weight difference in " << worst_name;
  }
  if (world_rank() == 0)
    std::printf("[ %s ] %d grids of %d ranks tested, %d skipped (model does not divide)\n",
                family_name(family).c_str(), tested, world_size(), skipped);
  EXPECT_GT(tested, 0);
}

// One micro-batch, no optimizer: the loss and the gradient of every tensor (every layer's forward
// and backward, both layouts, the embedding, head and loss) against the serial model.
void check_gradients_all_grids(Family family) {
  const ModelConfig mc = test_model(family);
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
  for (const GridShape& shape : factorizations(world_size())) {
    try {
      validate_grid_for_model(mc, shape);
      if (kB % (shape.z * shape.d) != 0) throw Error("batch does not divide");
    } catch (const Error&) {
      continue;
    }
    ProcessGroups g(comm::Communicator::world(), shape);
    const int Bl = kB / (shape.z * shape.d), slot = g.coord.z + shape.z * g.coord.d;
    ParallelTransformer m(mc, g, Bl, kT);
    m.init_weights(3);
    m.zero_grads();
    double loss = m.forward_backward(x.data() + size_t(slot) * Bl * kT, y.data() + size_t(slot) * Bl * kT,
                                     Bl, kT, 1.0f / kept);
    m.reduce_gradients();
    if (g.zd.size() > 1) g.zd.allreduce_sum(&loss, 1);
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
  check_gradients_all_grids(Family::GPT2);
}
TEST(ParallelLayers, LlamaGradientOfEveryTensorMatchesSerialOnEveryGrid) {
  check_gradients_all_grids(Family::Llama);
}

TEST(ParallelContract, Gpt2EveryGridTrainsLikeOneRank) { check_all_grids(Family::GPT2); }
TEST(ParallelContract, LlamaEveryGridTrainsLikeOneRank) { check_all_grids(Family::Llama); }

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

int main(int argc, char** argv) {
  MpiEnvironment env(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}
