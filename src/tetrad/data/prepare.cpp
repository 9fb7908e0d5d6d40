#include "tetrad/data/prepare.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>

#include "tetrad/core/error.hpp"
#include "tetrad/core/file_lock.hpp"
#include "tetrad/core/hash.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/data/shards.hpp"
#include "tetrad/data/tokenizer.hpp"

namespace fs = std::filesystem;

namespace tetrad::data {

// ---- documents ----

DocSplit parse_doc_split(const std::string& name) {
  if (name == "auto") return DocSplit::Auto;
  if (name == "file") return DocSplit::File;
  if (name == "blank-line") return DocSplit::BlankLine;
  if (name == "line") return DocSplit::Line;
  if (name == "kjv-chapter") return DocSplit::KjvChapter;
  fail("unknown doc_split '", name, "': expected auto, file, blank-line, line or kjv-chapter");
}

std::string doc_split_name(DocSplit mode) {
  switch (mode) {
    case DocSplit::Auto: return "auto";
    case DocSplit::File: return "file";
    case DocSplit::BlankLine: return "blank-line";
    case DocSplit::Line: return "line";
    case DocSplit::KjvChapter: return "kjv-chapter";
  }
  TETRAD_CHECK(false, "bad DocSplit");
  return {};
}

namespace {

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

// Lines without their '\n' and a trailing '\r'; no empty last line after a final '\n'.
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    pos = end + 1;
  }
  return lines;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }
bool is_alpha(char c) { return is_upper(c) || (c >= 'a' && c <= 'z'); }

// "Ge1:1 In the ..." -> "Ge1"; "1Cor13:4 Charity ..." -> "1Cor13"; anything else -> nullopt.
// The pattern: [1-3]? [A-Z] [A-Za-z]* [0-9]+ ':' [0-9]+ ' '.
std::optional<std::string_view> kjv_chapter_key(std::string_view line) {
  size_t i = 0, n = line.size();
  if (i < n && line[i] >= '1' && line[i] <= '3') ++i;
  if (i >= n || !is_upper(line[i])) return std::nullopt;
  while (i < n && is_alpha(line[i])) ++i;
  size_t d = i;
  while (i < n && is_digit(line[i])) ++i;
  if (i == d) return std::nullopt;
  size_t key_end = i;
  if (i >= n || line[i] != ':') return std::nullopt;
  d = ++i;
  while (i < n && is_digit(line[i])) ++i;
  if (i == d || i >= n || line[i] != ' ') return std::nullopt;
  return line.substr(0, key_end);
}

std::string join(const std::vector<std::string_view>& lines, size_t begin, size_t end) {
  std::string s;
  for (size_t i = begin; i < end; ++i) {
    if (i > begin) s += '\n';
    s.append(lines[i]);
  }
  return s;
}

}  // namespace

DocSplit detect_doc_split(std::string_view text) {
  std::vector<std::string_view> lines = split_lines(text);
  int checked = 0;
  bool all_kjv = true;
  for (auto line : lines) {
    if (is_blank(line)) continue;
    if (!kjv_chapter_key(line)) all_kjv = false;
    if (++checked == 5) break;
  }
  if (checked > 0 && all_kjv) return DocSplit::KjvChapter;
  bool seen_text = false, blank_after_text = false;
  for (auto line : lines) {
    if (is_blank(line)) {
      blank_after_text = seen_text;
    } else {
      if (blank_after_text) return DocSplit::BlankLine;
      seen_text = true;
    }
  }
  return DocSplit::File;
}

