// The expert-parallel fold E (GridShape::e(), parallel/expert_parallel.hpp): the experts of the
// Mixtral block split over E of the data (and context) ranks, the rows dispatched to their
// experts' ranks by a variable all-to-all and combined back. The correctness contract of
// 4d-parallelism.md: E = 2 with D = 2, E = 4 with D = 4, E over C x D, E with Z and with P, with
// ZeRO 1 and 2 (expert state sharded over the expert-data group) and with full recomputation: 20
// fp32 steps like one rank (loss relative 1e-5, weights at the end; ZeRO and recomputation 10). Every token
// to experts 0 and 1 (a router of zeros): dropless, the other experts' ranks receive no row. The
// whole tensors move between E = 1, 2 and 4 unchanged (what checkpoints store). Bad input
// refused by name: E not dividing the experts or D x C, E on a dense model.
#include <cstdio>

#include "contract.hpp"
#include "tetrad/model/params.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

using namespace contract;

constexpr int kSteps = 20;

ModelConfig moe_model(int experts = 4) {
  ModelConfig mc = tiny_model(Family::Mixtral, 2);
  mc.n_experts = experts;
  mc.experts_per_token = 2;
  mc.router_aux_loss_coef = 0.05f;
  mc.router_z_loss_coef = 0.01f;
  mc.validate();
  return mc;
}

GridShape with_e(GridShape g, int e) { return g.set_e(e); }

// The expert-parallel grids of this world size: E = every divisor > 1 of n over D; E over C x D,
// with Z and with P where the ranks allow.
std::vector<GridShape> expert_grids() {
  const int n = world_size();
  std::vector<GridShape> g;
  for (int e = 2; e <= n; e *= 2)
    if (n % e == 0 && 4 % e == 0) g.push_back(with_e(GridShape{{Axis::D, n}}, e));
  if (n >= 4) {
    g.push_back(with_e(GridShape{{Axis::C, 2}, {Axis::D, n / 2}}, 4 <= n ? 4 : 2));
    g.push_back(with_e(GridShape{{Axis::Z, 2}, {Axis::D, n / 2}}, 2));
    g.push_back(with_e(GridShape{{Axis::P, 2}, {Axis::D, n / 2}}, 2));
  }
  return g;
}

void expect_follows(const Run& par, const Run& serial, const ModelConfig& mc,
                    const std::string& where) {
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_NEAR(par.losses[s] / serial.losses[s], 1.0, 1e-5) << where << " step " << s + 1;
    EXPECT_NEAR(par.grad_norms[s] / serial.grad_norms[s], 1.0, 1e-4) << where << " step " << s + 1;
  }
  std::string worst_name;
  const double worst = worst_weight_difference(par, serial, mc, &worst_name);
  EXPECT_LT(worst, 2e-4) << where << ": largest weight difference in " << worst_name;
}

}  // namespace

TEST(ExpertParallelMpi, EveryFoldTrainsLikeOneRank) {
  const ModelConfig mc = moe_model();
  const contract::Run serial = serial_run(mc, kSteps);
  int tested = 0;
  for (const GridShape& shape : expert_grids()) {
    ProcessGroups g(comm::Communicator::world(), shape);
    EXPECT_EQ(g.experts().size(), shape.e());
    EXPECT_EQ(g.expert_replicas().size(), shape.size(replica_axes()) / shape.e());
    expect_follows(parallel_run(mc, g, kSteps, ParallelOptions{}), serial, mc,
                   "grid " + shape.to_string());
    ++tested;
  }
  if (world_rank() == 0)
    std::printf("[ expert parallel ] %d grids of %d ranks tested\n", tested, world_size());
  EXPECT_GE(tested, 1);
}

