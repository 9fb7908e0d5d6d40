#include "tetrad/tools/memorization.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <sstream>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/model/sampling.hpp"

namespace tetrad {

// ---- metrics ---------------------------------------------------------------------------------

bool exact_match(const std::vector<int32_t>& generated, const std::vector<int32_t>& truth) {
  return generated == truth;
}

double token_match_rate(const std::vector<int32_t>& generated, const std::vector<int32_t>& truth) {
  if (truth.empty()) return 1.0;
  const size_t n = std::min(generated.size(), truth.size());
  int64_t equal = 0;
  for (size_t i = 0; i < n; ++i) equal += generated[i] == truth[i];
  return double(equal) / double(truth.size());
}

int64_t lcs_length(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  // One DP row over the shorter sequence: row[j] = LCS(long[0..i), short[0..j)).
  const std::vector<int32_t>& lo = a.size() >= b.size() ? a : b;
  const std::vector<int32_t>& sh = a.size() >= b.size() ? b : a;
  std::vector<int64_t> row(sh.size() + 1, 0);
  for (size_t i = 0; i < lo.size(); ++i) {
    int64_t diag = 0;  // row[j-1] of the previous i
    for (size_t j = 1; j <= sh.size(); ++j) {
      const int64_t up = row[j];
      row[j] = lo[i] == sh[j - 1] ? diag + 1 : std::max(up, row[j - 1]);
      diag = up;
    }
  }
  return row[sh.size()];
}

double rouge_l(const std::vector<int32_t>& generated, const std::vector<int32_t>& truth) {
  const int64_t l = lcs_length(generated, truth);
  if (l == 0) return 0.0;
  const double p = double(l) / double(generated.size());
  const double r = double(l) / double(truth.size());
  return 2 * p * r / (p + r);
}

// ---- extraction ------------------------------------------------------------------------------

ExtractionReport measure_extraction(Transformer<float>& model,
                                    const std::vector<std::vector<int32_t>>& documents,
                                    const std::vector<std::string>& names,
                                    const ExtractionOptions& opt) {
  const int P = opt.prefix_len, N = opt.suffix_len;
  if (P < 1 || N < 1 || opt.batch < 1)
    fail("extraction needs prefix_len >= 1, suffix_len >= 1 and batch >= 1 (got ", P, ", ", N,
         ", ", opt.batch, ")");
  if (!names.empty() && names.size() != documents.size())
    fail("extraction: ", names.size(), " names for ", documents.size(), " documents");
  if (P + N > model.max_len())
    fail("extraction: prefix ", P, " + suffix ", N, " = ", P + N,
         " tokens exceeds the model's maximum length ", model.max_len(),
         "; use a shorter prefix or suffix");
  const int V = model.config().vocab_size;

  ExtractionReport rep;
  rep.prefix_len = P;
  rep.suffix_len = N;
  rep.docs.resize(documents.size());
  std::vector<size_t> todo;  // documents long enough to evaluate
  for (size_t i = 0; i < documents.size(); ++i) {
    DocumentResult& d = rep.docs[i];
    d.doc_index = int64_t(i);
    d.name = names.empty() ? "doc " + std::to_string(i) : names[i];
    const auto& doc = documents[i];
    if (int64_t(doc.size()) < P + N) {
      d.skipped = true;
      d.why = "has " + std::to_string(doc.size()) + " tokens, needs prefix " + std::to_string(P) +
              " + suffix " + std::to_string(N);
      continue;
    }
    const auto bad = std::find_if(doc.begin(), doc.begin() + P + N,
                                  [V](int32_t t) { return t < 0 || t >= V; });
    if (bad != doc.begin() + P + N) {
      d.skipped = true;
      d.why = "token id " + std::to_string(*bad) + " outside the model's vocabulary of " +
              std::to_string(V);
      continue;
    }
    todo.push_back(i);
  }

  const size_t B = size_t(std::min(opt.batch, model.max_batch()));
  for (size_t g = 0; g < todo.size(); g += B) {
    const size_t n = std::min(B, todo.size() - g);
    std::vector<std::vector<int32_t>> prompts(n);
    for (size_t k = 0; k < n; ++k) {
      const auto& doc = documents[todo[g + k]];
      prompts[k].assign(doc.begin(), doc.begin() + P);
    }
    const auto gen = generate_greedy_batch(model, prompts, N);
    for (size_t k = 0; k < n; ++k) {
      const auto& doc = documents[todo[g + k]];
      const std::vector<int32_t> truth(doc.begin() + P, doc.begin() + P + N);
      DocumentResult& d = rep.docs[todo[g + k]];
      d.exact = exact_match(gen[k], truth);
      d.token_match = token_match_rate(gen[k], truth);
      d.rouge_l = rouge_l(gen[k], truth);
    }
  }

  for (const auto& d : rep.docs) {
    if (d.skipped) {
      ++rep.skipped;
      continue;
    }
    ++rep.evaluated;
    rep.exact_rate += d.exact;
    rep.token_match_rate += d.token_match;
    rep.rouge_l += d.rouge_l;
  }
  if (rep.evaluated > 0) {
    rep.exact_rate /= rep.evaluated;
    rep.token_match_rate /= rep.evaluated;
    rep.rouge_l /= rep.evaluated;
  }
  return rep;
}

std::string ExtractionReport::table() const {
  size_t w = 8;
  for (const auto& d : docs) w = std::max(w, std::min<size_t>(d.name.size(), 48));
  std::ostringstream os;
  char buf[256];
  os << "extraction: prefix " << prefix_len << " tokens, greedy suffix " << suffix_len
     << " tokens\n";
  std::snprintf(buf, sizeof buf, "%-*s  %5s  %11s  %7s\n", int(w), "document", "exact",
                "token-match", "rouge-l");
  os << buf;
  for (const auto& d : docs) {
    const std::string name = d.name.size() > w ? "..." + d.name.substr(d.name.size() - w + 3)
                                               : d.name;
    if (d.skipped) {
      os << std::string(name) << std::string(w - name.size(), ' ') << "  skipped: " << d.why
         << "\n";
      continue;
    }
    std::snprintf(buf, sizeof buf, "%-*s  %5s  %11.3f  %7.3f\n", int(w), name.c_str(),
                  d.exact ? "yes" : "no", d.token_match, d.rouge_l);
    os << buf;
  }
  std::snprintf(buf, sizeof buf,
                "overall: %d evaluated, %d skipped | exact %.3f | token-match %.3f | "
                "rouge-l %.3f\n",
                evaluated, skipped, exact_rate, token_match_rate, rouge_l);
  os << buf;
  return os.str();
}

nlohmann::json ExtractionReport::to_json() const {
  nlohmann::json j = {{"prefix_len", prefix_len},      {"suffix_len", suffix_len},
                      {"evaluated", evaluated},        {"skipped", skipped},
                      {"exact_rate", exact_rate},      {"token_match_rate", token_match_rate},
                      {"rouge_l", rouge_l},            {"documents", nlohmann::json::array()}};
  for (const auto& d : docs) {
    nlohmann::json e = {{"name", d.name}, {"index", d.doc_index}, {"skipped", d.skipped}};
    if (d.skipped) {
      e["why"] = d.why;
    } else {
      e["exact"] = d.exact;
      e["token_match"] = d.token_match;
      e["rouge_l"] = d.rouge_l;
    }
    j["documents"].push_back(std::move(e));
  }
  return j;
}

// ---- CLI entry point -------------------------------------------------------------------------

namespace {
std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read document file '", path, "'");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) fail("error reading document file '", path, "'");
  return s;
}
}  // namespace

