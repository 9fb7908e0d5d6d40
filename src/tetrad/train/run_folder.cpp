#include "tetrad/train/run_folder.hpp"

#include <cctype>
#include <exception>
#include <filesystem>
#include <ostream>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/core/error.hpp"

namespace fs = std::filesystem;

namespace tetrad {

std::string latest_checkpoint_name(const std::string& run_dir, const std::vector<int64_t>& steps) {
  const std::string latest = run_dir + "/checkpoints/latest";
  std::error_code ec;
  if (fs::exists(latest, ec)) {
    try {
      std::string name = read_small_file(latest);
      while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
      if (!name.empty()) return name;
    } catch (const Error&) {
    }
  }
  return steps.empty() ? std::string() : checkpoint_folder_name(steps.front());
}

void claim_run_folder(const std::string& run_dir, const ClaimOptions& opt, std::ostream& out) {
  if (opt.resume && opt.overwrite)
    fail("--resume and --overwrite contradict each other: --resume continues the run in ", run_dir,
         ", --overwrite deletes it");
  const std::vector<int64_t> steps = checkpoint_steps(run_dir);
  if (!opt.resume && !steps.empty()) {
    std::string list;
    for (size_t i = 0; i < steps.size() && i < 5; ++i) list += (i ? ", " : "") + std::to_string(steps[i]);
    if (steps.size() > 5) list += ", ...";
    const std::string latest = latest_checkpoint_name(run_dir, steps);
    if (!opt.overwrite)
      fail("run folder '", run_dir, "' already holds a trained run: checkpoints of step(s) ", list,
           ", the latest ", run_dir, "/checkpoints/", latest,
           ". Not overwriting it. To continue that run pass --resume; to start another run set "
           "run.dir to a new folder (--set run.dir=...); to delete it and start afresh pass --overwrite");
    out << "overwrite: deleting the run in " << run_dir << " (checkpoints of step(s) " << list
        << ", metrics.jsonl) and starting afresh\n";
    const fs::path ck = fs::path(run_dir) / "checkpoints", gone = fs::path(run_dir) / "checkpoints.pruning";
    std::error_code ec;
    fs::remove_all(gone, ec);
    fs::rename(ck, gone, ec);
    if (ec) fail("cannot move '", ck.string(), "' out of the way: ", ec.message());
    fs::remove_all(gone, ec);
    if (ec) fail("cannot delete '", gone.string(), "': ", ec.message());
    fs::remove(fs::path(run_dir) / "metrics.jsonl", ec);
  }
  std::error_code ec;
  if (fs::exists(fs::path(run_dir) / "checkpoints.pruning", ec)) {
    fs::remove_all(fs::path(run_dir) / "checkpoints.pruning", ec);
    if (ec) fail("cannot delete '", run_dir, "/checkpoints.pruning' (left by an interrupted --overwrite): ",
                 ec.message());
  }
  clean_run_folder(run_dir, out);
}

namespace {

fs::path normalized(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(dir), ec).lexically_normal();
  if (ec) return {};
  if (!p.has_filename() && p != p.root_path()) p = p.parent_path();  // a trailing slash
  return p;
}

// The outermost folder on the way to `dir` that does not exist yet ("" if `dir` exists).
std::string first_missing(const std::string& dir) {
  std::error_code ec;
  std::string missing;
  for (fs::path p = normalized(dir); !p.empty() && !fs::exists(p, ec) && !ec;) {
    missing = p.string();
    const fs::path up = p.parent_path();
    if (up == p) break;
    p = up;
  }
  return missing;
}

// True when `dir` holds nothing but (possibly nested) empty folders; removes those and `dir`.
bool remove_if_only_empty_folders(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(dir, ec))) return false;
  bool empty = true;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (!remove_if_only_empty_folders(e.path())) empty = false;
  if (ec || !empty) return false;
  return fs::remove(dir, ec) && !ec;
}

}  // namespace

RunFolder::~RunFolder() {
  if (created_.empty()) return;
  lock_.reset();  // its file goes first
  // Only while the run never got under way: config.toml, metrics.jsonl and checkpoints are files.
  try {
    const fs::path top(created_);
    for (fs::path p = normalized(dir_); !p.empty();) {
      if (!remove_if_only_empty_folders(p) || p == top) break;
      const fs::path up = p.parent_path();
      if (up == p) break;
      p = up;
    }
  } catch (...) {  // a folder that cannot be listed: left as it is
  }
}

RunFolder::RunFolder(const std::string& run_dir, const std::string& resolved,
                     const ClaimOptions& opt, const comm::Communicator& world, std::ostream& out)
    : dir_(run_dir), resolved_(resolved) {
  int refused = 0;
  std::exception_ptr why;
  if (world.rank() == 0) {
    try {
      created_ = first_missing(run_dir);
      std::string took_over;
      lock_ = std::make_unique<RunLock>(run_dir, &took_over);
      if (!took_over.empty()) out << took_over << "\n";
      claim_run_folder(run_dir, opt, out);
      if (!opt.quiet) out << "# resolved configuration (saved to " << run_dir << "/config.toml)\n"
                          << resolved << "\n";
    } catch (const Error&) {
      refused = 1;
      why = std::current_exception();
    }
  }
  if (world.size() > 1) world.broadcast(&refused, 1, 0);
  if (refused) {
    if (why) std::rethrow_exception(why);
    fail("rank 0 refused the run folder ", run_dir, " (see its message)");
  }
}

void RunFolder::write_config() const {
  if (lock_) write_file_atomic(dir_ + "/config.toml", resolved_);
}

}  // namespace tetrad