std::vector<std::string> split_documents(std::string_view text, DocSplit mode) {
  if (mode == DocSplit::Auto) mode = detect_doc_split(text);
  std::vector<std::string_view> lines = split_lines(text);
  std::vector<std::string> docs;
  const size_t n = lines.size();
  switch (mode) {
    case DocSplit::File: {
      size_t b = 0, e = n;
      while (b < e && is_blank(lines[b])) ++b;
      while (e > b && is_blank(lines[e - 1])) --e;
      if (b < e) docs.push_back(join(lines, b, e));
      break;
    }
    case DocSplit::BlankLine:
      for (size_t i = 0; i < n;) {
        if (is_blank(lines[i])) { ++i; continue; }
        size_t j = i;
        while (j < n && !is_blank(lines[j])) ++j;
        docs.push_back(join(lines, i, j));
        i = j;
      }
      break;
    case DocSplit::Line:
      for (auto line : lines)
        if (!is_blank(line)) docs.emplace_back(line);
      break;
    case DocSplit::KjvChapter: {
      std::string_view key;
      bool open = false;
      for (auto line : lines) {
        if (is_blank(line)) continue;
        auto k = kjv_chapter_key(line);
        if (!open || (k && *k != key)) {
          docs.emplace_back();
          open = true;
          if (k) key = *k;
        } else {
          docs.back() += '\n';
        }
        docs.back().append(line);
      }
      break;
    }
    case DocSplit::Auto: TETRAD_CHECK(false, "unreachable"); break;
  }
  return docs;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  if (inputs.empty()) fail("prepare: no inputs given (expected text files or folders)");
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, ec); !ec && it != fs::end(it);
           it.increment(ec)) {
        if (it->is_regular_file() &&
            (it->path().extension() == ".txt" || is_json_lines_file(it->path().string())))
          found.push_back(it->path().string());
      }
      if (ec) fail("cannot list input folder '", in, "': ", ec.message());
      if (found.empty()) fail("input folder '", in, "' holds no *.txt or *.jsonl files");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else {
      fail("input '", in, "' does not exist (expected a text or JSON-lines file, or a folder of "
           "*.txt / *.jsonl files)");
    }
  }
  return files;
}

bool is_json_lines_file(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  return ext == ".jsonl" || ext == ".ndjson";
}

std::vector<std::string> json_lines_documents(std::string_view text, const std::string& field,
                                              bool skip_bad, const std::string& path,
                                              uint64_t* skipped, std::string* first_problem) {
  std::vector<std::string> docs;
  uint64_t number = 0, bad = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++number;
    if (is_blank(line)) continue;
    std::string problem;
    try {
      const nlohmann::json j = nlohmann::json::parse(line, [](int depth, nlohmann::json::parse_event_t,
                                                              nlohmann::json&) {
        if (depth > 64) throw std::runtime_error("nested deeper than 64 levels");
        return true;
      });
      if (!j.is_object()) problem = "is not a JSON object";
      else if (!j.contains(field)) problem = "has no field '" + field + "'";
      else if (!j[field].is_string()) problem = "has a field '" + field + "' that is not a string";
      else if (!j[field].get_ref<const std::string&>().empty()) docs.push_back(j[field].get<std::string>());
    } catch (const std::exception& e) {
      std::string what = e.what();  // the parser quotes what it read: up to a whole line
      if (what.size() > 200) what = what.substr(0, 200) + "...";
      problem = "is not valid JSON (" + what + ")";
    }
    if (problem.empty()) continue;
    if (!skip_bad)
      fail("input '", path, "' line ", number, " ", problem,
           " (expected one JSON object per line with a string field '", field,
           "'; --skip-bad-lines skips such lines)");
    if (bad++ == 0 && first_problem) *first_problem = "line " + std::to_string(number) + " " + problem;
  }
  if (skipped) *skipped = bad;
  return docs;
}

double document_uniform(uint64_t index, uint64_t seed) {
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(index >> (8 * i));
  return static_cast<double>(hash64(le, sizeof le, seed) >> 11) * 0x1p-53;
}

// ---- prepare ----

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Input that is not text gets a warning (NUL bytes, a share of invalid UTF-8 above 1%: a binary
// file given by mistake). (Lines of any length are taken: the tokenizer trainer gets pieces of
// those longer than it takes, trainer_pieces.)
void check_text_input(const std::string& path, const std::string& text, std::ostream& log) {
  uint64_t nul = 0, invalid = 0;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == 0) ++nul;
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + size_t(len) <= text.size();
    for (int k = 1; ok && k < len; ++k)
      ok = (static_cast<unsigned char>(text[i + size_t(k)]) & 0xC0) == 0x80;
    if (!ok) {
      ++invalid;
      i += 1;
    } else {
      i += size_t(len);
    }
  }
  const double share = text.empty() ? 0.0 : double(invalid) / double(text.size());
  if (nul > 0 || share > 0.01)
    log << "prepare: warning: " << path << " does not look like text: " << nul << " NUL byte(s), "
        << std::fixed << std::setprecision(1) << 100 * share << std::defaultfloat
        << "% of its bytes are not valid UTF-8 (is it a binary file?)\n";
}

