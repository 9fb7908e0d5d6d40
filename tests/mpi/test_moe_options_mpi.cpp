// The mixture of experts' optional parts on the expert-parallel fold (docs/moe.md): the shared
// expert (Qwen2-MoE's form: dense weights, whole on every rank and reduced over every data rank
// also with E > 1) and DeepSeek-V3's aux-loss-free expert bias (whole on every rank, updated after
// each step from the whole global batch's load, the same update everywhere). The contract of
// 4d-parallelism.md: E = 2 with D = 2, and E = 2 with Z and with P where the ranks allow (the
// bias also with X),
// 20 fp32 steps like one rank (the oracle, which updates its bias by the rule written out in
// contract.hpp): loss relative 1e-5, weights at the end (the bias among them) within 2e-4. The
// bias must have moved, and the shared expert must matter, or the test would prove nothing. The
// whole bias tensors move between E = 2 and E = 1 unchanged (what checkpoints store;
// tests/mpi/ckpt_expert_fold.sh resumes a run's checkpoint across folds).
#include <cstdio>

#include "moe_contract.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

using namespace moe_contract;

constexpr int kSteps = 20;

// E = 2 over D = n; with n >= 4 also Z = 2 and P = 2 beside D = n / 2.
std::vector<GridShape> fold_grids() {
  const int n = world_size();
  std::vector<GridShape> g = {GridShape{{Axis::D, n}}.set_e(2)};
  if (n >= 4) {
    g.push_back(GridShape{{Axis::Z, 2}, {Axis::D, n / 2}}.set_e(2));
    g.push_back(GridShape{{Axis::P, 2}, {Axis::D, n / 2}}.set_e(2));
  }
  return g;
}

ModelConfig shared_expert_model() {
  ModelConfig mc = moe_model();
  mc.shared_expert_ffn = 48;
  mc.validate();
  return mc;
}

// The bias with the auxiliary loss ("both") at a rate that moves the routing within 20 steps.
ModelConfig expert_bias_model(const char* balance) {
  ModelConfig mc = moe_model();
  mc.moe_balance = balance;
  mc.expert_bias_rate = 0.01f;
  mc.validate();
  return mc;
}

double largest_of_role(const contract::Run& r, const ModelConfig& mc, TensorRole role) {
  const ParamTable table = build_param_table(mc);
  double most = 0;
  for (size_t i = 0; i < table.specs.size(); ++i)
    if (table.specs[i].role == role)
      for (float v : r.weights[i]) most = std::max(most, double(std::abs(v)));
  return most;
}

void check_folds(const ModelConfig& mc, const std::string& what,
                 std::vector<GridShape> grids = fold_grids()) {
  const contract::Run serial = serial_run(mc, kSteps);
  int tested = 0;
  for (const GridShape& shape : grids) {
    ProcessGroups g(comm::Communicator::world(), shape);
    expect_matches_serial(parallel_run(mc, g, kSteps, ParallelOptions{}), serial, mc,
                          what + " grid " + shape.to_string());
    ++tested;
  }
  if (world_rank() == 0)
    std::printf("[ %s ] %d expert-parallel grids of %d ranks tested\n", what.c_str(), tested,
                world_size());
  EXPECT_GE(tested, 1);
}

}  // namespace

TEST(MoeOptionsMpi, SharedExpertOnTheFoldTrainsLikeOneRank) {
  const ModelConfig mc = shared_expert_model();
  // The shared expert is in the model and trained (its gate's weights moved from their start).
  const contract::Run one = serial_run(mc, 2);
  ASSERT_GT(largest_of_role(one, mc, TensorRole::SharedExpertGate), 0.0);
  check_folds(mc, "shared expert");
}

TEST(MoeOptionsMpi, ExpertBiasOnTheFoldTrainsLikeOneRank) {
  const ModelConfig mc = expert_bias_model("expert_bias");
  // 20 steps move the bias by whole multiples of the rate: it must have moved.
  const contract::Run serial = serial_run(mc, kSteps);
  EXPECT_GE(largest_of_role(serial, mc, TensorRole::ExpertBias), mc.expert_bias_rate)
      << "the bias never moved";
  // The routing is the same on every X rank (its logits summed over X): the bias too.
  std::vector<GridShape> grids = fold_grids();
  if (world_size() >= 4) grids.push_back(GridShape{{Axis::X, 2}, {Axis::D, world_size() / 2}}.set_e(2));
  check_folds(mc, "expert bias", grids);
}

// The shared expert is whole on every rank: split over X or Y it is refused by name.
TEST(MoeOptionsMpi, SharedExpertOnTheTensorAxesIsRefusedByName) {
  std::string e;
  try {
    ProcessGroups g(comm::Communicator::world(), GridShape{{Axis::X, 2}, {Axis::D, world_size() / 2}});
    ParallelTransformer m(shared_expert_model(), g, 1, kT);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("shared expert (model.shared_expert_ffn = 48) split over the tensor axes (Gx = 2"),
            std::string::npos) << e;
}

// Both with the auxiliary loss and the shared expert, and ZeRO 1 (the bias is not sharded over Z: replicated, updated in place).
TEST(MoeOptionsMpi, BothWithZeroTrainLikeOneRank) {
  ModelConfig mc = expert_bias_model("both");
  mc.shared_expert_ffn = 48;
  mc.validate();
  const contract::Run serial = serial_run(mc, 10);
  ProcessGroups g(comm::Communicator::world(), GridShape{{Axis::D, world_size()}}.set_e(2));
  ParallelOptions po;
  po.zero = 1;
  const contract::Run par = parallel_run(mc, g, 10, po);
  expect_matches_serial(par, serial, mc, "zero 1, shared expert and expert bias");
}

// A trained bias and shared expert moved whole between E = 2 and E = 1 (a checkpoint's tensors):
// read back bit for bit, and the next step's loss the same on both folds.
TEST(MoeOptionsMpi, BiasAndSharedExpertMoveBetweenFolds) {
  ModelConfig mc = expert_bias_model("both");
  mc.shared_expert_ffn = 48;
  mc.validate();
  const auto trained_bias = [](const ParamSpec& s, std::vector<float>& v) {
    if (s.role == TensorRole::ExpertBias)  // a bias as training leaves it
      for (size_t j = 0; j < v.size(); ++j)
        v[j] = 0.03f * float(int(j % 3) - 1) * float(s.layer + 1);
  };
  const auto one_bias_a_layer = [&](const ParamTable& table, int e) {
    int bias_tensors = 0;
    for (const ParamSpec& s : table.specs) bias_tensors += s.role == TensorRole::ExpertBias;
    EXPECT_EQ(bias_tensors, mc.n_layer) << "E = " << e;
  };
  check_tensors_move_between_folds(mc, {2, 1}, trained_bias, one_bias_a_layer);
}
