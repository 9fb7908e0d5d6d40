// DataLoader: batches of (inputs, targets) from the token shards of one split (docs/data.md).
//
// Windows. Shard s with n_s tokens holds floor((n_s - 1) / T) windows (none if n_s < T + 1);
// window k covers tokens [k*T, k*T + T + 1) of its shard: inputs are the first T, targets the last
// T (inputs shifted by one). Windows never cross a shard boundary; the at most T tokens after a
// shard's last window are not used as targets. Windows are numbered 0..N-1 in shard order.
//
// Order. The stream is perm(0) ++ perm(1) ++ ..., where perm(e) is a permutation of 0..N-1 made
// by Fisher-Yates driven by splitmix64 seeded from (seed, e) — portable, documented bit for bit in
// docs/data.md (the identity permutation when options.shuffle is false). Replica r of n takes
// stream positions r, r+n, r+2n, ...: call j of next_batch fills row b (0 <= b < B) with the window
// at position (j*B + b)*n + r. So replicas are disjoint, and the union of all replicas' batches of
// one step is the batch a single replica with micro-batch n*B gets, whatever n is.
//
// Position. state() is the position of the whole job in the stream (epoch, cursor < N), the same
// on every replica after the same number of next_batch calls. restore(state) continues exactly:
// no window repeated or skipped, even with a different number of replicas or micro-batch (the
// batches are then those of the new layout from that position on).
//
// Documents. With options.documents, every shard must record its document boundaries (format
// version 2, written by prepare); next_batch then also gives each input token the position in its
// row where its document begins (0 for a document that began before the window): what the
// document mask and per-document positions of the model read.
//
// What this does not do: prefetch in a background thread, pad short data.
//
// Failures: a missing folder or split, inconsistent shards, a tokenizer or vocab that does not
// match the expectations, or fewer tokens than one window throw tetrad::Error naming the folder or
// file. Not thread-safe; one loader per replica.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tetrad/data/shards.hpp"

namespace tetrad::data {

struct LoaderState {
  uint64_t epoch = 0;
  uint64_t cursor = 0;  // stream position within the epoch, < num_windows()
};

struct LoaderOptions {
  // When set, every shard must carry this tokenizer identity (the model's tokenizer).
  std::optional<uint64_t> tokenizer_identity;
  // When > 0, the model's vocab size: the shards' tokenizer vocab and every token must fit in it.
  int64_t model_vocab = 0;
  bool verify_checksums = true;  // hash every shard on open
  bool shuffle = true;           // false: windows in file order each epoch (e.g. for evaluation)
  // The document starts of each window are needed (next_batch's doc_start): every shard must
  // record its boundaries (Error naming the first that does not, and the way out).
  bool documents = false;
};

class DataLoader {
 public:
  // dir: a folder written by prepare_data; split: "train" or "val" (any name whose shards are
  // <split>_000000.bin, <split>_000001.bin, ... numbered without gaps).
  DataLoader(const std::string& dir, const std::string& split, int B, int T, int replica = 0,
             int num_replicas = 1, uint64_t seed = 0, const LoaderOptions& options = {});

  // Fills inputs[B*T] and targets[B*T] (row-major, row b = one window) and advances the stream.
  void next_batch(int32_t* inputs, int32_t* targets);
  // ... and doc_start[B*T]: for input token t of row b, the position in the row where its
  // document begins (options.documents must be set).
  void next_batch(int32_t* inputs, int32_t* targets, int32_t* doc_start);

  LoaderState state() const { return state_; }
  // Throws Error if state.cursor >= num_windows() (a state saved for other data or another T).
  void restore(const LoaderState& state);

  uint64_t num_windows() const { return num_windows_; }
  uint64_t epoch() const { return state_.epoch; }
  uint64_t num_tokens() const { return num_tokens_; }
  size_t num_shards() const { return shards_.size(); }
  uint64_t tokenizer_identity() const { return tokenizer_identity_; }
  // The split's content identity: XXH64 over each shard's token count and token checksum, in
  // order (from the headers: nothing is read). Equal for the same tokens however prepared.
  uint64_t fingerprint() const;
  uint32_t vocab_size() const { return vocab_size_; }

  // Window index (0..N-1) at a position of epoch `epoch`'s permutation; for tests and tools.
  uint64_t window_at(uint64_t epoch, uint64_t position);

 private:
  const std::vector<uint32_t>& permutation(uint64_t epoch);
  void copy_window(uint64_t window, int32_t* inputs /*[T]*/, int32_t* targets /*[T]*/,
                   int32_t* doc_start /*[T] or null*/) const;

  std::string dir_, split_;
  int B_, T_, replica_, num_replicas_;
  uint64_t seed_;
  LoaderOptions options_;
  std::vector<ShardReader> shards_;
  std::vector<uint64_t> window_begin_;  // [num_shards + 1]: first global window of each shard
  uint64_t num_windows_ = 0, num_tokens_ = 0, tokenizer_identity_ = 0;
  uint32_t vocab_size_ = 0;
  LoaderState state_;
  std::vector<uint32_t> perm_;
  uint64_t perm_epoch_ = UINT64_MAX;
};

// The permutation of 0..n-1 for (seed, epoch) used by DataLoader (exposed for tests and tools).
std::vector<uint32_t> epoch_permutation(uint64_t n, uint64_t seed, uint64_t epoch);

}  // namespace tetrad::data
