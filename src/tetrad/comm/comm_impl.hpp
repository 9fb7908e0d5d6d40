// The interface a communication implementation fills (MPI: comm/mpi_communicator.cpp; NCCL:
// comm/nccl_communicator.cpp). Callers never use it: they hold comm::Communicator and
// comm::Request (comm/communicator.hpp), which wrap it.
//
// CommImpl is one process group of one implementation: it starts operations and makes its
// sub-groups. PendingOp is one started operation: its completion event (poll_native: MPI_Test;
// cudaEventQuery plus NCCL's asynchronous error), what to do when a wait runs out of time
// (cancel an MPI receive; abort an NCCL communicator), and what the operation was, for messages.
// What is the same for every implementation lives here and in communicator.cpp, written once:
// the wait loop with its timeout and the message it throws, the watchdog's blocked_in_wait()
// mark, keep-alive buffers, the policy of a request destroyed while pending, the error after a
// timed-out collective.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tetrad/comm/comm_base.hpp"
#include "tetrad/core/event.hpp"

namespace tetrad::comm {

// A PendingOp is also the Event of its completion (Request::event()): query() is test(),
// synchronize() is wait(collective_timeout()), native() is the implementation's event.
class PendingOp : public Event::Impl {
 public:
  PendingOp() = default;
  PendingOp(const PendingOp&) = delete;
  PendingOp& operator=(const PendingOp&) = delete;
  ~PendingOp() override = default;

  // What the operation is, for messages: "iallreduce_sum of 1024 float on group 'x' (rank 0 of 2)
  // from root 1". Filled in by the implementation when it starts the operation.
  const char* transport = "";  // "MPI", "NCCL"
  const char* op = "";         // "iallreduce_sum", "recv", ... (string literals)
  const char* type = "";       // "float"; "" for a barrier
  size_t count = 0;            // elements per rank
  std::string extra;           // " from rank 1, tag 7"
  std::string group;           // the communicator's name
  int rank = 0, size = 1;
  bool is_recv = false;
  std::vector<std::shared_ptr<const void>> keep;  // released on completion
  std::string description() const;

  // Common bookkeeping (communicator.cpp).
  bool test();               // complete? Throws tetrad::Error if the operation failed.
  void wait(double timeout_s);
  bool pending() const { return !done_; }
  bool timed_out() const { return timed_out_; }

  // Event::Impl
  bool query() override { return test(); }
  void synchronize() override;  // wait(collective_timeout())

  // ---- what an implementation provides ----
  // One non-blocking look at the completion event: true when complete. Throws tetrad::Error when
  // the operation failed (the operation is then over: test() marks it done).
  virtual bool poll_native() = 0;
  // The wait ran out of time (after waited_s seconds). Returns true if the operation completed after all (an MPI receive
  // that arrived while being cancelled); else sets `*note` to what was done about it
  // (" (the receive was cancelled)"), `*group_usable` to whether the group can go on (a cancelled
  // receive), and `*over` to whether the operation is finished (cancelled, aborted) rather than
  // still pending (an MPI collective that a late peer may still complete).
  virtual bool on_timeout(double waited_s, std::string* note, bool* group_usable, bool* over) = 0;
  // The library is already shut down (MPI finalised): a pending operation can only be leaked.
  virtual bool library_finalized() const { return false; }
  virtual bool needs_host_progress() const { return true; }
  NativeEvent native() const override { return {}; }

 protected:
  void mark_done() { done_ = true; }

 private:
  bool done_ = false;
  bool timed_out_ = false;
};

// One process group of one implementation. Operations return a started PendingOp (never null;
// size-1 groups are Communicator::self() and never reach an implementation). `after` is the event
// the operation must start after (see Communicator). Counts are elements per rank.
class CommImpl : public std::enable_shared_from_this<CommImpl> {
 public:
  virtual ~CommImpl() = default;
  virtual const char* transport() const = 0;
  virtual BufferSpace buffer_space() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;

  virtual std::shared_ptr<PendingOp> allreduce(const char* op, void* inout, size_t n, DType t,
                                               ReduceOp r, const Event& after) = 0;
  virtual std::shared_ptr<PendingOp> allgather(const char* op, const void* send, void* recv,
                                               size_t n, DType t, const Event& after) = 0;
  virtual std::shared_ptr<PendingOp> reduce_scatter(const char* op, const void* send, void* recv,
                                                    size_t n, DType t, const Event& after) = 0;
  virtual std::shared_ptr<PendingOp> broadcast(const char* op, void* data, size_t n, DType t,
                                               int root, const Event& after) = 0;
  // Variable all-to-all: counts and displacements (elements) have size() entries each, already
  // checked by the caller; they are read before the call returns.
  virtual std::shared_ptr<PendingOp> alltoallv(const char* op, const void* send,
                                               const size_t* send_counts,
                                               const size_t* send_displs, void* recv,
                                               const size_t* recv_counts,
                                               const size_t* recv_displs, DType t,
                                               const Event& after) = 0;
  virtual std::shared_ptr<PendingOp> send(const char* op, const void* data, size_t n, DType t,
                                          int peer, int tag, const Event& after) = 0;
  virtual std::shared_ptr<PendingOp> recv(const char* op, void* data, size_t n, DType t, int peer,
                                          int tag, const Event& after) = 0;
  virtual std::shared_ptr<PendingOp> barrier(const char* op) = 0;

  // Buffers the host cannot read are staged through host memory from now on, on this group and
  // the groups dup() and split() make from it (MPI; NCCL reads device memory itself and ignores
  // it). Null: no staging.
  virtual void stage_device_memory(std::shared_ptr<DeviceStaging>) {}

  // Collective over this group: always a group of this implementation (size 1 included), so
  // that sub-groups keep the transport the caller chose.
  virtual std::shared_ptr<CommImpl> dup(const std::string& name) = 0;
  virtual std::shared_ptr<CommImpl> split(int color, int key, const std::string& name) = 0;

 protected:
  // Fills a PendingOp's description fields from this group.
  void describe(PendingOp& p, const char* op, DType t, size_t n) const;
  void describe_untyped(PendingOp& p, const char* op) const;
};

}  // namespace tetrad::comm
