// `tetrad memorization`: extraction of training text, greedy continuation of each document's
// prefix (tools/memorization).
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/tools/memorization.hpp"

namespace tetrad::cli {

namespace {

struct Options {
  std::string model_dir;
  MemorizationCommand memo;
};

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  MemorizationCommand& m = o->memo;
  sub.add_option("-m,--model", o->model_dir, "model folder or run folder")->required();
  sub.add_option("--prefix", m.opt.prefix_len, "prefix tokens given")->capture_default_str();
  sub.add_option("--suffix", m.opt.suffix_len, "tokens generated and compared")->capture_default_str();
  sub.add_option("--batch", m.opt.batch, "documents decoded together (per rank)")->capture_default_str();
  sub.add_option("--json", m.json_out, "also write the report as JSON");
  sub.add_option("--data", m.data_dir,
                 "also take --samples windows of prefix+suffix tokens from this prepared data");
  sub.add_option("--split", m.split, "split of --data")->capture_default_str();
  sub.add_option("--samples", m.samples, "windows taken from --data, evenly spaced");
  sub.add_option("--grid", m.grid,
                 "process grid x,y,z,d under mpirun (default: all ranks on the data axis)");
  sub.add_option("docs", m.doc_files, "document files (one document each)");
  return [o](Context& ctx) {
    o->memo.model_dir = ctx.resolve_model_dir(o->model_dir);
    run_memorization_command(o->memo, std::cout);
  };
}

}  // namespace

const Command memorization_command{
    "memorization", "extraction of training text: greedy continuation of each document's prefix",
    true, &setup};

}  // namespace tetrad::cli
