// Tests of the data pipeline: tokenizer, token shards, document splitting, prepare, loader.
// Every test writes under its own temporary folder in the build tree and removes it afterwards.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tetrad/core/error.hpp"
#include "tetrad/core/hash.hpp"
#include "tetrad/data/loader.hpp"
#include "tetrad/data/prepare.hpp"
#include "tetrad/data/shards.hpp"
#include "tetrad/data/tokenizer.hpp"

namespace fs = std::filesystem;
using namespace tetrad;
using namespace tetrad::data;

namespace {

// A fresh folder under the build tree, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = std::string(TETRAD_BINARY_DIR) + "/test_data_XXXXXX";
    char* p = mkdtemp(tmpl.data());
    if (!p) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The message of the tetrad::Error that f throws ("" and a test failure if it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const tetrad::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a tetrad::Error";
  return "";
}

#define EXPECT_CONTAINS(haystack, needle)                                                  \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos)                         \
      << "message: \"" << (haystack) << "\"\n does not contain: \"" << (needle) << "\""

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// Deterministic test data (not std::uniform_int_distribution, whose output is unspecified).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return next() % n; }
};

const std::vector<std::string> kWords = {
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then", "runs",
    "away", "from", "river", "bank", "café", "naïve", "über", "straße", "日本語", "東京",
    "Привет", "мир", "λόγος", "🙂", "tokens", "shard", "window", "epoch", "replica"};

std::string sentence(Rng& r) {
  std::string s;
  size_t n = 3 + r.below(10);
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kWords[r.below(kWords.size())];
  }
  return s;
}

// ~100 KB of lines.
std::string corpus_lines(uint64_t seed, int lines) {
  Rng r{seed};
  std::string text;
  for (int i = 0; i < lines; ++i) text += sentence(r) + "\n";
  return text;
}

}  // namespace

// ---------------------------------------------------------------- tokenizer

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    spit(*dir_ / "corpus.txt", corpus_lines(1, 2000));
    tok_ = new Tokenizer(Tokenizer::train({*dir_ / "corpus.txt"}, *dir_ / "tok", 400));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete dir_;
  }
  static TempDir* dir_;
  static Tokenizer* tok_;
};
TempDir* TokenizerTest::dir_ = nullptr;
Tokenizer* TokenizerTest::tok_ = nullptr;

TEST_F(TokenizerTest, ReservedIdsAndVocab) {
  EXPECT_EQ(tok_->vocab_size(), 400);
  EXPECT_EQ(tok_->unk_id(), 0);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_EQ(tok_->identity(), hash_file(*dir_ / "tok.model"));
  EXPECT_EQ(tok_->model_bytes(), slurp(*dir_ / "tok.model"));
}

TEST_F(TokenizerTest, RoundTripsAnyText) {
  const std::vector<std::string> texts = {
      "the quick brown fox",
      "café über straße 日本語 🙂",
      "  leading spaces, double  spaces and a trailing space ",
      "tabs\tand\nnewlines\n\nand CRLF\r\n",
      "unseen: Ωμέγα ψ 🚀 Ελληνικά ﷽ ∑∫√ 한국어",
      "",
      "x",
  };
  for (const auto& t : texts) {
    std::vector<int32_t> ids = tok_->encode(t);
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tok_->vocab_size());
      EXPECT_NE(id, tok_->unk_id()) << "byte fallback should avoid <unk> in: " << t;
    }
    EXPECT_EQ(tok_->decode(ids), t);
  }
  // The corpus' own words are merged into pieces: fewer tokens than bytes.
  std::string known = "the quick brown fox jumps over the lazy dog";
  EXPECT_LT(tok_->encode(known).size(), known.size() / 2);
}

TEST_F(TokenizerTest, TrainingIsDeterministicAndPathIndependent) {
  TempDir other;
  spit(other / "same_lines.txt", slurp(*dir_ / "corpus.txt"));
  Tokenizer again = Tokenizer::train({other / "same_lines.txt"}, other / "elsewhere", 400);
  EXPECT_EQ(again.identity(), tok_->identity());
  EXPECT_EQ(again.model_bytes(), tok_->model_bytes());

  // Lines from a callback give the same model as the same lines from a file.
  std::istringstream in(slurp(*dir_ / "corpus.txt"));
  Tokenizer from_lines = Tokenizer::train_lines(
      [&](std::string& line) { return static_cast<bool>(std::getline(in, line)); }, other / "cb", 400);
  EXPECT_EQ(from_lines.identity(), tok_->identity());

  // Other data, other identity.
  spit(other / "different.txt", corpus_lines(2, 2000));
  Tokenizer diff = Tokenizer::train({other / "different.txt"}, other / "diff", 400);
  EXPECT_NE(diff.identity(), tok_->identity());
}

TEST_F(TokenizerTest, LoadMatchesTrained) {
  Tokenizer loaded = Tokenizer::load(*dir_ / "tok.model");
  EXPECT_EQ(loaded.identity(), tok_->identity());
  EXPECT_EQ(loaded.vocab_size(), tok_->vocab_size());
  std::string t = "naïve replica runs over the river bank";
  EXPECT_EQ(loaded.encode(t), tok_->encode(t));
}

TEST_F(TokenizerTest, Errors) {
  std::string missing = *dir_ / "no_such.model";
  std::string msg = error_of([&] { Tokenizer::load(missing); });
  EXPECT_CONTAINS(msg, missing);
  EXPECT_CONTAINS(msg, "does not exist");

  spit(*dir_ / "garbage.model", "this is not a protobuf \xff\xfe\x01");
  msg = error_of([&] { Tokenizer::load(*dir_ / "garbage.model"); });
  EXPECT_CONTAINS(msg, "garbage.model");
  EXPECT_CONTAINS(msg, "not a valid SentencePiece model");

  msg = error_of([&] { tok_->decode({5, 400}); });
  EXPECT_CONTAINS(msg, "token id 400");

  msg = error_of([&] { Tokenizer::train({*dir_ / "absent.txt"}, *dir_ / "x", 400); });
  EXPECT_CONTAINS(msg, "absent.txt");

  msg = error_of([&] { Tokenizer::train({*dir_ / "corpus.txt"}, *dir_ / "big", 100000); });
  EXPECT_CONTAINS(msg, "tokenizer training");
  EXPECT_CONTAINS(msg, "Vocabulary size too high");
}