// The end of the next piece of line [at, end) for the tokenizer trainer, which skips lines longer
// than `max` bytes (SentencePiece's max_sentence_length; it fails when it skips them all): the
// whole rest when it fits, else cut after the last space within `max` bytes, else at the last
// UTF-8 character boundary. A document's text is tokenized whole; only what the tokenizer is
// trained on is cut.
size_t trainer_piece_end(const std::string& s, size_t at, size_t end, size_t max) {
  if (end - at <= max) return end;
  size_t cut = s.rfind(' ', at + max - 1);
  if (cut != std::string::npos && cut > at) return cut + 1;
  cut = at + max;
  while (cut > at + 1 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open input '", path, "': ", std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("error reading input '", path, "'");
  return ss.str();
}

struct InputFile {
  std::string path;
  bool json_lines = false;
  DocSplit mode = DocSplit::File;
  uint64_t first_doc = 0, num_docs = 0, bytes = 0;
};

// Tokens of one split, cut into shards of at most shard_tokens.
class SplitWriter {
 public:
  SplitWriter(std::string dir, std::string split, uint32_t vocab, uint64_t identity, int64_t shard_tokens,
              std::ostream& log)
      : dir_(std::move(dir)), split_(std::move(split)), vocab_(vocab), identity_(identity),
        shard_tokens_(static_cast<uint64_t>(shard_tokens)), log_(log) {}

  void add_document(const std::vector<int32_t>& tokens) {
    size_t off = 0;
    while (off < tokens.size()) {
      if (!cur_) {
        char name[64];
        std::snprintf(name, sizeof name, "%s_%06zu.bin", split_.c_str(), shards_.size());
        cur_ = std::make_unique<ShardWriter>((fs::path(dir_) / name).string(), vocab_, identity_);
        cur_name_ = name;
      }
      if (off == 0) cur_->begin_document();  // the shard's document table (format version 2)
      size_t take = std::min<uint64_t>(tokens.size() - off, shard_tokens_ - cur_->num_tokens());
      cur_->write(tokens.data() + off, take);
      off += take;
      if (cur_->num_tokens() == shard_tokens_) close_shard();
    }
    tokens_ += tokens.size();
    ++documents_;
  }

  void finish() {
    if (cur_) close_shard();
  }

  nlohmann::json summary() const {
    return {{"documents", documents_}, {"tokens", tokens_}, {"shards", shards_}};
  }
  uint64_t tokens() const { return tokens_; }
  uint64_t documents() const { return documents_; }
  size_t num_shards() const { return shards_.size(); }

 private:
  void close_shard() {
    ShardHeader h = cur_->finish();
    shards_.push_back({{"file", cur_name_}, {"tokens", h.num_tokens}, {"checksum", hex64(h.checksum)}});
    log_ << "prepare: wrote " << cur_name_ << " (" << h.num_tokens << " tokens)\n";
    cur_.reset();
  }

  std::string dir_, split_;
  uint32_t vocab_;
  uint64_t identity_, shard_tokens_;
  std::ostream& log_;
  std::unique_ptr<ShardWriter> cur_;
  std::string cur_name_;
  std::vector<nlohmann::json> shards_;
  uint64_t tokens_ = 0, documents_ = 0;
};

// Deletes what an earlier run left: shards of either split (and their temporaries), meta.json.
// meta.json's description of the inputs, tokenizer and options (prepare_into adds the canaries
// and the splits).
nlohmann::json meta_of(const PrepareOptions& o, const Tokenizer& tok, bool trained,
                       const std::vector<InputFile>& files, uint64_t num_docs) {
  nlohmann::json meta;
  meta["format"] = "tetrad-data";
  meta["version"] = 1;
  meta["tokenizer"] = {{"file", tok.file_name()},
                       {"kind", tok.kind()},
                       {"identity", hex64(tok.identity())},
                       {"vocab_size", tok.vocab_size()},
                       {"bos_id", tok.bos_id()},
                       {"eos_id", tok.eos_id()},
                       {"unk_id", tok.unk_id()},
                       {"trained", trained},
                       {"source", trained ? std::string() : o.tokenizer_model}};
  meta["inputs"] = o.inputs;
  meta["canaries"] = nlohmann::json::array();
  nlohmann::json jfiles = nlohmann::json::array();
  for (const auto& f : files)
    jfiles.push_back({{"path", f.path}, {"bytes", f.bytes}, {"documents", f.num_docs},
                      {"doc_split", f.json_lines ? "json-lines" : doc_split_name(f.mode)}});
  meta["files"] = jfiles;
  meta["options"] = {{"vocab_size", o.vocab_size},     {"val_fraction", o.val_fraction},
                     {"shard_tokens", o.shard_tokens}, {"seed", o.seed},
                     {"doc_split", o.doc_split},       {"tokenizer_model", o.tokenizer_model},
                     {"text_field", o.text_field},     {"skip_bad_lines", o.skip_bad_lines}};
  meta["documents"] = num_docs;
  return meta;
}

void write_text_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("cannot create '", tmp, "': ", std::strerror(errno));
    f << text;
    f.flush();
    if (!f) fail("cannot write '", tmp, "'");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

// The whole preparation into o.out_dir, a new empty folder (prepare_data's temporary one).
void prepare_into(const PrepareOptions& o, std::ostream& log) {
  const DocSplit requested_split = parse_doc_split(o.doc_split);
  const std::vector<std::string> paths = expand_inputs(o.inputs);
  const auto t_start = Clock::now();

  // Pass 1: find the documents (count them, resolve each file's split mode) and choose val.
  std::vector<InputFile> files;
  uint64_t num_docs = 0, total_bytes = 0;
  double min_u = 2.0;
  uint64_t min_u_doc = 0, num_val = 0;
  for (const auto& p : paths) {
    std::string text = read_text(p);
    InputFile f;
    f.path = p;
    f.json_lines = is_json_lines_file(p);
    f.mode = requested_split == DocSplit::Auto ? detect_doc_split(text) : requested_split;
    f.first_doc = num_docs;
    uint64_t skipped = 0;
    std::string first_problem;
    f.num_docs = f.json_lines ? json_lines_documents(text, o.text_field, o.skip_bad_lines, p,
                                                     &skipped, &first_problem).size()
                              : split_documents(text, f.mode).size();
    if (skipped > 0)
      log << "prepare: input " << p << ": skipped " << skipped << " bad line(s), the first: "
          << first_problem << "\n";
    f.bytes = text.size();
    for (uint64_t i = f.first_doc; i < f.first_doc + f.num_docs; ++i) {
      double u = document_uniform(i, o.seed);
      if (u < o.val_fraction) ++num_val;
      if (u < min_u) min_u = u, min_u_doc = i;
    }
    num_docs += f.num_docs;
    total_bytes += f.bytes;
    check_text_input(p, text, log);
    log << "prepare: input " << p << ": " << f.bytes << " bytes, " << f.num_docs << " documents ("
        << (f.json_lines ? "JSON lines, field " + o.text_field : doc_split_name(f.mode)) << ")\n";
    files.push_back(std::move(f));
  }
  if (num_docs == 0) fail("prepare: the inputs hold no documents (all files are empty or blank)");
  auto documents_of = [&](const InputFile& f) {
    const std::string text = read_text(f.path);
    return f.json_lines ? json_lines_documents(text, o.text_field, o.skip_bad_lines, f.path)
                        : split_documents(text, f.mode);
  };
  const bool fallback_val = o.val_fraction > 0 && num_val == 0 && num_docs >= 2;
  auto is_val = [&](uint64_t doc) {
    return document_uniform(doc, o.seed) < o.val_fraction || (fallback_val && doc == min_u_doc);
  };
  if (fallback_val) num_val = 1;
  if (num_val == num_docs)
    fail("prepare: all ", num_docs, " documents fell into the validation split; lower val_fraction (",
         o.val_fraction, ") or add documents");
  log << "prepare: " << num_docs << " documents, " << num_docs - num_val << " train / " << num_val
      << " val" << (fallback_val ? " (no document fell under val_fraction; took the lowest)" : "")
      << "\n";

  // Tokenizer: load and copy, or train on the train documents' lines.
  const auto t_tok = Clock::now();
  std::optional<Tokenizer> tok;
  bool trained = false;
  if (!o.tokenizer_model.empty()) {
    tok.emplace(Tokenizer::load(o.tokenizer_model));
    // Stored under its own name, with its companions (tokenizer_config.json names BOS/EOS for
    // transformers); what an earlier run left of another tokenizer goes.
    const fs::path src(tok->path());
    const fs::path dst = fs::path(o.out_dir) / tok->file_name();
    if (!fs::exists(dst) || !fs::equivalent(src, dst)) write_text_atomic(dst.string(), tok->model_bytes());
    for (const char* other : {"tokenizer.model", "tokenizer.json"})
      if (other != tok->file_name()) fs::remove(fs::path(o.out_dir) / other);
    for (const char* name : kTokenizerCompanions) {
      const fs::path from = src.parent_path() / name, to = fs::path(o.out_dir) / name;
      if (fs::is_regular_file(from)) {
        if (!fs::exists(to) || !fs::equivalent(from, to)) write_text_atomic(to.string(), read_text(from.string()));
      } else {
        fs::remove(to);
      }
    }
    log << "prepare: loaded " << tok->kind() << " tokenizer " << tok->path() << " (vocab "
        << tok->vocab_size() << ", BOS " << tok->bos_id() << ", EOS " << tok->eos_id()
        << ", identity " << hex64(tok->identity()) << ")\n";
  } else {
    size_t file = 0, doc = 0, line_pos = 0;
    std::vector<std::string> docs;
    uint64_t lines_fed = 0;
    TokenizerTrainOptions topt;
    const size_t max_piece = size_t(topt.max_sentence_length);
    auto next_line = [&](std::string& line) -> bool {
      for (;;) {
        if (doc < docs.size()) {
          if (!is_val(files[file - 1].first_doc + doc)) {
            const std::string& d = docs[doc];
            if (line_pos <= d.size()) {
              size_t end = d.find('\n', line_pos);
              if (end == std::string::npos) end = d.size();
              const size_t piece = trainer_piece_end(d, line_pos, end, max_piece);
              line.assign(d, line_pos, piece - line_pos);
              line_pos = piece == end ? end + 1 : piece;
              ++lines_fed;
              return true;
            }
          }
          ++doc;
          line_pos = 0;
          continue;
        }
        if (file == files.size()) return false;
        docs = documents_of(files[file]);
        TETRAD_CHECK(docs.size() == files[file].num_docs, "input changed while preparing: ",
                     files[file].path);
        ++file;
        doc = 0;
        line_pos = 0;
      }
    };
    topt.seed = static_cast<uint32_t>(o.seed);
    tok.emplace(Tokenizer::train_lines(next_line, (fs::path(o.out_dir) / "tokenizer").string(),
                                       o.vocab_size, topt));
    trained = true;
    for (const char* stale : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
      fs::remove(fs::path(o.out_dir) / stale);
    log << "prepare: trained BPE tokenizer, vocab " << tok->vocab_size() << ", on " << lines_fed
        << " lines in " << seconds_since(t_tok) << " s (identity " << hex64(tok->identity())
        << ")\n";
  }
  const double tokenizer_seconds = seconds_since(t_tok);
  if (tok->eos_id() < 0)
    fail("tokenizer '", o.tokenizer_model, "' has no EOS token; prepare separates documents with "
         "EOS (for a tokenizer.json, name it as eos_token in a tokenizer_config.json beside it)");

  // Canaries: encoded now, inserted before the training document their draw picked.
  struct Canary {
    std::string file;
    std::vector<int32_t> tokens;
    int repeats = 0;
    std::vector<uint64_t> offsets;
  };
  std::vector<Canary> canaries;
  std::multimap<uint64_t, size_t> canary_at;  // train document index -> canary
  if (!o.canaries.empty()) {
    if (!o.canary_repeats.empty() && o.canary_repeats.size() != 1 &&
        o.canary_repeats.size() != o.canaries.size())
      fail("prepare: ", o.canaries.size(), " canary files but ", o.canary_repeats.size(),
           " repeat counts; give one count for all or one per canary");
    const uint64_t num_train = num_docs - num_val;
    Rng draw(o.seed ^ 0xCA4A21E5ull);
    for (size_t c = 0; c < o.canaries.size(); ++c) {
      Canary k;
      k.file = o.canaries[c];
      k.repeats = o.canary_repeats.empty() ? 1
                  : o.canary_repeats.size() == 1 ? o.canary_repeats[0] : o.canary_repeats[c];
      if (k.repeats < 1) fail("prepare: canary repeat counts must be >= 1, got ", k.repeats);
      k.tokens = tok->encode(read_text(k.file));
      if (k.tokens.empty()) fail("prepare: canary file '", k.file, "' is empty");
      k.tokens.push_back(tok->eos_id());
      for (int r = 0; r < k.repeats; ++r) canary_at.emplace(draw.next_u64() % (num_train + 1), c);
      canaries.push_back(std::move(k));
    }
  }
  uint64_t train_docs_seen = 0;

  // Pass 2: encode documents in batches (in parallel), append them in order to their split.
  const auto t_enc = Clock::now();
  const uint32_t vocab = static_cast<uint32_t>(tok->vocab_size());
  const int32_t eos = tok->eos_id();
  SplitWriter train(o.out_dir, "train", vocab, tok->identity(), o.shard_tokens, log);
  SplitWriter val(o.out_dir, "val", vocab, tok->identity(), o.shard_tokens, log);
  std::vector<std::string> batch;
  std::vector<uint64_t> batch_index;
  size_t batch_bytes = 0;
  uint64_t docs_done = 0;
  auto flush = [&] {
    std::vector<std::vector<int32_t>> encoded(batch.size());
    const Tokenizer& t = *tok;
#pragma omp parallel for schedule(dynamic, 4)
    for (size_t i = 0; i < batch.size(); ++i) {
      encoded[i] = t.encode(batch[i]);
      encoded[i].push_back(eos);
    }
    auto insert_canaries_before = [&](uint64_t train_doc) {
      auto [lo, hi] = canary_at.equal_range(train_doc);
      for (auto it = lo; it != hi; ++it) {
        canaries[it->second].offsets.push_back(train.tokens());
        train.add_document(canaries[it->second].tokens);
      }
    };
    for (size_t i = 0; i < batch.size(); ++i) {
      if (is_val(batch_index[i])) {
        val.add_document(encoded[i]);
      } else {
        insert_canaries_before(train_docs_seen++);
        train.add_document(encoded[i]);
      }
    }
    docs_done += batch.size();
    log << "prepare: encoded " << docs_done << "/" << num_docs << " documents, "
        << train.tokens() + val.tokens() << " tokens, " << seconds_since(t_enc) << " s\n";
    batch.clear();
    batch_index.clear();
    batch_bytes = 0;
  };
  for (const auto& f : files) {
    std::vector<std::string> docs = documents_of(f);
    TETRAD_CHECK(docs.size() == f.num_docs, "input changed while preparing: ", f.path);
    for (size_t i = 0; i < docs.size(); ++i) {
      batch_bytes += docs[i].size();
      batch.push_back(std::move(docs[i]));
      batch_index.push_back(f.first_doc + i);
      if (batch_bytes >= (64u << 20) || batch.size() >= 65536) flush();
    }
  }
  if (!batch.empty()) flush();
  {  // canaries drawn to go after the last training document
    auto [lo, hi] = canary_at.equal_range(train_docs_seen);
    for (auto it = lo; it != hi; ++it) {
      canaries[it->second].offsets.push_back(train.tokens());
      train.add_document(canaries[it->second].tokens);
    }
  }
  train.finish();
  val.finish();
  const double encode_seconds = seconds_since(t_enc);

  // meta.json, last.
  nlohmann::json meta = meta_of(o, *tok, trained, files, num_docs);
  for (const auto& k : canaries)
    meta["canaries"].push_back({{"file", k.file}, {"repeats", k.repeats},
                                {"tokens", k.tokens.size()}, {"offsets", k.offsets}});
  meta["splits"] = {{"train", train.summary()}, {"val", val.summary()}};
  write_text_atomic((fs::path(o.out_dir) / "meta.json").string(), meta.dump(2) + "\n");

  log << "prepare: done in " << seconds_since(t_start) << " s: " << total_bytes << " bytes -> train "
      << train.tokens() << " tokens (" << train.documents() << " docs, " << train.num_shards()
      << " shards), val " << val.tokens() << " tokens (" << val.documents() << " docs, "
      << val.num_shards() << " shards); tokenizer " << tokenizer_seconds << " s, encode "
      << encode_seconds << " s\n";
}

// fsync of every file in `dir` and of the folder, before it is renamed into place.
void sync_folder(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::fsync(fd) != 0) fail("cannot sync '", e.path().string(), "': ", std::strerror(errno));
    ::close(fd);
  }
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) ::fsync(fd), ::close(fd);
}

