// Document masking in the model (data.document_mask, data.document_positions; issue 28): a packed
// sequence of documents A|B gives B's tokens what B alone gives, on one rank, for both families
// (rotary and learned positions) and with full recomputation; with the mask alone, B's logits do
// not depend on A's tokens. A batch run without its documents is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "support/parallel_options.hpp"
#include "support/train_harness.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

constexpr int kVocab = 64, kLa = 7, kLb = 11, kT = kLa + kLb;

ModelConfig model(Family f) {
  return tetrad_test::small_model(f, {.n_layer = 2, .n_embd = 32, .n_head = 4, .mha_ffn = 64,
                                      .gqa_ffn = 48, .vocab_size = kVocab, .max_seq = 24});
}

std::vector<int32_t> tokens(uint64_t seed, int n) {
  Rng r(seed);
  std::vector<int32_t> v(size_t(n), 0);
  for (auto& t : v) t = int32_t(r.next_u64() % kVocab);
  return v;
}

// Largest |a - b| over the largest |b| (normwise relative difference).
double rel_diff(const float* a, const float* b, size_t n) {
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return worst / scale;
}

struct ModelRun {
  std::vector<float> logits;  // [rows, V]
  std::vector<float> grads;
  double loss = 0;
};

// The model on one batch of `rows` sequences of T tokens: logits, then the gradients of the loss
// over the targets that are not -1.
ModelRun run(Family f, ParallelOptions po, const std::vector<int32_t>& x, const std::vector<int32_t>& y,
        const std::vector<int32_t>* docs, int B, int T) {
  ProcessGroups g;
  ParallelTransformer m(model(f), g, B, T, po);
  m.init_weights(5);
  if (docs) m.set_documents(x.data(), docs->data(), int64_t(x.size()));
  ModelRun r;
  const float* lg = m.forward_logits(x.data(), B, T);
  r.logits.assign(lg, lg + size_t(B) * T * kVocab);
  m.zero_grads();
  r.loss = m.forward_backward(x.data(), y.data(), B, T, 1.0f);
  m.reduce_gradients();
  r.grads.assign(m.grads(), m.grads() + m.num_local_grads());
  return r;
}

}  // namespace

// A|B packed into one sequence, positions restarting per document: B's logits and the gradients
// of B's loss are B's alone (to fp32 rounding: GEMMs and kernels sum over other shapes). A second
// sequence of the batch holds one document from its start. Both families; recompute none and full.
TEST(DocumentMask, PackedDocumentGetsTheLogitsAndGradientsOfItsOwn) {
  for (Family f : {Family::Llama, Family::GPT2})
    for (Recompute rc : {Recompute::None, Recompute::Full}) {
      const std::string where = family_name(f) + " recompute " + recompute_name(rc);
      const std::vector<int32_t> a = tokens(1, kLa), b = tokens(2, kLb + 1), other = tokens(3, kT + 1);
      // Packed: row 0 = A | B (targets of A dropped), row 1 = one document (targets dropped).
      std::vector<int32_t> x, y, docs;
      for (int t = 0; t < kLa; ++t) x.push_back(a[t]), y.push_back(-1), docs.push_back(0);
      for (int t = 0; t < kLb; ++t) x.push_back(b[t]), y.push_back(b[t + 1]), docs.push_back(kLa);
      for (int t = 0; t < kT; ++t) x.push_back(other[t]), y.push_back(-1), docs.push_back(0);
      std::vector<int32_t> xb(b.begin(), b.begin() + kLb), yb(b.begin() + 1, b.end());
      ParallelOptions po = tetrad_test::parallel_options(rc);
      po.document_mask = po.document_positions = true;
      const ModelRun packed = run(f, po, x, y, &docs, 2, kT);
      const ModelRun alone = run(f, tetrad_test::parallel_options(rc), xb, yb, nullptr, 1, kLb);
      EXPECT_LT(rel_diff(packed.logits.data() + size_t(kLa) * kVocab, alone.logits.data(),
                         size_t(kLb) * kVocab),
                2e-6)
          << where << ": B's logits in the packed sequence";
      EXPECT_NEAR(packed.loss, alone.loss, 1e-5 * std::fabs(alone.loss)) << where;
      ASSERT_EQ(packed.grads.size(), alone.grads.size());
      EXPECT_LT(rel_diff(packed.grads.data(), alone.grads.data(), alone.grads.size()), 1e-5)
          << where << ": the gradients of B's loss";
      // Row 1 (one document from 0) is what the model without documents gives it.
      std::vector<int32_t> x1(x.begin() + kT, x.end()), y1(y.begin() + kT, y.end());
      const ModelRun plain = run(f, tetrad_test::parallel_options(rc), x1, y1, nullptr, 1, kT);
      EXPECT_LT(rel_diff(packed.logits.data() + size_t(kT) * kVocab, plain.logits.data(),
                         plain.logits.size()),
                2e-6)
          << where << ": a one-document row is what the model without documents gives it";
    }
}

// The mask alone (positions continue across documents): B's logits do not depend on A's tokens
// (bit for bit: masked keys contribute exact zeros), A's are unchanged by the mask (causal).
TEST(DocumentMask, MaskAloneKeepsADocumentBlindToTheOneBefore) {
  for (Family f : {Family::Llama, Family::GPT2}) {
    const std::vector<int32_t> b = tokens(2, kLb);
    std::vector<int32_t> docs;
    for (int t = 0; t < kT; ++t) docs.push_back(t < kLa ? 0 : kLa);
    ParallelOptions po;
    po.document_mask = true;
    std::vector<std::vector<float>> bl;
    std::vector<float> a_masked;
    for (uint64_t seed : {10, 11}) {
      std::vector<int32_t> x = tokens(seed, kLa), y(kT, -1);
      x.insert(x.end(), b.begin(), b.end());
      const ModelRun r = run(f, po, x, y, &docs, 1, kT);
      bl.emplace_back(r.logits.begin() + kLa * kVocab, r.logits.end());
      if (seed == 10) {
        a_masked.assign(r.logits.begin(), r.logits.begin() + kLa * kVocab);
        const ModelRun u = run(f, ParallelOptions{}, x, y, nullptr, 1, kT);
        EXPECT_EQ(0, std::memcmp(a_masked.data(), u.logits.data(), a_masked.size() * sizeof(float)))
            << family_name(f) << ": A's logits are the unmasked model's";
        EXPECT_GT(rel_diff(r.logits.data() + kLa * kVocab, u.logits.data() + kLa * kVocab,
                           size_t(kLb) * kVocab),
                  1e-4)
            << family_name(f) << ": without the mask B sees A";
      }
    }
    EXPECT_EQ(bl[0], bl[1]) << family_name(f) << ": B's logits changed with A's tokens";
  }
}

TEST(DocumentMask, ABatchWithoutItsDocumentsIsRefused) {
  ProcessGroups g;
  ParallelOptions po;
  po.document_mask = true;
  ParallelTransformer m(model(Family::Llama), g, 1, 8, po);
  m.init_weights(1);
  const std::vector<int32_t> x = tokens(1, 8);
  try {
    m.forward_logits(x.data(), 1, 8);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without its documents"), std::string::npos) << e.what();
  }
  // Starts that are no document starts (after the token, decreasing) are refused by name.
  std::vector<int32_t> bad = {0, 0, 3, 3, 3, 2, 2, 2};
  m.set_documents(x.data(), bad.data(), 8);
  try {
    m.forward_logits(x.data(), 1, 8);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 2 of sequence 0"), std::string::npos) << e.what();
  }
}
