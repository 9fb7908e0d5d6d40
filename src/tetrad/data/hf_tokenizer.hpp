// Hugging Face `tokenizer.json` tokenizers: byte-level BPE as GPT-2, Llama 3, Qwen and most
// current models ship them, encoding to the same ids as the `tokenizers` library.
//
// What is implemented (anything else in the file is refused with its name, never ignored):
//   model           BPE: vocab, merges ("a b" strings or ["a", "b"] pairs), unk_token, fuse_unk,
//                   byte_fallback, ignore_merges; dropout null or 0; no continuing_subword_prefix
//                   or end_of_word_suffix
//   added_tokens    special and normal, normalized or not (matched leftmost-longest, the
//                   non-normalized ones on the raw text, the others after normalization, as the
//                   library does); lstrip / rstrip / single_word refused
//   normalizer      null, NFC (ICU), or a Sequence of those
//   pre_tokenizer   ByteLevel (add_prefix_space, use_regex: GPT-2's regex), Split (Regex or
//                   String pattern, every behavior, invert), Sequence of those, or null
//   post_processor  ByteLevel, TemplateProcessing, Sequence of those, or null: only the single
//                   template's special tokens are used (bos/eos); encode() adds none
//   decoder         ByteLevel (or a Sequence holding only ByteLevel)
//   truncation, padding: null
//
// Regexes are Oniguruma's (the library's engine); they run on PCRE2 with Unicode properties.
// Where the two differ in meaning the pattern is rewritten before compiling: \s becomes
// Oniguruma's Unicode whitespace (U+0009..U+000D, U+0085, Zs, U+2028, U+2029; PCRE2 would add
// U+180E), \w its word characters (letters, marks, numbers, connector punctuation), \h a hex
// digit, \uHHHH \x{HHHH}; ^ and $ match at line ends as in Oniguruma. \W, \S or \H inside a
// character class and \b, \B, \G, \K are refused. Unicode property tables are PCRE2's (Debian
// 12: Unicode 14); characters assigned later may be classified differently from the library.
//
// encode() takes valid UTF-8 (Tokenizer replaces ill-formed input first, utf8.hpp); decode()
// returns what the library's decode(ids, skip_special_tokens=False) returns, ill-formed byte
// sequences replaced by U+FFFD. encode/decode are const and thread-safe.
//
// The JSON reader refuses files nested deeper than kMaxJsonDepth (tokenizer.json files are about
// 6 deep): a hostile file cannot exhaust the stack or memory through nesting.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tetrad::data {

class HfTokenizer {
 public:
  static constexpr int kMaxJsonDepth = 64;
  // Parses the bytes of a tokenizer.json; `where` names it in errors.
  static std::unique_ptr<HfTokenizer> parse(const std::string& json_text, const std::string& where);
  ~HfTokenizer();

  std::vector<int32_t> encode(std::string_view valid_utf8_text) const;
  // Throws Error for an id that names no token.
  std::string decode(const std::vector<int32_t>& ids) const;

  int vocab_size() const;  // largest id + 1, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // Error if no token has the id
  // The special tokens the single-sequence template puts before and after the text.
  const std::vector<int32_t>& template_prefix() const;
  const std::vector<int32_t>& template_suffix() const;
  int32_t unk_id() const;  // -1 if none

  struct Impl;

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tetrad::data
