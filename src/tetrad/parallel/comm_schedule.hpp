// Scheduling the ParallelTransformer's collectives (docs/parallel.md, "Overlap"): which overlaps
// are on (OverlapOptions, the parallel.* config keys, in options.hpp) and the CommQueue that issues collectives
// non-blocking, drives their progress and completes them as late as the schedule allows.
//
// Progress. Open MPI moves a non-blocking collective forward only inside MPI calls
// (machine-notes.md). The model calls CommQueue::poll() between kernels, and any wait progresses
// every pending operation. Inside a long kernel (a GEMM) nothing would move, and splitting a GEMM
// into row chunks to poll between them changes its rounding (oneDNN picks kernels by shape), so
// with progress = thread a helper thread calls MPI_Iprobe every ~50 us while the main thread runs
// a kernel and collectives are pending (ProgressScope). The two never call MPI at the same time
// (MPI_THREAD_SERIALIZED): the main thread takes the helper's lock before it calls MPI again.
//
// Ordering. MPI needs every rank of a group to start that group's collectives in the same order.
// Everything the model issues is in program order, identical on every rank; the only operations
// started from completion callbacks are data-parallel buckets, and those start strictly in bucket
// order (ParallelTransformer::start_ready_buckets).
//
// Events. The queue knows the backend queue the model computes on (set_compute_queue). Every
// collective is started after ready(), that queue's record() at the point the input is produced
// (comm::Communicator's `after`): free on the CPU, whose events are complete at once; on a GPU the
// communicator's stream waits for the compute stream on the device. Completion is the request's
// event: wait() blocks the host until it has fired (MPI_Test, or cudaEventQuery for NCCL), and
// order_compute_after() makes the compute queue wait for it instead, on the device where the
// event is a device event (no host round trip), else by waiting on the host.
//
// Not thread-safe: the main thread only (MPI_THREAD_FUNNELED).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/comm/communicator.hpp"
#include "tetrad/core/event.hpp"
#include "tetrad/core/profile.hpp"
#include "tetrad/parallel/options.hpp"

namespace tetrad::parallel {

class CommQueue {
 public:
  using Ticket = uint64_t;  // 0: nothing to wait for

  void set_profile(StepProfile* p) { prof_ = p; }
  // The backend queue the model computes on (null: none, host compute).
  void set_compute_queue(backend::Queue* q) { compute_ = q; }
  // The event a collective starts after: the compute queue's work so far (empty on the CPU).
  Event ready() const { return compute_ ? compute_->record() : Event(); }

  // Takes a started request. on_done runs (in poll() or a wait) once it completes; it may call
  // start() itself. Names: op = "allreduce_sum", what = "dIn fc", layer for the timeline.
  Ticket start(comm::Request request, const comm::Communicator& group, const char* op,
               const char* what, int layer, int64_t bytes, std::function<void()> on_done = {});
  // One MPI_Test per pending request; completions run their callbacks.
  void poll();
  // Blocks until the ticket's operation is complete (time counted as exposed communication).
  void wait(Ticket t);
  void wait_all();
  // Later work on the compute queue waits for the ticket's operation; the host does not wait where
  // the operation's completion is a device event (NCCL); otherwise the same as wait(t).
  void order_compute_after(Ticket t);
  bool done(Ticket t) const;
  size_t pending() const { return ops_.size(); }

  // While alive (a kernel runs on the main thread, which makes no MPI call meanwhile), the
  // progress thread keeps MPI moving, if enabled and anything is pending.
  class ProgressScope {
   public:
    explicit ProgressScope(CommQueue& q);
    ~ProgressScope();
    ProgressScope(const ProgressScope&) = delete;
    ProgressScope& operator=(const ProgressScope&) = delete;

   private:
    CommQueue* q_ = nullptr;
  };
  void enable_progress_thread(bool on) { use_thread_ = on; }
  CommQueue();
  ~CommQueue();
  CommQueue(const CommQueue&) = delete;
  CommQueue& operator=(const CommQueue&) = delete;

  // start() then wait(): a blocking collective, timed and traced like the others.
  void run(comm::Request request, const comm::Communicator& group, const char* op,
           const char* what, int layer, int64_t bytes) {
    wait(start(std::move(request), group, op, what, layer, bytes));
  }

 private:
  struct Op {
    Ticket id;
    comm::Request request;
    std::string group, op, what;
    int layer;
    int64_t bytes;
    SteadyTime issued;
    std::function<void()> on_done;
  };
  void complete(Op& op, SteadyTime now);
  // Polls until `ready()` holds; blocked time is Phase::Comm; times out like Request::wait.
  template <typename F> void block_until(F&& ready, const char* what);

  std::vector<Op> ops_;  // pending, in issue order
  Ticket next_ = 1;
  bool use_thread_ = false;
  struct Progress;  // the helper thread (comm_schedule.cpp)
  std::unique_ptr<Progress> progress_;
  SteadyTime busy_since_;  // since when ops_ has been non-empty
  StepProfile* prof_ = nullptr;
  backend::Queue* compute_ = nullptr;
};

// Writes the trace of every rank of `world` as one Chrome trace-event JSON file on rank 0
// (collective; ranks send their events to rank 0). Opens in Perfetto / chrome://tracing.
void write_trace(const comm::Communicator& world, const TraceLog& log, const std::string& path);

}  // namespace tetrad::parallel
