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

// The global batches' documents: positions drawn from seed 500, each starting one with
// probability 1/5.
Run documents_run(const ModelConfig& mc, ProcessGroups& g, ParallelOptions po) {
  return contract::documents_run(mc, g, po, kSteps, {500, 5});
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
