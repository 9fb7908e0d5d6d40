#include "tetrad/train/stop_control.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <thread>

namespace tetrad {

StepHook stall_hook(const std::string& text) {
  int rank = -1;
  long long step = -1;
  if (text.empty() || std::sscanf(text.c_str(), "%d:%lld", &rank, &step) != 2) return {};
  return [rank, step](int r, int64_t s) {
    if (r == rank && s == step)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  };
}

// SIGINT/SIGTERM end the run with a final checkpoint (a scheduler's SIGTERM before the
// wall-clock limit loses no work). The handler never runs on this thread or its OpenMP team:
// a signal taken inside oneDNN's GEMM corrupts the heap (core/signals.hpp).
// Under Open MPI, a SIGCONT reaching a running rank is mpirun's first notice that it is ending
// the job (core/signals.hpp): stopping then, not at its SIGTERM, doubles the time to save.
StopControl::StopControl(double step_timeout_s, const comm::Communicator& world, StepHook hook)
    : world_(world),
      watchdog_(step_timeout_s, world.rank()),
      hook_(std::move(hook)) {}

// Under Open MPI's mpirun, Ctrl-C / SIGTERM to mpirun reaches the ranks as SIGCONT, then
// SIGTERM odls_base_sigkill_timeout seconds later, then SIGKILL as long again (default 1 s:
// 2 s from the notice to the kill, too short for a final checkpoint of most models); SIGUSR1
// is forwarded without a kill.
void StopControl::note_kill_grace(const std::string& sigkill_timeout, std::ostream& out) {
  const int grace = sigkill_timeout.empty() ? 1 : std::atoi(sigkill_timeout.c_str());
  if (grace < 10)
    out << "note: Ctrl-C or SIGTERM to mpirun gives the ranks " << 2 * grace
        << " s from its first notice to its SIGKILL (twice Open MPI's odls_base_sigkill_timeout), which may "
           "not be enough for the final checkpoint: launch with `mpirun --mca "
           "odls_base_sigkill_timeout 30 ...`, or stop with `kill -USR1 <mpirun pid>` (forwarded "
           "to every rank without a kill; docs/checkpoints.md, \"Stopping a run\")\n";
}

void StopControl::begin_step(int64_t step) {
  watchdog_.arm(step, "a training step");
  if (hook_) hook_(world_.rank(), step);
}

int StopControl::agreed_signal() const {
  int sig = StopSignals::received();
  if (world_.size() > 1) world_.allreduce_max(&sig, 1);
  return sig;
}

std::string StopControl::stop_line(int sig, int64_t step) {
  const char* name = sig == SIGTERM   ? "SIGTERM"
                     : sig == SIGUSR1 ? "SIGUSR1"
                     : sig == SIGCONT ? "SIGCONT from mpirun (it is ending the job; SIGTERM and SIGKILL follow)"
                                      : "SIGINT";
  return std::string("received ") + name + ": writing a final checkpoint and stopping at step " +
         std::to_string(step) + "\n";
}

}  // namespace tetrad
