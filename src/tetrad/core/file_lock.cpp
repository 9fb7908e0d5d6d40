#include "tetrad/core/file_lock.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tetrad/core/error.hpp"

namespace tetrad {

namespace {

// The process's start time in clock ticks since boot (/proc/PID/stat field 22), or "" when the
// process does not exist (or /proc is not there).
std::string process_start_time(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!f || !std::getline(f, s)) return "";
  // Field 2 (the command) is in parentheses and may contain spaces: count from the last ')'.
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream rest(s.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (rest >> field); ++i)
    if (i == 22) return field;
  return "";
}

// The process's state letter (/proc/PID/stat field 3: R, S, D, Z, ...), or 0 when it does not
// exist (or /proc is not there).
char process_state(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!f || !std::getline(f, s)) return 0;
  const size_t close = s.rfind(')');
  if (close == std::string::npos || close + 2 >= s.size()) return 0;
  return s[close + 2];
}

struct Holder {
  long pid = 0;
  std::string host, start;
};

Holder parse_holder(const std::string& text) {
  Holder h;
  std::istringstream in(text);
  for (std::string kv; in >> kv;) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "pid") h.pid = std::atol(v.c_str());
    else if (k == "host") h.host = v;
    else if (k == "start") h.start = v;
  }
  return h;
}

std::string read_fd(int fd) {
  std::string out;
  char buf[256];
  for (off_t off = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n <= 0) break;
    out.append(buf, size_t(n));
    off += n;
    if (out.size() > 4096) break;
  }
  return out;
}

// Whether the recorded holder is alive: true / false, on this host; on another host unknown
// (treated as alive by the caller).
bool holder_alive_here(const Holder& h) {
  if (h.pid <= 0) return false;
  if (::kill(pid_t(h.pid), 0) != 0 && errno == ESRCH) return false;
  // A zombie has exited (its files, the lock's included, are closed) and only waits for its
  // parent to reap it, which for the ranks of a killed mpirun job can take a while: kill(pid, 0)
  // still finds it, yet it holds nothing. (CkptCrash: a --resume right after kill -9 of a job's
  // ranks was refused, "which is still running".)
  const char state = process_state(h.pid);
  if (state == 'Z' || state == 'X') return false;
  const std::string start = process_start_time(h.pid);
  if (start.empty()) return ::kill(pid_t(h.pid), 0) == 0 || errno == EPERM;
  return h.start.empty() || start == h.start;  // another start time: the pid was reused
}

}  // namespace

std::string this_host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

std::string FileLock::describe_holder(const std::string& content) {
  const Holder h = parse_holder(content);
  if (h.pid <= 0) return "an unknown process (the lock file is empty or unreadable)";
  return "pid " + std::to_string(h.pid) + " on host " + (h.host.empty() ? "?" : h.host);
}

FileLock::FileLock(std::string path, const Refusal& refusal, std::string* took_over)
    : path_(std::move(path)) {
  if (took_over) took_over->clear();
  const std::string me_host = this_host_name();
  for (int attempt = 0; attempt < 20; ++attempt) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fail("cannot open the lock '", path_, "': ", std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string content = read_fd(fd);
      ::close(fd);
      if (err == EWOULDBLOCK) fail(refusal(Busy::Locked, describe_holder(content)));
      fail("cannot lock '", path_, "': ", std::strerror(err));
    }
    // The file may have been removed (released) between open and flock: then this flock is on a
    // deleted file that nobody else will see; start again.
    struct stat a {}, b {};
    if (::fstat(fd, &a) != 0 || ::stat(path_.c_str(), &b) != 0 || a.st_ino != b.st_ino ||
        a.st_dev != b.st_dev) {
      ::close(fd);
      continue;
    }
    // The flock is ours. The content says who held it before: a holder whose flock this file
    // system does not show (another host; flock not shared) may still be alive.
    const std::string content = read_fd(fd);
    const Holder prev = parse_holder(content);
    if (prev.pid > 0) {
      const bool here = prev.host == me_host;
      const bool alive = here ? holder_alive_here(prev) && prev.pid != long(::getpid()) : true;
      if (alive) {
        ::close(fd);
        fail(refusal(here ? Busy::Running : Busy::OtherHost, describe_holder(content)));
      }
      if (took_over) *took_over = describe_holder(content);
    }
    const std::string mine = "pid=" + std::to_string(::getpid()) + " host=" + me_host +
                             " start=" + process_start_time(::getpid()) + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, mine.data(), mine.size(), 0) != ssize_t(mine.size()) ||
        ::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      fail("cannot write the lock '", path_, "': ", std::strerror(err));
    }
    fd_ = fd;
    return;
  }
  fail("cannot lock '", path_, "': it keeps being replaced by another process");
}

FileLock::~FileLock() {
  if (fd_ < 0) return;
  // Remove while still holding the flock, so no one takes over a file that is about to vanish
  // (a waiter that opened it before finds its inode gone and starts again). Only our own file:
  // a holder that replaced the whole folder (import --overwrite, prepare) took its lock file with
  // it, and the path may now be a later holder's lock.
  struct stat a {}, b {};
  if (::fstat(fd_, &a) == 0 && ::stat(path_.c_str(), &b) == 0 && a.st_ino == b.st_ino &&
      a.st_dev == b.st_dev)
    ::unlink(path_.c_str());
  ::close(fd_);
}

}  // namespace tetrad
