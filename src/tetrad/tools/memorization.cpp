#include "tetrad/tools/memorization.hpp"

#include <mpi.h>

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
#include "tetrad/data/loader.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/model/sampling.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"

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

std::vector<size_t> plan_extraction(ExtractionReport& rep,
                                    const std::vector<std::vector<int32_t>>& documents,
                                    const std::vector<std::string>& names,
                                    const ExtractionOptions& opt, int max_len, int V) {
  const int P = opt.prefix_len, N = opt.suffix_len;
  if (P < 1 || N < 1 || opt.batch < 1)
    fail("extraction needs prefix_len >= 1, suffix_len >= 1 and batch >= 1 (got ", P, ", ", N,
         ", ", opt.batch, ")");
  if (!names.empty() && names.size() != documents.size())
    fail("extraction: ", names.size(), " names for ", documents.size(), " documents");
  if (P + N > max_len)
    fail("extraction: prefix ", P, " + suffix ", N, " = ", P + N,
         " tokens exceeds the model's maximum length ", max_len,
         "; use a shorter prefix or suffix");
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
  return todo;
}

void score_document(DocumentResult& d, const std::vector<int32_t>& doc,
                    const std::vector<int32_t>& generated, int P, int N) {
  const std::vector<int32_t> truth(doc.begin() + P, doc.begin() + P + N);
  d.exact = exact_match(generated, truth);
  d.token_match = token_match_rate(generated, truth);
  d.rouge_l = rouge_l(generated, truth);
}

void summarize_extraction(ExtractionReport& rep) {
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
}

