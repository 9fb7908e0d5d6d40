#include "tetrad/core/signals.hpp"

#include <omp.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
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
                SIGVTALRM})
    sigaddset(&set, s);
  return set;
}

struct StopSignals::Impl {
  sigset_t set{}, old_mask{}, pool_set{};
  struct sigaction old_action[kNumHandled]{};
  std::mutex mu;
  std::condition_variable cv;
  bool quit = false;
  std::atomic<long> catcher_tid{0};
  std::thread catcher;
};

StopSignals::StopSignals() : impl_(std::make_unique<Impl>()) {
  if (g_active.exchange(true)) fail("StopSignals: only one may be alive at a time");
  Impl& m = *impl_;
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
  // The catcher: the one thread of ours that takes these signals. It only waits.
  m.catcher = std::thread([&m] {
    pthread_sigmask(SIG_UNBLOCK, &m.set, nullptr);
    m.catcher_tid.store(this_tid());
    std::unique_lock<std::mutex> lock(m.mu);
    m.cv.wait(lock, [&] { return m.quit; });
    // Back to blocked before it ends, so no signal lands on a thread being torn down.
    pthread_sigmask(SIG_BLOCK, &m.set, nullptr);
  });
  while (m.catcher_tid.load() == 0) std::this_thread::yield();
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // system calls interrupted on the catcher resume (as std::signal)
  for (int i = 0; i < kNumHandled; ++i)
    TETRAD_CHECK(sigaction(kHandled[i], &sa, &m.old_action[i]) == 0);
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

}  // namespace tetrad
