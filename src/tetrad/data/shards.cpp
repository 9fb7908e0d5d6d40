#include "tetrad/data/shards.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "tetrad/core/error.hpp"
#include "tetrad/core/hash.hpp"

namespace tetrad::data {

// Tokens are stored and read in host order, which the format fixes as little-endian.
static_assert(std::endian::native == std::endian::little, "token shards assume a little-endian host");

TokenDtype dtype_for_vocab(uint64_t vocab_size) {
  return vocab_size <= 65536 ? TokenDtype::U16 : TokenDtype::U32;
}

size_t dtype_bytes(TokenDtype d) { return d == TokenDtype::U16 ? 2 : 4; }

namespace {

const char* dtype_name(uint32_t code) {
  switch (code) {
    case 1: return "uint16";
    case 2: return "uint32";
    default: return "unknown";
  }
}

template <typename T>
void put(unsigned char* p, T v) { std::memcpy(p, &v, sizeof v); }
template <typename T>
T get(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void encode_header(const ShardHeader& h, unsigned char* out /*[64]*/) {
  std::memset(out, 0, kShardHeaderBytes);
  std::memcpy(out, kShardMagic, 8);
  put<uint32_t>(out + 8, h.version);
  put<uint32_t>(out + 12, static_cast<uint32_t>(h.dtype));
  put<uint64_t>(out + 16, h.num_tokens);
  put<uint32_t>(out + 24, h.vocab_size);
  put<uint32_t>(out + 28, 0);
  put<uint64_t>(out + 32, h.tokenizer_identity);
  put<uint64_t>(out + 40, h.checksum);
  put<uint64_t>(out + 48, h.num_documents);
  put<uint64_t>(out + 56, h.documents_checksum);
}

std::string printable(const unsigned char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f) {
      s += static_cast<char>(p[i]);
    } else {
      char b[5];
      std::snprintf(b, sizeof b, "\\x%02x", p[i]);
      s += b;
    }
  }
  return s;
}

// Validates the header bytes against the file length; throws Error naming the file.
ShardHeader decode_header(const std::string& path, const unsigned char* p, uint64_t file_bytes) {
  if (file_bytes < kShardHeaderBytes)
    fail("shard '", path, "' is too small to be a token shard: ", file_bytes,
         " bytes, but the header alone is ", kShardHeaderBytes, " bytes");
  if (std::memcmp(p, kShardMagic, 8) != 0)
    fail("shard '", path, "' is not a tetrad token shard: its magic is \"", printable(p, 8),
         "\", expected \"TTRDTOKN\"");
  ShardHeader h;
  h.version = get<uint32_t>(p + 8);
  if (h.version != kShardVersion && h.version != kShardVersionNoDocuments)
    fail("shard '", path, "' has format version ", h.version, ", but this build reads versions ",
         kShardVersionNoDocuments, " and ", kShardVersion, " (re-run prepare with this build)");
  uint32_t dtype = get<uint32_t>(p + 12);
  if (dtype != 1 && dtype != 2)
    fail("shard '", path, "' has dtype code ", dtype, ", expected 1 (uint16) or 2 (uint32)");
  h.dtype = static_cast<TokenDtype>(dtype);
  h.num_tokens = get<uint64_t>(p + 16);
  h.vocab_size = get<uint32_t>(p + 24);
  h.tokenizer_identity = get<uint64_t>(p + 32);
  h.checksum = get<uint64_t>(p + 40);
  if (h.has_documents()) {
    h.num_documents = get<uint64_t>(p + 48);
    h.documents_checksum = get<uint64_t>(p + 56);
  }
  if (h.dtype == TokenDtype::U16 && h.vocab_size > 65536)
    fail("shard '", path, "' stores uint16 tokens but says its vocab has ", h.vocab_size,
         " ids (uint16 holds at most 65536)");
  size_t width = dtype_bytes(h.dtype);
  if (h.num_tokens > (UINT64_MAX - kShardHeaderBytes) / width / 2)
    fail("shard '", path, "' has an impossible token count ", h.num_tokens);
  if (h.num_documents > h.num_tokens)
    fail("shard '", path, "' says it holds ", h.num_documents, " document starts in ",
         h.num_tokens, " tokens (at most one per token)");
  const uint64_t tokens_end = kShardHeaderBytes + h.num_tokens * width;
  const uint64_t want = tokens_end + 8 * h.num_documents;
  if (file_bytes < want && file_bytes >= tokens_end)
    fail("shard '", path, "' is truncated: header says ", h.num_documents, " document starts (",
         8 * h.num_documents, " bytes after the tokens) but the file holds ",
         file_bytes - tokens_end, " bytes after the tokens");
  if (file_bytes < want)
    fail("shard '", path, "' is truncated: header says ", h.num_tokens, " tokens (",
         h.num_tokens * width, " bytes of ", dtype_name(dtype), ") but the file holds ",
         file_bytes - kShardHeaderBytes, " bytes after the header");
  if (file_bytes > want)
    fail("shard '", path, "' has ", file_bytes - want, " unexpected trailing bytes: header says ",
         h.num_tokens, " tokens (", h.num_tokens * width, " bytes) and ", h.num_documents,
         " document starts (", 8 * h.num_documents, " bytes) but the file holds ",
         file_bytes - kShardHeaderBytes, " bytes after the header");
  return h;
}

}  // namespace

