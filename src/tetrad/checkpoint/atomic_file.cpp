#include "tetrad/checkpoint/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "tetrad/core/error.hpp"
#include "tetrad/core/signals.hpp"

namespace fs = std::filesystem;

namespace tetrad {
namespace {

std::string errno_text() { return std::strerror(errno); }

std::string parent_of(const std::string& path) {
  fs::path p = fs::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

void write_all(int fd, const void* data, size_t size, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write '", what, "': ", errno_text());
    }
    p += n;
    size -= size_t(n);
  }
}

void fsync_fd(int fd, const std::string& what) {
  if (::fsync(fd) != 0) fail("cannot fsync '", what, "': ", errno_text());
}

}  // namespace

AtomicFile::AtomicFile(std::string path, bool direct) : path_(std::move(path)), direct_(direct) {
  if (direct_) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create '", path_, "': ", errno_text());
    tmp_path_ = path_;
    return;
  }
  std::string templ = path_ + ".tmp-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  fd_ = ::mkstemp(buf.data());
  if (fd_ < 0) fail("cannot create a temporary file for '", path_, "': ", errno_text());
  tmp_path_ = buf.data();
  ::fchmod(fd_, 0644);  // mkstemp makes 0600; checkpoints are meant to be shared
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_path_.empty()) ::unlink(tmp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t size) {
  TETRAD_CHECK(fd_ >= 0, "write after commit");
  check_abandon();  // a command stopped by a signal abandons its output (core/signals.hpp)
  write_all(fd_, data, size, tmp_path_);
}

void AtomicFile::start_writeback(int64_t offset, int64_t size) {
  TETRAD_CHECK(fd_ >= 0, "start_writeback after commit");
#ifdef SYNC_FILE_RANGE_WRITE
  // Only a hint: the final fsync in commit() is what makes the data durable.
  ::sync_file_range(fd_, offset, size, SYNC_FILE_RANGE_WRITE);
#else
  (void)offset;
  (void)size;
#endif
}

void AtomicFile::commit() {
  TETRAD_CHECK(fd_ >= 0, "commit twice");
  fsync_fd(fd_, tmp_path_);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close '", tmp_path_, "': ", errno_text());
  if (direct_) {
    tmp_path_.clear();
    return;
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    fail("cannot rename '", tmp_path_, "' to '", path_, "': ", errno_text());
  tmp_path_.clear();
  fsync_dir(parent_of(path_));
}

void write_file_atomic(const std::string& path, std::string_view content) {
  AtomicFile f(path);
  f.write(content.data(), content.size());
  f.commit();
}

void write_file_synced(const std::string& path, std::string_view content) {
  AtomicFile f(path, /*direct=*/true);
  f.write(content.data(), content.size());
  f.commit();
}

void copy_file_synced(const std::string& src, const std::string& dst) {
  int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) fail("cannot open '", src, "' for reading: ", errno_text());
  int out = ::open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    ::close(in);
    fail("cannot create '", dst, "': ", errno_text());
  }
  try {
    std::vector<char> buf(1 << 20);
    for (;;) {
      ssize_t n = ::read(in, buf.data(), buf.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("cannot read '", src, "': ", errno_text());
      }
      if (n == 0) break;
      write_all(out, buf.data(), size_t(n), dst);
    }
    fsync_fd(out, dst);
  } catch (...) {
    ::close(in);
    ::close(out);
    throw;
  }
  ::close(in);
  if (::close(out) != 0) fail("cannot close '", dst, "': ", errno_text());
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory '", dir, "' to fsync it: ", errno_text());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems do not support fsync on directories (EINVAL); the rename is still done.
  if (rc != 0 && err != EINVAL) fail("cannot fsync directory '", dir, "': ", std::strerror(err));
}

void replace_dir(const std::string& tmp_dir, const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (::rename(tmp_dir.c_str(), dir.c_str()) != 0)
      fail("cannot rename '", tmp_dir, "' to '", dir, "': ", errno_text());
  } else if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    // tmp_dir now holds the old content: marked, so that a kill while it is deleted leaves a
    // folder no reader takes for a model.
    // (Killed before the mark is written, it is the old complete output, unmarked: still whole.)
    if (std::FILE* f = std::fopen((fs::path(tmp_dir) / kUnfinishedMarker).c_str(), "w")) {
      std::fputs("the old content of a folder that was replaced, being deleted\n", f);
      std::fclose(f);
    }
    remove_marked_dir(tmp_dir);
  } else {
    // No atomic exchange here: move the old folder aside, then the new one in. A crash between
    // the two renames leaves the complete new folder under its temporary name and the old one
    // under `.old-`; both are visible to a person, neither is half-written.
    std::string old = dir + ".old-" + std::to_string(::getpid());
    fs::remove_all(old, ec);
    if (::rename(dir.c_str(), old.c_str()) != 0)
      fail("cannot move '", dir, "' aside to replace it: ", errno_text());
    if (::rename(tmp_dir.c_str(), dir.c_str()) != 0)
      fail("cannot rename '", tmp_dir, "' to '", dir, "': ", errno_text());
    fs::remove_all(old, ec);
  }
  fsync_dir(parent_of(dir));
}

bool remove_marked_dir(const std::string& dir) {
  std::error_code ec;
  // fs::remove_all's order is the directory's, so the mark could go first and leave an
  // unmarked half of a model behind a kill; here it goes last.
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename() == kUnfinishedMarker) continue;
    std::error_code ec2;
    fs::remove_all(e.path(), ec2);
  }
  std::error_code ec3;
  fs::remove((fs::path(dir) / kUnfinishedMarker), ec3);
  fs::remove(dir, ec3);
  return !fs::exists(dir, ec3);
}

void refuse_unfinished(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(path.empty() ? "." : path), ec).lexically_normal();
  if (ec) return;
  for (;;) {
    const fs::path marker = p / kUnfinishedMarker;
    if (fs::exists(marker, ec)) {
      std::string what;
      try {
        what = read_small_file(marker.string());
      } catch (const Error&) {
      }
      while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
      fail("'", p.string(), "' is unfinished output", what.empty() ? std::string() : " (" + what + ")",
           ": a command writing it was interrupted, or is still writing it. Not reading it; the "
           "next run of that command removes it (or delete it)");
    }
    const fs::path up = p.parent_path();
    if (up == p || up.empty()) return;
    p = up;
  }
}

std::string read_small_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot open '", path, "' for reading: ", errno_text());
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  bool err = std::ferror(f);
  std::fclose(f);
  if (err) fail("error reading '", path, "'");
  return s;
}

}  // namespace tetrad