// ---------------------------------------------------------------- shards

namespace {

std::string write_shard(const std::string& path, const std::vector<int32_t>& tokens, uint32_t vocab,
                        uint64_t identity = 0x1234abcd5678ef00ull) {
  ShardWriter w(path, vocab, identity);
  w.write(tokens);
  w.finish();
  return path;
}

}  // namespace

TEST(Shards, RoundTripUint16) {
  TempDir d;
  std::vector<int32_t> toks;
  for (int i = 0; i < 5000; ++i) toks.push_back((i * 7919) % 8192);
  toks.push_back(8191);
  std::string path = d / "a.bin";
  {
    ShardWriter w(path, 8192, 42);
    w.write(toks.data(), 1000);  // in two pieces
    EXPECT_FALSE(fs::exists(path)) << "the final name must not appear before finish()";
    EXPECT_TRUE(fs::exists(path + ".tmp"));
    w.write(toks.data() + 1000, toks.size() - 1000);
    ShardHeader h = w.finish();
    EXPECT_EQ(h.num_tokens, toks.size());
    EXPECT_EQ(h.dtype, TokenDtype::U16);
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(fs::file_size(path), 64 + 2 * toks.size());
  std::string bytes = slurp(path);
  EXPECT_EQ(bytes.substr(0, 8), "TTRDTOKN");

  ShardReader r(path);
  EXPECT_EQ(r.num_tokens(), toks.size());
  EXPECT_EQ(r.vocab_size(), 8192u);
  EXPECT_EQ(r.tokenizer_identity(), 42u);
  EXPECT_EQ(r.header().checksum, hash64(bytes.data() + 64, bytes.size() - 64));
  for (size_t i = 0; i < toks.size(); ++i) ASSERT_EQ(r.token(i), static_cast<uint32_t>(toks[i]));
  std::vector<int32_t> out(100);
  r.copy(4000, 100, out.data());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), toks.begin() + 4000));
  EXPECT_EQ(r.max_token(), 8191u);
}

TEST(Shards, RoundTripUint32) {
  TempDir d;
  std::vector<int32_t> toks = {0, 1, 65535, 65536, 99999, 70000, 12};
  std::string path = write_shard(d / "b.bin", toks, 100000);
  EXPECT_EQ(fs::file_size(path), 64 + 4 * toks.size());
  ShardReader r(path);
  EXPECT_EQ(r.header().dtype, TokenDtype::U32);
  std::vector<int32_t> out(toks.size());
  r.copy(0, toks.size(), out.data());
  EXPECT_EQ(out, toks);
  EXPECT_EQ(r.max_token(), 99999u);
  // Exactly 65536 ids still fit uint16.
  EXPECT_EQ(dtype_for_vocab(65536), TokenDtype::U16);
  EXPECT_EQ(dtype_for_vocab(65537), TokenDtype::U32);
}

TEST(Shards, EmptyShard) {
  TempDir d;
  std::string path = write_shard(d / "e.bin", {}, 300);
  ShardReader r(path);
  EXPECT_EQ(r.num_tokens(), 0u);
}

