// Hugging Face tokenizers (tokenizer.json byte-level BPE) and SentencePiece models against the ids
// the Python libraries gave for the same inputs (tests/fixtures/tokenizers, made by
// make_fixtures.py with `tokenizers` and `sentencepiece` from PyPI; no Python needed here).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include <unistd.h>

#include "tetrad/core/error.hpp"
#include "tetrad/data/hf_tokenizer.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/data/utf8.hpp"

using namespace tetrad;
using namespace tetrad::data;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(TETRAD_SOURCE_DIR) / "tests/fixtures/tokenizers";

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << p;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += char(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

const nlohmann::json& expected() {
  static const nlohmann::json j = nlohmann::json::parse(slurp(kFixtures / "expected.json"));
  return j;
}

std::vector<std::string> lines_of(const std::string& s) {  // as `tetrad tokenize` reads them
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
    out.push_back(l);
  }
  return out;
}

// A tokenizer.json from pieces, for the refusal and model-option tests.
std::string tiny_json(const std::string& extra_top, const std::string& model_extra = "",
                      const std::string& vocab = R"({"a": 0, "b": 1, "ab": 2, "c": 3})",
                      const std::string& merges = R"(["a b"])") {
  return R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
             "normalizer": null, "pre_tokenizer": null, "post_processor": null,
             "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                         "use_regex": true},)" +
         extra_top + R"( "model": {"type": "BPE", "dropout": null, "unk_token": null,
             "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
             "byte_fallback": false, "ignore_merges": false, )" +
         model_extra + R"( "vocab": )" + vocab + R"(, "merges": )" + merges + "}}";
}

