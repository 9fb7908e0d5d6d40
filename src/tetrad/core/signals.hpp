// Graceful stop on SIGINT/SIGTERM without ever running a signal handler on a compute thread.
//
// Why: oneDNN's JIT sgemm kernels (the x64 "gemm:jit" path behind dnnl_sgemm, oneDNN <= 3.11;
// this machine has 2.6) point the stack pointer at their heap workspace while they run. A signal
// handled on such a thread makes the kernel push the signal frame (ucontext + AVX state, ~1-3 KB)
// below that pointer, i.e. over the neighbouring heap chunk; free() later aborts with "corrupted
// size vs. prev_size" (oneDNN issues #4845, fixed by PR #4855). The handler itself does nothing
// wrong: any handled signal corrupts the heap, whatever the handler does. docs/parallel.md,
// "Signals and oneDNN" has the evidence (core dumps, a 60 ms standalone reproducer).
//
// So while a StopSignals is alive:
//  - SIGINT, SIGTERM and SIGUSR1 run a handler that only records the signal (received());
//  - the asynchronous signals in blocked_signals() are blocked on the constructing thread and on
//    every OpenMP worker thread (threads created later by either inherit the mask: the OpenMP
//    pool grown later, the watchdog, the checkpoint writer, the progress thread);
//  - one catcher thread with those signals unblocked, which never runs kernels, takes every
//    process-directed signal. Threads a library created before (Open MPI's event threads) may
//    also take one; they run no JIT code either.
// A signal sent to a specific thread (pthread_kill, tgkill) is not covered; nothing here does
// that, and a profiler that samples with SIGPROF on every thread would still hit this bug.
//
// Construct on the thread that runs the kernels (the training loop), after its OpenMP thread
// count is set (teams up to omp_get_max_threads() are covered; a larger team set later could
// reuse idle pool threads created before with the old mask). One StopSignals at a time per
// process.
#pragma once
#include <csignal>
#include <memory>
#include <string>

#include "tetrad/core/error.hpp"

namespace tetrad {

class StopSignals {
 public:
  // cont_notice: also take a SIGCONT that reaches the process while it runs (not after it was
  // stopped) as a stop request: received() returns SIGCONT. Open MPI's mpirun, told to end the
  // job (Ctrl-C, SIGTERM, a failed rank), sends every rank SIGCONT first, SIGTERM
  // odls_base_sigkill_timeout seconds later and SIGKILL as long after that; stopping at the
  // SIGCONT leaves twice that time for the final checkpoint. A SIGCONT that resumes a stopped
  // process (Ctrl-Z and fg, a debugger, kill -STOP / -CONT) is told apart by a heartbeat of the
  // catcher thread (every 50 ms; none while stopped) and ignored; under a load that delays the
  // heartbeat over 300 ms a notice may be missed, and the SIGTERM still stops the run.
  explicit StopSignals(bool cont_notice = false);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // 0, or the number of the last SIGINT/SIGTERM/SIGUSR1 (or SIGCONT notice) received since
  // construction.
  static int received();
  // The kernel thread id (gettid) of the thread that ran the handler last; 0 if none yet.
  // For tests: it must be the catcher's (or a library thread's), never a compute thread's.
  static long handler_thread();
  // The catcher thread's kernel thread id.
  long catcher_thread() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The signals kept off compute threads: SIGINT and SIGTERM (handled above) and the other
// asynchronous ones a library or tool may install a handler for (SIGHUP, SIGUSR1, SIGUSR2,
// SIGALRM, SIGCHLD, SIGWINCH, SIGPROF, SIGVTALRM, SIGCONT). Blocking one whose action is the default
// changes nothing: the catcher thread takes it and the default action (end the process, or
// ignore) applies as before.
sigset_t blocked_signals();

// Commands whose output is worth nothing unfinished (import, export, report -o) stop on SIGINT or
// SIGTERM by abandoning it. While an AbandonOnSignal is alive (it holds a StopSignals, so the
// signal is only recorded, on the catcher thread), check_abandon() throws Interrupted once one was
// received: AtomicFile::write calls it between the blocks it writes, and the command calls it
// before it publishes. The command's clean-up removes its unfinished output as for any error;
// the CLI prints the message and exits with 128 + the signal's number, as a shell reports a
// command ended by that signal. Outside an AbandonOnSignal check_abandon() does nothing (the
// trainer finishes its checkpoint on a signal and stops at a step boundary instead).
class Interrupted : public Error {
 public:
  Interrupted(int sig, const std::string& what) : Error(what), signal(sig) {}
  int signal;
};

class AbandonOnSignal {
 public:
  explicit AbandonOnSignal(std::string command);  // named in the message ("export")
  ~AbandonOnSignal();
  AbandonOnSignal(const AbandonOnSignal&) = delete;
  AbandonOnSignal& operator=(const AbandonOnSignal&) = delete;

 private:
  StopSignals signals_;
};

// `dest`: the command's destination, not yet written to (named in the message as not touched).
void check_abandon(const std::string& dest = "");

// "SIGTERM", "SIGINT", ... ("signal N" for others).
std::string signal_name(int sig);

}  // namespace tetrad