// ---- ShardWriter ----

ShardWriter::ShardWriter(std::string path, uint32_t vocab_size, uint64_t tokenizer_identity)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  if (vocab_size == 0) fail("shard '", path_, "': vocab size must be at least 1");
  header_.dtype = dtype_for_vocab(vocab_size);
  header_.vocab_size = vocab_size;
  header_.tokenizer_identity = tokenizer_identity;
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  if (!file_) fail("cannot create shard '", tmp_path_, "': ", std::strerror(errno));
  unsigned char zero[kShardHeaderBytes] = {};  // placeholder, rewritten by finish()
  if (std::fwrite(zero, 1, sizeof zero, file_) != sizeof zero) {
    std::fclose(file_);
    std::remove(tmp_path_.c_str());
    fail("cannot write shard '", tmp_path_, "': ", std::strerror(errno));
  }
}

ShardWriter::~ShardWriter() {
  if (!finished_) {
    if (file_) std::fclose(file_);
    std::remove(tmp_path_.c_str());
  }
}

void ShardWriter::begin_document() {
  TETRAD_CHECK(!finished_, "begin_document after finish on shard ", path_);
  if (doc_starts_.empty() || doc_starts_.back() != header_.num_tokens)  // (an empty document)
    doc_starts_.push_back(header_.num_tokens);
}

void ShardWriter::write(const int32_t* tokens, size_t n) {
  TETRAD_CHECK(!finished_, "write after finish on shard ", path_);
  const size_t width = dtype_bytes(header_.dtype);
  const size_t chunk = 1 << 16;
  buf_.resize(chunk * width);
  for (size_t i0 = 0; i0 < n; i0 += chunk) {
    size_t m = std::min(chunk, n - i0);
    for (size_t i = 0; i < m; ++i) {
      int32_t t = tokens[i0 + i];
      if (t < 0 || static_cast<uint32_t>(t) >= header_.vocab_size)
        fail("token id ", t, " is outside the vocab [0, ", header_.vocab_size,
             ") while writing shard '", path_, "'");
      if (width == 2) put<uint16_t>(&buf_[i * 2], static_cast<uint16_t>(t));
      else put<uint32_t>(&buf_[i * 4], static_cast<uint32_t>(t));
    }
    hasher_.update(buf_.data(), m * width);
    if (std::fwrite(buf_.data(), 1, m * width, file_) != m * width)
      fail("cannot write shard '", tmp_path_, "': ", std::strerror(errno));
    header_.num_tokens += m;
  }
}

ShardHeader ShardWriter::finish() {
  TETRAD_CHECK(!finished_, "finish called twice on shard ", path_);
  header_.checksum = hasher_.digest();
  // A start at the very end (a document begun but given no token here) is not a start in this
  // shard: its tokens went nowhere.
  if (!doc_starts_.empty() && doc_starts_.back() == header_.num_tokens) doc_starts_.pop_back();
  header_.num_documents = doc_starts_.size();
  std::vector<unsigned char> table(8 * doc_starts_.size());
  for (size_t i = 0; i < doc_starts_.size(); ++i) put<uint64_t>(&table[8 * i], doc_starts_[i]);
  header_.documents_checksum = hash64(table.data(), table.size(), 0);
  unsigned char h[kShardHeaderBytes];
  encode_header(header_, h);
  bool ok = (table.empty() || std::fwrite(table.data(), 1, table.size(), file_) == table.size()) &&
            std::fseek(file_, 0, SEEK_SET) == 0 && std::fwrite(h, 1, sizeof h, file_) == sizeof h &&
            std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  int err = errno;
  ok = (std::fclose(file_) == 0) && ok;
  file_ = nullptr;
  if (!ok) fail("cannot write shard '", tmp_path_, "': ", std::strerror(err));
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    fail("cannot rename '", tmp_path_, "' to '", path_, "': ", std::strerror(errno));
  finished_ = true;
  return header_;
}

// ---- ShardReader ----

