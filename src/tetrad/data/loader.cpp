#include "tetrad/data/loader.hpp"

#include <algorithm>
#include <filesystem>
#include <map>

#include "tetrad/core/error.hpp"
#include "tetrad/core/hash.hpp"

namespace fs = std::filesystem;

namespace tetrad::data {

namespace {

// splitmix64 (Steele, Lea, Flood 2014): the step and its output function.
uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, range), range >= 1: Lemire's multiply-and-reject (exact, no modulo bias).
uint64_t bounded(uint64_t& state, uint64_t range) {
  unsigned __int128 m = static_cast<unsigned __int128>(splitmix64_next(state)) * range;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < range) {
    const uint64_t threshold = (0 - range) % range;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(splitmix64_next(state)) * range;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

}  // namespace

std::vector<uint32_t> epoch_permutation(uint64_t n, uint64_t seed, uint64_t epoch) {
  TETRAD_CHECK(n <= UINT32_MAX, "too many windows for a 32-bit permutation: ", n);
  std::vector<uint32_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<uint32_t>(i);
  // state = mix(mix(seed) ^ epoch), where mix(x) is one splitmix64 step from state x.
  uint64_t s = seed;
  s = splitmix64_next(s) ^ epoch;
  s = splitmix64_next(s);
  for (uint64_t i = n; i > 1; --i) {
    uint64_t j = bounded(s, i);  // in [0, i)
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

DataLoader::DataLoader(const std::string& dir, const std::string& split, int B, int T, int replica,
                       int num_replicas, uint64_t seed, const LoaderOptions& options)
    : dir_(dir), split_(split), B_(B), T_(T), replica_(replica), num_replicas_(num_replicas),
      seed_(seed), options_(options) {
  if (B < 1 || T < 1) fail("data loader: B (", B, ") and T (", T, ") must be at least 1");
  if (num_replicas < 1 || replica < 0 || replica >= num_replicas)
    fail("data loader: replica ", replica, " is not in [0, ", num_replicas, ")");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("data folder '", dir, "' does not exist");

  // Shards <split>_NNNNNN.bin, numbered 0, 1, 2, ... without gaps.
  std::map<uint64_t, std::string> found;
  const std::string prefix = split + "_";
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.size() != prefix.size() + 10 || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - 4, 4, ".bin") != 0)
      continue;
    std::string digits = name.substr(prefix.size(), 6);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    found[std::stoull(digits)] = e.path().string();
  }
  if (found.empty())
    fail("data folder '", dir, "' has no ", split, " shards (", split,
         "_000000.bin ...); run prepare first or check the split name");
  uint64_t expect = 0;
  for (const auto& [index, path] : found) {
    if (index != expect) {
      char name[64];
      std::snprintf(name, sizeof name, "%s_%06llu.bin", split.c_str(),
                    static_cast<unsigned long long>(expect));
      fail("data folder '", dir, "' is missing shard ", name, " (found shards up to ",
           fs::path(found.rbegin()->second).filename().string(), ")");
    }
    ++expect;
    shards_.emplace_back(path, options.verify_checksums);
  }

  // All shards from one tokenizer, and the one the caller expects.
  const ShardReader& first = shards_.front();
  tokenizer_identity_ = first.tokenizer_identity();
  vocab_size_ = first.vocab_size();
  for (const auto& s : shards_) {
    if (s.tokenizer_identity() != tokenizer_identity_)
      fail("shards in '", dir, "' come from different tokenizers: '", first.path(), "' has ",
           hex64(tokenizer_identity_), " but '", s.path(), "' has ", hex64(s.tokenizer_identity()));
    if (s.vocab_size() != vocab_size_)
      fail("shards in '", dir, "' disagree on the vocab size: '", first.path(), "' says ",
           vocab_size_, " but '", s.path(), "' says ", s.vocab_size());
  }
  if (options.tokenizer_identity && *options.tokenizer_identity != tokenizer_identity_)
    fail("shards in '", dir, "' were made with tokenizer ", hex64(tokenizer_identity_),
         ", but the model's tokenizer is ", hex64(*options.tokenizer_identity),
         " (re-run prepare with the model's tokenizer.model)");
  if (options.model_vocab > 0 && vocab_size_ > options.model_vocab) {
    for (const auto& s : shards_) {
      uint32_t m = s.max_token();
      if (m >= options.model_vocab)
        fail("shard '", s.path(), "' holds token id ", m, " >= model vocab ", options.model_vocab);
    }
    fail("shards in '", dir, "' were made with a tokenizer of ", vocab_size_,
         " ids, more than the model vocab ", options.model_vocab);
  }

