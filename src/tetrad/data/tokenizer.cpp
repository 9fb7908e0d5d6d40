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
#include <optional>
#include <unordered_map>

#include "tetrad/core/error.hpp"
#include "tetrad/core/json.hpp"
#include "tetrad/core/hash.hpp"
#include "tetrad/data/hf_tokenizer.hpp"
#include "tetrad/data/utf8.hpp"

#include <nlohmann/json.hpp>

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

std::string find_tokenizer_file(const std::string& dir) {
  std::error_code ec;
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
    const std::string p = (std::filesystem::path(dir) / name).string();
    if (std::filesystem::is_regular_file(p, ec)) return p;
  }
  return {};
}

void copy_tokenizer_files(const std::string& tokenizer_path, const std::string& dst_dir,
                          const std::function<void(const std::string&, const std::string&)>& copy) {
  namespace fs = std::filesystem;
  const fs::path src(tokenizer_path);
  // Stored under the name Hugging Face folders use for its kind.
  const char* name = src.extension() == ".json" ? "tokenizer.json" : "tokenizer.model";
  copy(tokenizer_path, (fs::path(dst_dir) / name).string());
  std::error_code ec;
  for (const char* name : kTokenizerCompanions) {
    const fs::path c = src.parent_path() / name;
    if (fs::is_regular_file(c, ec)) copy(c.string(), (fs::path(dst_dir) / name).string());
  }
}

void write_hf_tokenizer_files(const Tokenizer& tok, const std::string& dst_dir, int model_max_length) {
  namespace fs = std::filesystem;
  write_file_atomic((fs::path(dst_dir) / tok.file_name()).string(), tok.model_bytes(), "tokenizer");
  const fs::path src = fs::path(tok.path()).parent_path();
  std::error_code ec;
  bool have_config = false;
  for (const char* name : kTokenizerCompanions) {
    if (!fs::is_regular_file(src / name, ec)) continue;
    write_file_atomic((fs::path(dst_dir) / name).string(), read_file((src / name).string(), name), name);
    have_config = have_config || std::string(name) == "tokenizer_config.json";
  }
  if (have_config) return;
  auto piece = [&](int id) -> nlohmann::json {
    if (id < 0) return nullptr;
    return tok.id_to_token(id);
  };
  nlohmann::json c;
  if (tok.is_hf_json()) {
    c["tokenizer_class"] = "PreTrainedTokenizerFast";
  } else {
    // The slow class runs the .model as it is (legacy: no extra prefix-space handling); the fast
    // one would convert it with Llama's normalizer, which tetrad-trained models do not have.
    c["tokenizer_class"] = "LlamaTokenizer";
    c["legacy"] = true;
    c["add_bos_token"] = false;
    c["add_eos_token"] = false;
    c["use_fast"] = false;
  }
  c["bos_token"] = piece(tok.bos_id());
  c["eos_token"] = piece(tok.eos_id());
  if (tok.unk_id() >= 0) c["unk_token"] = piece(tok.unk_id());
  c["model_max_length"] = model_max_length;
  c["clean_up_tokenization_spaces"] = false;
  write_file_atomic((fs::path(dst_dir) / "tokenizer_config.json").string(), c.dump(2) + "\n",
                    "tokenizer_config.json");
}

Tokenizer Tokenizer::load(const std::string& path_in) {
  std::error_code ec;
  std::string path = path_in;
  if (std::filesystem::is_directory(path, ec)) {
    path = find_tokenizer_file(path_in);
    if (path.empty())
      fail("folder '", path_in, "' holds no tokenizer.model or tokenizer.json");
  }
  if (!std::filesystem::is_regular_file(path, ec))
    fail("tokenizer '", path, "' does not exist or is not a file (expected a SentencePiece .model, "
         "a tokenizer.json or a folder holding one)");
  std::string bytes = read_file(path, "tokenizer");
  if (std::filesystem::path(path).extension() == ".json") return from_json(std::move(bytes), path);
  return from_bytes(std::move(bytes), path);
}

