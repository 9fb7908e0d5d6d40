#include "tetrad/checkpoint/output_path.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <stdio.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/signals.hpp"

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
  // (Not `where = "."` on an empty string: GCC 12 -O3 warns -Wrestrict there, a false positive.)
  const std::string parent = is_folder ? path : fs::path(path).parent_path().string();
  const std::string where = parent.empty() ? std::string(".") : parent;
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

namespace {

std::mutex g_marks_mu;
std::map<std::string, int> g_marks;  // temporary folder -> its locked marker's descriptor

// Removes what interrupted commands left beside `d` (d.tmp-XXXXXX, marked, lock free).
void remove_leftovers(const std::string& d) {
  const fs::path dest(d);
  const fs::path parent = dest.parent_path().empty() ? fs::path(".") : dest.parent_path();
  const std::string prefix = dest.filename().string() + ".tmp-";
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) continue;
    std::error_code ec2;
    if (!fs::is_directory(fs::symlink_status(e.path(), ec2))) continue;
    // An empty one: a command killed between making it and marking it (or after moving its
    // output out). rmdir removes only an empty folder, so a folder another command is filling
    // stays (one that a command has just made and not yet marked goes: make_temp_sibling then
    // makes another).
    if (::rmdir(e.path().c_str()) == 0) {
      std::cerr << "tetrad: removed the empty folder '" << e.path().string()
                << "', left by an interrupted command\n";
      continue;
    }
    const std::string marker = (e.path() / kUnfinishedMarker).string();
    const int fd = ::open(marker.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;  // not marked: not ours to remove
    const bool gone = ::flock(fd, LOCK_EX | LOCK_NB) == 0;  // its writer no longer holds it
    std::string what;
    char buf[512];
    const ssize_t n = gone ? ::read(fd, buf, sizeof buf - 1) : 0;
    if (n > 0) what.assign(buf, size_t(n));
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    if (gone) {
      const bool removed = remove_marked_dir(e.path().string());
      std::cerr << "tetrad: removed '" << e.path().string() << "'"
                << (what.empty() ? std::string() : ", " + what) << (removed ? "" : ": failed, something remains")
                << "\n";
    }
    ::close(fd);
  }
}

}  // namespace

std::string make_temp_sibling(const std::string& dest, const std::string& command) {
  const std::string d = strip_slashes(dest);
  const fs::path parent = fs::path(d).parent_path();
  std::error_code ec;
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) fail("cannot create the folder '", parent.string(), "': ", ec.message());
  }
  remove_leftovers(d);
  std::string templ, marker;
  int fd = -1;
  // Another command's remove_leftovers may take the folder while it is still empty (ENOENT):
  // then a new one.
  for (int attempt = 0; fd < 0 && attempt < 8; ++attempt) {
    templ = d + ".tmp-XXXXXX";
    if (!::mkdtemp(templ.data()))
      fail("cannot create a temporary folder beside '", d, "': ", std::strerror(errno));
    ::chmod(templ.c_str(), 0755);
    marker = (fs::path(templ) / kUnfinishedMarker).string();
    fd = ::open(marker.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != ENOENT) break;
  }
  if (fd < 0 || ::flock(fd, LOCK_EX) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    fs::remove_all(templ, ec);
    fail("cannot mark the temporary folder '", templ, "': ", std::strerror(err));
  }
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  const std::string what = "unfinished output of `tetrad" + (command.empty() ? "" : " " + command) +
                           "` (pid " + std::to_string(::getpid()) + " on " + host + ") for '" + d + "'\n";
  if (::write(fd, what.data(), what.size()) < 0) {
  }
  std::lock_guard<std::mutex> lock(g_marks_mu);
  g_marks[templ] = fd;
  return templ;
}

void abandon_temp_sibling(const std::string& tmp_dir, const std::string& dest) {
  const bool removed = remove_marked_dir(tmp_dir);
  try {
    throw;
  } catch (const Interrupted& e) {
    throw Interrupted(e.signal, detail::concat(
        e.what(), ": ", removed ? "removed the unfinished '" + tmp_dir + "'"
                                : "could not remove all of the unfinished '" + tmp_dir +
                                      "' (readers refuse it; the next run removes it)",
        "; '", strip_slashes(dest), "' was not touched"));
  }
}

void seal_temp_sibling(const std::string& tmp_dir) {
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(g_marks_mu);
    auto it = g_marks.find(tmp_dir);
    if (it == g_marks.end()) return;
    fd = it->second;
    g_marks.erase(it);
  }
  const std::string marker = (fs::path(tmp_dir) / kUnfinishedMarker).string();
  if (::unlink(marker.c_str()) != 0 && errno != ENOENT) {
    const int err = errno;
    ::close(fd);
    fail("cannot remove the mark '", marker, "': ", std::strerror(err));
  }
  fsync_dir(tmp_dir);
  ::close(fd);  // the lock goes with it
}

void publish_new_dir(const std::string& tmp_dir, const std::string& dir_in) {
  const std::string dir = strip_slashes(dir_in);
  seal_temp_sibling(tmp_dir);
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
