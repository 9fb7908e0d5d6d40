// Communicator: one process group and the collectives tetrad uses on it; Request: the handle of a
// non-blocking operation (docs/parallel.md, "Communication"). The interface every communication
// implementation fills (comm/comm_impl.hpp): MPI (comm/mpi_communicator.hpp, the first one, for
// host memory) and NCCL (comm/nccl_communicator.hpp, built with TETRAD_NCCL, for device memory).
// Callers hold Communicator and Request values and never see which one runs underneath.
//
// Completion is an event. A Request completes when its implementation's event fires: for MPI the
// MPI_Request (MPI_Test, which is also what moves Open MPI's non-blocking collectives forward),
// for NCCL a CUDA event recorded on the communicator's stream after the collective. event()
// returns it as a core Event, so a backend queue can order compute after a collective
// (Queue::wait(request.event()): on the device for NCCL, no host round trip); the `after` event
// of every operation orders the operation after compute (a queue's record()). The CPU backend's
// events are complete at once, so on the CPU `after` is free and nothing changes.
//
// Ownership. A Communicator shares its implementation (an MPI_Comm it duplicated or split, never
// MPI_COMM_WORLD itself; an ncclComm_t) with its pending requests: it is freed when the last of
// them lets go. Movable, not copyable. A Request owns its operation and shared ownership of
// whatever it was given to keep alive (keep_alive(), or the vector moved into isend); raw buffers
// passed to the i* calls stay the caller's and must outlive the request's completion (wait() /
// test() returning true).
//
// Errors. Every return code is checked; a failure throws tetrad::Error naming the operation, the
// group (e.g. "x", "zd", "world"), the element count and the library's error string. Nothing
// waits forever: Request::wait(timeout_s) polls the completion and throws tetrad::Error naming
// the rank, the transport ("MPI", "NCCL"), operation, group, element count and the time waited
// when the timeout passes. Blocking calls are the non-blocking call plus
// wait(collective_timeout()), so a dead or diverged peer becomes an error, not a hang. After a
// collective times out the group is in an unknown state: report and end the job
// (MpiEnvironment::abort). A timed-out MPI receive is cancelled (MPI_Cancel), so the group stays
// usable; a timed-out NCCL operation aborts its communicator (ncclCommAbort).
//
// Self. Communicator::self() is a size-1 group with no implementation behind it (works without
// MPI_Init): collectives are local copies or no-ops, so serial code runs the same calls.
//
// What this does not do: progress threads (poll with Request::test() between compute chunks; the
// parallel layer's CommQueue has one, parallel/comm_schedule.hpp), MPI_THREAD_MULTIPLE (call from
// one thread at a time), counts above INT_MAX elements per rank on MPI (rejected with an Error),
// point-to-point on self().
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tetrad/comm/comm_base.hpp"
#include "tetrad/core/event.hpp"

namespace tetrad::comm {

class PendingOp;  // one started operation of an implementation (comm/comm_impl.hpp)
class CommImpl;   // an implementation's group (comm/comm_impl.hpp)

class Request {
 public:
  Request();  // an empty handle: already complete
  explicit Request(std::shared_ptr<PendingOp> op);
  Request(Request&& other) noexcept;
  // Finishes the request this handle held first, as the destructor does.
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  // A pending request is waited for (collective_timeout()) and reported on stderr, since dropping
  // a pending handle is a bug in the caller. If it still does not complete, its state and buffers
  // are deliberately leaked (the library may still write into them) and that is reported too.
  ~Request();

  // One non-blocking look at the completion event (MPI_Test; cudaEventQuery): true when complete
  // (then the keep-alive buffers are released). Call it between compute chunks so Open MPI
  // progresses. Throws tetrad::Error if the operation failed.
  bool test();
  // Polls test() until complete; throws tetrad::Error after timeout_s seconds.
  void wait();  // timeout collective_timeout()
  void wait(double timeout_s);
  bool pending() const;  // started and not yet seen complete

  // The completion as an event (core/event.hpp): a backend queue waits for it (on the device where
  // it is a CUDA event). Complete for an empty handle. The event keeps the operation's state alive;
  // it does not replace wait()/test() on this handle.
  Event event() const;
  // False where the operation completes without the host calling into the library (NCCL).
  bool needs_host_progress() const;

  // Keeps `owner` alive until the request completes (for buffers the request must not outlive).
  void keep_alive(std::shared_ptr<const void> owner);

  // "iallreduce_sum of 1024 float on group 'x'"; "" for an empty handle.
  std::string description() const;
  // "MPI", "NCCL"; "" for an empty handle.
  const char* transport() const;

 private:
  void finish_in_destructor() noexcept;
  std::shared_ptr<PendingOp> op_;
};

class Communicator {
 public:
  // A size-1 group of this process alone; needs no MPI (works before MPI_Init and without mpirun).
  static Communicator self(std::string name = "self");
  // A duplicate of MPI_COMM_WORLD named `name` (the MPI implementation). MPI must be initialised
  // (MpiEnvironment).
  static Communicator world(std::string name = "world");
  // Wraps an implementation (comm/mpi_communicator.cpp, comm/nccl_communicator.cpp).
  explicit Communicator(std::shared_ptr<CommImpl> impl);

