// The training data of a run: the data folder checked before any compute (meta.json, the
// tokenizer the shards were made with, both splits' shards against the model's vocabulary), the
// training split's loader for this rank's slot of the Z x D replicas, the loss mask, the batch of
// a step (grad_accum micro-batches of B x T), the data position a checkpoint records and its
// restore, and the validation split's loader.
//
// Failures: a data folder that cannot be used throws Error naming the folder and the way out.
#pragma once
#include <array>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tetrad/core/error.hpp"
#include "tetrad/data/loader.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/parallel/context_split.hpp"
#include "tetrad/train/config.hpp"
#include "tetrad/train/loss_mask.hpp"

namespace tetrad {

// The data folder's tokenizer identity and vocabulary, checked against the model.
struct DataInfo {
  uint64_t tokenizer_identity = 0;
  int vocab_size = 0;
  std::string tokenizer_path;
};

// Reads data_dir/meta.json; refuses a tokenizer larger than the model's vocabulary.
DataInfo read_data_info(const std::string& data_dir, const ModelConfig& model);

// Before any compute: the data folder's tokenizer is there, loads, and is the one the shards
// were made with (it is copied into every checkpoint; `generate` needs it).
void check_data_tokenizer(const std::string& data_dir, const DataInfo& d);

// A resume that would change the run's data order (train.seed, the training data): refused
// unless allowed, before any weight is read (Checkpointer::resume_or_init does not try older
// checkpoints for it: they have the same data).
class DataChangeRefused : public Error {
 public:
  using Error::Error;
};

// This rank's part of each micro-batch: `local_batch` of its sequences, slot `slot` of
// `replicas` (the Z x D ranks split the micro-batch's sequences), and of each sequence its
// context chunks (the C ranks of one slot read the same sequences and each keeps its two chunks:
// context.local_len(seq_len) tokens per sequence).
struct DataSlot {
  int local_batch = 1, seq_len = 1;
  int slot = 0, replicas = 1;
  parallel::ContextSplit context;
};

class TrainingData {
 public:
  // Checks the folder (above) and the shards of both splits (validation only where evaluation
  // is on), then opens the training split.
  TrainingData(const RunConfig& cfg, const DataSlot& slot);

  const DataInfo& info() const { return info_; }
  const DataSlot& slot() const { return slot_; }

  // The batch of step `step` (0-based): grad_accum micro-batches read into inputs() and
  // targets() (micro-batch m at m x B x T, T this rank's tokens per sequence: its context chunks
  // of each sequence), the loss mask applied to the whole sequences. Returns {targets kept,
  // targets the mask dropped} of this rank's tokens.
  std::array<double, 2> next_step(int64_t step);
  std::vector<int32_t>& inputs() { return inputs_; }
  std::vector<int32_t>& targets() { return targets_; }
  // With data.document_mask or data.document_positions: each input token's document start in its
  // sequence (data::DataLoader::next_batch; a position of the whole sequence, also with a
  // context axis), inputs()'s layout; empty otherwise.
  const std::vector<int32_t>& doc_starts() const { return doc_starts_; }
  bool documents() const { return opt_.documents; }

  // The loader's position (the job's position in the global window stream, the same on every
  // replica).
  data::LoaderState state() const { return loader_.state(); }
  // The sharded checkpoint's "data" record: the position and the layout it was read with, the
  // seed and the training split's fingerprint (data::DataLoader::fingerprint).
  nlohmann::json position() const;
  // Before a sharded checkpoint's weights are read: its "data" record and tokenizer identity
  // against this run's. A different tokenizer throws DataChangeRefused; so do a different
  // train.seed or training data (another fingerprint) unless `allow`, and then each difference
  // is returned, said in words, and a data change makes restore() start the new data from its
  // beginning. Records from before the fingerprint was kept are checked for what they hold.
  // What a record from an older tetrad lacks (its seed, the data's fingerprint, seq_len, the
  // tokenizer) is not compared and is added to `unchecked`, in words, to be said once.
  std::vector<std::string> check_continuity(const nlohmann::json& data, uint64_t tokenizer,
                                            const std::string& dir, bool allow,
                                            std::vector<std::string>* unchecked = nullptr);
  // Continues where a checkpoint left off: a sharded checkpoint's "data" record (an empty object:
  // an imported model, from the start), or a run checkpoint's info (data_epoch, data_cursor).
  // Throws Error naming `dir` when the record lacks the position or was for another seq_len.
  void restore(const nlohmann::json& data, const std::string& dir);
  // The "data" record of a checkpoint in the previous format (run_checkpoint.hpp) from its
  // trainer state's info: the record itself where it keeps one (since the data fingerprint),
  // else what an older one holds (data_epoch, data_cursor; train.seed, train.seq_len and
  // data.dir from the configuration it recorded).
  static nlohmann::json legacy_record(const nlohmann::json& info);
  // Fills a record's missing train.seed (and data.dir, for messages) from a run configuration
  // in TOML (run.dir/config.toml), naming `source` as where they came from.
  static void complete_from_config(nlohmann::json& data, const std::string& toml_text,
                                   const std::string& source);

  // A fresh loader of the validation split, from its start (unshuffled).
  data::DataLoader validation_loader() const;

  bool masking() const { return mask_.mode != LossMaskMode::None; }
  // "loss mask: ..." when a mask is on.
  void describe_loss_mask(std::ostream& out) const;

 private:
  const RunConfig& cfg_;
  DataSlot slot_;
  DataInfo info_;
  data::LoaderOptions opt_;
  data::DataLoader loader_;
  LossMask mask_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<int32_t> whole_inputs_, whole_targets_;  // the whole sequences (context axis only)
  std::vector<int32_t> doc_starts_;  // data.document_*: the inputs' document starts
  std::vector<int32_t> whole_doc_starts_;  // ... of the whole sequences (context axis only)
  bool restart_data_ = false;  // an allowed data change: restore() starts from the beginning
};

}  // namespace tetrad
