// The run folder (run.dir) is this run's from claim to destruction: rank 0 holds its lock (a
// second trainer on the folder is refused), a folder that already holds a trained run is only
// continued (--resume) or, when asked (--overwrite), emptied, never silently overwritten; what an
// interrupted save or prune left is removed, and the resolved configuration is printed and, once
// the run is under way, written to run.dir/config.toml. Every rank agrees: when rank 0 refuses, every rank throws.
// A run refused before it got under way (a bad run.init_from, a memory or data check after the
// claim) leaves nothing it created: the folders it made for run.dir are removed again while they
// hold nothing but empty folders.
#pragma once
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "tetrad/checkpoint/run_lock.hpp"
#include "tetrad/comm/communicator.hpp"

namespace tetrad {

struct ClaimOptions {
  bool resume = false;     // continue the run the folder holds
  bool overwrite = false;  // delete the run the folder holds (refused together with resume)
  bool quiet = false;      // do not print the resolved configuration
};

class RunFolder {
 public:
  // Collective over `world`. resolved_config: the TOML written to run_dir/config.toml. Throws
  // Error on every rank when rank 0 refuses the folder.
  RunFolder(const std::string& run_dir, const std::string& resolved_config,
            const ClaimOptions& opt, const comm::Communicator& world, std::ostream& out);
  ~RunFolder();
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;
  const std::string& dir() const { return dir_; }
  // Rank 0 writes run_dir/config.toml: once the run is under way (a resume that is refused, for
  // another model or other data, leaves the folder's config.toml as it was).
  void write_config() const;

 private:
  std::string dir_, resolved_;
  std::string created_;  // rank 0: the outermost folder of run_dir this run created ("" if none)
  std::unique_ptr<RunLock> lock_;  // rank 0 only
};

// On rank 0, holding the lock: refuses or empties a folder holding a trained run (see above),
// then removes what an interrupted save, prune or overwrite left.
void claim_run_folder(const std::string& run_dir, const ClaimOptions& opt, std::ostream& out);

// The checkpoint a run folder's `latest` names, else its newest step folder ("" if none);
// steps: checkpoint_steps(run_dir), newest first.
std::string latest_checkpoint_name(const std::string& run_dir, const std::vector<int64_t>& steps);

}  // namespace tetrad
