// When a training run stops early: SIGINT/SIGTERM/SIGUSR1 (and Open MPI's SIGCONT notice, as
// recorded by core/signals' StopSignals) end it at the same step on every rank with a final
// checkpoint; the watchdog ends the job when a
// phase (a step, a validation pass, a checkpoint) stalls; a step hook, injected by the caller
// (tests: a rank that hangs in a given step, tests/mpi/watchdog.sh), runs at the start of every
// step. Nothing here reads the environment except StopSignals' Open MPI detection, given in.
//
// Not thread-safe: one instance, called from the training loop's thread.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>

#include "tetrad/comm/communicator.hpp"
#include "tetrad/core/signals.hpp"
#include "tetrad/train/watchdog.hpp"

namespace tetrad {

// Called at the start of step `step` (1-based) on rank `rank`, after the watchdog is armed.
using StepHook = std::function<void(int rank, int64_t step)>;

// "RANK:STEP" (the test hook TETRAD_TEST_STALL_AT): a hook that makes that rank hang in that
// step, as a stuck kernel or file system would; an empty or malformed text gives no hook.
StepHook stall_hook(const std::string& rank_colon_step);

class StopControl {
 public:
  // The signals are recorded by a StopSignals the caller made before the run's first large
  // allocation (train(): right after the thread count is set, so a SIGTERM during start-up is a
  // stop request like any other) and keeps alive as long as this.
  StopControl(double step_timeout_s, const comm::Communicator& world, StepHook hook);

  // Root's note when mpirun's kill timeout leaves too little time for a final checkpoint
  // (sigkill_timeout: OMPI_MCA_odls_base_sigkill_timeout, "" when unset).
  static void note_kill_grace(const std::string& sigkill_timeout, std::ostream& out);

  void begin_step(int64_t step);  // arms the watchdog for step `step` (1-based), runs the hook
  void arm(int64_t step, const char* phase) { watchdog_.arm(step, phase); }
  void disarm() { watchdog_.disarm(); }
  Watchdog& watchdog() { return watchdog_; }

  // Collective: the signal any rank received (0: none), so every rank stops at the same step.
  int agreed_signal() const;
  // "received SIGTERM: writing a final checkpoint and stopping at step N\n"
  static std::string stop_line(int sig, int64_t step);

 private:
  const comm::Communicator& world_;
  Watchdog watchdog_;
  StepHook hook_;
};

}  // namespace tetrad
