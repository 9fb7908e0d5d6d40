// The tokenizer: a SentencePiece BPE model, trained here or loaded from a .model file.
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
// identity() is hash64 of the .model file bytes; shards and checkpoints record it so that data
// made with one tokenizer is never fed to a model trained with another.
//
// What this does not do: add BOS/EOS on its own (callers append eos_id()), sampling/subword
// regularization, or anything but SentencePiece models.
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
  // Loads an existing SentencePiece .model file.
  static Tokenizer load(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text) const;
  // Throws Error if an id is outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;

  int vocab_size() const;
  int bos_id() const;  // -1 if the model has none
  int eos_id() const;  // -1 if the model has none
  int unk_id() const;
  uint64_t identity() const { return identity_; }
  // The serialized model (the exact bytes of the .model file).
  const std::string& model_bytes() const { return model_bytes_; }
  const std::string& path() const { return path_; }

 private:
  Tokenizer();
  static Tokenizer from_bytes(std::string bytes, const std::string& path);
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string model_bytes_;
  std::string path_;
  uint64_t identity_ = 0;
};

}  // namespace tetrad::data