TEST(Shards, WriterRefusesOutOfRangeTokensAndCleansUp) {
  TempDir d;
  std::string path = d / "bad.bin";
  {
    ShardWriter w(path, 100, 0);
    std::string msg = error_of([&] { w.write({1, 2, 100}); });
    EXPECT_CONTAINS(msg, "token id 100");
    EXPECT_CONTAINS(msg, "bad.bin");
    msg = error_of([&] { w.write({-1}); });
    EXPECT_CONTAINS(msg, "token id -1");
  }  // abandoned without finish()
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(Shards, TruncatedIsRefused) {
  TempDir d;
  std::vector<int32_t> toks(1000, 7);
  std::string path = write_shard(d / "x.bin", toks, 8192);
  fs::resize_file(path, 64 + 1500);
  std::string msg = error_of([&] { ShardReader r(path); });
  EXPECT_CONTAINS(msg, "x.bin");
  EXPECT_CONTAINS(msg, "is truncated: header says 1000 tokens (2000 bytes");
  EXPECT_CONTAINS(msg, "holds 1500 bytes");

  fs::resize_file(path, 10);
  msg = error_of([&] { ShardReader r(path); });
  EXPECT_CONTAINS(msg, "x.bin");
  EXPECT_CONTAINS(msg, "too small");
}

TEST(Shards, TrailingBytesAreRefused) {
  TempDir d;
  std::string path = write_shard(d / "t.bin", {1, 2, 3}, 8192);
  spit(path, slurp(path) + "junk");
  std::string msg = error_of([&] { ShardReader r(path); });
  EXPECT_CONTAINS(msg, "t.bin");
  EXPECT_CONTAINS(msg, "4 unexpected trailing bytes");
}

TEST(Shards, WrongMagicIsRefused) {
  TempDir d;
  std::string path = write_shard(d / "m.bin", {1, 2, 3}, 8192);
  std::string bytes = slurp(path);
  bytes.replace(0, 8, "NOTASHRD");
  spit(path, bytes);
  std::string msg = error_of([&] { ShardReader r(path); });
  EXPECT_CONTAINS(msg, "m.bin");
  EXPECT_CONTAINS(msg, "not a tetrad token shard");
  EXPECT_CONTAINS(msg, "NOTASHRD");
  EXPECT_CONTAINS(msg, "TTRDTOKN");
}

TEST(Shards, WrongVersionIsRefused) {
  TempDir d;
  std::string path = write_shard(d / "v.bin", {1, 2, 3}, 8192);
  std::string bytes = slurp(path);
  bytes[8] = 3;  // u32 version, little-endian
  spit(path, bytes);
  std::string msg = error_of([&] { ShardReader r(path); });
  EXPECT_CONTAINS(msg, "v.bin");
  EXPECT_CONTAINS(msg, "format version 3");
  EXPECT_CONTAINS(msg, "reads versions 1 and 2");
}

// Format version 2's document table: starts recorded by begin_document (an empty document and a
// start after the last token leave no entry), read back, and each token's document start in a
// window counted from the window's first token (clamped to 0 for a document begun before it).
TEST(Shards, DocumentTableRoundTrip) {
  TempDir d;
  std::vector<int32_t> toks(20);
  for (int i = 0; i < 20; ++i) toks[i] = i;
  const std::string path = d / "doc.bin";
  {
    ShardWriter w(path, 8192, 7);
    w.begin_document();
    w.write(toks.data(), 5);
    w.begin_document();
    w.begin_document();  // an empty document: the same start once
    w.write(toks.data() + 5, 7);
    w.begin_document();
    w.write(toks.data() + 12, 8);
    w.begin_document();  // no token after it: not a start in this shard
    ShardHeader h = w.finish();
    EXPECT_EQ(h.num_documents, 3u);
    EXPECT_EQ(h.version, 2u);
  }
  EXPECT_EQ(fs::file_size(path), 64 + 2 * 20 + 8 * 3);
  ShardReader r(path);
  ASSERT_TRUE(r.has_documents());
  ASSERT_EQ(r.num_documents(), 3u);
  EXPECT_EQ(r.document_start(0), 0u);
  EXPECT_EQ(r.document_start(1), 5u);
  EXPECT_EQ(r.document_start(2), 12u);
  std::vector<int32_t> got(10);
  r.document_starts(3, 10, got.data());  // tokens 3..12
  EXPECT_EQ(got, (std::vector<int32_t>{0, 0, 2, 2, 2, 2, 2, 2, 2, 9}));
}

// A shard of format version 1 (before the document table) is still read; asking it for document
// starts, or opening a loader that needs them, is refused naming the file and the way out.
TEST(Shards, VersionOneShardsAreReadWithoutDocuments) {
  TempDir d;
  fs::create_directories(d / "data");
  const std::string path = d / "data/train_000000.bin";
  std::vector<int32_t> toks(300);
  for (int i = 0; i < 300; ++i) toks[i] = i % 200;
  write_shard(path, toks, 8192);
  std::string bytes = slurp(path);
  bytes[8] = 1;  // version 1: bytes 48..63 were zero padding
  std::fill(bytes.begin() + 48, bytes.begin() + 64, '\0');
  spit(path, bytes);
  ShardReader r(path);
  EXPECT_FALSE(r.has_documents());
  EXPECT_EQ(r.num_tokens(), 300u);
  EXPECT_EQ(r.token(299), 99u);
  std::vector<int32_t> got(4);
  std::string msg = error_of([&] { r.document_starts(0, 4, got.data()); });
  EXPECT_CONTAINS(msg, "train_000000.bin");
  EXPECT_CONTAINS(msg, "format version 1");
  EXPECT_CONTAINS(msg, "prepare the data again");
  DataLoader plain(d / "data", "train", 2, 16);  // without documents: read as before
  std::vector<int32_t> in(32), tg(32);
  plain.next_batch(in.data(), tg.data());
  EXPECT_EQ(tg[0], in[0] + 1);
  LoaderOptions o;
  o.documents = true;
  msg = error_of([&] { DataLoader l(d / "data", "train", 2, 16, 0, 1, 0, o); });
  EXPECT_CONTAINS(msg, "train_000000.bin");
  EXPECT_CONTAINS(msg, "data.document_mask");
  EXPECT_CONTAINS(msg, "prepare the data again");
}

TEST(Shards, CorruptDocumentTableIsRefused) {
  TempDir d;
  const std::string path = d / "c.bin";
  {
    ShardWriter w(path, 100, 0);
    w.begin_document();
    w.write({1, 2, 3});
    w.begin_document();
    w.write({4, 5});
    w.finish();
  }
  std::string bytes = slurp(path);
  bytes[64 + 2 * 5 + 8] ^= 1;  // the second start: 3 -> 2
  spit(path, bytes);
  std::string msg = error_of([&] { ShardReader r(path); });
  EXPECT_CONTAINS(msg, "c.bin");
  EXPECT_CONTAINS(msg, "table of 2 document starts");
}

TEST(Shards, WrongDtypeIsRefused) {
  TempDir d;
  std::string path = write_shard(d / "dt.bin", {1, 2, 3}, 8192);
  std::string bytes = slurp(path);
  bytes[12] = 9;
  spit(path, bytes);
  std::string msg = error_of([&] { ShardReader r(path); });
  EXPECT_CONTAINS(msg, "dt.bin");
  EXPECT_CONTAINS(msg, "dtype code 9");
}

TEST(Shards, ChecksumMismatchIsRefused) {
  TempDir d;
  std::vector<int32_t> toks(500, 3);
  std::string path = write_shard(d / "c.bin", toks, 8192);
  std::string bytes = slurp(path);
  bytes[64 + 2 * 250] ^= 1;  // one bit of token 250
  spit(path, bytes);
  std::string msg = error_of([&] { ShardReader r(path); });
  EXPECT_CONTAINS(msg, "c.bin");
  EXPECT_CONTAINS(msg, "corrupt");
  EXPECT_CONTAINS(msg, "checksum");
  // Verification can be skipped; the flipped token is then visible.
  ShardReader r(path, /*verify_checksum=*/false);
  EXPECT_EQ(r.token(250), 2u);
}

TEST(Shards, MissingFileIsRefused) {
  TempDir d;
  std::string msg = error_of([&] { ShardReader r(d / "nope.bin"); });
  EXPECT_CONTAINS(msg, "nope.bin");
}

// ---------------------------------------------------------------- documents

TEST(Documents, SplitModes) {
  std::string text = "\n\npara one\nline two\n\n\n  \npara two\r\n\nlast\n";
  EXPECT_EQ(split_documents(text, DocSplit::File),
            (std::vector<std::string>{"para one\nline two\n\n\n  \npara two\n\nlast"}));
  EXPECT_EQ(split_documents(text, DocSplit::BlankLine),
            (std::vector<std::string>{"para one\nline two", "para two", "last"}));
  EXPECT_EQ(split_documents(text, DocSplit::Line),
            (std::vector<std::string>{"para one", "line two", "para two", "last"}));
  EXPECT_TRUE(split_documents("  \n\n", DocSplit::File).empty());
  EXPECT_EQ(split_documents("no newline at end", DocSplit::File),
            (std::vector<std::string>{"no newline at end"}));
}

TEST(Documents, KjvChapters) {
  std::string kjv =
      "Ge1:1 In the beginning God created the heaven and the earth.\n"
      "Ge1:2 And the earth was without form, and void.\n"
      "Ge2:1 Thus the heavens and the earth were finished.\n"
      "1Cor13:4 Charity suffereth long, and is kind;\n"
      "1Cor13:5 Doth not behave itself unseemly,\n"
      "SSol1:1 The song of songs, which is Solomon's.\n";
  EXPECT_EQ(detect_doc_split(kjv), DocSplit::KjvChapter);
  auto docs = split_documents(kjv, DocSplit::Auto);
  ASSERT_EQ(docs.size(), 4u);
  EXPECT_EQ(docs[0],
            "Ge1:1 In the beginning God created the heaven and the earth.\n"
            "Ge1:2 And the earth was without form, and void.");
  EXPECT_EQ(docs[1], "Ge2:1 Thus the heavens and the earth were finished.");
  EXPECT_EQ(docs[2], "1Cor13:4 Charity suffereth long, and is kind;\n1Cor13:5 Doth not behave itself unseemly,");
  EXPECT_EQ(docs[3], "SSol1:1 The song of songs, which is Solomon's.");
}

TEST(Documents, AutoDetection) {
  EXPECT_EQ(detect_doc_split("a\nb\n\nc\n"), DocSplit::BlankLine);
  EXPECT_EQ(detect_doc_split("\n\na\nb\nc\n\n"), DocSplit::File);  // blank lines only at the ends
  EXPECT_EQ(detect_doc_split("Ge1:1 x\nnot a verse\n"), DocSplit::File);
  EXPECT_EQ(parse_doc_split("kjv-chapter"), DocSplit::KjvChapter);
  std::string msg = error_of([] { parse_doc_split("paragraph"); });
  EXPECT_CONTAINS(msg, "paragraph");
  EXPECT_CONTAINS(msg, "blank-line");
}

// ---------------------------------------------------------------- prepare

namespace {

// Documents in the order prepare numbers them, and prepare's inputs.
struct Corpus {
  std::vector<std::string> docs;
  std::vector<std::string> inputs;
};

Corpus make_corpus(const TempDir& d) {
  Corpus c;
  fs::create_directories(d / "corpus/sub");
  Rng r{7};
  auto write_doc_file = [&](const std::string& path, int ndocs) {
    std::string text;
    for (int i = 0; i < ndocs; ++i) {
      std::string doc;
      int lines = 1 + static_cast<int>(r.below(4));
      for (int l = 0; l < lines; ++l) {
        if (l) doc += '\n';
        doc += sentence(r);
      }
      c.docs.push_back(doc);
      text += doc + "\n\n";
    }
    spit(path, text);
  };
  // Folder inputs are expanded in sorted path order: corpus/a.txt, corpus/sub/b.txt.
  write_doc_file(d / "corpus/sub/b.txt", 40);
  std::vector<std::string> b_docs = c.docs;
  c.docs.clear();
  write_doc_file(d / "corpus/a.txt", 60);
  c.docs.insert(c.docs.end(), b_docs.begin(), b_docs.end());
  spit(d / "corpus/ignored.md", "not a .txt file\n\nnot read");
  c.inputs = {d / "corpus"};
  return c;
}

// All tokens of a split, in shard order.
std::vector<int32_t> split_tokens(const std::string& dir, const std::string& split) {
  std::vector<int32_t> all;
  for (int i = 0;; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "%s_%06d.bin", split.c_str(), i);
    std::string path = (fs::path(dir) / name).string();
    if (!fs::exists(path)) break;
    ShardReader r(path);
    std::vector<int32_t> t(r.num_tokens());
    r.copy(0, t.size(), t.data());
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

std::vector<std::string> decode_documents(const Tokenizer& tok, const std::vector<int32_t>& tokens) {
  std::vector<std::string> docs;
  std::vector<int32_t> cur;
  for (int32_t t : tokens) {
    if (t == tok.eos_id()) {
      docs.push_back(tok.decode(cur));
      cur.clear();
    } else {
      cur.push_back(t);
    }
  }
  EXPECT_TRUE(cur.empty()) << "a split must end with EOS";
  return docs;
}

}  // namespace

TEST(Prepare, EndToEndOnGeneratedCorpus) {
  TempDir d;
  Corpus c = make_corpus(d);
  PrepareOptions o;
  o.inputs = c.inputs;
  o.out_dir = d / "out";
  o.vocab_size = 320;
  o.val_fraction = 0.2;
  o.shard_tokens = 1000;
  std::ostringstream log;
  prepare_data(o, log);
  EXPECT_CONTAINS(log.str(), "prepare: done");

  Tokenizer tok = Tokenizer::load(d / "out/tokenizer.model");
  EXPECT_EQ(tok.vocab_size(), 320);
  auto meta = nlohmann::json::parse(slurp(d / "out/meta.json"));
  EXPECT_EQ(meta["tokenizer"]["identity"], hex64(tok.identity()));
  EXPECT_EQ(meta["tokenizer"]["vocab_size"], 320);
  EXPECT_EQ(meta["documents"], c.docs.size());
  ASSERT_EQ(meta["files"].size(), 2u);
  EXPECT_EQ(meta["files"][0]["doc_split"], "blank-line");

  // Every document appears exactly once, in order, in the split its index chooses.
  std::vector<std::string> want_train, want_val;
  for (size_t i = 0; i < c.docs.size(); ++i)
    (document_uniform(i, o.seed) < o.val_fraction ? want_val : want_train).push_back(c.docs[i]);
  ASSERT_FALSE(want_val.empty());
  ASSERT_FALSE(want_train.empty());
  std::vector<int32_t> train = split_tokens(o.out_dir, "train"), val = split_tokens(o.out_dir, "val");
  EXPECT_EQ(decode_documents(tok, train), want_train);
  EXPECT_EQ(decode_documents(tok, val), want_val);
  EXPECT_EQ(meta["splits"]["train"]["tokens"], train.size());
  EXPECT_EQ(meta["splits"]["val"]["tokens"], val.size());
  EXPECT_EQ(meta["splits"]["train"]["documents"], want_train.size());
  EXPECT_EQ(meta["splits"]["val"]["documents"], want_val.size());
  // Shards are full except the last of each split, and carry the tokenizer identity.
  const auto& shards = meta["splits"]["train"]["shards"];
  ASSERT_GE(shards.size(), 2u);
  for (size_t i = 0; i + 1 < shards.size(); ++i) EXPECT_EQ(shards[i]["tokens"], 1000);
  EXPECT_EQ(ShardReader(d / "out/train_000000.bin").tokenizer_identity(), tok.identity());

  // The same inputs and options give the same bytes, tokenizer included.
  PrepareOptions o2 = o;
  o2.out_dir = d / "out2";
  std::ostringstream log2;
  prepare_data(o2, log2);
  for (const char* f : {"tokenizer.model", "train_000000.bin", "val_000000.bin"})
    EXPECT_EQ(slurp(d / (std::string("out/") + f)), slurp(d / (std::string("out2/") + f))) << f;

  // Reusing the tokenizer gives the same shards; re-running into a used folder replaces it whole
  // (no stale shards).
  PrepareOptions o3 = o;
  o3.tokenizer_model = d / "out/tokenizer.model";
  o3.out_dir = d / "out2";
  o3.shard_tokens = 1 << 20;
  std::ostringstream log3;
  prepare_data(o3, log3);
  EXPECT_CONTAINS(log3.str(), "replaced the earlier content");
  EXPECT_FALSE(fs::exists(d / "out2/train_000001.bin"));
  EXPECT_EQ(split_tokens(d / "out2", "train"), train);

  // The loader reads it.
  LoaderOptions lo;
  lo.tokenizer_identity = tok.identity();
  lo.model_vocab = 320;
  DataLoader loader(o.out_dir, "val", 2, 8, 0, 1, 1, lo);
  std::vector<int32_t> in(16), tg(16);
  loader.next_batch(in.data(), tg.data());

  // The shards record where each document begins: after every EOS of the split's stream (and at
  // its start), in the shard the document begins in; a document that continues into the next
  // shard has no start there.
  for (const char* split : {"train", "val"}) {
    const std::vector<int32_t> stream = split_tokens(o.out_dir, split);
    std::vector<uint64_t> want = {0}, got;
    for (size_t i = 0; i + 1 < stream.size(); ++i)
      if (stream[i] == tok.eos_id()) want.push_back(i + 1);
    uint64_t base = 0;
    for (int s = 0;; ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "/%s_%06d.bin", split, s);
      if (!fs::exists(o.out_dir + name)) break;
      ShardReader r(o.out_dir + name);
      ASSERT_TRUE(r.has_documents()) << name;
      for (uint64_t k = 0; k < r.num_documents(); ++k) got.push_back(base + r.document_start(k));
      base += r.num_tokens();
    }
    EXPECT_EQ(got, want) << split;
  }
  // A loader with documents gives each token its document's start in the window.
  LoaderOptions ld = lo;
  ld.documents = true;
  ld.shuffle = false;
  DataLoader dl(o.out_dir, "train", 2, 8, 0, 1, 1, ld);
  std::vector<int32_t> ds(16);
  for (int step = 0; step < 20; ++step) {
    dl.next_batch(in.data(), tg.data(), ds.data());
    for (int b = 0; b < 2; ++b)
      for (int t = 0; t < 8; ++t) {
        const int32_t s0 = ds[b * 8 + t];
        ASSERT_TRUE(s0 >= 0 && s0 <= t);
        // A document begins at t exactly when the token before it is EOS.
        if (t > 0) {
          EXPECT_EQ(s0 == t, in[b * 8 + t - 1] == tok.eos_id()) << step << " " << b << " " << t;
        }
        if (t > 0 && s0 != t) {
          EXPECT_EQ(s0, ds[b * 8 + t - 1]);
        }
      }
  }
}

TEST(Prepare, Errors) {
  TempDir d;
  PrepareOptions o;
  o.out_dir = d / "out";
  o.inputs = {d / "missing.txt"};
  std::ostringstream log;
  std::string msg = error_of([&] { prepare_data(o, log); });
  EXPECT_CONTAINS(msg, "missing.txt");
  EXPECT_CONTAINS(msg, "does not exist");

  fs::create_directories(d / "empty");
  o.inputs = {d / "empty"};
  msg = error_of([&] { prepare_data(o, log); });
  EXPECT_CONTAINS(msg, "holds no *.txt or *.jsonl files");

  spit(d / "blank.txt", "\n  \n\n");
  o.inputs = {d / "blank.txt"};
  msg = error_of([&] { prepare_data(o, log); });
  EXPECT_CONTAINS(msg, "no documents");

  o.val_fraction = 1.0;
  msg = error_of([&] { prepare_data(o, log); });
  EXPECT_CONTAINS(msg, "val_fraction");
}

// ---------------------------------------------------------------- loader

namespace {

// Shards whose tokens are their global position (so a window is known by its first token):
// shard sizes 1000, 517, 64, 10 with T = 16 hold 62 + 32 + 3 + 0 = 97 windows.
constexpr int kT = 16;
constexpr uint64_t kWindows = 97;
constexpr uint32_t kVocab = 1 << 20;
constexpr uint64_t kIdentity = 0xfeedbeefcafe0001ull;

void make_position_shards(const std::string& dir, const std::string& split,
                          const std::vector<int>& sizes = {1000, 517, 64, 10},
                          uint64_t identity = kIdentity) {
  fs::create_directories(dir);
  int32_t pos = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<int32_t> t(sizes[s]);
    for (auto& x : t) x = pos++;
    char name[32];
    std::snprintf(name, sizeof name, "%s_%06zu.bin", split.c_str(), s);
    write_shard((fs::path(dir) / name).string(), t, kVocab, identity);
  }
}

LoaderOptions expect_tokenizer(uint64_t identity) {
  LoaderOptions o;
  o.tokenizer_identity = identity;
  return o;
}
LoaderOptions expect_vocab(int64_t vocab) {
  LoaderOptions o;
  o.model_vocab = vocab;
  return o;
}

// One batch: B rows of (inputs, targets).
struct Batch {
  std::vector<int32_t> in, tg;
  bool operator==(const Batch& o) const { return in == o.in && tg == o.tg; }
};

Batch next(DataLoader& l, int B) {
  Batch b{std::vector<int32_t>(B * kT), std::vector<int32_t>(B * kT)};
  l.next_batch(b.in.data(), b.tg.data());
  return b;
}

}  // namespace

