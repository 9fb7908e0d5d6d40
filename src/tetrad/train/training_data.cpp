#include "tetrad/train/training_data.hpp"

#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <toml++/toml.h>

#include "tetrad/core/error.hpp"
#include "tetrad/core/hash.hpp"
#include "tetrad/core/json.hpp"
#include "tetrad/data/tokenizer.hpp"

namespace fs = std::filesystem;

namespace tetrad {

DataInfo read_data_info(const std::string& data_dir, const ModelConfig& model) {
  const std::string meta_path = data_dir + "/meta.json";
  std::ifstream f(meta_path);
  if (!f)
    fail("data folder '", data_dir, "' has no meta.json; prepare it first with `tetrad prepare "
         "--input <text> --out ", data_dir, "`");
  std::stringstream text;
  text << f.rdbuf();
  const nlohmann::json j = parse_json_file_text(text.str(), "'" + meta_path + "'");
  DataInfo d;
  try {
    d.vocab_size = j.at("tokenizer").at("vocab_size").get<int>();
    d.tokenizer_identity =
        std::stoull(j.at("tokenizer").at("identity").get<std::string>(), nullptr, 16);
  } catch (const std::exception& e) {
    fail("'", meta_path, "' lacks tokenizer.vocab_size / tokenizer.identity: ", e.what());
  }
  if (d.vocab_size > model.vocab_size)
    fail("the tokenizer of '", data_dir, "' has ", d.vocab_size,
         " tokens but model.vocab_size is ", model.vocab_size,
         "; set model.vocab_size >= ", d.vocab_size);
  // Data folders from before tokenizer.json support name no file: theirs is tokenizer.model.
  const auto& tj = j["tokenizer"];
  d.tokenizer_path = data_dir + "/" +
                     (tj.contains("file") && tj["file"].is_string() ? tj["file"].get<std::string>()
                                                                    : std::string("tokenizer.model"));
  return d;
}

void check_data_tokenizer(const std::string& data_dir, const DataInfo& d) {
  const std::string file = fs::path(d.tokenizer_path).filename().string();
  std::error_code ec;
  if (!fs::exists(d.tokenizer_path, ec))
    fail("data folder '", data_dir, "' has no ", file, " (the shards' tokenizer, kept with every "
         "checkpoint); prepare the folder again with `tetrad prepare`");
  uint64_t id = 0;
  try {
    id = data::Tokenizer::load(d.tokenizer_path).identity();
  } catch (const std::exception& e) {
    fail("data folder '", data_dir, "': ", file, " does not load (damaged?): ", e.what());
  }
  if (id != d.tokenizer_identity)
    fail("data folder '", data_dir, "': ", file, " (identity ", hex64(id),
         ") is not the tokenizer the shards were made with (meta.json records ",
         hex64(d.tokenizer_identity), "); prepare the folder again or restore its ", file);
}

namespace {

// The folder, its tokenizer and the shards of both splits (validation only where evaluation is
// on) open and match the tokenizer and model now, not at the first evaluation after compute was
// spent.
DataInfo checked_folder(const RunConfig& cfg, const DataSlot& s) {
  const TrainConfig& t = cfg.train;
  const DataInfo data = read_data_info(cfg.data_dir, cfg.model);
  check_data_tokenizer(cfg.data_dir, data);
  data::LoaderOptions o;
  o.tokenizer_identity = data.tokenizer_identity;
  o.model_vocab = cfg.model.vocab_size;
  o.shuffle = false;
  o.documents = cfg.document_mask || cfg.document_positions;  // shards without boundaries refused
  const data::DataLoader train_split(cfg.data_dir, "train", s.local_batch, s.seq_len, s.slot,
                                     s.replicas, t.seed, o);
  if (t.eval_interval > 0) {
    try {
      const data::DataLoader val_split(cfg.data_dir, "val", s.local_batch, s.seq_len, s.slot,
                                       s.replicas, t.seed, o);
    } catch (const Error& e) {
      fail(e.what(), " (validation is on, train.eval_interval = ", t.eval_interval,
           ": prepare with a larger --val-fraction, or set train.eval_interval = 0)");
    }
  }
  return data;
}

data::LoaderOptions loader_options(const DataInfo& d, const RunConfig& cfg) {
  data::LoaderOptions o;
  o.tokenizer_identity = d.tokenizer_identity;
  o.model_vocab = cfg.model.vocab_size;
  o.documents = cfg.document_mask || cfg.document_positions;
  return o;
}

}  // namespace

TrainingData::TrainingData(const RunConfig& cfg, const DataSlot& s)
    : cfg_(cfg),
      slot_(s),
      info_(checked_folder(cfg, s)),
      opt_(loader_options(info_, cfg)),
      loader_(cfg.data_dir, "train", s.local_batch, s.seq_len, s.slot, s.replicas, cfg.train.seed,
              opt_),
      mask_{parse_loss_mask(cfg.train.loss_mask), cfg.train.goldfish_k, cfg.train.goldfish_h,
            cfg.train.seed},
      inputs_(size_t(cfg.train.grad_accum) * s.local_batch * s.context.local_len(s.seq_len)),
      targets_(inputs_.size()),
      doc_starts_(opt_.documents ? inputs_.size() : 0) {
  if (s.context.active()) {
    whole_inputs_.resize(size_t(cfg.train.grad_accum) * s.local_batch * s.seq_len);
    whole_targets_.resize(whole_inputs_.size());
    whole_doc_starts_.resize(opt_.documents ? whole_inputs_.size() : 0);
  }
}

std::array<double, 2> TrainingData::next_step(int64_t step) {
  const int B = slot_.local_batch, T = slot_.seq_len, accum = cfg_.train.grad_accum;
  std::array<double, 2> counts = {0, 0};  // kept targets, dropped by the loss mask
  const parallel::ContextSplit& cs = slot_.context;
  // With a context axis the whole sequences are read (every C rank of the slot reads the same
  // ones) and masked, then each rank keeps its chunks.
  int32_t* in = cs.active() ? whole_inputs_.data() : inputs_.data();
  int32_t* tg = cs.active() ? whole_targets_.data() : targets_.data();
  int32_t* ds = cs.active() ? whole_doc_starts_.data() : doc_starts_.data();
  // All micro-batches of the step first, so the loss normaliser (kept targets over the whole
  // global batch) is known before any backward.
  for (int m = 0; m < accum; ++m)
    loader_.next_batch(in + size_t(m) * B * T, tg + size_t(m) * B * T,
                       opt_.documents ? ds + size_t(m) * B * T : nullptr);
  if (!cs.active()) {
    for (int m = 0; m < accum; ++m)
      counts[1] += double(apply_loss_mask(mask_, targets_.data() + size_t(m) * B * T, B, T, step,
                                          m, slot_.replicas, slot_.slot));
    for (int32_t y : targets_) counts[0] += y >= 0;
    return counts;
  }
  // This rank's targets before the mask, to count what the mask drops of them.
  cs.take(tg, T, B * accum, T, targets_.data());
  double before = 0;
  for (int32_t y : targets_) before += y >= 0;
  for (int m = 0; m < accum; ++m)
    apply_loss_mask(mask_, tg + size_t(m) * B * T, B, T, step, m, slot_.replicas, slot_.slot);
  cs.take(in, T, B * accum, T, inputs_.data());
  // Document starts stay positions of the whole sequence (what the chunks' offsets count).
  if (opt_.documents) cs.take(ds, T, B * accum, T, doc_starts_.data());
  cs.take(tg, T, B * accum, T, targets_.data());
  for (int32_t y : targets_) counts[0] += y >= 0;
  counts[1] = before - counts[0];
  return counts;
}

nlohmann::json TrainingData::position() const {
  const TrainConfig& t = cfg_.train;
  // The loader's position is the job's position in the global window stream (the same on
  // every replica); replica r's next window is stream position cursor + r (data/loader.hpp).
  const auto ls = loader_.state();
  nlohmann::json next = nlohmann::json::array();
  for (int r = 0; r < slot_.replicas; ++r) next.push_back(ls.cursor + uint64_t(r));
  return {{"epoch", ls.epoch}, {"cursor", ls.cursor}, {"replicas", slot_.replicas},
          {"micro_batch", t.micro_batch}, {"seq_len", slot_.seq_len}, {"grad_accum", t.grad_accum},
          {"replica_next_position", next}, {"seed", t.seed},
          {"fingerprint", hex64(loader_.fingerprint())}};
}

std::vector<std::string> TrainingData::check_continuity(const nlohmann::json& d, uint64_t tokenizer,
                                                        const std::string& dir, bool allow,
                                                        std::vector<std::string>* unchecked) {
  auto note = [&](const std::string& what) {
    if (unchecked) unchecked->push_back(what);
  };
  if (tokenizer && info_.tokenizer_identity && tokenizer != info_.tokenizer_identity)
    throw DataChangeRefused(detail::concat(
        "checkpoint ", dir, " was trained on tokens of tokenizer ", hex64(tokenizer), " but the "
        "data in '", cfg_.data_dir, "' was made with tokenizer ", hex64(info_.tokenizer_identity),
        "; the token ids would mean other text. Resume with the data it was trained on, or start "
        "a new run.dir (run.init_from its weights, with data prepared by its tokenizer)"));
  std::vector<std::string> changes;
  if (!d.is_object() || d.empty()) return changes;  // an imported model: no data yet
  if (!tokenizer && info_.tokenizer_identity) note("the tokenizer (the checkpoint has none)");
  const TrainConfig& t = cfg_.train;
  const std::string seed_from = d.value("seed_from", std::string());
  if (!d.contains("seed") || !d["seed"].is_number_integer())
    note(detail::concat("train.seed (this run: ", t.seed, ")"));
  else if (d["seed"].get<uint64_t>() != t.seed)
    changes.push_back(detail::concat("train.seed: checkpoint",
                                     seed_from.empty() ? std::string() : " (" + seed_from + ")",
                                     " ", d["seed"].get<uint64_t>(),
                                     ", config ", t.seed, " (the order of the data from here on)"));
  if (!d.contains("seq_len")) note(detail::concat("train.seq_len (this run: ", slot_.seq_len, ")"));
  bool data_changed = false;
  if (!d.contains("fingerprint") || !d["fingerprint"].is_string()) {
    const std::string then = d.value("data_dir", std::string());
    note(detail::concat("the training data (no fingerprint of its shards; this run reads data.dir '",
                        cfg_.data_dir, "'",
                        then.empty() ? std::string()
                        : then == cfg_.data_dir ? ", the folder the run was configured with"
                                                : ", the run was configured with '" + then + "'",
                        ")"));
  } else {
    const std::string now = hex64(loader_.fingerprint());
    if (d["fingerprint"].get<std::string>() != now) {
      data_changed = true;
      changes.push_back(detail::concat(
          "the training data: checkpoint ", d["fingerprint"].get<std::string>(), ", data.dir '",
          cfg_.data_dir, "' ", now, " (other shards: another or a re-prepared data folder)"));
    }
  }
  if (changes.empty()) return changes;
  std::string list;
  for (const std::string& c : changes) list += "\n  " + c;
  if (!allow)
    throw DataChangeRefused(detail::concat(
        "checkpoint ", dir, " was trained with other data settings than this run has:", list,
        "\nresuming would silently change the run (as a train.seq_len change would). Resume with "
        "the settings it was trained with, start a new run.dir, or pass --allow-data-change to "
        "continue on purpose (recorded in metrics.jsonl", data_changed ? "; the new data is read from its start)" : ")"));
  restart_data_ = data_changed;
  return changes;
}

// The position is the job's, so it holds for any number of data replicas or micro-batch split
// (the batches are then those of the new layout from that position on); a different sequence
// length numbers the windows differently, so that is refused.
void TrainingData::restore(const nlohmann::json& d, const std::string& dir) {
  if (d.is_object() && d.empty()) return;  // an imported model: the data from the start
  if (restart_data_) return;               // an allowed change of data: the new data from its start
  const int T = slot_.seq_len;
  try {
    // An older record without seq_len: not comparable (check_continuity said so).
    const int saved_T = d.contains("seq_len") ? d.at("seq_len").get<int>() : T;
    if (saved_T != T)
      fail("checkpoint ", dir, " was trained with train.seq_len = ", saved_T, " but the config has ",
           T, "; the data windows would not continue where they stopped (set train.seq_len = ",
           saved_T, " or start a new run.dir)");
    loader_.restore(data::LoaderState{d.at("epoch").get<uint64_t>(), d.at("cursor").get<uint64_t>()});
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint ", dir, " lacks the data position: ", e.what());
  }
}

nlohmann::json TrainingData::legacy_record(const nlohmann::json& info) {
  if (info.is_object() && info.contains("data") && info["data"].is_object()) return info["data"];
  nlohmann::json d = nlohmann::json::object();
  if (!info.is_object()) return d;
  if (info.contains("data_epoch")) d["epoch"] = info["data_epoch"];
  if (info.contains("data_cursor")) d["cursor"] = info["data_cursor"];
  if (info.contains("config") && info["config"].is_string()) {
    complete_from_config(d, info["config"].get<std::string>(), "as in the configuration it recorded");
    try {
      const toml::table c = toml::parse(info["config"].get<std::string>());
      if (auto T = c.at_path("train.seq_len").value<int64_t>()) d["seq_len"] = *T;
    } catch (const toml::parse_error&) {
    }
  }
  return d;
}

void TrainingData::complete_from_config(nlohmann::json& d, const std::string& text,
                                        const std::string& source) {
  try {
    const toml::table c = toml::parse(text);
    if (!d.contains("seed"))
      if (auto seed = c.at_path("train.seed").value<uint64_t>()) {
        d["seed"] = *seed;
        d["seed_from"] = source;
      }
    if (!d.contains("data_dir"))
      if (auto dir = c.at_path("data.dir").value<std::string>()) d["data_dir"] = *dir;
  } catch (const toml::parse_error&) {  // nothing to compare with: said as not compared
  }
}

data::DataLoader TrainingData::validation_loader() const {
  data::LoaderOptions o = opt_;
  o.shuffle = false;
  return data::DataLoader(cfg_.data_dir, "val", slot_.local_batch, slot_.seq_len, slot_.slot,
                          slot_.replicas, cfg_.train.seed, o);
}

void TrainingData::describe_loss_mask(std::ostream& out) const {
  const TrainConfig& t = cfg_.train;
  if (mask_.mode == LossMaskMode::None) return;
  out << "loss mask: " << t.loss_mask << " (k = " << t.goldfish_k
      << (mask_.mode == LossMaskMode::Goldfish ? ", h = " + std::to_string(t.goldfish_h) : std::string())
      << "): about 1 in " << t.goldfish_k << " targets dropped from the loss\n";
}

}  // namespace tetrad
