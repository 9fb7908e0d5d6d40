// Extraction metrics (docs: shared/design/memorization.md): does greedy decoding from a training
// prefix reproduce the true continuation?
//
// For each document: prefix = its first P tokens, truth = the next N tokens; the model decodes N
// tokens greedily (argmax, KV cache, batched) and they are compared with the truth by
//   * exact match     all N tokens equal (the document is "extracted");
//   * token match     fraction of the N truth positions where the generated token is equal;
//   * ROUGE-L         F1 of the longest common subsequence over token ids.
// Rates are averaged over the evaluated documents; documents shorter than P + N are skipped and
// say why.
//
// What this does not do: prefixes taken from the middle of a document, sampling (only greedy),
// text-level (detokenized) comparison, or a KV cache on the grid (the grid version recomputes the
// prefix for every token).
// Failures in the world (a model folder, a document file, P + N beyond the model's length) throw
// tetrad::Error.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tetrad::parallel {
class ParallelTransformer;
}

namespace tetrad {

// ---- metrics over token ids (pure functions) -------------------------------------------------

// True when generated == truth (same length, same tokens).
bool exact_match(const std::vector<int32_t>& generated, const std::vector<int32_t>& truth);
// Fraction of the truth positions i with generated[i] == truth[i]; positions past the end of
// `generated` count as mismatches. 1.0 for an empty truth.
double token_match_rate(const std::vector<int32_t>& generated, const std::vector<int32_t>& truth);
// Length of the longest common subsequence (not necessarily contiguous). O(|a|·|b|) time,
// O(min(|a|, |b|)) memory.
int64_t lcs_length(const std::vector<int32_t>& a, const std::vector<int32_t>& b);
// ROUGE-L F1: P = lcs/|generated|, R = lcs/|truth|, F = 2PR/(P+R); 0 when lcs = 0.
double rouge_l(const std::vector<int32_t>& generated, const std::vector<int32_t>& truth);

// ---- extraction over a set of documents ------------------------------------------------------

struct ExtractionOptions {
  int prefix_len = 32;  // P: tokens of training text given as the prompt
  int suffix_len = 50;  // N: tokens decoded and compared with the true continuation
  int batch = 8;        // prompts decoded together (capped at the model's max_batch)
};

struct DocumentResult {
  std::string name;
  int64_t doc_index = 0;
  bool exact = false;
  double token_match = 0;
  double rouge_l = 0;
  bool skipped = false;
  std::string why;  // reason for skipping ("" when evaluated)
};

struct ExtractionReport {
  std::vector<DocumentResult> docs;  // one per input document, in input order
  double exact_rate = 0;             // averages over the evaluated documents (0 if none)
  double token_match_rate = 0;
  double rouge_l = 0;
  int evaluated = 0, skipped = 0;
  int prefix_len = 0, suffix_len = 0;

  // A fixed-width table: one row per document, then the overall line.
  std::string table() const;
  // {"prefix_len", "suffix_len", "evaluated", "skipped", "exact_rate", "token_match_rate",
  //  "rouge_l", "documents": [{"name", "index", "skipped", "why" | "exact", "token_match",
  //  "rouge_l"}]}
  nlohmann::json to_json() const;
};

// Runs the extraction test on token documents (names[i] labels documents[i]; names may be empty,
// then documents are named by index) with the one model on its process grid (collective over
// the grid; every rank returns the whole report; 1x1x1x1: one process). Documents are dealt out
// over the Z and data axes, model.local_batch() per rank at a time, and continued greedily with
// the model's KV cache (generate_greedy_batch). Throws Error if prefix_len < 1, suffix_len < 1,
// batch < 1, names has a different non-zero size, or prefix_len + suffix_len > model.max_len().
// Uses (and resets) the model's KV cache; the parameters are not changed.
ExtractionReport measure_extraction(parallel::ParallelTransformer& model,
                                    const std::vector<std::vector<int32_t>>& documents,
                                    const std::vector<std::string>& names,
                                    const ExtractionOptions& opt);

// The pieces of the test, so that another decoder runs exactly the same test (the tests' serial
// oracle does: tests/support/extraction.hpp). plan_extraction checks the options (throws as
// measure_extraction does), fills rep's prefix/suffix lengths, names and skip reasons, and returns
// the indices of the documents to evaluate; score_document compares one generated suffix with
// the document's true continuation; summarize_extraction fills the counts and averages.
std::vector<size_t> plan_extraction(ExtractionReport& rep,
                                    const std::vector<std::vector<int32_t>>& documents,
                                    const std::vector<std::string>& names,
                                    const ExtractionOptions& opt, int max_len, int vocab_size);
void score_document(DocumentResult& d, const std::vector<int32_t>& doc,
                    const std::vector<int32_t>& generated, int prefix_len, int suffix_len);
void summarize_extraction(ExtractionReport& rep);

// `tetrad memorization`.
struct MemorizationCommand {
  std::string model_dir;               // Hugging Face folder (config.json, model.safetensors,
                                       // tokenizer.model), as a run checkpoint holds
  std::vector<std::string> doc_files;  // each file is one document, encoded with that tokenizer
  // A slice of prepared token shards instead of (or besides) files: `samples` windows of
  // prefix + suffix tokens at evenly spaced positions of split `split` of data_dir.
  std::string data_dir, split = "train";
  int samples = 0;
  // Process grid "x,y,z,d" when launched under mpirun (x*y*z*d = ranks); empty: all ranks on the
  // data axis ("1,1,1,n"); one rank without a grid: 1x1x1x1.
  std::string grid;
  ExtractionOptions opt;
  std::string json_out;  // also write the report as JSON (rank 0)
};
// Loads the model, builds the document list, runs measure_extraction, prints the table to `out`
// (rank 0) and writes the JSON. Collective when MPI is up with more than one rank.
void run_memorization_command(const MemorizationCommand& cmd, std::ostream& out);

}  // namespace tetrad
