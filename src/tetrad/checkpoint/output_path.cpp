#include "tetrad/checkpoint/output_path.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/core/error.hpp"

namespace fs = std::filesystem;

namespace tetrad {

namespace {

bool is_run_folder(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir / "checkpoints", ec) || fs::exists(dir / "train.lock", ec) ||
         fs::exists(dir / "metrics.jsonl", ec);
}

std::string strip_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

}  // namespace

std::string enclosing_run_folder(const std::string& path_in) {
  const std::string path = path_in.empty() ? "." : path_in;
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::absolute(path, ec).lexically_normal();
  for (;;) {
    if (fs::is_directory(p, ec) && is_run_folder(p)) return p.string();
    if (!p.has_relative_path()) return "";
    p = p.parent_path();
  }
}

void check_reader_output(const std::string& path_in, bool overwrite, bool is_folder,
                         const std::string& command, const std::string& flag) {
  const std::string path = strip_slashes(path_in);
  const std::string what = is_folder ? "folder" : "file";
  std::string where = is_folder ? path : fs::path(path).parent_path().string();
  if (where.empty()) where = ".";
  const std::string run = enclosing_run_folder(where);
  if (!run.empty())
    fail(command, " ", flag, " '", path, "' is ",
         fs::weakly_canonical(fs::absolute(path)).string() == run ? "the run folder '"
                                                                  : "inside the run folder '",
         run, "': a run folder belongs to its trainer, and ", command,
         " never writes into one (its checkpoints, metrics.jsonl and train.lock would be "
         "replaced). Write the ", what, " outside it (", flag, " ",
         fs::path(run).filename().string() + (is_folder ? "-hf" : "-report.html"), ")");
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (!fs::exists(st)) return;
  if (fs::is_directory(st)) {
    if (!is_folder)
      fail(command, " ", flag, " '", path, "' is a folder; give the path of the file to write");
    if (fs::is_empty(path, ec)) return;
    const bool model = fs::exists(fs::path(path) / "config.json", ec) ||
                       fs::exists(fs::path(path) / "model.safetensors", ec);
    if (!model)
      fail(command, " ", flag, " '", path, "' is a folder that holds other things than a model "
           "(no config.json or model.safetensors); not replacing it, even with --overwrite. "
           "Choose a new folder or an empty one");
    if (!overwrite)
      fail(command, " ", flag, " '", path, "' already holds a model (config.json); not replacing "
           "it. Pass --overwrite to replace it, or choose another ", flag);
    return;
  }
  if (is_folder)
    fail(command, " ", flag, " '", path, "' exists and is not a folder; choose another ", flag);
  if (!fs::is_regular_file(st))
    fail(command, " ", flag, " '", path, "' exists and is not a regular file; choose another ",
         flag);
  if (!overwrite)
    fail(command, " ", flag, " '", path, "' already exists; not replacing it. Pass --overwrite to "
         "replace it, or choose another ", flag);
}

std::string make_temp_sibling(const std::string& dest) {
  const std::string d = strip_slashes(dest);
  const fs::path parent = fs::path(d).parent_path();
  std::error_code ec;
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) fail("cannot create the folder '", parent.string(), "': ", ec.message());
  }
  std::string templ = d + ".tmp-XXXXXX";
  if (!::mkdtemp(templ.data()))
    fail("cannot create a temporary folder beside '", d, "': ", std::strerror(errno));
  ::chmod(templ.c_str(), 0755);
  return templ;
}

void publish_new_dir(const std::string& tmp_dir, const std::string& dir_in) {
  const std::string dir = strip_slashes(dir_in);
  int rc = ::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, dir.c_str(), RENAME_NOREPLACE);
  if (rc != 0 && errno == EINVAL) {  // a file system without RENAME_NOREPLACE
    std::error_code ec;
    rc = fs::exists(dir, ec) ? (errno = EEXIST, -1) : ::rename(tmp_dir.c_str(), dir.c_str());
  }
  if (rc != 0) {
    const int err = errno;
    if (err == EEXIST)
      fail("'", dir, "' appeared while it was being written (another command or a trainer made "
           "it); not replacing it. Run the command again to see what is there");
    fail("cannot rename '", tmp_dir, "' to '", dir, "': ", std::strerror(err));
  }
  const fs::path parent = fs::path(dir).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());
}

}  // namespace tetrad