ShardReader::ShardReader(const std::string& path, bool verify_checksum) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open shard '", path, "': ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot stat shard '", path, "': ", std::strerror(err));
  }
  uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    decode_header(path, nullptr, file_bytes);  // throws "too small"
  }
  void* m = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED) fail("cannot map shard '", path, "': ", std::strerror(err));
  map_ = static_cast<const unsigned char*>(m);
  map_bytes_ = file_bytes;
  try {
    header_ = decode_header(path, map_, file_bytes);
    const size_t token_bytes = header_.num_tokens * dtype_bytes(header_.dtype);
    if (verify_checksum) {
      uint64_t sum = hash64(map_ + kShardHeaderBytes, token_bytes, 0);
      if (sum != header_.checksum)
        fail("shard '", path, "' is corrupt: the checksum of its ", header_.num_tokens,
             " tokens is ", hex64(sum), " but the header says ", hex64(header_.checksum));
    }
    if (header_.has_documents()) {  // small: always checked, and the table's order too
      const unsigned char* t = map_ + kShardHeaderBytes + token_bytes;
      const uint64_t sum = hash64(t, 8 * header_.num_documents, 0);
      if (sum != header_.documents_checksum)
        fail("shard '", path, "' is corrupt: the checksum of its table of ", header_.num_documents,
             " document starts is ", hex64(sum), " but the header says ",
             hex64(header_.documents_checksum));
      for (uint64_t d = 0; d < header_.num_documents; ++d) {
        const uint64_t s = get<uint64_t>(t + 8 * d);
        if (s >= header_.num_tokens || (d > 0 && s <= get<uint64_t>(t + 8 * (d - 1))))
          fail("shard '", path, "' is corrupt: document start ", d, " is token ", s,
               " (starts must increase and lie below the token count ", header_.num_tokens, ")");
      }
    }
  } catch (...) {
    release();
    throw;
  }
}

ShardReader::~ShardReader() { release(); }

void ShardReader::release() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

ShardReader::ShardReader(ShardReader&& o) noexcept
    : path_(std::move(o.path_)), header_(o.header_), map_(o.map_), map_bytes_(o.map_bytes_) {
  o.map_ = nullptr;
  o.map_bytes_ = 0;
}

ShardReader& ShardReader::operator=(ShardReader&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    header_ = o.header_;
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    o.map_ = nullptr;
    o.map_bytes_ = 0;
  }
  return *this;
}

uint32_t ShardReader::token(size_t i) const {
  TETRAD_CHECK(i < header_.num_tokens, "token index ", i, " out of range in ", path_);
  const unsigned char* p = map_ + kShardHeaderBytes;
  return header_.dtype == TokenDtype::U16 ? get<uint16_t>(p + 2 * i) : get<uint32_t>(p + 4 * i);
}

void ShardReader::copy(size_t start, size_t count, int32_t* out) const {
  TETRAD_CHECK(start <= header_.num_tokens && count <= header_.num_tokens - start,
               "token range [", start, ", ", start + count, ") out of range in ", path_);
  const unsigned char* p = map_ + kShardHeaderBytes;
  if (header_.dtype == TokenDtype::U16) {
    for (size_t i = 0; i < count; ++i) out[i] = get<uint16_t>(p + 2 * (start + i));
  } else {
    for (size_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(get<uint32_t>(p + 4 * (start + i)));
  }
}

uint64_t ShardReader::document_start(size_t d) const {
  TETRAD_CHECK(d < header_.num_documents, "document index ", d, " out of range in ", path_);
  return get<uint64_t>(map_ + kShardHeaderBytes + header_.num_tokens * dtype_bytes(header_.dtype) +
                       8 * d);
}

void ShardReader::document_starts(size_t start, size_t count, int32_t* out) const {
  if (!has_documents())
    fail("shard '", path_, "' has format version ", header_.version,
         ", which records no document boundaries; data.document_mask and "
         "data.document_positions need them: prepare the data again with this build (tetrad "
         "prepare writes version ", kShardVersion, ")");
  TETRAD_CHECK(start <= header_.num_tokens && count <= header_.num_tokens - start,
               "token range [", start, ", ", start + count, ") out of range in ", path_);
  TETRAD_CHECK(count <= size_t(INT32_MAX), "document starts of ", count, " tokens at once");
  // The last document start <= start (binary search), then walk forward.
  size_t lo = 0, hi = header_.num_documents;  // first index whose start > `start`
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (document_start(mid) <= start) lo = mid + 1;
    else hi = mid;
  }
  size_t next = lo;
  int32_t cur = 0;
  for (size_t t = 0; t < count; ++t) {
    while (next < header_.num_documents && document_start(next) <= start + t)
      cur = int32_t(document_start(next) - start), ++next;
    out[t] = cur;
  }
}

uint32_t ShardReader::max_token() const {
  uint32_t m = 0;
  for (size_t i = 0; i < header_.num_tokens; ++i) m = std::max(m, token(i));
  return m;
}

}  // namespace tetrad::data
