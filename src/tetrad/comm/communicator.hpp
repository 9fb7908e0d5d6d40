// Communicator: one process group (an MPI communicator it owns) and the collectives tetrad uses on
// it; Request: the handle of a non-blocking operation (docs/parallel.md).
//
// Ownership. A Communicator owns its MPI_Comm (a duplicate or a split, never MPI_COMM_WORLD
// itself) and frees it in its destructor; it is movable, not copyable. A Request owns its
// MPI_Request and shared ownership of whatever it was given to keep alive (keep_alive(), or the
// vector moved into isend); raw buffers passed to the i* calls stay the caller's and must outlive
// the request's completion (wait() / test() returning true).
//
// Errors. Every communicator has MPI_ERRORS_RETURN set; every MPI return code is checked and a
// failure throws tetrad::Error naming the operation, the group (e.g. "x", "zd", "world"), the
// element count and MPI's error string. Nothing waits forever: Request::wait(timeout_s) polls
// MPI_Test (which is also what moves Open MPI's non-blocking collectives forward) and throws
// tetrad::Error naming the operation, group, element count and the time waited when the timeout
// passes. Blocking calls are the non-blocking call plus wait(collective_timeout()), so a dead or
// diverged peer becomes an error, not a hang. After a collective times out the group is in an
// unknown state: report and end the job (MpiEnvironment::abort). A timed-out irecv is cancelled
// (MPI_Cancel), so the group stays usable.
//
// Self. Communicator::self() is a size-1 group with no MPI behind it (works without MPI_Init):
// collectives are local copies or no-ops, so serial code runs the same calls.
//
// What this does not do: progress threads (poll with Request::test() between compute chunks; the
// parallel layer's CommQueue has one, parallel/comm_schedule.hpp), MPI_THREAD_MULTIPLE (call from
// one thread at a time), GPU buffers, counts above INT_MAX elements
// per rank (rejected with an Error), point-to-point on self().
#pragma once
// The C API only: no deprecated C++ bindings (Open MPI's mpicxx.h, MPICH's equivalent).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tetrad::comm {

// The element types the collectives accept (mapped to MPI_FLOAT, MPI_DOUBLE, MPI_INT32_T,
// MPI_INT64_T, MPI_UINT64_T).
template <typename T>
concept Element = std::same_as<T, float> || std::same_as<T, double> ||
                  std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t> ||
                  std::same_as<T, std::uint64_t>;

// Process-wide timeout (seconds) of blocking calls and of Request::wait(). Default 300 s, or the
// value of the environment variable TETRAD_COMM_TIMEOUT when set (an invalid value throws
// tetrad::Error from the first collective_timeout() call); set_collective_timeout() overrides
// both. Must be > 0 (infinity allowed: no timeout). Thread-safe.
// `setting`: what a user changes to set it (e.g. "train.comm_timeout"), named in timeout errors.
void set_collective_timeout(double seconds, const std::string& setting = "");
double collective_timeout();
// What sets it, for messages: the `setting` given to set_collective_timeout, else the
// environment variable (and the config key that sets it in training).
std::string collective_timeout_setting();
// True once a collective of this process timed out (Request::wait threw): the group's state is
// unknown and the job is ending, so a pending Request destroyed from then on (the unwinding of
// the error: prefetched all-gathers, queued reductions) is not waited for again (each would wait a
// whole timeout) but tested once and leaked: the job ends within about one timeout however many
// requests are pending. wait() itself keeps its timeout (a timed-out request may be waited out
// later). clear_collective_failure(): for a caller that provoked a timeout on purpose and goes on
// (tests).
bool collective_failed();
void clear_collective_failure();

// What this process is blocked on right now, for a watchdog on another thread: true while the
// main thread waits in Request::wait past its first quick polls, with the operation's description
// ("allreduce_sum of 2 double on group 'world'") and the seconds waited so far. Thread-safe.
bool blocked_in_wait(std::string* what, double* seconds);

class Request {
 public:
  Request();  // an empty handle: already complete
  Request(Request&& other) noexcept;
  // Finishes the request this handle held first, as the destructor does.
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  // A pending request is waited for (collective_timeout()) and reported on stderr, since dropping
  // a pending handle is a bug in the caller. If it still does not complete, its state and buffers
  // are deliberately leaked (MPI may still write into them) and that is reported too.
  ~Request();