// ZeRO shards each expert tensor's optimizer state (and with ZeRO 2 its gradient) over the
// expert-data group; recomputation reruns the dispatch. 10 steps each (the fold's 20-step
// contract is above); ZeRO 1's and 2's Adam moments agree.
TEST(ExpertParallelMpi, ZeroAndRecomputeTrainLikeOneRank) {
  constexpr int kShort = 10;
  const ModelConfig mc = moe_model();
  const contract::Run serial = serial_run(mc, kShort);
  const int n = world_size();
  const GridShape shape = with_e(GridShape{{Axis::D, n}}, n >= 4 ? 2 : n);  // E < D at n >= 4
  ProcessGroups g(comm::Communicator::world(), shape);
  auto follows = [&](const contract::Run& par, const std::string& where) {
    for (int s = 0; s < kShort; ++s)
      EXPECT_NEAR(par.losses[s] / serial.losses[s], 1.0, 1e-5) << where << " step " << s + 1;
    std::string worst_name;
    EXPECT_LT(worst_weight_difference(par, serial, mc, &worst_name), 2e-4) << where << ": " << worst_name;
  };
  std::vector<contract::Run> zero;
  for (int z : {1, 2}) {
    ParallelOptions po;
    po.zero = z;
    zero.push_back(parallel_run(mc, g, kShort, po));
    follows(zero.back(), "zero " + std::to_string(z) + " grid " + shape.to_string());
  }
  for (size_t i = 0; i < zero[0].m.size(); ++i)
    for (size_t j = 0; j < zero[0].m[i].size(); ++j) {
      ASSERT_NEAR(zero[1].m[i][j], zero[0].m[i][j], 1e-6 + 1e-4 * std::abs(zero[0].m[i][j])) << "m of tensor " << i;
      ASSERT_NEAR(zero[1].v[i][j], zero[0].v[i][j], 1e-9 + 1e-4 * std::abs(zero[0].v[i][j])) << "v of tensor " << i;
    }
  ParallelOptions po;
  po.recompute = Recompute::Full;
  follows(parallel_run(mc, g, kShort, po), "recompute full " + shape.to_string());
}

// A router of zeros sends every token to experts 0 and 1, both on expert rank 0: it receives
// every row of its expert group (E times its own), the other ranks' experts none. One forward
// and backward against one rank: the loss and every gradient, the empty experts' zero.
TEST(ExpertParallelMpi, EveryTokenToOneRanksExpertsDropless) {
  const ModelConfig mc = moe_model();
  Transformer<float> serial(mc, kB, kT);
  serial.init_weights(3);
  for (const ParamSpec& s : serial.table().specs)
    if (s.role == TensorRole::Router)
      std::fill(serial.params() + s.offset, serial.params() + s.offset + s.numel, 0.0f);
  std::vector<int32_t> x(size_t(kB) * kT), y(x.size());
  tetrad_test::rank_share(batch_tokens(0, 0, mc.vocab_size), kT, kB, 0, 0, x.data(), y.data());
  serial.zero_grads();
  const double serial_loss = serial.forward_backward(x.data(), y.data(), kB, kT, 1.0f / (kB * kT));
  for (const GridShape& shape : expert_grids()) {
    if (shape.p() > 1 || shape.c() > 1) continue;  // one micro-batch by hand: Z and D only
    ProcessGroups g(comm::Communicator::world(), shape);
    const int Bl = kB / token_slots(shape), slot = token_slot(g.coord, shape);
    ParallelTransformer m(mc, g, Bl, kT);
    m.init_weights(3);
    for (size_t i = 0; i < m.table().specs.size(); ++i)
      if (m.table().specs[i].role == TensorRole::Router) {
        std::vector<float> z(size_t(m.table().specs[i].numel), 0.0f);
        m.set_tensor(i, z.data());
      }
    m.zero_grads();
    double loss = m.forward_backward(x.data() + size_t(slot) * Bl * kT,
                                     y.data() + size_t(slot) * Bl * kT, Bl, kT, 1.0f / (kB * kT));
    m.reduce_gradients();
    const MoeStats st = m.take_moe_stats();
    if (g.tokens().size() > 1) g.tokens().allreduce_sum(&loss, 1);
    const std::string where = "grid " + shape.to_string();
    EXPECT_NEAR(loss / serial_loss, 1.0, 1e-5) << where;
    EXPECT_EQ(st.min_rows, 0) << where;
    EXPECT_EQ(st.max_rows, kB * kT) << where;
    EXPECT_EQ(st.dropped, 0) << where;
    for (size_t i = 0; i < m.table().specs.size(); ++i) {
      const ParamSpec& s = m.table().specs[i];
      std::vector<float> full(size_t(s.numel));
      m.gather_tensor(m.grads(), i, full.data());
      double num = 0, den = 0;
      for (int64_t j = 0; j < s.numel; ++j) {
        const double a = full[size_t(j)], b = serial.grads()[s.offset + j];
        num += (a - b) * (a - b);
        den += b * b;
      }
      EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-4) << where << ": gradient of " << s.name;
    }
  }
}