std::string error_of(const std::string& json_text) {
  try {
    HfTokenizer::parse(json_text, "test.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Replaces the first occurrence of `from` in s.
std::string with(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

}  // namespace

// Every fixture tokenizer on every input, as whole texts (newlines and all) and line by line:
// the library's ids exactly, and its decode of them.
TEST(HfTokenizer, IdsAndDecodeMatchTheLibraries) {
  int compared_ids = 0, cases = 0;
  for (const auto& [name, spec] : expected()["tokenizers"].items()) {
    SCOPED_TRACE(name);
    const Tokenizer tok = Tokenizer::load((kFixtures / spec["file"].get<std::string>()).string());
    EXPECT_EQ(tok.is_hf_json(), name != "sp");
    for (const auto& c : spec["cases"]) {
      SCOPED_TRACE(c["input"].get<std::string>());
      const std::string text = slurp(kFixtures / c["input"].get<std::string>());
      const auto want = c["ids"].get<std::vector<int32_t>>();
      const auto got = tok.encode(text);
      EXPECT_EQ(got, want);
      EXPECT_EQ(tok.decode(got), unhex(c["decoded_hex"].get<std::string>()));
      const auto lines = lines_of(text);
      ASSERT_EQ(lines.size(), c["line_ids"].size());
      for (size_t i = 0; i < lines.size(); ++i)
        EXPECT_EQ(tok.encode(lines[i]), c["line_ids"][i].get<std::vector<int32_t>>()) << "line " << i + 1;
      compared_ids += int(want.size());
      ++cases;
    }
  }
  EXPECT_EQ(cases, 12);  // 4 tokenizers x (KJV sample, Unicode stress text, empty)
  EXPECT_GT(compared_ids, 14000);
}

// decode(encode(s)) == s for valid UTF-8 (no normalizer): the fixture inputs and random strings
// mixing ASCII, whitespace runs, Latin, CJK, emoji, combining marks and the special tokens.
TEST(HfTokenizer, DecodeOfEncodeIsTheText) {
  std::mt19937_64 rng(7);
  const std::vector<std::vector<uint32_t>> ranges = {
      {0x20, 0x7E}, {0x09, 0x0D}, {0xC0, 0x17F}, {0x300, 0x36F}, {0x4E00, 0x4FFF},
      {0x1F300, 0x1F64F}, {0x600, 0x6FF}, {0x2000, 0x206F}, {0x30, 0x39}};
  for (const char* name : {"gpt2", "llama3", "sp"}) {
    SCOPED_TRACE(name);
    const Tokenizer tok = Tokenizer::load((kFixtures / name).string());
    const std::string kjv = slurp(kFixtures / "kjv_sample.txt");
    EXPECT_EQ(tok.decode(tok.encode(kjv)), kjv);
    for (int n = 0; n < 300; ++n) {
      std::string s;
      const int len = int(rng() % 40);
      for (int k = 0; k < len; ++k) {
        const auto& r = ranges[rng() % ranges.size()];
        append_utf8(s, r[0] + uint32_t(rng() % (r[1] - r[0] + 1)));
        if (rng() % 50 == 0) s += "<|endoftext|>";
      }
      ASSERT_EQ(tok.decode(tok.encode(s)), s) << s;
    }
  }
}

TEST(HfTokenizer, FolderAndSpecialTokens) {
  const Tokenizer g = Tokenizer::load((kFixtures / "gpt2").string());
  EXPECT_EQ(g.file_name(), "tokenizer.json");
  EXPECT_EQ(g.vocab_size(), 1000);
  EXPECT_EQ(g.eos_id(), g.token_to_id("<|endoftext|>"));  // tokenizer_config.json
  EXPECT_EQ(g.encode("<|endoftext|>"), std::vector<int32_t>{0});
  const Tokenizer l = Tokenizer::load((kFixtures / "llama3/tokenizer.json").string());
  EXPECT_EQ(l.bos_id(), l.token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(l.eos_id(), l.token_to_id("<|end_of_text|>"));
  EXPECT_EQ(l.unk_id(), -1);
  EXPECT_NE(g.identity(), l.identity());
  const Tokenizer s = Tokenizer::load((kFixtures / "sp").string());
  EXPECT_EQ(s.file_name(), "tokenizer.model");
  EXPECT_EQ(s.eos_id(), 2);

  // A folder with both files: tokenizer.model, the original in Llama 2 / Mistral folders.
  // Named by this process: two suites at once (CI's two builds, worktrees side by side) would
  // otherwise share one folder and remove each other's files midway.
  const fs::path both = fs::temp_directory_path() / ("tetrad_hftok_both_" + std::to_string(::getpid()));
  fs::remove_all(both);
  fs::create_directories(both);
  fs::copy_file(kFixtures / "sp/tokenizer.model", both / "tokenizer.model");
  fs::copy_file(kFixtures / "gpt2/tokenizer.json", both / "tokenizer.json");
  EXPECT_EQ(find_tokenizer_file(both.string()), (both / "tokenizer.model").string());
  fs::remove(both / "tokenizer.model");
  EXPECT_EQ(Tokenizer::load(both.string()).identity(), g.identity());
  // Companions travel with the file.
  const fs::path dst = both / "copy";
  fs::create_directories(dst);
  copy_tokenizer_files((kFixtures / "llama3/tokenizer.json").string(), dst.string(),
                       [](const std::string& a, const std::string& b) { fs::copy_file(a, b); });
  EXPECT_TRUE(fs::exists(dst / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(dst / "tokenizer_config.json"));
  EXPECT_EQ(Tokenizer::load(dst.string()).eos_id(), l.eos_id());
  fs::remove_all(both);
  EXPECT_THROW(Tokenizer::load((kFixtures / "nope").string()), Error);
}

TEST(HfTokenizer, InvalidUtf8IsReplacedAsPythonDoes) {
  EXPECT_EQ(valid_utf8("ab"), "ab");
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(valid_utf8("a\x80" "b"), "a" + fffd + "b");
  EXPECT_EQ(valid_utf8("\xE2\x82" "d"), fffd + "d");              // one for a truncated sequence
  EXPECT_EQ(valid_utf8("\xC0\xAF"), fffd + fffd);                  // overlong: each byte
  EXPECT_EQ(valid_utf8("\xED\xA0\x80"), fffd + fffd + fffd);       // a surrogate
  EXPECT_EQ(valid_utf8("\xF0\x9F\x98"), fffd);                     // truncated at the end
  EXPECT_EQ(valid_utf8("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // above U+10FFFF
  EXPECT_TRUE(is_valid_utf8("\xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xFF"));
}

// BPE options the fixtures do not use: legacy "a b" merges, unk (fused or not), byte fallback,
// ignore_merges, Split behaviors.
TEST(HfTokenizer, ModelOptions) {
  auto t = HfTokenizer::parse(tiny_json(""), "t");
  EXPECT_EQ(t->encode("abab"), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(t->encode("abxxc"), (std::vector<int32_t>{2, 3}));  // no unk: unknown characters dropped
  const std::string with_unk = with(
      tiny_json("", "", R"({"a": 0, "b": 1, "ab": 2, "c": 3, "<unk>": 4})", R"([["a", "b"]])"),
      "\"unk_token\": null", "\"unk_token\": \"<unk>\"");
  EXPECT_EQ(HfTokenizer::parse(with_unk, "u")->encode("abxxc"), (std::vector<int32_t>{2, 4, 4, 3}));
  const std::string fused = with(with_unk, "\"fuse_unk\": false", "\"fuse_unk\": true");
  EXPECT_EQ(HfTokenizer::parse(fused, "f")->encode("abxxc"), (std::vector<int32_t>{2, 4, 3}));
  const std::string fallback = with(
      tiny_json("", "", R"({"a": 0, "b": 1, "ab": 2, "<0x78>": 3, "<0xC3>": 4, "<0xA9>": 5})"),
      "\"byte_fallback\": false", "\"byte_fallback\": true");
  EXPECT_EQ(HfTokenizer::parse(fallback, "b")->encode("xabé"), (std::vector<int32_t>{3, 2, 4, 5}));
  // ignore_merges: a pre-token in the vocab is taken whole even where merges would not reach it.
  const std::string vocab = R"({"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4})";
  EXPECT_EQ(HfTokenizer::parse(tiny_json("", "", vocab), "m")->encode("abc"),
            (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(HfTokenizer::parse(with(tiny_json("", "", vocab), "\"ignore_merges\": false",
                                    "\"ignore_merges\": true"), "m")->encode("abc"),
            (std::vector<int32_t>{4}));
  // Split with a String pattern, removed: "a-b-c" -> a, b, c.
  const std::string split = with(tiny_json("", "", R"({"a": 0, "b": 1, "ab": 2, "c": 3, "-": 5})"),
                                 "\"pre_tokenizer\": null",
                                 R"("pre_tokenizer": {"type": "Split", "pattern": {"String": "-"},
                                     "behavior": "Removed", "invert": false})");
  EXPECT_EQ(HfTokenizer::parse(split, "s")->encode("ab-c-a"), (std::vector<int32_t>{2, 3, 0}));
  EXPECT_EQ(HfTokenizer::parse(with(split, "Removed", "MergedWithPrevious"), "s")->encode("a-b"),
            (std::vector<int32_t>{0, 5, 1}));
  EXPECT_EQ(HfTokenizer::parse(with(split, "Removed", "MergedWithNext"), "s")->encode("a-b"),
            (std::vector<int32_t>{0, 5, 1}));
}

// Features tetrad does not implement are refused by name, never ignored.
TEST(HfTokenizer, RefusesWhatItDoesNotImplement) {
  const std::string base = tiny_json("");
  EXPECT_NE(error_of(with(base, "\"type\": \"BPE\"", "\"type\": \"WordPiece\"")).find("WordPiece"),
            std::string::npos);
  EXPECT_NE(error_of(with(base, "\"normalizer\": null", R"("normalizer": {"type": "Lowercase"})"))
                .find("Lowercase"), std::string::npos);
  EXPECT_NE(error_of(with(base, "\"pre_tokenizer\": null",
                          R"("pre_tokenizer": {"type": "Metaspace", "replacement": "_"})"))
                .find("Metaspace"), std::string::npos);
  EXPECT_NE(error_of(with(base, "\"decoder\": {\"type\": \"ByteLevel\"", "\"decoder\": {\"type\": \"WordPiece\""))
                .find("WordPiece"), std::string::npos);
  EXPECT_NE(error_of(with(base, "\"post_processor\": null",
                          R"("post_processor": {"type": "RobertaProcessing"})"))
                .find("RobertaProcessing"), std::string::npos);
  EXPECT_NE(error_of(with(base, "\"truncation\": null", R"("truncation": {"max_length": 8})"))
                .find("truncation"), std::string::npos);
  EXPECT_NE(error_of(with(base, "\"dropout\": null", "\"dropout\": 0.1")).find("dropout"),
            std::string::npos);
  EXPECT_NE(error_of(with(base, "\"continuing_subword_prefix\": null",
                          "\"continuing_subword_prefix\": \"##\""))
                .find("continuing_subword_prefix"), std::string::npos);
  EXPECT_NE(error_of(with(base, "\"added_tokens\": []",
                          R"("added_tokens": [{"id": 9, "content": "<x>", "single_word": false,
                              "lstrip": true, "rstrip": false, "normalized": false, "special": true}])"))
                .find("lstrip"), std::string::npos);
  EXPECT_NE(error_of(with(base, "\"pre_tokenizer\": null",
                          R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\bx"},
                              "behavior": "Isolated", "invert": false})"))
                .find("\\b"), std::string::npos);
  EXPECT_NE(error_of(with(base, "\"version\": \"1.0\",", "\"version\": \"1.0\", \"frobnicate\": 1,"))
                .find("frobnicate"), std::string::npos);
  EXPECT_NE(error_of(with(base, "\"merges\": [\"a b\"]", "\"merges\": [\"a q\"]")).find("not in the vocab"),
            std::string::npos);
  EXPECT_NE(error_of("{\"model\": ").find("not valid JSON"), std::string::npos);
  // Nesting is bounded: a file nested 100 deep is refused before anything is built.
  std::string deep = with(base, "\"version\": \"1.0\",",
                          "\"version\": " + std::string(100, '[') + std::string(100, ']') + ",");
  EXPECT_NE(error_of(deep).find("nested deeper than 64"), std::string::npos);
}
