// The exclusive lock a trainer holds on its run folder for the run's life (RUN_DIR/train.lock),
// a FileLock (core/file_lock.hpp) with the run folder's messages. `import --overwrite` takes it
// too, so no trainer runs in a folder it replaces.
//
// Two trainers writing one run folder destroy each other's checkpoints (each prunes and cleans
// the other's in-progress save), so a second one is refused, naming the holder. The lock is the
// file RUN_DIR/train.lock, held open with flock(LOCK_EX) and holding "pid host start-time": the
// kernel releases the flock when the holder dies however it dies, and the recorded pid and host
// let a later trainer tell a live holder from a stale file when the flock cannot tell (a file
// system without flock, or a holder on another host): on this host a pid that no longer runs, or
// now runs a different process (another start time), is stale and taken over; a holder on
// another host is refused with its name (delete the file if that job is gone).
//
// Released (file removed, flock dropped) by the destructor: on a normal return, an Error
// unwinding, or exit after a signal. A SIGKILL leaves the file; the next trainer finds it stale.
//
// Read-only commands never take this lock and never write into a run folder; they read only
// published checkpoints (the one `latest` names, else the newest complete step_* folder).
#pragma once
#include <memory>
#include <string>

#include "tetrad/core/file_lock.hpp"

namespace tetrad {

class RunLock {
 public:
  // Takes the lock on run_dir (created if missing). Throws Error naming the holder when another
  // live process holds it. `took_over` (if given) is set to a line describing a stale lock
  // taken over, or "" if there was none.
  explicit RunLock(const std::string& run_dir, std::string* took_over = nullptr);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  const std::string& path() const;

  // "pid 1234 on host node7" from a lock file's content, for messages.
  static std::string describe_holder(const std::string& lock_file_content);

 private:
  std::unique_ptr<FileLock> lock_;  // the mechanism (core/file_lock.hpp)
};

}  // namespace tetrad
