// prepare_data: text files -> tokenizer + train/val token shards + meta.json (docs/data.md).
//
//   inputs (files, or folders: every *.txt and *.jsonl below them, sorted by path)
//     -> documents (per file, by doc_split; a *.jsonl / *.ndjson file: one per line, the string
//        in its text_field)                           document i = i-th in that order
//     -> split: document i goes to val when u(i) < val_fraction, where
//        u(i) = (XXH64(u64le i, seed) >> 11) * 2^-53; whole documents only
//     -> tokenizer: loaded from tokenizer_model, or BPE-trained on the train documents' lines
//     -> each document encoded and followed by EOS, appended to the split's stream
//     -> out_dir/{tokenizer.model, train_000000.bin..., val_000000.bin..., meta.json}
//
// Output is a pure function of the input bytes and the options: running it twice gives identical
// files. The folder is built beside out_dir (out_dir.tmp-XXXXXX, every file fsync'ed) and swapped
// in whole when complete (renameat2 RENAME_EXCHANGE), so an input error, Ctrl-C or a kill leaves
// an existing out_dir as it was; the old content is deleted after the swap. A lock on out_dir
// (out_dir/prepare.lock, core/file_lock) refuses a second prepare of the same folder, naming the
// first; under it, folders left beside out_dir by a killed prepare are removed.
//
// What this does not do: deduplication, filtering, or streaming a single huge file (one input
// file at a time is held in memory, plus one batch of encoded documents).
//
// Failures (missing inputs, no documents, an empty train split, bad options, I/O) throw
// tetrad::Error.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace tetrad::data {

// How a file's text is cut into documents. In every mode a document is its lines joined by '\n'
// (no trailing newline, a trailing '\r' dropped from each line), blank lines never start or end
// a document, and documents with no non-blank line are dropped.
//   File       — the whole file is one document.
//   BlankLine  — blocks of lines separated by one or more blank (whitespace-only) lines.
//   Line       — every non-blank line is a document.
//   KjvChapter — the `bible` tool's one-verse-per-line output ("Ge1:1 In the beginning ..."):
//                consecutive lines with the same book+chapter prefix ("Ge1") form a document.
//   Auto       — per file: KjvChapter if its first 5 non-blank lines all start with a verse
//                reference, else BlankLine if it has a blank line between text, else File.
enum class DocSplit { Auto, File, BlankLine, Line, KjvChapter };

DocSplit parse_doc_split(const std::string& name);  // "auto" | "file" | "blank-line" | "line" | "kjv-chapter"
std::string doc_split_name(DocSplit mode);
DocSplit detect_doc_split(std::string_view text);  // the Auto rule; never returns Auto
std::vector<std::string> split_documents(std::string_view text, DocSplit mode);

// Expands files and folders into the ordered list of input files; Error if one does not exist or
// a folder holds no *.txt or *.jsonl file.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

// JSON lines (*.jsonl, *.ndjson): every non-blank line is a JSON object whose `field` is a string,
// one document (taken as it is; an empty one is dropped). A line that is not valid JSON (nesting
// is bounded at 64 levels), not an object, or without a string `field` is an Error naming the
// file and line number, or, with skip_bad, skipped and counted in *skipped.
bool is_json_lines_file(const std::string& path);
std::vector<std::string> json_lines_documents(std::string_view text, const std::string& field,
                                              bool skip_bad, const std::string& path,
                                              uint64_t* skipped = nullptr,
                                              std::string* first_problem = nullptr);

// u(index) < val_fraction (see above). prepare_data adds one rule: if no document qualifies but
// val_fraction > 0 and there are at least two documents, the document with the smallest u goes to
// val.
double document_uniform(uint64_t index, uint64_t seed);

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or folders (all *.txt inside, recursively, sorted)
  std::string out_dir;              // created if missing
  std::string tokenizer_model;      // existing .model to load, or empty to train one
  int vocab_size = 8192;            // when training
  double val_fraction = 0.01;       // in [0, 1)
  int64_t shard_tokens = 1 << 24;   // tokens per shard (the last one of a split may hold fewer)
  uint64_t seed = 1337;             // validation choice and tokenizer training
  std::string doc_split = "auto";   // see DocSplit
  std::string text_field = "text";  // JSON lines: the field holding each document's text
  bool skip_bad_lines = false;      // JSON lines: skip (and count) bad lines instead of failing
  // Canaries (memorization experiments): each file is one document, inserted canary_repeats[i]
  // times (one value: the same for all) between training documents at positions drawn from the
  // seed, never into validation. Where each copy landed (token offset in the train stream) is
  // recorded in meta.json under "canaries".
  std::vector<std::string> canaries;
  std::vector<int> canary_repeats;
};

void prepare_data(const PrepareOptions& options, std::ostream& log);

}  // namespace tetrad::data
