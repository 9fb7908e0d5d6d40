// Document masking on every grid of the world size (issue 28): 8 steps of the trainer's own step
// with data.document_mask and data.document_positions (packed sequences of several documents,
// some rows one document) on each grid that divides the model and batch (X, Y, Z, D, P and their
// products) match the same steps of the one-rank model in this process, within the contract's
// tolerance (4d-parallelism.md), for GQA Llama (rotary) and GPT-2 (learned positions).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "contract.hpp"

using namespace contract;

namespace {

constexpr int kSteps = 8;

// Document starts of the global batch of step s, micro-batch mb: row b's documents begin at
// places drawn from (s, mb, b); every fourth row is one document.
std::vector<int32_t> batch_docs(int step, int micro) {
  Rng r(500 + 31 * step + micro);
  std::vector<int32_t> d(size_t(kB) * kT);
  for (int b = 0; b < kB; ++b) {
    int start = 0;
    for (int t = 0; t < kT; ++t) {
      if (b % 4 != 3 && t > 0 && r.next_u64() % 5 == 0) start = t;
      d[size_t(b) * kT + t] = start;
    }
  }
  return d;
}

Run documents_run(const ModelConfig& mc, ProcessGroups& g, ParallelOptions po) {
  const int replicas = token_slots(g.shape);
  const int Bl = kB / replicas;
  const int slot = token_slot(g.coord, g.shape);
  ParallelTransformer m(mc, g, Bl, kT, po);
  m.init_weights(7);
  const TrainConfig tc = train_config(kSteps);
  AdamW opt = tetrad_test::layout_adamw(m, tc);
  StepRunner runner(m, opt, g, tetrad_test::step_options(tc, kAccum, Bl, kT));
  Run r;
  std::vector<int32_t> x(size_t(kAccum) * Bl * kT), y(x.size()), docs(x.size());
  for (int s = 0; s < kSteps; ++s) {
    for (int mb = 0; mb < kAccum; ++mb) {
      tetrad_test::rank_share(batch_tokens(s, mb, mc.vocab_size), kT, Bl, slot, mb, x.data(),
                              y.data());
      const std::vector<int32_t> all = batch_docs(s, mb);  // this rank's rows, as rank_share's
      std::copy(all.begin() + size_t(slot) * Bl * kT, all.begin() + size_t(slot + 1) * Bl * kT,
                docs.begin() + size_t(mb) * Bl * kT);
    }
    m.set_documents(x.data(), docs.data(), int64_t(x.size()));
    const StepResult sr =
        runner.run(x.data(), y.data(), double(kB * kT * kAccum), learning_rate(tc, s), s);
    EXPECT_EQ(sr.verdict, StepVerdict::Apply) << "step " << s + 1 << " is not finite";
    r.losses.push_back(sr.loss);
    r.grad_norms.push_back(sr.grad_norm);
  }
  m.finish_communication();
  for (size_t i = 0; i < m.table().specs.size(); ++i) {
    std::vector<float> full(m.table().specs[i].numel);
    m.get_tensor(i, full.data());
    r.weights.push_back(full);
  }
  return r;
}

void check_all_grids(Family family) {
  const ModelConfig mc = tiny_model(family, 2);
  ParallelOptions po;
  po.document_mask = po.document_positions = true;
  ProcessGroups alone;  // this rank by itself: the one-rank reference
  const Run one = documents_run(mc, alone, po);
  // The documents change the run (else this test would check nothing of them).
  ProcessGroups alone2;
  const Run plain = documents_run(mc, alone2, ParallelOptions{});
  EXPECT_GT(std::abs(plain.losses[0] / one.losses[0] - 1.0), 1e-4) << family_name(family);
  int tested = 0;
  for (const GridShape& shape : contract_grids(mc)) {
    ProcessGroups g(comm::Communicator::world(), shape);
    const Run par = documents_run(mc, g, po);
    ++tested;
    expect_matches_serial(par, one, mc, family_name(family) + " grid " + shape.to_string());
  }
  if (world_rank() == 0)
    std::printf("[ %s ] document masking: %d grids of %d ranks tested\n",
                family_name(family).c_str(), tested, world_size());
  EXPECT_GT(tested, 0);
}

}  // namespace

TEST(DocumentsMpi, LlamaEveryGridMatchesOneRank) { check_all_grids(Family::Llama); }
TEST(DocumentsMpi, Gpt2EveryGridMatchesOneRank) { check_all_grids(Family::GPT2); }
