// The tokenizer: a SentencePiece model (trained here, or loaded from a .model file) or a Hugging
// Face tokenizer.json (byte-level BPE, hf_tokenizer.hpp), loaded from the file or from a model
// folder holding either.
//
// Models trained by Tokenizer::train have these properties (docs/data.md):
//   * BPE, byte_fallback = true: text the pieces do not cover is spelled as UTF-8 byte pieces
//     <0x00>..<0xFF>, so any valid UTF-8 text encodes without <unk>;
//   * no normalization (identity rule), no dummy prefix, no whitespace collapsing: decode(encode(s))
//     == s byte for byte for valid UTF-8 s, newlines and tabs included;
//   * reserved ids: 0 = <unk>, 1 = <s> (BOS), 2 = </s> (EOS); no padding piece. Ids 3..258 are the
//     256 byte pieces, merged pieces follow;
//   * deterministic: the same lines and options give the same .model bytes (SentencePiece's
//     random seed is set from the options, and the model records no input paths).
//
// identity() is hash64 of the tokenizer file's bytes (tokenizer.model or tokenizer.json); shards
// and checkpoints record it so that data made with one tokenizer is never fed to a model trained
// with another. Wherever a tokenizer is stored (data folders, checkpoints, exported model folders)
// it keeps its file name, and its companions (tokenizer_config.json, special_tokens_map.json,
// which name BOS/EOS for transformers) go with it.
//
// Input bytes that are not valid UTF-8 are replaced first (utf8.hpp, as Python decodes them), so
// both kinds give the ids the Python libraries give for the same file read as text.
//
// BOS/EOS of a tokenizer.json: tokenizer_config.json's bos_token / eos_token beside it, else
// config.json's bos_token_id / eos_token_id beside it, else the post-processor template's special
// tokens before / after the text; -1 when none says.
//
// What this does not do: add BOS/EOS on its own (callers append eos_id()), sampling/subword
// regularization, tokenizer.json models other than byte-level BPE.
//
// Thread safety: encode/decode are const and may be called from several threads at once. Training
// is not thread-safe: SentencePiece's trainer takes its seed from a process-wide setting.
// Failures (missing or invalid model file, training errors) throw tetrad::Error.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece { class SentencePieceProcessor; }

namespace tetrad::data {

class HfTokenizer;

// The files that travel with a tokenizer file (read by transformers' AutoTokenizer).
inline constexpr const char* kTokenizerCompanions[] = {"tokenizer_config.json",
                                                       "special_tokens_map.json"};

// The tokenizer file of a model or data folder: tokenizer.model if it is there (Llama 2 and
// Mistral folders hold both, the .model being the original), else tokenizer.json; empty if none.
std::string find_tokenizer_file(const std::string& dir);
// Writes the tokenizer into a Hugging Face model folder: its file, the companions beside its source,
// and, when the source has no tokenizer_config.json, one naming the tokenizer class, BOS, EOS
// (and UNK) and model_max_length, so that AutoTokenizer loads the folder as it is.
class Tokenizer;
void write_hf_tokenizer_files(const Tokenizer& tok, const std::string& dst_dir, int model_max_length);
// Copies a tokenizer file into dst_dir as tokenizer.json (a .json) or tokenizer.model (anything
// else), with the companions beside it;
// copy(src, dst) does the copying (callers that fsync pass their own).
void copy_tokenizer_files(const std::string& tokenizer_path, const std::string& dst_dir,
                          const std::function<void(const std::string&, const std::string&)>& copy);

struct TokenizerTrainOptions {
  // At most this many lines are used for training; above it SentencePiece samples lines at
  // random (seeded by `seed`). 2M lines keeps memory and time bounded on large corpora.
  uint64_t input_sentence_size = 2'000'000;
  uint32_t seed = 1337;
  int num_threads = 2;
  double character_coverage = 0.9995;  // rarer characters are left to byte fallback
  int max_sentence_length = 16384;     // longer lines are skipped by the trainer (bytes)
};

class Tokenizer {
 public:
  // Trains a BPE model on the lines of text_files and writes "<model_prefix>.model". Returns the
  // trained tokenizer. Throws Error naming the file if an input cannot be read, or with
  // SentencePiece's reason if training fails (e.g. vocab_size too large for the corpus).
  static Tokenizer train(const std::vector<std::string>& text_files, const std::string& model_prefix,
                         int vocab_size, const TokenizerTrainOptions& options = {});
  // Same, with the training lines supplied by next_line (returns false when there are no more);
  // prepare_data uses it to train on the training split only.
  static Tokenizer train_lines(const std::function<bool(std::string& line)>& next_line,
                               const std::string& model_prefix, int vocab_size,
                               const TokenizerTrainOptions& options = {});
  // Loads a SentencePiece .model, a tokenizer.json (by its .json name), or the tokenizer of a
  // folder (find_tokenizer_file).
  static Tokenizer load(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // No BOS/EOS added.
  std::vector<int32_t> encode(std::string_view text) const;
  // Throws Error if an id is outside [0, vocab_size()) or names no token. Special tokens are
  // kept (as transformers' decode by default).
  std::string decode(const std::vector<int32_t>& ids) const;

  int vocab_size() const;
  int bos_id() const;  // -1 if the model has none
  int eos_id() const;  // -1 if the model has none
  int unk_id() const;
  uint64_t identity() const { return identity_; }
  // The serialized model (the exact bytes of the .model or .json file).
  const std::string& model_bytes() const { return model_bytes_; }
  const std::string& path() const { return path_; }
  // "tokenizer.model" or "tokenizer.json": the name it is stored under.
  std::string file_name() const;
  bool is_hf_json() const { return hf_ != nullptr; }
  // "sentencepiece" or "hf-bpe".
  std::string kind() const { return hf_ ? "hf-bpe" : "sentencepiece"; }
  // The token's text as the vocabulary spells it (byte-level or SentencePiece pieces).
  std::string id_to_token(int id) const;
  // The token's id, or -1.
  int token_to_id(const std::string& token) const;

 private:
  Tokenizer();
  static Tokenizer from_bytes(std::string bytes, const std::string& path);
  static Tokenizer from_json(std::string bytes, const std::string& path);
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::unique_ptr<HfTokenizer> hf_;
  int hf_bos_ = -1, hf_eos_ = -1;
  std::string model_bytes_;
  std::string path_;
  uint64_t identity_ = 0;
};

}  // namespace tetrad::data