TEST(Loader, WindowsAndTargetsShiftedByOne) {
  TempDir d;
  make_position_shards(d.path(), "train");
  DataLoader l(d.path(), "train", 4, kT, 0, 1, 5);
  EXPECT_EQ(l.num_windows(), kWindows);
  EXPECT_EQ(l.num_shards(), 4u);
  EXPECT_EQ(l.num_tokens(), 1000u + 517 + 64 + 10);
  const std::vector<int> begins = {0, 1000, 1517, 1581};
  for (int step = 0; step < 30; ++step) {
    Batch b = next(l, 4);
    for (int r = 0; r < 4; ++r) {
      const int32_t* in = &b.in[r * kT];
      const int32_t* tg = &b.tg[r * kT];
      for (int t = 0; t < kT; ++t) {
        EXPECT_EQ(in[t], in[0] + t);
        EXPECT_EQ(tg[t], in[t] + 1);  // targets = inputs shifted by one
      }
      // Window starts at a multiple of T inside its shard, and ends inside the same shard.
      int s = static_cast<int>(std::upper_bound(begins.begin(), begins.end(), in[0]) - begins.begin()) - 1;
      EXPECT_EQ((in[0] - begins[s]) % kT, 0);
      int shard_end = s + 1 < static_cast<int>(begins.size()) ? begins[s + 1] : 1591;
      EXPECT_LT(tg[kT - 1], shard_end);
    }
  }
}