// What a checkpoint stores is every tensor whole (gather_tensor / set_tensor): the weights of a
// model trained at one E load into every other E and give the same next steps.
TEST(ExpertParallelMpi, WholeTensorsMoveBetweenFolds) {
  const ModelConfig mc = moe_model();
  const int n = world_size();
  std::vector<int> folds = {1, 2};
  if (n >= 4) folds.push_back(4);
  std::vector<std::vector<float>> saved;
  double first_loss = 0;
  for (int e : folds) {
    ProcessGroups g(comm::Communicator::world(), with_e(GridShape{{Axis::D, n}}, e));
    const int Bl = kB / token_slots(g.shape), slot = token_slot(g.coord, g.shape);
    ParallelTransformer m(mc, g, Bl, kT);
    if (saved.empty()) {
      m.init_weights(5);
      for (size_t i = 0; i < m.table().specs.size(); ++i) {
        saved.emplace_back(size_t(m.table().specs[i].numel));
        m.get_tensor(i, saved.back().data());
      }
    } else {
      for (size_t i = 0; i < saved.size(); ++i) m.set_tensor(i, saved[i].data());
    }
    std::vector<int32_t> x(size_t(Bl) * kT), y(x.size());
    tetrad_test::rank_share(batch_tokens(3, 0, mc.vocab_size), kT, Bl, slot, 0, x.data(), y.data());
    m.zero_grads();
    double loss = m.forward_backward(x.data(), y.data(), Bl, kT, 1.0f / (kB * kT));
    if (g.tokens().size() > 1) g.tokens().allreduce_sum(&loss, 1);
    if (e == 1) first_loss = loss;
    EXPECT_NEAR(loss / first_loss, 1.0, 1e-6) << "E = " << e;
    for (size_t i = 0; i < saved.size(); ++i) {  // read back whole, bit for bit
      std::vector<float> back(saved[i].size());
      m.get_tensor(i, back.data());
      ASSERT_EQ(back, saved[i]) << "E = " << e << " tensor " << m.table().specs[i].name;
    }
  }
}

TEST(ExpertParallelMpi, BadFoldsAreRefusedNamingTheNumbers) {
  const int n = world_size();
  auto error_of = [&](const ModelConfig& mc, GridShape shape) -> std::string {
    try {
      ProcessGroups g(comm::Communicator::world(), shape);
      ParallelTransformer m(mc, g, 1, kT);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  auto has = [](const std::string& s, const char* part) { return s.find(part) != std::string::npos; };
  // 3 experts over E = 2
  std::string e = error_of(moe_model(3), with_e(GridShape{{Axis::D, n}}, 2));
  EXPECT_TRUE(has(e, "model.n_experts (3) is not divisible by E = 2")) << e;
  // E = 2n over D = n
  e = error_of(moe_model(), with_e(GridShape{{Axis::D, n}}, 2 * n));
  EXPECT_TRUE(has(e, ("E = " + std::to_string(2 * n) + " must divide").c_str())) << e;
  // A dense model
  e = error_of(tiny_model(Family::Llama, 2), with_e(GridShape{{Axis::D, n}}, 2));
  EXPECT_TRUE(has(e, "needs a mixture-of-experts model")) << e;
  // X with E stays refused by name (experts over the tensor axes are not implemented)
  e = error_of(moe_model(), with_e(GridShape{{Axis::X, 2}, {Axis::D, n / 2}}, n / 2 > 1 ? n / 2 : 1));
  EXPECT_TRUE(has(e, "tensor axes (Gx = 2")) << e;
}
