// Extraction metrics: exact / token match / LCS / ROUGE-L on hand-made cases, and
// measure_extraction end to end on a tiny model that has memorised one sequence (extracted
// exactly) and never seen another (not extracted); the CLI entry point on a Hugging Face folder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "support/extraction.hpp"
#include "tetrad/tools/memorization.hpp"
#include "tetrad/train/optimizer.hpp"

using namespace tetrad;
namespace fs = std::filesystem;

namespace {

using Ids = std::vector<int32_t>;

Ids random_tokens(int n, int V, uint64_t seed) {
  Rng r(seed);
  Ids t(n);
  for (auto& x : t) x = int32_t(r.next_u64() % uint64_t(V));
  return t;
}

// Trains `m` with AdamW on the single sequence `seq` (next-token loss over all of it) until the
// mean loss is below `target` or `max_steps` are done. Returns the final mean loss.
double memorise(Transformer<float>& m, const Ids& seq, int max_steps, double target) {
  TrainConfig tc;
  tc.weight_decay = 0;
  AdamW opt(m.table(), tc);
  const int T = int(seq.size()) - 1;
  double loss = 0;
  for (int s = 0; s < max_steps; ++s) {
    m.zero_grads();
    loss = m.forward_backward(seq.data(), seq.data() + 1, 1, T, 1.0f / T) / T;
    if (loss < target) break;
    const double gn = grad_norm(m.grads(), m.num_params());
    opt.update(m.params(), m.grads(), 1e-2, gn > 1 ? 1 / gn : 1, s + 1);
  }
  return loss;
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tetrad_memo_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void spit(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

}  // namespace

// ---------------------------------------------------------------- metrics

TEST(MemorizationMetrics, ExactAndTokenMatch) {
  const Ids truth = {5, 6, 7, 8};
  EXPECT_TRUE(exact_match({5, 6, 7, 8}, truth));
  EXPECT_DOUBLE_EQ(token_match_rate({5, 6, 7, 8}, truth), 1.0);
  // Partial: two of four positions equal.
  EXPECT_FALSE(exact_match({5, 0, 7, 0}, truth));
  EXPECT_DOUBLE_EQ(token_match_rate({5, 0, 7, 0}, truth), 0.5);
  // None equal (a shifted copy matches no position).
  EXPECT_FALSE(exact_match({6, 7, 8, 5}, truth));
  EXPECT_DOUBLE_EQ(token_match_rate({6, 7, 8, 5}, truth), 0.0);
  // Generated shorter than the truth: the missing positions are mismatches, over |truth|.
  EXPECT_FALSE(exact_match({5, 6}, truth));
  EXPECT_DOUBLE_EQ(token_match_rate({5, 6}, truth), 0.5);
  EXPECT_DOUBLE_EQ(token_match_rate({}, truth), 0.0);
  // Longer generated text is not an exact match, and the extra tokens do not count.
  EXPECT_FALSE(exact_match({5, 6, 7, 8, 9}, truth));
  EXPECT_DOUBLE_EQ(token_match_rate({5, 6, 7, 8, 9}, truth), 1.0);
}

TEST(MemorizationMetrics, LcsOfKnownStrings) {
  auto ids = [](const std::string& s) { return Ids(s.begin(), s.end()); };
  // The textbook cases: LCS("ABCBDAB", "BDCABA") = 4 (e.g. BCBA); LCS("AGGTAB", "GXTXAYB") = 4.
  EXPECT_EQ(lcs_length(ids("ABCBDAB"), ids("BDCABA")), 4);
  EXPECT_EQ(lcs_length(ids("BDCABA"), ids("ABCBDAB")), 4);  // symmetric
  EXPECT_EQ(lcs_length(ids("AGGTAB"), ids("GXTXAYB")), 4);
  EXPECT_EQ(lcs_length(ids("ABC"), ids("ABC")), 3);
  EXPECT_EQ(lcs_length(ids("ABC"), ids("DEF")), 0);
  EXPECT_EQ(lcs_length(ids(""), ids("ABC")), 0);
  EXPECT_EQ(lcs_length(ids("A"), ids("XXXXAXXXX")), 1);
  // Not a substring: the common subsequence may skip tokens on both sides.
  EXPECT_EQ(lcs_length(ids("AXBXC"), ids("YAYBYCY")), 3);
}

TEST(MemorizationMetrics, RougeLByHand) {
  const Ids truth = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(rouge_l(truth, truth), 1.0);
  EXPECT_DOUBLE_EQ(rouge_l({9, 9, 9, 9}, truth), 0.0);
  EXPECT_DOUBLE_EQ(rouge_l({}, truth), 0.0);
  // gen {1,3,9}: lcs = 2 (1,3); P = 2/3, R = 2/4; F = 2·(2/3)(1/2) / (2/3 + 1/2) = 4/7.
  EXPECT_NEAR(rouge_l({1, 3, 9}, truth), 4.0 / 7.0, 1e-12);
  // gen shorter, all in order: {2,4}: lcs 2, P = 1, R = 1/2, F = 2/3.
  EXPECT_NEAR(rouge_l({2, 4}, truth), 2.0 / 3.0, 1e-12);
  // Reversed: {4,3,2,1}: lcs 1, P = R = 1/4, F = 1/4.
  EXPECT_NEAR(rouge_l({4, 3, 2, 1}, truth), 0.25, 1e-12);
  // A shifted copy has token match 0 but a high ROUGE-L: {0,1,2,3}: lcs 3, F = 3/4.
  EXPECT_NEAR(rouge_l({0, 1, 2, 3}, truth), 0.75, 1e-12);
}

// ---------------------------------------------------------------- extraction

TEST(MemorizationExtraction, MemorisedSequenceIsExtractedUnseenIsNot) {
  const ModelConfig cfg = named_model("tiny");
  Transformer<float> m(cfg, 8, cfg.max_seq);
  m.init_weights(3);
  const Ids seen = random_tokens(48, cfg.vocab_size, 101);
  const Ids unseen = random_tokens(48, cfg.vocab_size, 202);
  const double loss = memorise(m, seen, 400, 0.01);
  ASSERT_LT(loss, 0.05) << "the tiny model did not memorise the sequence";

  ExtractionOptions opt;
  opt.prefix_len = 16;
  opt.suffix_len = 32;
  opt.batch = 2;
  const Ids short_doc(40, 1);  // 40 < 16 + 32: skipped
  const std::vector<Ids> docs = {seen, unseen, short_doc, seen};
  const ExtractionReport r = measure_extraction(m, docs, {"seen", "unseen", "short", "again"}, opt);

  ASSERT_EQ(r.docs.size(), 4u);
  EXPECT_EQ(r.evaluated, 3);
  EXPECT_EQ(r.skipped, 1);
  EXPECT_EQ(r.docs[0].name, "seen");
  EXPECT_TRUE(r.docs[0].exact);
  EXPECT_DOUBLE_EQ(r.docs[0].token_match, 1.0);
  EXPECT_DOUBLE_EQ(r.docs[0].rouge_l, 1.0);
  EXPECT_FALSE(r.docs[1].exact);
  EXPECT_LT(r.docs[1].token_match, 0.5);
  EXPECT_TRUE(r.docs[2].skipped);
  EXPECT_NE(r.docs[2].why.find("40 tokens"), std::string::npos) << r.docs[2].why;
  EXPECT_TRUE(r.docs[3].exact);  // the second group of the batch decodes the same way
  EXPECT_NEAR(r.exact_rate, 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(r.token_match_rate, (2.0 + r.docs[1].token_match) / 3.0, 1e-12);
  EXPECT_NEAR(r.rouge_l, (2.0 + r.docs[1].rouge_l) / 3.0, 1e-12);

  // The memorised sequence alone: extraction rate 1.0. The unseen one alone: below 0.5.
  const ExtractionReport only_seen = measure_extraction(m, {seen}, {}, opt);
  EXPECT_DOUBLE_EQ(only_seen.exact_rate, 1.0);
  EXPECT_EQ(only_seen.docs[0].name, "doc 0");
  const ExtractionReport only_unseen = measure_extraction(m, {unseen}, {}, opt);
  EXPECT_DOUBLE_EQ(only_unseen.exact_rate, 0.0);
  EXPECT_LT(only_unseen.token_match_rate, 0.5);

  // Batching does not change results: one prompt at a time gives the same numbers.
  ExtractionOptions one = opt;
  one.batch = 1;
  const ExtractionReport r1 = measure_extraction(m, docs, {}, one);
  for (size_t i = 0; i < docs.size(); ++i) {
    EXPECT_EQ(r1.docs[i].exact, r.docs[i].exact) << i;
    EXPECT_DOUBLE_EQ(r1.docs[i].token_match, r.docs[i].token_match) << i;
    EXPECT_DOUBLE_EQ(r1.docs[i].rouge_l, r.docs[i].rouge_l) << i;
  }

  // Report forms.
  const std::string table = r.table();
  EXPECT_NE(table.find("seen"), std::string::npos);
  EXPECT_NE(table.find("skipped"), std::string::npos);
  EXPECT_NE(table.find("overall: 3 evaluated, 1 skipped"), std::string::npos) << table;
  const nlohmann::json j = r.to_json();
  EXPECT_EQ(j["evaluated"], 3);
  EXPECT_EQ(j["prefix_len"], 16);
  EXPECT_EQ(j["suffix_len"], 32);
  EXPECT_DOUBLE_EQ(j["exact_rate"].get<double>(), r.exact_rate);
  ASSERT_EQ(j["documents"].size(), 4u);
  EXPECT_EQ(j["documents"][0]["exact"], true);
  EXPECT_EQ(j["documents"][2]["skipped"], true);
  EXPECT_FALSE(j["documents"][2].contains("exact"));
}

TEST(MemorizationExtraction, RefusesBadOptions) {
  ModelConfig cfg = named_model("tiny");
  Transformer<float> m(cfg, 2, 32);
  m.init_weights(1);
  const std::vector<Ids> docs = {random_tokens(64, cfg.vocab_size, 1)};
  ExtractionOptions opt;
  opt.prefix_len = 16;
  opt.suffix_len = 17;  // 33 > max_len 32
  try {
    measure_extraction(m, docs, {}, opt);
    FAIL() << "prefix + suffix beyond max_len accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("maximum length 32"), std::string::npos) << e.what();
  }
  opt.suffix_len = 16;
  EXPECT_NO_THROW(measure_extraction(m, docs, {}, opt));  // exactly max_len fits
  opt.prefix_len = 0;
  EXPECT_THROW(measure_extraction(m, docs, {}, opt), Error);
  opt.prefix_len = 8;
  EXPECT_THROW(measure_extraction(m, docs, {"a", "b"}, opt), Error);  // names vs documents
  // Token ids outside the vocabulary are reported, not decoded.
  std::vector<Ids> bad = {Ids(40, cfg.vocab_size)};
  const auto r = measure_extraction(m, bad, {}, opt);
  EXPECT_TRUE(r.docs[0].skipped);
  EXPECT_EQ(r.evaluated, 0);
  EXPECT_DOUBLE_EQ(r.exact_rate, 0.0);
}

// ---------------------------------------------------------------- CLI entry point

TEST(MemorizationCommand, HuggingFaceFolderWithTokenizer) {
  TempDir tmp;
  // A small tokenizer (vocab 300 < the tiny model's 512) and a model folder like a checkpoint.
  std::string corpus;
  for (int i = 0; i < 300; ++i)
    corpus += "the quick brown fox " + std::to_string(i) + " jumps over the lazy dog\n";
  spit(tmp.path / "corpus.txt", corpus);
  const auto tok = data::Tokenizer::train({(tmp.path / "corpus.txt").string()},
                                          (tmp.path / "tok").string(), 300);
  const ModelConfig cfg = named_model("tiny");
  Transformer<float> m(cfg, 2, cfg.max_seq);
  m.init_weights(7);
  const fs::path dir = tmp.path / "model";
  save_hf(dir.string(), cfg, m.table(), m.params());
  fs::copy_file(tmp.path / "tok.model", dir / "tokenizer.model");

  const std::string long_text =
      "the quick brown fox 12 jumps over the lazy dog, then the lazy dog 7 jumps over the fox.";
  spit(tmp.path / "long.txt", long_text);
  spit(tmp.path / "short.txt", "the fox");
  ExtractionOptions opt;
  opt.prefix_len = 4;
  opt.suffix_len = 8;
  const std::string json_path = (tmp.path / "out.json").string();
  std::ostringstream out;
  MemorizationCommand cmd;
  cmd.model_dir = dir.string();
  cmd.doc_files = {(tmp.path / "long.txt").string(), (tmp.path / "short.txt").string()};
  cmd.opt = opt;
  cmd.json_out = json_path;
  run_memorization_command(cmd, out);

  // Same numbers as measure_extraction on the folder's tokenizer encoding of the files.
  const std::vector<Ids> docs = {tok.encode(long_text), tok.encode("the fox")};
  ASSERT_GE(docs[0].size(), 12u);
  const ExtractionReport direct = measure_extraction(m, docs, {}, opt);
  std::ifstream f(json_path);
  ASSERT_TRUE(f.good()) << "no JSON written";
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["evaluated"], 1);
  EXPECT_EQ(j["skipped"], 1);
  EXPECT_DOUBLE_EQ(j["token_match_rate"].get<double>(), direct.token_match_rate);
  EXPECT_DOUBLE_EQ(j["rouge_l"].get<double>(), direct.rouge_l);
  EXPECT_EQ(j["documents"][0]["name"], (tmp.path / "long.txt").string());
  EXPECT_NE(out.str().find("overall: 1 evaluated, 1 skipped"), std::string::npos) << out.str();

  // A folder without tokenizer.model is refused with the reason.
  fs::remove(dir / "tokenizer.model");
  std::ostringstream out2;
  try {
    MemorizationCommand no_tok = cmd;
    no_tok.json_out.clear();
    run_memorization_command(no_tok, out2);
    FAIL() << "folder without tokenizer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.model"), std::string::npos) << e.what();
  }
}