TEST(Loader, EachEpochVisitsEveryWindowOnce) {
  TempDir d;
  make_position_shards(d.path(), "train");
  DataLoader l(d.path(), "train", 1, kT, 0, 1, 11);
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::set<int32_t> seen;
    for (uint64_t i = 0; i < kWindows; ++i) {
      EXPECT_EQ(l.epoch(), epoch);
      seen.insert(next(l, 1).in[0]);
    }
    EXPECT_EQ(seen.size(), kWindows);
  }
  EXPECT_EQ(l.epoch(), 2u);
  // Shuffled: epoch 0 is not in file order and differs from epoch 1.
  EXPECT_NE(epoch_permutation(kWindows, 11, 0), epoch_permutation(kWindows, 11, 1));
  std::vector<uint32_t> sorted = epoch_permutation(kWindows, 11, 0);
  EXPECT_FALSE(std::is_sorted(sorted.begin(), sorted.end()));
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < kWindows; ++i) EXPECT_EQ(sorted[i], i);
}

TEST(Loader, PermutationIsPinned) {
  // The order is part of what a checkpoint resumes (docs/data.md); changing it breaks resumption.
  // Expected values from an independent Python transcription of the algorithm in docs/data.md.
  EXPECT_EQ(epoch_permutation(10, 1337, 0), (std::vector<uint32_t>{9, 0, 5, 6, 7, 8, 4, 1, 2, 3}));
  EXPECT_EQ(epoch_permutation(10, 1337, 1), (std::vector<uint32_t>{0, 9, 2, 3, 7, 1, 5, 8, 4, 6}));
}

