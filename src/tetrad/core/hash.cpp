#include "tetrad/core/hash.hpp"

#include <xxhash.h>

#include <cstdio>
#include <vector>

#include "tetrad/core/error.hpp"

namespace tetrad {

uint64_t hash64(const void* data, size_t size, uint64_t seed) { return XXH64(data, size, seed); }

Hasher64::Hasher64(uint64_t seed) : state_(XXH64_createState()) {
  TETRAD_CHECK(state_ != nullptr);
  XXH64_reset(static_cast<XXH64_state_t*>(state_), seed);
}
Hasher64::~Hasher64() { XXH64_freeState(static_cast<XXH64_state_t*>(state_)); }
void Hasher64::update(const void* data, size_t size) {
  XXH64_update(static_cast<XXH64_state_t*>(state_), data, size);
}
uint64_t Hasher64::digest() const { return XXH64_digest(static_cast<XXH64_state_t*>(state_)); }

uint64_t hash_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot open '", path, "' for reading");
  Hasher64 h;
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.update(buf.data(), n);
  bool err = std::ferror(f);
  std::fclose(f);
  if (err) fail("error reading '", path, "'");
  return h.digest();
}

std::string hex64(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

}  // namespace tetrad