// Puts the complete folder `tmp` in the place of `dir` (which exists): one atomic exchange
// (renameat2 RENAME_EXCHANGE) where the file system has it, else `dir` moved aside and `tmp` in;
// then the old content is deleted. (checkpoint/atomic_file's replace_dir, a layer above data.)
void swap_in(const std::string& tmp, const std::string& dir) {
  std::error_code ec;
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
    const std::string old = dir + ".old-" + std::to_string(::getpid());
    fs::remove_all(old, ec);
    if (::rename(dir.c_str(), old.c_str()) != 0 || ::rename(tmp.c_str(), dir.c_str()) != 0)
      fail("cannot move the prepared folder '", tmp, "' into the place of '", dir, "': ",
           std::strerror(errno));
    fs::remove_all(old, ec);
  } else {
    fs::remove_all(tmp, ec);  // now the old content
  }
  const fs::path parent = fs::path(dir).parent_path();
  const int fd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) ::fsync(fd), ::close(fd);
}

// What an interrupted prepare of `dir` left beside it (dir.tmp-XXXXXX); called under the lock.
void remove_leftovers(const std::string& dir, std::ostream& log) {
  const fs::path p(dir);
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string prefix = p.filename().string() + ".tmp-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() == prefix.size() + 6 && name.compare(0, prefix.size(), prefix) == 0 &&
        e.is_directory(ec)) {
      fs::remove_all(e.path(), ec);
      log << "prepare: removed " << e.path().string() << ", left by an interrupted prepare\n";
    }
  }
}

}  // namespace

