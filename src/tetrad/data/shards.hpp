// Binary token shards: the on-disk form of a tokenized corpus (docs/data.md has the byte table).
//
// A shard is a fixed 64-byte little-endian header followed by the tokens as uint16 or uint32
// and (version 2) the table of document starts:
//
//   offset size  field
//        0    8  magic "TTRDTOKN"
//        8    4  u32 version (2; version 1 files are still read: they have no document table)
//       12    4  u32 dtype code (1 = uint16 tokens, 2 = uint32 tokens)
//       16    8  u64 token count n
//       24    4  u32 vocab size of the tokenizer that made the tokens
//       28    4  u32 reserved (0)
//       32    8  u64 tokenizer identity (hash64 of the tokenizer .model file bytes)
//       40    8  u64 XXH64 (seed 0) of the token bytes exactly as stored after the header
//       48    8  u64 document count m (version 2; 0 in version 1's zero padding)
//       56    8  u64 XXH64 (seed 0) of the document table's bytes (version 2)
//       64       tokens (n * 2 or n * 4 bytes)
//   64 + n*w     u64[m] document starts: the token index (in this shard) where each document
//                that begins in the shard begins, strictly increasing, each < n. Tokens before
//                the first start belong to a document that began in an earlier shard.
//
// What this does not do: compression, random writes, appending to a finished shard, big-endian
// hosts (a static_assert in shards.cpp refuses to build there).
//
// Failure: every problem with a file (missing, truncated, wrong magic/version/dtype, checksum
// mismatch, token out of range while writing) throws tetrad::Error naming the file, what was
// found and what was expected. Neither class is thread-safe for mutation; a ShardReader's const
// methods may be called from several threads at once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tetrad/core/hash.hpp"

namespace tetrad::data {

inline constexpr char kShardMagic[8] = {'T', 'T', 'R', 'D', 'T', 'O', 'K', 'N'};
inline constexpr uint32_t kShardVersion = 2;         // what the writer writes
inline constexpr uint32_t kShardVersionNoDocuments = 1;  // still read: no document table
inline constexpr size_t kShardHeaderBytes = 64;

enum class TokenDtype : uint32_t { U16 = 1, U32 = 2 };

// The dtype a shard of this vocabulary is written with: U16 when every id fits (vocab <= 65536).
TokenDtype dtype_for_vocab(uint64_t vocab_size);
size_t dtype_bytes(TokenDtype d);  // 2 or 4

struct ShardHeader {
  uint32_t version = kShardVersion;
  TokenDtype dtype = TokenDtype::U16;
  uint64_t num_tokens = 0;
  uint32_t vocab_size = 0;
  uint64_t tokenizer_identity = 0;
  uint64_t checksum = 0;  // XXH64 of the token bytes
  uint64_t num_documents = 0;        // document starts recorded (version 2)
  uint64_t documents_checksum = 0;   // XXH64 of the document table (version 2)
  bool has_documents() const { return version >= 2; }  // whether boundaries were recorded
};

// Writes one shard. Tokens go to "<path>.tmp"; finish() writes the header, flushes, fsyncs and
// renames the file to <path>, so a reader never sees a partial shard under the final name. A
// writer destroyed before finish() (an exception, say) removes its temporary file.
class ShardWriter {
 public:
  ShardWriter(std::string path, uint32_t vocab_size, uint64_t tokenizer_identity);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends n tokens; each must be in [0, vocab_size) (Error otherwise, nothing half-written
  // into the final name).
  void write(const int32_t* tokens, size_t n);
  void write(const std::vector<int32_t>& tokens) { write(tokens.data(), tokens.size()); }
  // Records that a document begins at the next token written (the document table).
  void begin_document();
  // Completes the shard and returns its header. Call exactly once.
  ShardHeader finish();

  uint64_t num_tokens() const { return header_.num_tokens; }
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_path_;
  std::FILE* file_ = nullptr;
  ShardHeader header_;
  Hasher64 hasher_;  // over the token bytes as written
  std::vector<unsigned char> buf_;
  std::vector<uint64_t> doc_starts_;
  bool finished_ = false;
};

// A read-only, memory-mapped view of one shard. The constructor validates the header against the
// file (magic, version, dtype, vocab fits the dtype, file length equals header + tokens) and, when
// verify_checksum is true (the default), the checksum of the token bytes. Move-only; the mapping
// lives as long as the reader.
class ShardReader {
 public:
  explicit ShardReader(const std::string& path, bool verify_checksum = true);
  ~ShardReader();
  ShardReader(ShardReader&& other) noexcept;
  ShardReader& operator=(ShardReader&& other) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  const ShardHeader& header() const { return header_; }
  uint64_t num_tokens() const { return header_.num_tokens; }
  uint32_t vocab_size() const { return header_.vocab_size; }
  uint64_t tokenizer_identity() const { return header_.tokenizer_identity; }

  // Token i (checked: i < num_tokens()).
  uint32_t token(size_t i) const;
  // Copies tokens [start, start + count) into out[count] as int32 (checked range).
  void copy(size_t start, size_t count, int32_t* out) const;
  // Largest token id in the shard (a full scan; 0 for an empty shard).
  uint32_t max_token() const;

  // The document table (version 2; has_documents() false for a version 1 shard, which has none).
  bool has_documents() const { return header_.has_documents(); }
  uint64_t num_documents() const { return header_.num_documents; }
  uint64_t document_start(size_t d) const;  // d < num_documents()
  // For the tokens [start, start + count): out[t] = where token start + t's document begins,
  // counted from `start` and clamped to 0 (a document that began before `start` starts at 0).
  // Error naming the file and the way out (prepare again) when the shard has no document table.
  void document_starts(size_t start, size_t count, int32_t* out) const;

 private:
  void release();
  std::string path_;
  ShardHeader header_;
  const unsigned char* map_ = nullptr;  // whole file
  size_t map_bytes_ = 0;
};

}  // namespace tetrad::data
