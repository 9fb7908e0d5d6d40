#include "tetrad/core/signals.hpp"

#include <omp.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "tetrad/core/error.hpp"

namespace tetrad {

namespace {

std::atomic<int> g_signal{0};
std::atomic<long> g_handler_tid{0};
std::atomic<bool> g_active{false};

long this_tid() { return long(::syscall(SYS_gettid)); }

// Async-signal-safe: two lock-free atomic stores and a raw system call.
extern "C" void on_stop_signal(int sig) {
  g_handler_tid.store(this_tid());
  g_signal.store(sig);
}

// SIGCONT as Open MPI's notice (see signals.hpp): the catcher thread beats every kBeatNs while the
// process runs; a SIGCONT that finds a recent beat (and no resume just seen) reached a process
// that was not stopped. Monotonic nanoseconds; clock_gettime is async-signal-safe.
constexpr int64_t kBeatNs = 50'000'000, kStaleNs = 300'000'000, kResumeQuietNs = 1'000'000'000;
std::atomic<int64_t> g_beat_ns{0}, g_resumed_ns{0};
int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}
extern "C" void on_cont_signal(int) {
  const int64_t now = mono_ns();
  if (now - g_beat_ns.load() > kStaleNs) return;         // the process was stopped: a resume
  if (now - g_resumed_ns.load() < kResumeQuietNs) return;  // the catcher just saw a resume
  g_handler_tid.store(this_tid());
  g_signal.store(SIGCONT);
}

// SIGUSR1 too: Open MPI's mpirun forwards it to every rank without killing the job (on SIGINT /
// SIGTERM it kills the ranks itself after odls_base_sigkill_timeout), and Slurm's --signal sends it
// ahead of the time limit.
constexpr int kHandled[] = {SIGINT, SIGTERM, SIGUSR1};
constexpr int kNumHandled = int(sizeof kHandled / sizeof kHandled[0]);

}  // namespace

sigset_t blocked_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGALRM, SIGCHLD, SIGWINCH, SIGPROF,
                SIGVTALRM, SIGCONT})
    sigaddset(&set, s);
  return set;
}

struct StopSignals::Impl {
  sigset_t set{}, old_mask{}, pool_set{};
  struct sigaction old_action[kNumHandled]{};
  bool cont_notice = false;
  struct sigaction old_cont{};
  std::mutex mu;
  std::condition_variable cv;
  bool quit = false;
  std::atomic<long> catcher_tid{0};
  std::thread catcher;
};

StopSignals::StopSignals(bool cont_notice) : impl_(std::make_unique<Impl>()) {
  if (g_active.exchange(true)) fail("StopSignals: only one may be alive at a time");
  Impl& m = *impl_;
  m.cont_notice = cont_notice;
  g_resumed_ns.store(0);
  g_signal.store(0);
  g_handler_tid.store(0);
  m.set = blocked_signals();
  // This thread first: every thread it creates from here on starts with the signals blocked.
  TETRAD_CHECK(pthread_sigmask(SIG_BLOCK, &m.set, &m.old_mask) == 0);
  // The OpenMP workers already in the pool were created earlier with the old mask (model set-up
  // runs parallel regions). A region as wide as the teams the run uses (omp_get_max_threads(),
  // which the trainer has set) reaches each of them once; libgomp reuses pool threads in order,
  // so later teams of that size are these threads. Not wider: with one thread per rank and many
  // ranks per node, a region of every core would leave that many idle threads in each rank.
  // oneDNN runs its GEMMs on this same OpenMP pool (libdnnl built with the OpenMP runtime).
  sigemptyset(&m.pool_set);
  for (int s = 1; s < NSIG; ++s)
    if (sigismember(&m.set, s) == 1 && sigismember(&m.old_mask, s) == 0) sigaddset(&m.pool_set, s);
  const int width = omp_get_max_threads();
  const sigset_t pool_set = m.pool_set;
#pragma omp parallel num_threads(width)
  pthread_sigmask(SIG_BLOCK, &pool_set, nullptr);
  // The handlers before the catcher: until it unblocks them, a signal stays pending (blocked on
  // every thread of ours), and it is taken by the handler, never by the default action.
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // system calls interrupted on the catcher resume (as std::signal)
  for (int i = 0; i < kNumHandled; ++i)
    TETRAD_CHECK(sigaction(kHandled[i], &sa, &m.old_action[i]) == 0);
  if (m.cont_notice) {
    sa.sa_handler = on_cont_signal;
    TETRAD_CHECK(sigaction(SIGCONT, &sa, &m.old_cont) == 0);
  }
  // The catcher: the one thread of ours that takes these signals. It only waits.
  m.catcher = std::thread([&m] {
    pthread_sigmask(SIG_UNBLOCK, &m.set, nullptr);
    m.catcher_tid.store(this_tid());
    std::unique_lock<std::mutex> lock(m.mu);
    if (m.cont_notice) {
      g_beat_ns.store(mono_ns());
      while (!m.cv.wait_for(lock, std::chrono::nanoseconds(kBeatNs), [&] { return m.quit; })) {
        const int64_t now = mono_ns();
        if (now - g_beat_ns.load() > kStaleNs) g_resumed_ns.store(now);  // we were stopped
        g_beat_ns.store(now);
      }
    } else {
      m.cv.wait(lock, [&] { return m.quit; });
    }
    // Back to blocked before it ends, so no signal lands on a thread being torn down.
    pthread_sigmask(SIG_BLOCK, &m.set, nullptr);
  });
  while (m.catcher_tid.load() == 0) std::this_thread::yield();
}