// On a grid, documents are dealt out like training sequences: over the Z and data axes (the
// ranks of one (z, d) slot hold the same sequences, split over X and Y as the model is). Every
// rank runs the same number of rounds (a slot with fewer documents left pads with a copy of a
// prompt and drops the result), so the collectives line up.
ExtractionReport measure_extraction(parallel::ParallelTransformer& model,
                                    const std::vector<std::vector<int32_t>>& documents,
                                    const std::vector<std::string>& names,
                                    const ExtractionOptions& opt) {
  ExtractionReport rep;
  const std::vector<size_t> todo = plan_extraction(rep, documents, names, opt, model.max_len(),
                                                   model.config().vocab_size);
  const int P = opt.prefix_len, N = opt.suffix_len;
  const parallel::ProcessGroups& g = model.groups();
  const int slots = token_slots(g.shape);
  const int slot = token_slot(g.coord, g.shape);
  const int B = model.local_batch();
  const size_t per_round = size_t(slots) * size_t(B);
  const size_t rounds = (todo.size() + per_round - 1) / per_round;
  // Generated suffixes of all evaluated documents, written by the (x0, y0) rank of the slot that
  // decoded them and summed over the world (everybody else contributes zeros).
  std::vector<int32_t> generated(todo.size() * size_t(N), 0);
  const bool writer = g.coord.x() == 0 && g.coord.y() == 0;
  for (size_t round = 0; round < rounds; ++round) {
    const size_t first = round * per_round + size_t(slot) * B;
    std::vector<std::vector<int32_t>> prompts(B);
    for (int b = 0; b < B; ++b) {
      const size_t k = first + size_t(b);
      const auto& doc = documents[todo[k < todo.size() ? k : 0]];
      prompts[b].assign(doc.begin(), doc.begin() + P);
    }
    const auto gen = generate_greedy_batch(model, prompts, N);  // KV cache on the grid
    for (int b = 0; b < B; ++b) {
      const size_t k = first + size_t(b);
      if (!writer || k >= todo.size()) continue;
      std::copy(gen[b].begin(), gen[b].end(), generated.begin() + k * N);
    }
  }
  if (g.world.size() > 1) g.world.allreduce_sum(generated.data(), generated.size());
  for (size_t k = 0; k < todo.size(); ++k) {
    const std::vector<int32_t> gen(generated.begin() + k * N, generated.begin() + (k + 1) * N);
    score_document(rep.docs[todo[k]], documents[todo[k]], gen, P, N);
  }
  summarize_extraction(rep);
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

// Windows of `len` tokens at evenly spaced window positions of a prepared split.
std::vector<std::vector<int32_t>> sample_windows(const std::string& dir, const std::string& split,
                                                 int samples, int len, int64_t model_vocab,
                                                 std::vector<std::string>& names) {
  data::LoaderOptions lo;
  lo.model_vocab = model_vocab;
  lo.shuffle = false;
  data::DataLoader loader(dir, split, 1, len - 1, 0, 1, 0, lo);
  const uint64_t n = loader.num_windows();
  if (uint64_t(samples) > n)
    fail("memorization: --samples ", samples, " but split '", split, "' of '", dir, "' has only ",
         n, " windows of ", len, " tokens");
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> in(size_t(len - 1)), tgt(size_t(len - 1));
  for (int i = 0; i < samples; ++i) {
    const uint64_t w = uint64_t(i) * n / uint64_t(samples);
    loader.restore({0, w});
    loader.next_batch(in.data(), tgt.data());
    std::vector<int32_t> doc(in);
    doc.push_back(tgt.back());
    out.push_back(std::move(doc));
    names.push_back(split + " window " + std::to_string(w));
  }
  return out;
}

void run_memorization_command(const MemorizationCommand& cmd, std::ostream& log) {
  const ExtractionOptions& opt = cmd.opt;
  if (cmd.doc_files.empty() && cmd.samples <= 0)
    fail("memorization: no documents: give document files and/or --data DIR --samples N");
  if (cmd.samples > 0 && cmd.data_dir.empty())
    fail("memorization: --samples needs --data (a folder written by `tetrad prepare`)");
  int mpi_ready = 0, world = 1;
  MPI_Initialized(&mpi_ready);
  if (mpi_ready) MPI_Comm_size(MPI_COMM_WORLD, &world);
  const bool on_grid = world > 1 || !cmd.grid.empty();
  const std::string grid = cmd.grid.empty() ? "1,1,1," + std::to_string(world) : cmd.grid;
  parallel::ProcessGroups groups =
      on_grid ? parallel::ProcessGroups(comm::Communicator::world(), parallel::parse_grid(grid))
              : parallel::ProcessGroups();
  std::ostream null_stream(nullptr);
  std::ostream& out = groups.world.rank() == 0 ? log : null_stream;

  const ModelConfig mc = read_hf_config(cmd.model_dir);
  const std::string tok_path = data::find_tokenizer_file(cmd.model_dir);
  if (tok_path.empty())
    fail("model folder '", cmd.model_dir, "' has no tokenizer.model or tokenizer.json to encode the "
         "documents with");
  const auto tok = data::Tokenizer::load(tok_path);
  if (tok.vocab_size() > mc.vocab_size)
    fail("tokenizer in '", cmd.model_dir, "' has ", tok.vocab_size(),
         " pieces but the model's vocabulary is ", mc.vocab_size);

  std::vector<std::vector<int32_t>> docs;
  std::vector<std::string> names;
  for (const auto& f : cmd.doc_files) {
    docs.push_back(tok.encode(read_text_file(f)));
    names.push_back(f);
  }
  if (cmd.samples > 0) {
    auto windows = sample_windows(cmd.data_dir, cmd.split, cmd.samples,
                                  opt.prefix_len + opt.suffix_len, mc.vocab_size, names);
    for (auto& w : windows) docs.push_back(std::move(w));
  }

  // The one model on every grid; without one, the trivial 1x1x1x1 grid (the same code).
  const int slots = token_slots(groups.shape);
  const int per_slot = int((docs.size() + size_t(slots) - 1) / size_t(slots));
  const int local_batch = std::max(1, std::min(opt.batch, per_slot));
  const int max_len = std::min(mc.max_seq, opt.prefix_len + opt.suffix_len);
  parallel::ParallelOptions po;
  po.precision = backend::Precision::FP32;
  po.recompute = parallel::Recompute::Full;  // forward only: one layer's scratch (inference.hpp)
  parallel::ParallelTransformer model(mc, groups, local_batch, max_len, po);
  load_hf_params_streamed(cmd.model_dir, mc, model.table(),
                          [&](size_t i, const float* data) { model.set_tensor(i, data); });
  if (on_grid)
    out << "extraction on grid " << grid << " (x,y,z,d): " << local_batch
        << " documents per rank at a time\n";
  const ExtractionReport rep = measure_extraction(model, docs, names, opt);
  out << rep.table();
  if (!cmd.json_out.empty() && groups.world.rank() == 0) {
    write_file_atomic(cmd.json_out, rep.to_json().dump(2) + "\n");
    out << "wrote " << cmd.json_out << "\n";
  }
}

}  // namespace tetrad
