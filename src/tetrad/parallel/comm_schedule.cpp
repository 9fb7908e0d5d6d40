#include "tetrad/parallel/comm_schedule.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <fstream>
#include <sstream>
#include <thread>

#include "tetrad/comm/roll_call.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

// The helper: sleeps on `cv` until a scope activates it; then, holding `mu` around each call,
// drives the communicator's host progress (an MPI probe: any MPI call runs Open MPI's progress
// engine) every ~50 us until deactivated.
struct CommQueue::Progress {
  std::mutex mu;
  std::condition_variable cv;
  bool active = false, quit = false;
  std::thread thread;

  Progress() : thread([this] { run(); }) {}
  ~Progress() {
    {
      std::lock_guard<std::mutex> lock(mu);
      quit = true;
    }
    cv.notify_all();
    thread.join();
  }
  void run() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return active || quit; });
      if (quit) return;
      comm::drive_host_progress();
      // Release the lock while sleeping, so the main thread can take it back at once.
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      lock.lock();
    }
  }
};

CommQueue::CommQueue() = default;
CommQueue::~CommQueue() = default;

CommQueue::ProgressScope::ProgressScope(CommQueue& q) {
  if (!q.use_thread_ || q.ops_.empty()) return;
  // Only operations the host must drive (MPI) need the helper; NCCL's progress on the device.
  bool host_driven = false;
  for (const Op& op : q.ops_) host_driven = host_driven || op.request.needs_host_progress();
  if (!host_driven) return;
  if (!q.progress_) {
    if (!comm::host_progress_available()) {
      q.use_thread_ = false;  // MPI initialised by someone else with less: poll only
      return;
    }
    q.progress_ = std::make_unique<Progress>();
  }
  q_ = &q;
  {
    std::lock_guard<std::mutex> lock(q.progress_->mu);
    q.progress_->active = true;
  }
  q.progress_->cv.notify_one();
}

CommQueue::ProgressScope::~ProgressScope() {
  if (!q_) return;
  // Taking the lock waits out a probe in progress: afterwards only the main thread calls MPI.
  std::lock_guard<std::mutex> lock(q_->progress_->mu);
  q_->progress_->active = false;
}

CommQueue::Ticket CommQueue::start(comm::Request request, const comm::Communicator& group,
                                   const char* op, const char* what, int layer, int64_t bytes,
                                   std::function<void()> on_done) {
  const Ticket id = next_++;
  Op o{id, std::move(request), group.name(), op, what ? what : "", layer, bytes,
       std::chrono::steady_clock::now(), std::move(on_done)};
  if (!o.request.pending()) {  // a size-1 group: complete at once
    complete(o, o.issued);
    return id;
  }
  if (ops_.empty()) busy_since_ = o.issued;
  ops_.push_back(std::move(o));
  return id;
}

void CommQueue::complete(Op& op, SteadyTime now) {
  if (prof_) {
    if (prof_->tracing()) {
      const int track = prof_->trace->track(op.group);
      prof_->trace->add(track, event_name(op.op.c_str(), op.what.c_str(), op.layer), op.issued, now,
                        "\"bytes\":" + std::to_string(op.bytes) + ",\"group\":\"" + op.group + "\"");
    }
  }
  if (op.on_done) {
    auto f = std::move(op.on_done);
    f();
  }
}

