#include "tetrad/checkpoint/run_lock.hpp"

#include <filesystem>

#include "tetrad/core/error.hpp"

namespace fs = std::filesystem;

namespace tetrad {

namespace {

std::string lock_path(const std::string& run_dir) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) fail("cannot create the run folder '", run_dir, "': ", ec.message());
  return (fs::path(run_dir) / "train.lock").string();
}

}  // namespace

std::string RunLock::describe_holder(const std::string& content) {
  return FileLock::describe_holder(content);
}

RunLock::RunLock(const std::string& run_dir, std::string* took_over) {
  const std::string path = lock_path(run_dir);
  std::string stale;
  lock_ = std::make_unique<FileLock>(
      path,
      [&](FileLock::Busy why, const std::string& holder) -> std::string {
        if (why == FileLock::Busy::Locked)
          return "run folder '" + run_dir + "' is in use: another trainer (" + holder + ") holds " +
                 path + ". Wait for it to finish, stop it, or train into another run.dir";
        return "run folder '" + run_dir + "' is in use: " + path + " names " + holder +
               (why == FileLock::Busy::Running ? ", which is still running"
                                               : ", which cannot be checked from this host") +
               ". If that trainer is gone, delete " + path + "; otherwise train into another run.dir";
      },
      &stale);
  if (took_over)
    *took_over = stale.empty() ? std::string()
                               : "run lock: " + path + " was left by " + stale +
                                     ", which is no longer running; taking it over";
}

RunLock::~RunLock() = default;

const std::string& RunLock::path() const { return lock_->path(); }

}  // namespace tetrad
