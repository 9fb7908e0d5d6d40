#include "tetrad/train/watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "tetrad/comm/communicator.hpp"
#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/comm/roll_call.hpp"

namespace tetrad {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Watchdog::Watchdog(double timeout_s, int rank) : timeout_(timeout_s), rank_(rank) {
  if (timeout_ > 0) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::arm(int64_t step, const char* phase) {
  comm::set_activity(step, phase);  // named in this rank's answer to a roll call
  if (timeout_ <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
  step_ = step;
  phase_ = phase;
  deadline_ = now_s() + timeout_;
}

void Watchdog::disarm() {
  if (timeout_ <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  // The longest gap between two wakes since the last arm(): this process did not run (stopped,
  // e.g. by SIGSTOP, or not scheduled) for that long.
  double last_wake = now_s(), frozen = 0, seen_deadline = deadline_;
  while (!stop_) {
    // Wake at least a few times a second: deadlines move forward on every arm().
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    const double now = now_s();
    if (deadline_ != seen_deadline) seen_deadline = deadline_, frozen = 0;
    frozen = std::max(frozen, now - last_wake);
    last_wake = now;
    if (stop_ || !armed_ || now < deadline_) continue;
    // A rank blocked in a collective is waiting for a peer, not stalled itself: it gives the
    // stalled peer half a timeout more to report itself (naming the right rank) before it
    // reports what it waits on.
    std::string what;
    double waited = 0;
    const bool in_collective = comm::blocked_in_wait(&what, &waited);
    if (in_collective && now_s() < deadline_ + timeout_ / 2) continue;
    // This rank did not run itself (stopped, e.g. by SIGSTOP, or not scheduled) for most of the
    // step's timeout: it names itself, even where it waits in a collective. (Its peers' roll
    // call named it while it was stopped; its own roll call, after it is woken, can find every
    // rank answering: the collective it was stopped in may complete as it resumes, so its main
    // thread never serves the roll call from that wait with the gap it measured.)
    const bool self_frozen = frozen > 1.0 && frozen > 0.4 * timeout_;
    if (in_collective && !self_frozen) {
      // Who the collective waits for: a roll call of the job's ranks (comm/roll_call.hpp), held
      // by the main thread from its wait loop; the ranks that do not answer are named. (A rank
      // that was itself stopped, woken late, names itself.) Without one (a single rank, or the
      // main thread not in a wait that serves it) the group and operation are still named.
      std::string verdict;
      const double grace = comm::roll_call_grace();
      if (grace > 0) {
        comm::request_roll_call();
        lock.unlock();
        if (!comm::roll_call_verdict(&verdict, grace + 5)) verdict.clear();
        lock.lock();
      }
      std::fprintf(stderr,
                   "tetrad: error (rank %d): watchdog: step %lld has spent more than %g s in %s "
                   "(train.step_timeout), the last %.1f s waiting in MPI %s: %s. Ending the "
                   "job.\n",
                   rank_, static_cast<long long>(step_), timeout_, phase_, waited, what.c_str(),
                   verdict.empty() ? "a peer in that group is stalled or dead" : verdict.c_str());
    } else {
      // Stuck itself; or, woken late (SIGCONT after SIGSTOP), it says that it did not run (and
      // in which collective it was stopped, if in one).
      char why[160] = " in it";
      if (self_frozen)
        std::snprintf(why, sizeof why, ": this rank did not run for %.1f s (stopped, e.g. by "
                      "SIGSTOP, or not scheduled by the machine)", frozen);
      std::string in_wait;
      if (in_collective) {
        char last[64];
        std::snprintf(last, sizeof last, ", the last %.1f s waiting in MPI ", waited);
        in_wait = last + what;
      }
      std::fprintf(stderr,
                   "tetrad: error (rank %d): watchdog: step %lld has spent more than %g s in %s "
                   "(train.step_timeout)%s; rank %d stopped progressing%s. Ending the job.\n",
                   rank_, static_cast<long long>(step_), timeout_, phase_, in_wait.c_str(),
                   rank_, why);
    }
    std::fflush(stderr);
    comm::MpiEnvironment::abort(3);
  }
}

}  // namespace tetrad