TEST(Loader, SameSeedSameBatchesOtherSeedOthers) {
  TempDir d;
  make_position_shards(d.path(), "train");
  DataLoader a(d.path(), "train", 3, kT, 0, 1, 42), b(d.path(), "train", 3, kT, 0, 1, 42),
      c(d.path(), "train", 3, kT, 0, 1, 43);
  bool differs = false;
  for (int i = 0; i < 80; ++i) {  // > 2 epochs
    Batch x = next(a, 3), y = next(b, 3), z = next(c, 3);
    EXPECT_EQ(x, y);
    differs = differs || !(x == z);
  }
  EXPECT_TRUE(differs);
}

TEST(Loader, StateRestoreResumesExactly) {
  TempDir d;
  make_position_shards(d.path(), "train");
  for (int steps_before : {0, 5, 32, 33, 64}) {  // 32*3 = 96 windows: 33 crosses an epoch
    DataLoader a(d.path(), "train", 3, kT, 0, 1, 9);
    for (int i = 0; i < steps_before; ++i) next(a, 3);
    LoaderState s = a.state();
    EXPECT_EQ(s.epoch * kWindows + s.cursor, static_cast<uint64_t>(steps_before) * 3);
    DataLoader b(d.path(), "train", 3, kT, 0, 1, 9);
    b.restore(s);
    EXPECT_EQ(b.epoch(), a.epoch());
    for (int i = 0; i < 40; ++i) ASSERT_EQ(next(a, 3), next(b, 3)) << "after " << steps_before;
  }
  DataLoader a(d.path(), "train", 3, kT, 0, 1, 9);
  std::string msg = error_of([&] { a.restore({0, kWindows}); });
  EXPECT_CONTAINS(msg, "cursor 97");
  EXPECT_CONTAINS(msg, "97 windows");
}

TEST(Loader, ReplicasAreDisjointAndCoverTheEpoch) {
  TempDir d;
  make_position_shards(d.path(), "train");
  DataLoader single(d.path(), "train", 1, kT, 0, 1, 3);
  std::set<int32_t> single_epoch;
  for (uint64_t i = 0; i < kWindows; ++i) single_epoch.insert(next(single, 1).in[0]);
  ASSERT_EQ(single_epoch.size(), kWindows);

  for (int n : {2, 3}) {
    std::set<int32_t> all;
    size_t total = 0;
    for (int r = 0; r < n; ++r) {
      DataLoader rep(d.path(), "train", 1, kT, r, n, 3);
      // Replica r owns the epoch's positions r, r+n, ... below N.
      uint64_t mine = (kWindows - r + n - 1) / n;
      for (uint64_t i = 0; i < mine; ++i) {
        all.insert(next(rep, 1).in[0]);
        ++total;
      }
    }
    EXPECT_EQ(total, kWindows) << n;
    EXPECT_EQ(all.size(), kWindows) << "replicas overlap for n = " << n;
    EXPECT_EQ(all, single_epoch) << n;
  }
}