  // One MPI_Test: true when complete (then the keep-alive buffers are released). Call it between
  // compute chunks so Open MPI progresses. Throws tetrad::Error if the operation failed.
  bool test();
  // Polls test() until complete; throws tetrad::Error after timeout_s seconds.
  void wait();  // timeout collective_timeout()
  void wait(double timeout_s);
  bool pending() const;  // started and not yet seen complete

  // Keeps `owner` alive until the request completes (for buffers the request must not outlive).
  void keep_alive(std::shared_ptr<const void> owner);

  // "iallreduce_sum of 1024 float on group 'x'"; "" for an empty handle.
  std::string description() const;

  struct State;  // defined in communicator.cpp; only the Communicator makes one
  explicit Request(std::unique_ptr<State> state);

 private:
  void finish_in_destructor() noexcept;
  std::unique_ptr<State> state_;
};

class Communicator {
 public:
  // A size-1 group of this process alone; needs no MPI (works before MPI_Init and without mpirun).
  static Communicator self(std::string name = "self");
  // A duplicate of MPI_COMM_WORLD named `name`. MPI must be initialised (MpiEnvironment).
  static Communicator world(std::string name = "world");
  // A duplicate of `comm` (which stays the caller's). Collective over `comm`.
  static Communicator duplicate(MPI_Comm comm, std::string name);

  // Collective over this group: a duplicate of it / MPI_Comm_split(color >= 0, key).
  Communicator dup(std::string name) const;
  Communicator split(int color, int key, std::string name) const;

  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  // Lets go of the MPI_Comm, which is freed (MPI_Comm_free) once no pending Request uses it;
  // skipped if MPI is already finalised.
  ~Communicator();

  int rank() const;
  int size() const;
  const std::string& name() const { return name_; }
  bool is_self() const;     // self(): no MPI communicator behind it
  MPI_Comm native() const;  // MPI_COMM_NULL for self()

  // Blocking, guarded by collective_timeout(). Counts are elements per rank.
  template <Element T> void allreduce_sum(T* inout, size_t n) const;
  template <Element T> void allreduce_max(T* inout, size_t n) const;
  // recv[i*n .. i*n+n) = send of group rank i. send may be recv + rank()*n (in place).
  template <Element T> void allgather(const T* send, T* recv, size_t n_per_rank) const;
  // send holds size()*n blocks; recv (n) = block rank() summed over the group.
  template <Element T> void reduce_scatter_sum(const T* send, T* recv, size_t n_per_rank) const;
  template <Element T> void broadcast(T* data, size_t n, int root) const;
  template <Element T> void send(const T* data, size_t n, int peer, int tag) const;
  // Receives exactly n elements (a message of another length is an Error).
  template <Element T> void recv(T* data, size_t n, int peer, int tag) const;
  void barrier() const;

  // Non-blocking forms: same semantics; the buffers must stay valid until the Request completes.
  template <Element T> [[nodiscard]] Request iallreduce_sum(T* inout, size_t n) const;
  template <Element T> [[nodiscard]] Request iallreduce_max(T* inout, size_t n) const;
  template <Element T>
  [[nodiscard]] Request iallgather(const T* send, T* recv, size_t n_per_rank) const;
  template <Element T>
  [[nodiscard]] Request ireduce_scatter_sum(const T* send, T* recv, size_t n_per_rank) const;
  template <Element T> [[nodiscard]] Request ibroadcast(T* data, size_t n, int root) const;
  template <Element T> [[nodiscard]] Request isend(const T* data, size_t n, int peer, int tag) const;
  // Takes the data: the Request keeps it alive until the send completes.
  template <Element T> [[nodiscard]] Request isend(std::vector<T> data, int peer, int tag) const;
  template <Element T> [[nodiscard]] Request irecv(T* data, size_t n, int peer, int tag) const;
  [[nodiscard]] Request ibarrier() const;

 private:
  friend struct CommAccess;                       // communicator.cpp's helpers
  struct Handle;                                  // owns the MPI_Comm (communicator.cpp)
  Communicator() = default;                       // moved-from state; self() fills it in
  Communicator(MPI_Comm comm, std::string name);  // takes ownership of comm
  void check_usable() const;
  // The MPI_Comm is freed when the last of this object and its pending requests lets go of it:
  // a request that never completes (a timed-out collective) keeps its communicator alive, since
  // Open MPI keeps progressing it.
  std::shared_ptr<Handle> handle_;
  MPI_Comm comm_ = MPI_COMM_NULL;  // handle_->comm
  std::string name_;
  int rank_ = 0, size_ = 0;  // size_ == 0: moved-from
};

}  // namespace tetrad::comm
