// The mixture of experts on grids (parallel/moe_block.hpp): the correctness contract of
// 4d-parallelism.md for the Mixtral block. Every grid the block runs on (Z, D, C and P, alone and
// combined) trains 20 fp32 steps like one rank: the same loss at every step (relative 1e-5), the
// same weights at the end. The router's auxiliary loss is not a sum over tokens (E Σ f_e P_e of
// the whole micro-batch), so the ranks that hold a micro-batch's tokens share their routing
// counts: the loss, its gradient and the reported statistics are the micro-batch's, as on one
// rank. Also: the capacity factor's drops (taken in the micro-batch's token order across the
// ranks), every token to one expert (dropless, the other experts empty on every rank), and the
// grids refused by name (experts over X or Y; a capacity factor with the context axis).
#include <cstdio>

#include "contract.hpp"
#include "tetrad/model/params.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

using namespace contract;

constexpr int kSteps = 20;

ModelConfig moe_model() {
  ModelConfig mc = tiny_model(Family::Mixtral, 2);
  mc.n_experts = 4;
  mc.experts_per_token = 2;
  mc.router_aux_loss_coef = 0.05f;
  mc.router_z_loss_coef = 0.01f;
  mc.validate();
  return mc;
}

// The grids of this world size the block runs on: the x,y,z,d factorisations the model and batch
// divide (X and Y are refused for experts), and those with a pipeline or a context axis.
std::vector<GridShape> moe_grids(const ModelConfig& mc) {
  std::vector<GridShape> grids = contract_grids(mc);
  const int n = world_size();
  grids.push_back(GridShape{{Axis::P, 2}, {Axis::D, n / 2}});
  grids.push_back(GridShape{{Axis::C, 2}, {Axis::D, n / 2}});
  if (n >= 4) grids.push_back(GridShape{{Axis::Z, 2}, {Axis::P, 2}, {Axis::D, n / 4}});
  return grids;
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

void check_grids(const ModelConfig& mc, const char* what) {
  const contract::Run serial = serial_run(mc, kSteps);
  int tested = 0;
  for (const GridShape& shape : moe_grids(mc)) {
    ProcessGroups g(comm::Communicator::world(), shape);
    const Run par = parallel_run(mc, g, kSteps, ParallelOptions{});
    expect_follows(par, serial, mc, std::string(what) + " grid " + shape.to_string());
    ++tested;
  }
  if (world_rank() == 0)
    std::printf("[ %s ] %d grids of %d ranks tested\n", what, tested, world_size());
  EXPECT_GE(tested, 3);
}

}  // namespace

TEST(MoeMpi, EveryGridTrainsLikeOneRank) { check_grids(moe_model(), "mixtral"); }

// Without renormalising the top k, top 1 of 3 experts, no z-loss.
TEST(MoeMpi, TopOneUnnormalisedTrainsLikeOneRank) {
  ModelConfig mc = moe_model();
  mc.n_experts = 3;
  mc.experts_per_token = 1;
  mc.norm_topk_prob = false;
  mc.router_z_loss_coef = 0;
  mc.validate();
  check_grids(mc, "top-1");
}

// A capacity of ceil(0.5 * N * 2 / 4) rows per expert of a micro-batch's N tokens drops choices;
// which ones depends on the whole micro-batch's token order, so the ranks before this one take
// theirs first. Z and D only (the context axis is refused below).
TEST(MoeMpi, CapacityFactorDropsTheSameChoicesAsOneRank) {
  ModelConfig mc = moe_model();
  mc.moe_capacity_factor = 0.5f;
  const contract::Run serial = serial_run(mc, kSteps);
  for (const GridShape& shape : contract_grids(mc)) {
    ProcessGroups g(comm::Communicator::world(), shape);
    expect_follows(parallel_run(mc, g, kSteps, ParallelOptions{}), serial, mc,
                   "capacity 0.5 grid " + shape.to_string());
  }
}

// A router of zeros: every token ties on every expert and takes experts 0 and 1 (the lower index
// first), so experts 2 and 3 receive no token on any rank and 0 and 1 every token (dropless).
// One forward and backward on each grid: the statistics are the micro-batch's, and the gradients
// match one rank's (the empty experts' zero).
TEST(MoeMpi, EveryTokenToOneExpertDroplessAndEmptyExperts) {
  const ModelConfig mc = moe_model();
  Transformer<float> serial(mc, kB, kT);
  serial.init_weights(3);
  for (const ParamSpec& s : serial.table().specs)
    if (s.role == TensorRole::Router)
      std::fill(serial.params() + s.offset, serial.params() + s.offset + s.numel, 0.0f);
  auto tok = batch_tokens(0, 0, mc.vocab_size);
  std::vector<int32_t> x(size_t(kB) * kT), y(x.size());
  tetrad_test::rank_share(tok, kT, kB, 0, 0, x.data(), y.data());
  serial.zero_grads();
  const double serial_loss = serial.forward_backward(x.data(), y.data(), kB, kT, 1.0f / (kB * kT));
  for (const GridShape& shape : contract_grids(mc)) {
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
    EXPECT_EQ(st.min_rows, 0) << where << ": experts 2 and 3 take nothing";
    EXPECT_EQ(st.max_rows, kB * kT) << where << ": experts 0 and 1 take every token of the micro-batch";
    EXPECT_EQ(st.dropped, 0) << where;
    EXPECT_NEAR(st.mean_aux(), serial.mean_aux_loss(), 1e-9) << where << ": the micro-batch's aux loss";
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

TEST(MoeMpi, TensorAxesAndCapacityWithContextAreRefusedByName) {
  const int n = world_size();
  ModelConfig mc = moe_model();
  try {
    ProcessGroups g(comm::Communicator::world(), GridShape{{Axis::X, 2}, {Axis::D, n / 2}});
    ParallelTransformer m(mc, g, 1, kT);
    FAIL() << "experts over X were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor axes (Gx = 2"), std::string::npos) << e.what();
  }
  mc.moe_capacity_factor = 1.0f;
  try {
    ProcessGroups g(comm::Communicator::world(), GridShape{{Axis::C, 2}, {Axis::D, n / 2}});
    ParallelTransformer m(mc, g, 1, kT);
    FAIL() << "a capacity factor with the context axis was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe_capacity_factor = 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Gc = 2"), std::string::npos) << e.what();
  }
}
