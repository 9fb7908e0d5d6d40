// The bookkeeping every communication implementation shares (comm_impl.hpp).
#include "tetrad/comm/comm_impl.hpp"

#include <chrono>
#include <cstdio>
#include <thread>

#include "tetrad/comm/roll_call.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::comm {

// ---------------------------------------------------------------------------------------------
// PendingOp: the bookkeeping every implementation shares

std::string PendingOp::description() const {
  std::string s = op;
  if (*type != '\0') s += detail::concat(" of ", count, " ", type);
  s += extra;
  s += detail::concat(" on group '", group, "' (rank ", rank, " of ", size, ")");
  return s;
}

bool PendingOp::test() {
  if (done_) return true;
  bool complete = false;
  try {
    complete = poll_native();
  } catch (...) {
    // A failed operation is finished as far as we are concerned.
    done_ = true;
    keep.clear();
    throw;
  }
  if (!complete) return false;
  done_ = true;
  keep.clear();
  return true;
}

void PendingOp::synchronize() { wait(collective_timeout()); }

void PendingOp::wait(double timeout_s) {
  if (test()) return;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  BlockedMark blocked;
  double last = 0, frozen = 0;  // the longest gap between two polls: this process did not run
  for (long polls = 1;; ++polls) {
    if (test()) return;
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited - last > frozen) frozen = waited - last;
    last = waited;
    if (waited >= timeout_s) {
      std::string note;
      bool group_usable = false, over = false, completed = false;
      try {
        completed = on_timeout(waited, &note, &group_usable, &over);
      } catch (...) {
        done_ = true;
        keep.clear();
        throw;
      }
      if (completed) {
        done_ = true;
        keep.clear();
        return;
      }
      if (over) {
        done_ = true;
        keep.clear();
      } else {
        timed_out_ = true;
      }
      if (!group_usable) mark_collective_failed();
      char waited_text[32];
      std::snprintf(waited_text, sizeof waited_text, "%.2f", waited);
      // Who stopped (roll_call.hpp), when the trainer turned the roll call on.
      // (Not for a zero timeout: a request abandoned while another error unwinds.)
      const std::string verdict = timeout_s > 0 ? roll_call(description(), waited, frozen) : "";
      fail("rank ", job_rank(), ": ", transport, " ", description(), " did not complete within ",
           timeout_s, " s (waited ", waited_text, " s): ",
           verdict.empty() ? "a peer rank may have died or stalled, or the ranks of the group "
                             "called different operations" : verdict,
           note, ". The timeout is ", collective_timeout_setting(),
           "; raise it if the peers are only slow");
    }
    // Spin first (most operations finish within microseconds), then stop burning a core that a
    // peer rank may need (oversubscribed runs), then poll every 200 us. The spin ends after 2000
    // polls or 1 ms, whichever comes first: on a loaded machine 2000 polls took longer than a
    // 0.6 s timeout, so the wait never told the watchdog what it was blocked on.
    if (polls < 2000 && waited < 1e-3) continue;
    if (!blocked.set) blocked.mark(description(), start);
    if (roll_call_requested()) serve_roll_call(description(), waited, frozen);  // the watchdog's
    if (waited < 0.01)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void CommImpl::describe_untyped(PendingOp& p, const char* op) const {
  p.transport = transport();
  p.op = op;
  p.group = name();
  p.rank = rank();
  p.size = size();
  // The group outlives the operation: a request that never completes (a timed-out collective)
  // keeps its communicator alive, since the library may keep progressing it.
  p.keep.push_back(shared_from_this());
}

void CommImpl::describe(PendingOp& p, const char* op, DType t, size_t n) const {
  describe_untyped(p, op);
  p.type = dtype_name(t);
  p.count = n;
}

}  // namespace tetrad::comm
