// `tetrad tokenize`: the token ids of each line of standard input (or, --decode, the reverse).
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/command.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/data/tokenizer.hpp"

namespace fs = std::filesystem;

namespace tetrad::cli {

namespace {

struct Options {
  std::string path;
  bool decode = false;
};

// Standard input line by line (without its '\n' and a '\r' before it).
void run(Context& ctx, const Options& o) {
  std::string where = o.path;
  if (fs::is_directory(o.path) && fs::exists(o.path + "/checkpoints"))
    where = ctx.resolve_model_dir(o.path);
  const data::Tokenizer tok = data::Tokenizer::load(where);
  std::ios::sync_with_stdio(false);
  std::string line, out;
  uint64_t number = 0;
  while (std::getline(std::cin, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out.clear();
    if (!o.decode) {
      const std::vector<int32_t> ids = tok.encode(line);
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ' ';
        out += std::to_string(ids[i]);
      }
    } else {
      std::vector<int32_t> ids;
      std::istringstream ss(line);
      for (std::string item; ss >> item;) {
        size_t used = 0;
        long long v = -1;
        try {
          v = std::stoll(item, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != item.size() || v < 0 || v >= tok.vocab_size())
          fail("standard input line ", number, ": '", item, "' is not a token id of this tokenizer (0..",
               tok.vocab_size() - 1, ")");
        ids.push_back(int32_t(v));
      }
      out = tok.decode(ids);
    }
    out += '\n';
    std::cout.write(out.data(), std::streamsize(out.size()));
  }
  if (std::cin.bad()) fail("error reading standard input");
  std::cout.flush();
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("--tokenizer", o->path,
                 "tokenizer.json, SentencePiece .model, or a model, data or run folder "
                 "holding one")->required();
  sub.add_flag("--decode", o->decode, "the reverse: lines of space-separated ids in, their text out");
  return [o](Context& ctx) { run(ctx, *o); };
}

}  // namespace

const Command tokenize_command{
    "tokenize", "token ids of each line of standard input, one output line each (no BOS/EOS)",
    false, &setup};

}  // namespace tetrad::cli
