// An exclusive lock held through a file for as long as its holder runs: the file is held open
// with flock(LOCK_EX) and holds "pid=... host=... start=..." of its holder. The kernel releases
// the flock when the holder dies however it dies; the recorded pid and host let a later taker tell
// a live holder from a stale file when the flock cannot tell (a file system without flock, or a
// holder on another host): on this host a pid that no longer runs, or now runs a different process
// (another start time), is stale and taken over; a holder on another host is refused.
//
// Released (file removed, flock dropped) by the destructor; a SIGKILL leaves the file, which the
// next taker finds stale. Users: RunLock (a trainer's run folder, checkpoint/run_lock.hpp) and the
// data folder lock of `prepare` (data/prepare.hpp), each with its own messages.
#pragma once
#include <functional>
#include <string>

namespace tetrad {

class FileLock {
 public:
  // Why another process keeps the lock: its flock is held (Locked), the file names a process of
  // this host that still runs (Running), or one of another host (OtherHost).
  enum class Busy { Locked, Running, OtherHost };
  // The message of the Error thrown when the lock is busy; `holder` is describe_holder's text.
  using Refusal = std::function<std::string(Busy why, const std::string& holder)>;

  // Takes the lock file `path` (created if missing; its folder must exist). Throws Error with
  // refusal's message when another live process holds it, or naming the path and the system
  // error. `took_over` (if given) is set to the description of a stale holder taken over, or "".
  FileLock(std::string path, const Refusal& refusal, std::string* took_over = nullptr);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  const std::string& path() const { return path_; }

  // "pid 1234 on host node7" from a lock file's content, for messages.
  static std::string describe_holder(const std::string& lock_file_content);

 private:
  std::string path_;
  int fd_ = -1;
};

// This host's name (gethostname).
std::string this_host_name();

}  // namespace tetrad