void CommQueue::poll() {
  if (ops_.empty()) return;
  std::vector<Op> finished;
  for (size_t i = 0; i < ops_.size();) {
    if (ops_[i].request.test()) {
      finished.push_back(std::move(ops_[i]));
      ops_.erase(ops_.begin() + std::ptrdiff_t(i));
    } else {
      ++i;
    }
  }
  if (finished.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  // Issued communication time is the wall time with at least one collective in flight.
  if (ops_.empty() && prof_) prof_->comm_issued_s += std::chrono::duration<double>(now - busy_since_).count();
  for (Op& op : finished) complete(op, now);  // callbacks may start more operations
}

bool CommQueue::done(Ticket t) const {
  if (t == 0 || t >= next_) return true;
  for (const Op& op : ops_)
    if (op.id == t) return false;
  return true;
}

template <typename F>
void CommQueue::block_until(F&& ready, const char* what) {
  if (ready()) return;
  // Exposed from here: the first poll may do the whole transfer (Open MPI copies a large
  // message between two local ranks inside the MPI_Test that finds it; 250 ms for the logits'
  // 32 MiB under load), which must count as communication, not as the model's compute.
  ScopedPhase sp(prof_, Phase::Comm, what);
  poll();
  if (ready()) return;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const double timeout = comm::collective_timeout();
  double last = 0, frozen = 0;  // the longest gap between two polls: this process did not run
  // What the watchdog names (comm::blocked_in_wait): the oldest pending request, as the timeout's
  // message does. Set after the first quick polls, as Request::wait does.
  comm::BlockedMark blocked;
  Ticket marked = 0;
  for (long polls = 1;; ++polls) {
    poll();
    if (ready()) return;
    const double waited = std::chrono::duration<double>(clock::now() - t0).count();
    if (waited - last > frozen) frozen = waited - last;
    last = waited;
    if (waited >= timeout) {
      // Name the oldest pending request (operation, group, count) with the time really waited.
      // A zero-timeout wait marks each pending request abandoned, so their destructors (while
      // the error unwinds) test once instead of each waiting a whole timeout again: with overlap
      // on, many are pending and the job would take minutes to end.
      TETRAD_CHECK(!ops_.empty());
      const std::string what = ops_.front().request.description();
      const std::string transport = ops_.front().request.transport();
      // Who stopped (comm/roll_call.hpp), before the pending requests are abandoned.
      const std::string verdict = comm::roll_call(what, waited, frozen);
      for (Op& op : ops_) {
        try {
          op.request.wait(0.0);
        } catch (const Error&) {
        }
      }
      fail("rank ", comm::job_rank(), ": ", transport, " ", what, " did not complete within ",
           timeout, " s (waited ",
           waited, " s, ", ops_.size(), " collective(s) pending): ",
           verdict.empty() ? "a peer rank may have died or stalled, or the ranks of the group "
                             "called different operations" : verdict,
           ". The timeout is ", comm::collective_timeout_setting(),
           "; raise it if the peers are only slow");
    }
    // As Request::wait: spin first, then give the core to a peer rank (oversubscribed runs).
    if (polls < 2000) continue;
    // (Marked again when a nested wait in a completion callback cleared it.)
    if (!ops_.empty() && (ops_.front().id != marked || !comm::blocked_in_wait(nullptr, nullptr))) {
      marked = ops_.front().id;
      blocked.mark(ops_.front().request.description(), t0);
    }
    if (comm::roll_call_requested() && !ops_.empty())  // the watchdog asks who stopped
      comm::serve_roll_call(ops_.front().request.description(), waited, frozen);
    if (waited < 0.01) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void CommQueue::wait(Ticket t) {
  if (done(t)) return;
  // A copy: polling erases completed ops from ops_, which moves the others' strings.
  std::string what = "wait";
  for (const Op& op : ops_)
    if (op.id == t) what = op.op;
  block_until([&] { return done(t); }, what.c_str());
}

void CommQueue::order_compute_after(Ticket t) {
  if (done(t)) return;
  if (compute_)
    for (const Op& op : ops_)
      if (op.id == t) {
        const Event e = op.request.event();
        if (e.native().kind != NativeEvent::Kind::None) {
          compute_->wait(e);  // on the device; poll()/wait() see it complete later
          return;
        }
        break;
      }
  wait(t);
}

void CommQueue::wait_all() {
  block_until([&] { return ops_.empty(); }, "wait all");
}

void write_trace(const comm::Communicator& world, const TraceLog& log, const std::string& path) {
  const std::string mine = log.json_events(world.rank());
  // Text travels as uint64 words (the element types the communicator knows).
  auto pack = [](const std::string& s) {
    std::vector<uint64_t> w((s.size() + 7) / 8 + 1, 0);
    w[0] = s.size();
    std::memcpy(w.data() + 1, s.data(), s.size());
    return w;
  };
  constexpr int kTag = 4401;
  if (world.rank() != 0) {
    std::vector<uint64_t> w = pack(mine);
    uint64_t n = w.size();
    world.send(&n, 1, 0, kTag);
    world.send(w.data(), w.size(), 0, kTag);
    return;
  }
  std::ofstream f(path);
  if (!f) fail("cannot write the trace file '", path, "'");
  f << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n" << mine;
  for (int r = 1; r < world.size(); ++r) {
    uint64_t n = 0;
    world.recv(&n, 1, r, kTag);
    std::vector<uint64_t> w(n);
    world.recv(w.data(), n, r, kTag);
    const std::string text(reinterpret_cast<const char*>(w.data() + 1), size_t(w[0]));
    f << ",\n" << text;
  }
  f << "\n]}\n" << std::flush;
  if (!f) fail("writing the trace file '", path, "' failed");
}

}  // namespace tetrad::parallel