void prepare_data(const PrepareOptions& o, std::ostream& log) {
  std::string out = o.out_dir;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  if (out.empty()) fail("prepare: out_dir is empty");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    fail("prepare: val_fraction ", o.val_fraction, " must be in [0, 1)");
  if (o.shard_tokens < 1) fail("prepare: shard_tokens ", o.shard_tokens, " must be at least 1");
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(out, ec);
  if (fs::exists(st) && !fs::is_directory(fs::status(out, ec)))
    fail("prepare --out '", out, "' exists and is not a folder; give a folder for the data");
  const bool created = !fs::exists(st);
  fs::create_directories(out, ec);
  if (ec) fail("cannot create output folder '", out, "': ", ec.message());
  std::string tmp;
  bool locked = false;
  try {
    // The lock lives in the folder it guards; the new folder swapped in has none, and a prepare
    // that opened the old one's finds it gone and starts again (core/file_lock).
    const std::string lock_path = (fs::path(out) / "prepare.lock").string();
    FileLock lock(lock_path, [&](FileLock::Busy why, const std::string& holder) {
      return "data folder '" + out + "' is being prepared by another `tetrad prepare` (" + holder +
             (why == FileLock::Busy::OtherHost ? ", on another host" : "") + ", holding " +
             lock_path + "): two prepares into one folder would mix their shards and tokenizers. "
             "Wait for it to finish, stop it, or prepare into another --out" +
             (why == FileLock::Busy::Locked ? "" : " (if it is gone, delete " + lock_path + ")");
    });
    locked = true;
    remove_leftovers(out, log);
    char templ[4096];
    std::snprintf(templ, sizeof templ, "%s.tmp-XXXXXX", out.c_str());
    if (!::mkdtemp(templ)) fail("cannot create a folder beside '", out, "': ", std::strerror(errno));
    tmp = templ;
    ::chmod(tmp.c_str(), 0755);
    PrepareOptions inner = o;
    inner.out_dir = tmp;
    prepare_into(inner, log);
    sync_folder(tmp);
    swap_in(tmp, out);  // the old folder (and the lock file in it) goes
    if (!created) log << "prepare: replaced the earlier content of " << out << " (swapped in whole)\n";
  } catch (...) {
    if (!tmp.empty()) fs::remove_all(tmp, ec);
    // Nothing was there before: the empty folder goes (only an empty one: a prepare refused by
    // another's lock, or one that took the folder meanwhile, leaves it).
    if (created && locked) fs::remove(out, ec);
    throw;
  }
}

}  // namespace tetrad::data
