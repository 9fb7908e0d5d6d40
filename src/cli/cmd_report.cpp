// `tetrad report`: one self-contained HTML page of a run (tools/report), and where a trace is
// there, where the exposed communication went.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/output_path.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/signals.hpp"
#include "tetrad/tools/report.hpp"

namespace fs = std::filesystem;

namespace tetrad::cli {

namespace {

struct Options {
  std::string run_dir, out, trace;
  bool overwrite = false;
};

void run(const Options& o) {
  const AbandonOnSignal stop("report");  // SIGINT/SIGTERM: the unfinished output goes
  std::string name = fs::path(o.run_dir).lexically_normal().filename().string();
  if (name.empty() || name == ".")
    name = fs::absolute(o.run_dir).lexically_normal().parent_path().filename().string();
  const std::string path = o.out.empty() ? (name.empty() ? "run" : name) + "-report.html" : o.out;
  const std::string trace = o.trace.empty() && fs::exists(o.run_dir + "/trace.json")
                                ? o.run_dir + "/trace.json" : o.trace;
  check_reader_output(path, o.overwrite, false, "report", "-o");
  // Written beside -o and renamed into place: over the file only if it was there when checked
  // (--overwrite); one that appears meanwhile (another report) is refused, never replaced.
  std::error_code ec;
  const bool existed = fs::exists(path, ec);
  const std::string tmp = make_temp_sibling(path, "report");
  try {
    const std::string page = (fs::path(tmp) / "report.html").string();
    write_run_report(o.run_dir, page, trace);
    check_abandon();
    if (existed) {
      if (::rename(page.c_str(), path.c_str()) != 0)
        fail("cannot rename '", page, "' to '", path, "': ", std::strerror(errno));
    } else {
      publish_new_dir(page, path);  // renameat2 RENAME_NOREPLACE: a file as well as a folder
    }
  } catch (...) {
    abandon_temp_sibling(tmp, path);
  }
  fs::remove_all(tmp, ec);
  std::cout << "wrote " << path << "\n";
  if (!trace.empty()) {
    int ranks = 0;
    const auto rows = exposed_communication(trace, &ranks);
    std::cout << "exposed communication by collective (" << trace << ", per rank of " << ranks
              << "):\n";
    for (const auto& r : rows)
      std::printf("  %-40s %8.1f waits %10.1f ms %5.1f%%\n", r.what.c_str(), r.count,
                  r.seconds * 1e3, 100 * r.share);
  }
}

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("run_dir", o->run_dir, "run folder (metrics.jsonl, config.toml)")->required();
  sub.add_option("-o,--out", o->out,
                 "output file (default NAME-report.html in the current folder, NAME the run "
                 "folder's name: report never writes into a run folder, and replaces an existing "
                 "file only with --overwrite)");
  sub.add_flag("--overwrite", o->overwrite, "replace an existing file at -o");
  sub.add_option("--trace", o->trace,
                 "trace of the run (`tetrad train --trace`; default RUN_DIR/trace.json if it "
                 "exists): adds where the exposed communication went");
  return [o](Context&) { run(*o); };
}

}  // namespace

const Command report_command{
    "report", "one self-contained HTML page of a run: loss curves, speed, time breakdown, config",
    false, &setup};

}  // namespace tetrad::cli
