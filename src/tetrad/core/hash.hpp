// Content hashes for file identity and integrity checks (tokenizer identity, shard and
// checkpoint checksums). XXH64 from libxxhash: fast enough to checksum gigabytes at memory speed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tetrad {

uint64_t hash64(const void* data, size_t size, uint64_t seed = 0);

// Incremental form, for data written or read in pieces.
class Hasher64 {
 public:
  explicit Hasher64(uint64_t seed = 0);
  ~Hasher64();
  Hasher64(const Hasher64&) = delete;
  Hasher64& operator=(const Hasher64&) = delete;
  void update(const void* data, size_t size);
  uint64_t digest() const;

 private:
  void* state_;
};

// Hash of a whole file's bytes; throws Error naming the file if it cannot be read.
uint64_t hash_file(const std::string& path);

std::string hex64(uint64_t v);  // 16 lower-case hex digits

}  // namespace tetrad
