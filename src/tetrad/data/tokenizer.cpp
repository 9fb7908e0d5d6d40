#include "tetrad/data/tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>
#include <unordered_map>

#include "tetrad/core/error.hpp"
#include "tetrad/core/hash.hpp"

namespace tetrad::data {

static_assert(std::is_same_v<int, int32_t>, "SentencePiece ids are int; tetrad tokens are int32_t");

namespace {

// Feeds SentencePiece's trainer from a callback. An exception from the callback is not let
// through SentencePiece's code: it ends the iteration and is rethrown once Train has returned.
class CallbackLines : public sentencepiece::SentenceIterator {
 public:
  explicit CallbackLines(const std::function<bool(std::string&)>& next) : next_(next) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    try {
      done_ = !next_(line_);
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
    }
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override {
    if (error_)
      return sentencepiece::util::Status(sentencepiece::util::StatusCode::kInternal,
                                         "reading the training lines failed");
    return {};
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  const std::function<bool(std::string&)>& next_;
  std::string line_;
  bool done_ = false;
  std::exception_ptr error_;
};

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open ", what, " '", path, "': ", std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("error reading ", what, " '", path, "'");
  return ss.str();
}

void write_file_atomic(const std::string& path, const std::string& bytes, const char* what) {
  std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot create ", what, " '", tmp, "': ", std::strerror(errno));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    fail("cannot write ", what, " '", tmp, "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail("cannot rename '", tmp, "' to '", path, "': ", std::strerror(errno));
}

}  // namespace

Tokenizer::Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_bytes(std::string bytes, const std::string& path) {
  Tokenizer t;
  auto status = t.sp_->LoadFromSerializedProto(bytes);
  if (!status.ok())
    fail("'", path, "' is not a valid SentencePiece model: ", status.ToString());
  t.identity_ = hash64(bytes.data(), bytes.size());
  t.model_bytes_ = std::move(bytes);
  t.path_ = path;
  return t;
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail("tokenizer model '", path, "' does not exist or is not a file");
  return from_bytes(read_file(path, "tokenizer model"), path);
}

Tokenizer Tokenizer::train_lines(const std::function<bool(std::string& line)>& next_line,
                                 const std::string& model_prefix, int vocab_size,
                                 const TokenizerTrainOptions& o) {
  if (vocab_size < 260)
    fail("tokenizer vocab_size ", vocab_size,
         " is too small: 3 special and 256 byte pieces need at least 260 ids");
  if (model_prefix.empty()) fail("tokenizer model_prefix is empty");
  // Options that are not SentencePiece's defaults are there for exact round trips (identity
  // normalization, no dummy prefix, keep whitespace) and reproducibility (seed, fixed ids).
  const std::unordered_map<std::string, std::string> kwargs = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"character_coverage", std::to_string(o.character_coverage)},
      {"input_sentence_size", std::to_string(o.input_sentence_size)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(o.max_sentence_length)},
      {"num_threads", std::to_string(o.num_threads)},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"minloglevel", "1"},  // warnings and errors only
  };
  // Training with an iterator and an output string keeps input paths and the prefix out of the
  // model proto, so the same lines give the same bytes (and identity) wherever they come from.
  sentencepiece::SetRandomGeneratorSeed(o.seed);
  CallbackLines lines(next_line);
  std::string bytes;
  auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, &lines, &bytes);
  lines.rethrow();
  if (!status.ok())
    fail("tokenizer training for '", model_prefix, ".model' failed: ", status.ToString());
  std::string path = model_prefix + ".model";
  write_file_atomic(path, bytes, "tokenizer model");
  return from_bytes(std::move(bytes), path);
}

Tokenizer Tokenizer::train(const std::vector<std::string>& text_files,
                           const std::string& model_prefix, int vocab_size,
                           const TokenizerTrainOptions& options) {
  if (text_files.empty()) fail("tokenizer training needs at least one text file");
  for (const auto& f : text_files) {
    std::ifstream probe(f, std::ios::binary);
    if (!probe) fail("cannot open tokenizer training file '", f, "': ", std::strerror(errno));
  }
  size_t file = 0;
  std::ifstream in;
  auto next = [&](std::string& line) -> bool {
    for (;;) {
      if (!in.is_open()) {
        if (file == text_files.size()) return false;
        in.open(text_files[file], std::ios::binary);
        if (!in) fail("cannot open tokenizer training file '", text_files[file], "'");
      }
      if (std::getline(in, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return true;
      }
      if (in.bad()) fail("error reading tokenizer training file '", text_files[file], "'");
      in.close();
      ++file;
    }
  };
  return train_lines(next, model_prefix, vocab_size, options);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  auto status = sp_->Encode(text, &ids);
  TETRAD_CHECK(status.ok(), "SentencePiece encode failed: ", status.ToString());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const int n = vocab_size();
  for (int32_t id : ids)
    if (id < 0 || id >= n) fail("token id ", id, " is outside the tokenizer's vocab [0, ", n, ")");
  std::string text;
  auto status = sp_->Decode(ids, &text);
  TETRAD_CHECK(status.ok(), "SentencePiece decode failed: ", status.ToString());
  return text;
}

int Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int Tokenizer::bos_id() const { return sp_->bos_id(); }
int Tokenizer::eos_id() const { return sp_->eos_id(); }
int Tokenizer::unk_id() const { return sp_->unk_id(); }

}  // namespace tetrad::data