TEST(Loader, ReplicaBatchesInterleaveTheSingleStream) {
  // Row b of replica r at step j == row b*n + r of a single replica with micro-batch n*B.
  TempDir d;
  make_position_shards(d.path(), "train");
  const int B = 4;
  for (int n : {2, 3}) {
    DataLoader single(d.path(), "train", n * B, kT, 0, 1, 77);
    std::vector<DataLoader> reps;
    for (int r = 0; r < n; ++r) reps.emplace_back(d.path(), "train", B, kT, r, n, 77);
    for (int step = 0; step < 20; ++step) {  // crosses epochs
      Batch whole = next(single, n * B);
      for (int r = 0; r < n; ++r) {
        Batch part = next(reps[r], B);
        for (int b = 0; b < B; ++b)
          for (int t = 0; t < kT; ++t) {
            ASSERT_EQ(part.in[b * kT + t], whole.in[(b * n + r) * kT + t]);
            ASSERT_EQ(part.tg[b * kT + t], whole.tg[(b * n + r) * kT + t]);
          }
        EXPECT_EQ(reps[r].state().epoch, single.state().epoch);
        EXPECT_EQ(reps[r].state().cursor, single.state().cursor);
      }
    }
  }
}

TEST(Loader, ResumeWithAnotherReplicaCount) {
  // A state saved by one replica (B = 6) resumes two replicas (B = 3) on the same global batch.
  TempDir d;
  make_position_shards(d.path(), "train");
  DataLoader single(d.path(), "train", 6, kT, 0, 1, 5);
  for (int i = 0; i < 7; ++i) next(single, 6);
  LoaderState s = single.state();
  DataLoader r0(d.path(), "train", 3, kT, 0, 2, 5), r1(d.path(), "train", 3, kT, 1, 2, 5);
  r0.restore(s);
  r1.restore(s);
  for (int i = 0; i < 10; ++i) {
    Batch whole = next(single, 6), a = next(r0, 3), b = next(r1, 3);
    for (int row = 0; row < 3; ++row) {
      EXPECT_EQ(a.in[row * kT], whole.in[(2 * row) * kT]);
      EXPECT_EQ(b.in[row * kT], whole.in[(2 * row + 1) * kT]);
    }
  }
}

TEST(Loader, NoShuffleIsFileOrder) {
  TempDir d;
  make_position_shards(d.path(), "val");
  DataLoader l(d.path(), "val", 1, kT, 0, 1, 0, [] { LoaderOptions o; o.shuffle = false; return o; }());
  EXPECT_EQ(next(l, 1).in[0], 0);
  EXPECT_EQ(next(l, 1).in[0], kT);
}

TEST(Loader, TokenizerMismatchIsRefused) {
  TempDir d;
  make_position_shards(d.path(), "train");
  std::string msg = error_of([&] {
    DataLoader l(d.path(), "train", 1, kT, 0, 1, 0, expect_tokenizer(0x1111222233334444ull));
  });
  EXPECT_CONTAINS(msg, "were made with tokenizer " + hex64(kIdentity));
  EXPECT_CONTAINS(msg, "the model's tokenizer is 1111222233334444");
  EXPECT_CONTAINS(msg, d.path());
  // The right identity is accepted.
  DataLoader ok(d.path(), "train", 1, kT, 0, 1, 0, expect_tokenizer(kIdentity));

  // Shards of two tokenizers in one split.
  TempDir mixed;
  make_position_shards(mixed.path(), "train", {100, 100});
  write_shard(mixed / "train_000002.bin", {1, 2, 3}, kVocab, 0x9999);
  msg = error_of([&] { DataLoader l(mixed.path(), "train", 1, kT); });
  EXPECT_CONTAINS(msg, "different tokenizers");
  EXPECT_CONTAINS(msg, "train_000002.bin");
}

TEST(Loader, ModelVocabTooSmallIsRefused) {
  TempDir d;
  make_position_shards(d.path(), "train", {9001});  // tokens 0..9000
  std::string msg = error_of([&] { DataLoader l(d.path(), "train", 1, kT, 0, 1, 0, expect_vocab(8192)); });
  EXPECT_CONTAINS(msg, "token id 9000 >= model vocab 8192");
  EXPECT_CONTAINS(msg, "train_000000.bin");
  // A model vocab at least the tokenizer's is fine.
  DataLoader ok(d.path(), "train", 1, kT, 0, 1, 0, expect_vocab(kVocab));
}

TEST(Loader, TooFewTokensIsRefused) {
  TempDir d;
  make_position_shards(d.path(), "val", {50});
  std::string msg = error_of([&] { DataLoader l(d.path(), "val", 1, 64); });
  EXPECT_CONTAINS(msg, "val split of '" + d.path() + "' has 50 tokens, fewer than one sequence of T+1 = 65");
  // Enough tokens in total but no shard holds a window.
  TempDir small;
  make_position_shards(small.path(), "val", {40, 40});
  msg = error_of([&] { DataLoader l(small.path(), "val", 1, 64); });
  EXPECT_CONTAINS(msg, "no shard holds a sequence");
}

TEST(Loader, MissingOrGappedShardsAreRefused) {
  TempDir d;
  std::string msg = error_of([&] { DataLoader l(d.path(), "train", 1, kT); });
  EXPECT_CONTAINS(msg, "has no train shards");
  make_position_shards(d.path(), "train", {100, 100, 100});
  fs::remove(d / "train_000001.bin");
  msg = error_of([&] { DataLoader l(d.path(), "train", 1, kT); });
  EXPECT_CONTAINS(msg, "missing shard train_000001.bin");
  msg = error_of([&] { DataLoader l(d / "nowhere", "train", 1, kT); });
  EXPECT_CONTAINS(msg, "does not exist");
  msg = error_of([&] { DataLoader l(d.path(), "train", 1, kT, 2, 2); });
  EXPECT_CONTAINS(msg, "replica 2");
}

// ---------------------------------------------------------------- the real corpus (opt-in)

