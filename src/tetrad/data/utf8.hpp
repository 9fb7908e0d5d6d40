// UTF-8 helpers shared by the tokenizers.
//
// valid_utf8 replaces every ill-formed subsequence by U+FFFD the way Python's
// bytes.decode("utf-8", errors="replace") and Rust's String::from_utf8_lossy do (Unicode's
// "substitution of maximal subparts": a truncated but so far valid sequence becomes one U+FFFD;
// a byte that cannot start or continue a sequence becomes one U+FFFD each). Hugging Face
// tokenizers and SentencePiece's Python API only ever see text decoded like that, so tetrad
// gives its tokenizers the same text and gets the same ids for any input bytes.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace tetrad::data {

// Length of the well-formed sequence at s[i] (1..4), or 0 with *bad set to the number of bytes
// (>= 1) that one U+FFFD replaces.
int utf8_sequence_length(std::string_view s, size_t i, size_t* bad);
bool is_valid_utf8(std::string_view s);
std::string valid_utf8(std::string_view s);
// Appends code point cp (<= 0x10FFFF, not a surrogate) as UTF-8.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace tetrad::data