void run_memorization_command(const std::string& model_dir,
                              const std::vector<std::string>& doc_files,
                              const ExtractionOptions& opt, const std::string& json_out,
                              std::ostream& out) {
  if (doc_files.empty()) fail("memorization: no document files given");
  const ModelConfig mc = read_hf_config(model_dir);
  const std::string tok_path = model_dir + "/tokenizer.model";
  if (!std::filesystem::exists(tok_path))
    fail("model folder '", model_dir, "' has no tokenizer.model to encode the documents with");
  const auto tok = data::Tokenizer::load(tok_path);
  if (tok.vocab_size() > mc.vocab_size)
    fail("tokenizer in '", model_dir, "' has ", tok.vocab_size(),
         " pieces but the model's vocabulary is ", mc.vocab_size);

  std::vector<std::vector<int32_t>> docs;
  for (const auto& f : doc_files) docs.push_back(tok.encode(read_text_file(f)));

  const int batch = std::max(1, std::min<int>(opt.batch, int(docs.size())));
  Transformer<float> model(mc, batch, mc.max_seq);
  load_hf_params(model_dir, mc, model.table(), model.params());
  const ExtractionReport rep = measure_extraction(model, docs, doc_files, opt);
  out << rep.table();
  if (!json_out.empty()) {
    write_file_atomic(json_out, rep.to_json().dump(2) + "\n");
    out << "wrote " << json_out << "\n";
  }
}

}  // namespace tetrad