// prepare on the King James Bible (`bible -f "Gen1:1-Rev22:21"`, 4.4 MB) with the default vocab
// 8192, printing the log (timings): about 7 s of CPU. scripts/install-deps.sh installs bible-kjv,
// so the suite runs it; skipped, saying so, only where the `bible` program is missing.
TEST(PrepareKjv, EndToEnd) {
  if (std::system("command -v bible > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "the `bible` program (Debian package bible-kjv, scripts/install-deps.sh) is not installed";
  TempDir d;
  std::string txt = d / "kjv.txt";
  ASSERT_EQ(std::system(("bible -f \"Gen1:1-Rev22:21\" > '" + txt + "'").c_str()), 0);
  PrepareOptions o;
  o.inputs = {txt};
  o.out_dir = d / "kjv";
  std::ostringstream log;
  prepare_data(o, log);
  std::cout << log.str();
  auto meta = nlohmann::json::parse(slurp(d / "kjv/meta.json"));
  EXPECT_EQ(meta["files"][0]["doc_split"], "kjv-chapter");
  EXPECT_EQ(meta["documents"], 1189);  // chapters of the Bible
  EXPECT_EQ(meta["tokenizer"]["vocab_size"], 8192);
  DataLoader train(o.out_dir, "train", 8, 256);
  DataLoader val(o.out_dir, "val", 8, 256);
  std::cout << "train windows (T=256): " << train.num_windows() << ", val windows: " << val.num_windows()
            << "\n";
  Tokenizer tok = Tokenizer::load(d / "kjv/tokenizer.model");
  std::vector<int32_t> in(8 * 256), tg(8 * 256);
  train.next_batch(in.data(), tg.data());
  std::cout << "sample: " << tok.decode(std::vector<int32_t>(in.begin(), in.begin() + 40)) << "\n";
}

// ---- JSON lines and Hugging Face tokenizers in prepare ----

namespace {
std::string prepare_error(const PrepareOptions& o) {
  std::ostringstream log;
  try {
    prepare_data(o, log);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(PrepareJsonLines, DocumentsFieldsAndBadLines) {
  // Valid: one document per line, blank lines ignored, other fields ignored, empty text dropped.
  const std::string good = "{\"text\": \"In the beginning\\nGod\", \"id\": 1}\n\n"
                           "{\"id\": 2, \"text\": \"And the earth\"}\n{\"text\": \"\"}\n";
  EXPECT_EQ(json_lines_documents(good, "text", false, "g.jsonl"),
            (std::vector<std::string>{"In the beginning\nGod", "And the earth"}));
  EXPECT_THROW(json_lines_documents(good, "id", false, "g.jsonl"), Error);  // an int is not text
}

TEST(PrepareJsonLines, ErrorsNameTheLine) {
  const std::string bad = "{\"text\": \"a\"}\n{\"text\": \"b\"\n{\"body\": \"c\"}\n[1]\n{\"text\": 5}\n";
  auto error_of = [&](const std::string& text) {
    try {
      json_lines_documents(text, "text", false, "d.jsonl");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_CONTAINS(error_of(bad), "'d.jsonl' line 2 is not valid JSON");
  EXPECT_CONTAINS(error_of("{\"text\": \"a\"}\n{\"body\": \"c\"}\n"), "line 2 has no field 'text'");
  EXPECT_CONTAINS(error_of("[1]\n"), "line 1 is not a JSON object");
  EXPECT_CONTAINS(error_of("\n{\"text\": 5}\n"), "line 2 has a field 'text' that is not a string");
  EXPECT_CONTAINS(error_of(std::string(100, '[') + std::string(100, ']')), "nested deeper than 64");
  uint64_t skipped = 0;
  std::string first;
  EXPECT_EQ(json_lines_documents(bad, "text", true, "d.jsonl", &skipped, &first),
            (std::vector<std::string>{"a"}));
  EXPECT_EQ(skipped, 4u);
  EXPECT_CONTAINS(first, "line 2");
}

TEST(PrepareJsonLines, EndToEndWithTheFixtureTokenizer) {
  TempDir d;
  std::string jl;
  for (int i = 0; i < 40; ++i)
    jl += "{\"text\": \"the king went up to the city " + std::to_string(i) + ",\\nand the people followed.\"}\n";
  spit(d / "docs.jsonl", jl);
  PrepareOptions o;
  o.inputs = {d / "docs.jsonl"};
  o.out_dir = d / "out";
  o.val_fraction = 0.1;
  o.tokenizer_model = std::string(TETRAD_SOURCE_DIR) + "/tests/fixtures/tokenizers/llama3";
  std::ostringstream log;
  prepare_data(o, log);
  auto meta = nlohmann::json::parse(slurp(d / "out/meta.json"));
  EXPECT_EQ(meta["documents"], 40);
  EXPECT_EQ(meta["files"][0]["doc_split"], "json-lines");
  EXPECT_EQ(meta["tokenizer"]["file"], "tokenizer.json");
  EXPECT_EQ(meta["tokenizer"]["kind"], "hf-bpe");
  const Tokenizer tok = Tokenizer::load(d / "out");
  EXPECT_EQ(meta["tokenizer"]["identity"], hex64(tok.identity()));
  EXPECT_EQ(meta["tokenizer"]["eos_id"], tok.token_to_id("<|end_of_text|>"));
  EXPECT_TRUE(fs::exists(d / "out/tokenizer_config.json"));
  EXPECT_FALSE(fs::exists(d / "out/tokenizer.model"));
  // Every document's tokens, then EOS: the train and val streams together hold them all.
  uint64_t tokens = 0;
  for (int i = 0; i < 40; ++i)
    tokens += tok.encode("the king went up to the city " + std::to_string(i) + ",\nand the people followed.").size() + 1;
  EXPECT_EQ(meta["splits"]["train"]["tokens"].get<uint64_t>() + meta["splits"]["val"]["tokens"].get<uint64_t>(),
            tokens);

  // A bad line fails naming it, or is skipped and counted when asked.
  spit(d / "docs.jsonl", jl + "{\"txt\": \"typo\"}\n");
  EXPECT_CONTAINS(prepare_error(o), "line 41 has no field 'text'");
  o.skip_bad_lines = true;
  log.str("");
  prepare_data(o, log);
  EXPECT_CONTAINS(log.str(), "skipped 1 bad line(s), the first: line 41");
  // Another field name.
  spit(d / "body.jsonl", "{\"body\": \"one\"}\n{\"body\": \"two\"}\n");
  o.inputs = {d / "body.jsonl"};
  o.text_field = "body";
  o.skip_bad_lines = false;
  o.val_fraction = 0;
  prepare_data(o, log);
  EXPECT_EQ(nlohmann::json::parse(slurp(d / "out/meta.json"))["documents"], 2);
  // An empty file holds no documents.
  spit(d / "empty.jsonl", "");
  o.inputs = {d / "empty.jsonl"};
  EXPECT_CONTAINS(prepare_error(o), "hold no documents");
}