  // Collective over this group: a duplicate of it / the ranks of equal color (>= 0), ordered by
  // key. Same implementation as this one.
  Communicator dup(std::string name) const;
  Communicator split(int color, int key, std::string name) const;

  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  // Lets go of the implementation, which is freed once no pending Request uses it.
  ~Communicator();

  int rank() const;
  int size() const;
  const std::string& name() const { return name_; }
  bool is_self() const;  // self(): no implementation behind it
  // "MPI", "NCCL"; "self" for self().
  const char* transport() const;
  BufferSpace buffer_space() const;  // Host for self()
  CommImpl* impl() const { return impl_.get(); }  // nullptr for self()
  // Device buffers (those `staging` says the host cannot read) given to this group's operations
  // are staged through host memory where the implementation needs host memory (MPI); null turns
  // it off. On self() nothing moves between ranks: its local copies need host-readable buffers
  // (callers skip size-1 groups for device buffers).
  void stage_device_memory(std::shared_ptr<DeviceStaging> staging) const;

  // Blocking, guarded by collective_timeout(). Counts are elements per rank.
  template <Element T> void allreduce_sum(T* inout, size_t n) const;
  template <Element T> void allreduce_max(T* inout, size_t n) const;
  // recv[i*n .. i*n+n) = send of group rank i. send may be recv + rank()*n (in place).
  template <Element T> void allgather(const T* send, T* recv, size_t n_per_rank) const;
  // send holds size()*n blocks; recv (n) = block rank() summed over the group.
  template <Element T> void reduce_scatter_sum(const T* send, T* recv, size_t n_per_rank) const;
  template <Element T> void broadcast(T* data, size_t n, int root) const;
  // Variable all-to-all (MPI_Alltoallv): group rank i gets send[send_displs[i] ..
  // + send_counts[i]) and this rank receives rank j's block for it into recv[recv_displs[j] ..
  // + recv_counts[j]). Counts and displacements are in elements, one per group rank; a count may
  // be 0. Each pair of ranks must agree on the count between them (exchange the counts first, e.g.
  // with unit counts); send and recv must not overlap.
  template <Element T>
  void alltoallv(const T* send, const std::vector<size_t>& send_counts,
                 const std::vector<size_t>& send_displs, T* recv,
                 const std::vector<size_t>& recv_counts,
                 const std::vector<size_t>& recv_displs) const;
  template <Element T> void send(const T* data, size_t n, int peer, int tag) const;
  // Receives exactly n elements (a message of another length is an Error where the
  // implementation can tell: MPI).
  template <Element T> void recv(T* data, size_t n, int peer, int tag) const;
  void barrier() const;

  // Non-blocking forms: same semantics; the buffers must stay valid until the Request completes.
  // `after`: the operation reads its input only once this event has completed (a backend queue's
  // record() after producing the buffer; empty: now). MPI synchronizes the host on it when it is
  // not complete yet; NCCL makes its stream wait for it on the device.
  template <Element T>
  [[nodiscard]] Request iallreduce_sum(T* inout, size_t n, const Event& after = {}) const;
  template <Element T>
  [[nodiscard]] Request iallreduce_max(T* inout, size_t n, const Event& after = {}) const;
  template <Element T>
  [[nodiscard]] Request iallgather(const T* send, T* recv, size_t n_per_rank,
                                   const Event& after = {}) const;
  template <Element T>
  [[nodiscard]] Request ireduce_scatter_sum(const T* send, T* recv, size_t n_per_rank,
                                            const Event& after = {}) const;
  template <Element T>
  [[nodiscard]] Request ibroadcast(T* data, size_t n, int root, const Event& after = {}) const;
  // The counts and displacements are copied: only the data buffers must outlive the Request.
  template <Element T>
  [[nodiscard]] Request ialltoallv(const T* send, const std::vector<size_t>& send_counts,
                                   const std::vector<size_t>& send_displs, T* recv,
                                   const std::vector<size_t>& recv_counts,
                                   const std::vector<size_t>& recv_displs,
                                   const Event& after = {}) const;
  template <Element T>
  [[nodiscard]] Request isend(const T* data, size_t n, int peer, int tag,
                              const Event& after = {}) const;
  // Takes the data: the Request keeps it alive until the send completes.
  template <Element T> [[nodiscard]] Request isend(std::vector<T> data, int peer, int tag) const;
  template <Element T>
  [[nodiscard]] Request irecv(T* data, size_t n, int peer, int tag, const Event& after = {}) const;
  [[nodiscard]] Request ibarrier() const;

 private:
  Communicator() = default;  // moved-from state; self() fills it in
  void check_usable() const;
  std::shared_ptr<CommImpl> impl_;  // null for self()
  std::string name_;
  int rank_ = 0, size_ = 0;  // size_ == 0: moved-from
};

}  // namespace tetrad::comm