  if (options.documents)
    for (const auto& s : shards_)
      if (!s.has_documents())
        fail("shard '", s.path(), "' records no document boundaries (token shard format version ",
             s.header().version, "), which data.document_mask and data.document_positions need: "
             "prepare the data again with this build (it writes version ", kShardVersion,
             "), or switch those options off");

  // Windows.
  window_begin_.push_back(0);
  for (const auto& s : shards_) {
    uint64_t n = s.num_tokens();
    num_tokens_ += n;
    num_windows_ += n >= static_cast<uint64_t>(T) + 1 ? (n - 1) / T : 0;
    window_begin_.push_back(num_windows_);
  }
  if (num_tokens_ < static_cast<uint64_t>(T) + 1)
    fail(split, " split of '", dir, "' has ", num_tokens_, " tokens, fewer than one sequence of T+1 = ",
         T + 1);
  if (num_windows_ == 0)
    fail(split, " split of '", dir, "' has ", num_tokens_, " tokens but no shard holds a sequence of T+1 = ",
         T + 1, " (prepare with a larger shard_tokens)");
  if (num_windows_ > UINT32_MAX)
    fail(split, " split of '", dir, "' has ", num_windows_, " windows; at most 2^32-1 are supported");
  state_ = {0, 0};
}

const std::vector<uint32_t>& DataLoader::permutation(uint64_t epoch) {
  if (epoch != perm_epoch_) {
    if (options_.shuffle) {
      perm_ = epoch_permutation(num_windows_, seed_, epoch);
    } else if (perm_.size() != num_windows_) {
      perm_.resize(num_windows_);
      for (uint64_t i = 0; i < num_windows_; ++i) perm_[i] = static_cast<uint32_t>(i);
    }
    perm_epoch_ = epoch;
  }
  return perm_;
}

uint64_t DataLoader::window_at(uint64_t epoch, uint64_t position) {
  TETRAD_CHECK(position < num_windows_, "position ", position, " >= ", num_windows_);
  return permutation(epoch)[position];
}

void DataLoader::copy_window(uint64_t w, int32_t* inputs, int32_t* targets,
                             int32_t* doc_start) const {
  size_t s = std::upper_bound(window_begin_.begin(), window_begin_.end(), w) - window_begin_.begin() - 1;
  TETRAD_CHECK(s < shards_.size(), "window ", w, " out of range");
  uint64_t start = (w - window_begin_[s]) * static_cast<uint64_t>(T_);
  shards_[s].copy(start, T_, inputs);
  shards_[s].copy(start + 1, T_, targets);
  if (doc_start) shards_[s].document_starts(start, T_, doc_start);
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
  next_batch(inputs, targets, nullptr);
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets, int32_t* doc_start) {
  TETRAD_CHECK(!doc_start || options_.documents,
               "data loader: document starts asked of a loader opened without options.documents");
  const uint64_t N = num_windows_, n = static_cast<uint64_t>(num_replicas_);
  for (int b = 0; b < B_; ++b) {
    // Stream offset of this row from the job's position: b*n + r.
    uint64_t offset = static_cast<uint64_t>(b) * n + static_cast<uint64_t>(replica_);
    uint64_t epoch = state_.epoch + (state_.cursor + offset) / N;
    uint64_t pos = (state_.cursor + offset) % N;
    copy_window(permutation(epoch)[pos], inputs + static_cast<size_t>(b) * T_,
                targets + static_cast<size_t>(b) * T_,
                doc_start ? doc_start + static_cast<size_t>(b) * T_ : nullptr);
  }
  uint64_t advance = static_cast<uint64_t>(B_) * n;
  state_.epoch += (state_.cursor + advance) / N;
  state_.cursor = (state_.cursor + advance) % N;
}

uint64_t DataLoader::fingerprint() const {
  std::vector<uint64_t> words;
  words.reserve(2 * shards_.size());
  for (const ShardReader& s : shards_) {
    words.push_back(s.num_tokens());
    words.push_back(s.header().checksum);
  }
  return hash64(words.data(), words.size() * sizeof(uint64_t));
}

void DataLoader::restore(const LoaderState& s) {
  if (s.cursor >= num_windows_)
    fail("data loader state (epoch ", s.epoch, ", cursor ", s.cursor, ") does not fit the ", split_,
         " split of '", dir_, "', which has ", num_windows_, " windows of T = ", T_,
         " (was it saved for other data or another sequence length?)");
  state_ = s;
}

}  // namespace tetrad::data