namespace {

// A special token named in tokenizer_config.json: a string or {"content": ...}.
std::string config_token(const nlohmann::json& c, const char* key) {
  if (!c.contains(key)) return {};
  const auto& v = c[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return {};
}

std::optional<nlohmann::json> read_json_beside(const std::string& path, const char* name) {
  const auto p = std::filesystem::path(path).parent_path() / name;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec)) return std::nullopt;
  const std::string text = read_file(p.string(), name);
  check_json_depth(text, detail::concat("'", p.string(), "'"));
  try {
    return nlohmann::json::parse(text, nullptr, true, false);
  } catch (const nlohmann::json::exception& e) {
    fail("'", p.string(), "' is not valid JSON: ", e.what());
  }
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string bytes, const std::string& path) {
  Tokenizer t;
  t.sp_.reset();
  t.hf_ = HfTokenizer::parse(bytes, path);
  const HfTokenizer& h = *t.hf_;
  auto id_of = [&](const std::string& name, const char* what) {
    auto id = h.token_to_id(name);
    if (!id) fail("tokenizer '", path, "': its ", what, " '", name, "' is not in the vocabulary");
    return int(*id);
  };
  bool bos_set = false, eos_set = false;
  if (auto c = read_json_beside(path, "tokenizer_config.json")) {
    if (auto b = config_token(*c, "bos_token"); !b.empty()) t.hf_bos_ = id_of(b, "bos_token"), bos_set = true;
    if (auto e = config_token(*c, "eos_token"); !e.empty()) t.hf_eos_ = id_of(e, "eos_token"), eos_set = true;
  }
  if (auto c = read_json_beside(path, "config.json")) {
    auto first_id = [](const nlohmann::json& v) -> int {
      if (v.is_number_integer()) return v.get<int>();
      if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int>();
      return -1;
    };
    if (!bos_set && c->contains("bos_token_id")) t.hf_bos_ = first_id((*c)["bos_token_id"]), bos_set = t.hf_bos_ >= 0;
    if (!eos_set && c->contains("eos_token_id")) t.hf_eos_ = first_id((*c)["eos_token_id"]), eos_set = t.hf_eos_ >= 0;
  }
  if (!bos_set && h.template_prefix().size() == 1) t.hf_bos_ = h.template_prefix()[0];
  if (!eos_set && h.template_suffix().size() == 1) t.hf_eos_ = h.template_suffix()[0];
  for (int id : {t.hf_bos_, t.hf_eos_})
    if (id >= h.vocab_size())
      fail("tokenizer '", path, "': BOS/EOS id ", id, " is outside its vocabulary of ", h.vocab_size());
  t.identity_ = hash64(bytes.data(), bytes.size());
  t.model_bytes_ = std::move(bytes);
  t.path_ = path;
  return t;
}

std::string Tokenizer::file_name() const { return hf_ ? "tokenizer.json" : "tokenizer.model"; }

std::string Tokenizer::id_to_token(int id) const {
  if (hf_) return hf_->id_to_token(id);
  if (id < 0 || id >= sp_->GetPieceSize()) fail("token id ", id, " is outside the tokenizer's vocab");
  return sp_->IdToPiece(id);
}

int Tokenizer::token_to_id(const std::string& token) const {
  if (hf_) {
    auto id = hf_->token_to_id(token);
    return id ? int(*id) : -1;
  }
  const int id = sp_->PieceToId(token);
  return id == sp_->unk_id() && token != sp_->IdToPiece(id) ? -1 : id;
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

std::vector<int32_t> Tokenizer::encode(std::string_view raw) const {
  const std::string owned = is_valid_utf8(raw) ? std::string() : valid_utf8(raw);
  const std::string_view text = owned.empty() ? raw : std::string_view(owned);
  if (hf_) return hf_->encode(text);
  std::vector<int> ids;
  auto status = sp_->Encode(text, &ids);
  TETRAD_CHECK(status.ok(), "SentencePiece encode failed: ", status.ToString());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const int n = vocab_size();
  for (int32_t id : ids)
    if (id < 0 || id >= n) fail("token id ", id, " is outside the tokenizer's vocab [0, ", n, ")");
  if (hf_) return hf_->decode(ids);
  std::string text;
  auto status = sp_->Decode(ids, &text);
  TETRAD_CHECK(status.ok(), "SentencePiece decode failed: ", status.ToString());
  return text;
}

int Tokenizer::vocab_size() const { return hf_ ? hf_->vocab_size() : sp_->GetPieceSize(); }
int Tokenizer::bos_id() const { return hf_ ? hf_bos_ : sp_->bos_id(); }
int Tokenizer::eos_id() const { return hf_ ? hf_eos_ : sp_->eos_id(); }
int Tokenizer::unk_id() const { return hf_ ? hf_->unk_id() : sp_->unk_id(); }

}  // namespace tetrad::data
