// What the mixture-of-experts contract tests share (test_moe_mpi.cpp, test_expert_parallel_mpi.cpp,
// test_moe_options_mpi.cpp): the model, one micro-batch with every token routed to experts 0 and 1
// against one rank, and the whole tensors moved between expert-parallel folds.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "contract.hpp"
#include "tetrad/model/params.hpp"

namespace moe_contract {

using namespace contract;

// The contract's tiny Mixtral: 4 experts (or `experts`), top 2, the aux loss at 0.05 and the
// z-loss at 0.01 so their gradients matter.
inline ModelConfig moe_model(int experts = 4) {
  ModelConfig mc = tiny_model(Family::Mixtral, 2);
  mc.n_experts = experts;
  mc.experts_per_token = 2;
  mc.router_aux_loss_coef = 0.05f;
  mc.router_z_loss_coef = 0.01f;
  mc.validate();
  return mc;
}

inline void zero_router(ParallelTransformer& m) {
  for (size_t i = 0; i < m.table().specs.size(); ++i)
    if (m.table().specs[i].role == TensorRole::Router) {
      std::vector<float> z(size_t(m.table().specs[i].numel), 0.0f);
      m.set_tensor(i, z.data());
    }
}

// A router of zeros: every token ties on every expert and takes experts 0 and 1 (the lower index
// first), so 0 and 1 take every token of the micro-batch (dropless) and the others none. One
// forward and backward of the first micro-batch on each grid (Z and D: one micro-batch by hand)
// against one rank: the loss, the statistics (the micro-batch's) and every gradient.
inline void check_every_token_to_experts_0_and_1(const ModelConfig& mc,
                                                 const std::vector<GridShape>& grids) {
  Transformer<float> serial(mc, kB, kT);
  serial.init_weights(3);
  for (const ParamSpec& s : serial.table().specs)
    if (s.role == TensorRole::Router)
      std::fill(serial.params() + s.offset, serial.params() + s.offset + s.numel, 0.0f);
  std::vector<int32_t> x(size_t(kB) * kT), y(x.size());
  tetrad_test::rank_share(batch_tokens(0, 0, mc.vocab_size), kT, kB, 0, 0, x.data(), y.data());
  serial.zero_grads();
  const double serial_loss = serial.forward_backward(x.data(), y.data(), kB, kT, 1.0f / (kB * kT));
  for (const GridShape& shape : grids) {
    ProcessGroups g(comm::Communicator::world(), shape);
    const int Bl = kB / token_slots(shape), slot = token_slot(g.coord, shape);
    ParallelTransformer m(mc, g, Bl, kT);
    m.init_weights(3);
    zero_router(m);
    m.zero_grads();
    double loss = m.forward_backward(x.data() + size_t(slot) * Bl * kT,
                                     y.data() + size_t(slot) * Bl * kT, Bl, kT, 1.0f / (kB * kT));
    m.reduce_gradients();
    const MoeStats st = m.take_moe_stats();
    if (g.tokens().size() > 1) g.tokens().allreduce_sum(&loss, 1);
    const std::string where = "grid " + shape.to_string();
    EXPECT_NEAR(loss / serial_loss, 1.0, 1e-5) << where;
    EXPECT_EQ(st.min_rows, 0) << where << ": experts 2 and 3 take nothing";
    EXPECT_EQ(st.max_rows, kB * kT) << where << ": experts 0 and 1 take every token";
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

// What a checkpoint stores is every tensor whole (get_tensor / set_tensor): a model initialised
// (seed 5) on D = n with the first of `folds` as E gives its tensors to the same model at each
// later E. On every fold they read back bit for bit and one forward/backward of the same global
// batch gives the first fold's loss (relative 1e-6). `plant`, when given, changes the values of a
// tensor (whole) before they are set on the first fold: a state training leaves that
// init_weights does not make (an expert bias). `check_fold`, when given, checks more of each
// fold's table (its E given).
using PlantTensor = std::function<void(const ParamSpec&, std::vector<float>&)>;
using CheckFold = std::function<void(const ParamTable&, int e)>;

inline void check_tensors_move_between_folds(const ModelConfig& mc, const std::vector<int>& folds,
                                             const PlantTensor& plant = {},
                                             const CheckFold& check_fold = {}) {
  const int n = world_size();
  std::vector<std::vector<float>> saved;
  double first_loss = 0;
  for (int e : folds) {
    ProcessGroups g(comm::Communicator::world(), GridShape{{Axis::D, n}}.set_e(e));
    const int Bl = kB / token_slots(g.shape), slot = token_slot(g.coord, g.shape);
    ParallelTransformer m(mc, g, Bl, kT);
    const ParamTable& table = m.table();
    if (saved.empty()) {
      m.init_weights(5);
      for (size_t i = 0; i < table.specs.size(); ++i) {
        saved.emplace_back(size_t(table.specs[i].numel));
        m.get_tensor(i, saved.back().data());
        if (plant) {
          plant(table.specs[i], saved.back());
          m.set_tensor(i, saved.back().data());
        }
      }
    } else {
      for (size_t i = 0; i < saved.size(); ++i) m.set_tensor(i, saved[i].data());
    }
    std::vector<int32_t> x(size_t(Bl) * kT), y(x.size());
    tetrad_test::rank_share(batch_tokens(3, 0, mc.vocab_size), kT, Bl, slot, 0, x.data(), y.data());
    m.zero_grads();
    double loss = m.forward_backward(x.data(), y.data(), Bl, kT, 1.0f / (kB * kT));
    if (g.tokens().size() > 1) g.tokens().allreduce_sum(&loss, 1);
    if (e == folds.front()) first_loss = loss;
    EXPECT_NEAR(loss / first_loss, 1.0, 1e-6) << "E = " << e;
    for (size_t i = 0; i < saved.size(); ++i) {  // read back whole, bit for bit
      std::vector<float> back(saved[i].size());
      m.get_tensor(i, back.data());
      ASSERT_EQ(back, saved[i]) << "E = " << e << " tensor " << table.specs[i].name;
    }
    if (check_fold) check_fold(table, e);
  }
}

}  // namespace moe_contract