StopSignals::~StopSignals() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.quit = true;
  }
  m.cv.notify_all();
  m.catcher.join();
  // A SIGINT/SIGTERM sent just before the catcher stopped may still be pending (blocked on every
  // thread of ours): take it here and record it as the handler would have, rather than letting
  // the restored default action end the process after the final checkpoint was written.
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : kHandled) sigaddset(&handled, s);
  const timespec now{0, 0};
  for (int s; (s = sigtimedwait(&handled, nullptr, &now)) > 0;) g_signal.store(s);
  // Then the previous actions, then the old masks: any other signal still pending gets its usual
  // effect.
  for (int i = 0; i < kNumHandled; ++i) sigaction(kHandled[i], &m.old_action[i], nullptr);
  if (m.cont_notice) sigaction(SIGCONT, &m.old_cont, nullptr);
  const int width = omp_get_max_threads();
  const sigset_t pool_set = m.pool_set;
#pragma omp parallel num_threads(width)
  pthread_sigmask(SIG_UNBLOCK, &pool_set, nullptr);
  pthread_sigmask(SIG_SETMASK, &m.old_mask, nullptr);
  g_active.store(false);
}

int StopSignals::received() { return g_signal.load(); }
long StopSignals::handler_thread() { return g_handler_tid.load(); }
long StopSignals::catcher_thread() const { return impl_->catcher_tid.load(); }

namespace {
std::mutex g_abandon_mu;
std::string g_abandon_command;  // "" when no AbandonOnSignal is alive
std::atomic<bool> g_abandon{false};
}  // namespace

std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGCONT: return "SIGCONT";
    default: return "signal " + std::to_string(sig);
  }
}

AbandonOnSignal::AbandonOnSignal(std::string command) {
  std::lock_guard<std::mutex> lock(g_abandon_mu);
  g_abandon_command = std::move(command);
  g_abandon.store(true);
}

AbandonOnSignal::~AbandonOnSignal() {
  std::lock_guard<std::mutex> lock(g_abandon_mu);
  g_abandon.store(false);
  g_abandon_command.clear();
}

void check_abandon(const std::string& dest) {
  if (!g_abandon.load()) return;
  const int sig = StopSignals::received();
  if (sig == 0) return;
  std::string command;
  {
    std::lock_guard<std::mutex> lock(g_abandon_mu);
    command = g_abandon_command;
  }
  throw Interrupted(sig, detail::concat(command, " stopped by ", signal_name(sig),
                                        " before its output was complete",
                                        dest.empty() ? "" : ": nothing was written; '" + dest +
                                                                "' was not touched"));
}

}  // namespace tetrad
