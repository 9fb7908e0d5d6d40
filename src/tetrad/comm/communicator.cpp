// Communicator and Request (communicator.hpp): what every implementation shares, written once.
// The implementations: comm/mpi_communicator.cpp, comm/nccl_communicator.cpp.
#include "tetrad/comm/communicator.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>

#include "tetrad/comm/comm_impl.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::comm {

// ---------------------------------------------------------------------------------------------
// Request

Request::Request() = default;
Request::Request(std::shared_ptr<PendingOp> op) : op_(std::move(op)) {}
Request::Request(Request&& other) noexcept = default;

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    if (pending()) finish_in_destructor();
    op_ = std::move(other.op_);
  }
  return *this;
}

Request::~Request() {
  if (pending()) finish_in_destructor();
}

bool Request::pending() const { return op_ && op_->pending(); }
bool Request::test() { return !op_ || op_->test(); }
void Request::wait() { wait(collective_timeout()); }
void Request::wait(double timeout_s) {
  if (op_) op_->wait(timeout_s);
}
Event Request::event() const { return op_ && op_->pending() ? Event(op_) : Event(); }
bool Request::needs_host_progress() const { return op_ && op_->needs_host_progress(); }
std::string Request::description() const { return op_ ? op_->description() : ""; }
const char* Request::transport() const { return op_ ? op_->transport : ""; }

void Request::keep_alive(std::shared_ptr<const void> owner) {
  if (pending()) op_->keep.push_back(std::move(owner));
  // A complete (or empty) request needs nothing kept: `owner` is released here.
}

void Request::finish_in_destructor() noexcept {
  PendingOp& s = *op_;
  // The operation's state and buffers are kept for good: the library may still write into them.
  auto leak = [this] { (void)new std::shared_ptr<PendingOp>(std::move(op_)); };
  if (s.library_finalized()) {
    std::fprintf(stderr, "tetrad: %s was still pending when %s was finalised; its buffers are leaked\n",
                 s.description().c_str(), s.transport);
    leak();
    return;
  }
  if (!s.timed_out() && collective_failed()) {
    // The job is ending after a timeout: one last test, no waiting, no warning for each.
    try {
      s.test();
    } catch (const std::exception&) {
    }
  } else if (!s.timed_out()) {
    const auto start = std::chrono::steady_clock::now();
    double timeout = 300;
    try {
      timeout = collective_timeout();
    } catch (const std::exception&) {
      // An invalid TETRAD_COMM_TIMEOUT was reported where it was read; use the default here.
    }
    try {
      s.wait(timeout);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tetrad: %s\n", e.what());
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr,
                 "tetrad: warning: the Request of %s was destroyed while pending (a missing "
                 "wait()); the destructor waited %.3f s for it\n",
                 s.description().c_str(), waited);
  } else {
    try {
      s.test();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tetrad: %s\n", e.what());
    }
  }
  if (s.pending()) {
    // The library may still write into the buffers and a collective cannot be cancelled.
    std::fprintf(stderr,
                 "tetrad: %s never completed; its request and buffers are leaked on purpose\n",
                 s.description().c_str());
    leak();
  }
}

// ---------------------------------------------------------------------------------------------
// Communicator

Communicator::Communicator(std::shared_ptr<CommImpl> impl) : impl_(std::move(impl)) {
  TETRAD_CHECK(impl_ != nullptr, "Communicator: no implementation given");
  name_ = impl_->name();
  rank_ = impl_->rank();
  size_ = impl_->size();
}

Communicator Communicator::self(std::string name) {
  Communicator c;
  c.name_ = std::move(name);
  c.rank_ = 0;
  c.size_ = 1;
  return c;
}

Communicator Communicator::dup(std::string name) const {
  check_usable();
  if (is_self()) return self(std::move(name));
  return Communicator(impl_->dup(name));
}

Communicator Communicator::split(int color, int key, std::string name) const {
  check_usable();
  TETRAD_CHECK(color >= 0, "split of '", name_, "': color must be >= 0, got ", color);
  if (is_self()) return self(std::move(name));
  return Communicator(impl_->split(color, key, name));
}

Communicator::Communicator(Communicator&& other) noexcept
    : impl_(std::move(other.impl_)),
      name_(std::move(other.name_)),
      rank_(other.rank_),
      size_(other.size_) {
  other.size_ = 0;
}

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    impl_ = std::move(other.impl_);
    name_ = std::move(other.name_);
    rank_ = other.rank_;
    size_ = other.size_;
    other.size_ = 0;
  }
  return *this;
}

Communicator::~Communicator() = default;

void Communicator::check_usable() const {
  TETRAD_CHECK(size_ > 0, "use of a moved-from Communicator");
}

int Communicator::rank() const {
  check_usable();
  return rank_;
}

int Communicator::size() const {
  check_usable();
  return size_;
}

void Communicator::stage_device_memory(std::shared_ptr<DeviceStaging> staging) const {
  check_usable();
  if (impl_) impl_->stage_device_memory(std::move(staging));
}

bool Communicator::is_self() const {
  check_usable();
  return impl_ == nullptr;
}

const char* Communicator::transport() const {
  check_usable();
  return impl_ ? impl_->transport() : "self";
}

BufferSpace Communicator::buffer_space() const {
  check_usable();
  return impl_ ? impl_->buffer_space() : BufferSpace::Host;
}

// ---------------------------------------------------------------------------------------------
// Communicator: operations. Each `start_*` launches one non-blocking operation under the name
// `op` (so a blocking call's errors carry the blocking name); blocking calls wait on it. On
// self() they are local: the input is ready once `after` is.

namespace {

void wait_on_host(const Event& after) {
  if (!after.empty() && !after.query()) after.synchronize();
}

// bf16 bit patterns (uint16_t) are moved, never reduced (comm_base.hpp).
template <Element T>
void refuse_reduction_of_bits(const Communicator& c, const char* op) {
  if constexpr (std::same_as<T, std::uint16_t>)
    fail(op, " on group '", c.name(), "': uint16 elements (bf16 bit patterns) can be gathered, "
         "broadcast and sent, not reduced; reduce fp32 (or float) data");
}

template <Element T>
Request start_allreduce(const Communicator& c, const char* op, T* inout, size_t n, ReduceOp r,
                        const Event& after) {
  refuse_reduction_of_bits<T>(c, op);
  if (c.is_self()) {
    wait_on_host(after);
    return Request();
  }
  return Request(c.impl()->allreduce(op, inout, n, dtype_of<T>(), r, after));
}

template <Element T>
Request start_allgather(const Communicator& c, const char* op, const T* send, T* recv, size_t n,
                        const Event& after) {
  if (c.is_self()) {
    wait_on_host(after);
    if (send != recv && n > 0) std::memmove(recv, send, n * sizeof(T));
    return Request();
  }
  return Request(c.impl()->allgather(op, send, recv, n, dtype_of<T>(), after));
}

template <Element T>
Request start_reduce_scatter(const Communicator& c, const char* op, const T* send, T* recv,
                             size_t n, const Event& after) {
  refuse_reduction_of_bits<T>(c, op);
  if (c.is_self()) {
    wait_on_host(after);
    if (send != recv && n > 0) std::memmove(recv, send, n * sizeof(T));
    return Request();
  }
  return Request(c.impl()->reduce_scatter(op, send, recv, n, dtype_of<T>(), after));
}

template <Element T>
Request start_broadcast(const Communicator& c, const char* op, T* data, size_t n, int root,
                        const Event& after) {
  if (root < 0 || root >= c.size())
    fail(op, " on group '", c.name(), "': root ", root, " is outside the group of ", c.size());
  if (c.is_self()) {
    wait_on_host(after);
    return Request();
  }
  return Request(c.impl()->broadcast(op, data, n, dtype_of<T>(), root, after));
}

// One count and displacement per group rank; blocks inside neither buffer's overlap are the
// caller's business (the implementations read and write exactly the blocks given).
template <Element T>
Request start_alltoallv(const Communicator& c, const char* op, const T* send,
                        const std::vector<size_t>& sc, const std::vector<size_t>& sd, T* recv,
                        const std::vector<size_t>& rc, const std::vector<size_t>& rd,
                        const Event& after) {
  const size_t S = static_cast<size_t>(c.size());
  if (sc.size() != S || sd.size() != S || rc.size() != S || rd.size() != S)
    fail(op, " on group '", c.name(), "': expected ", S, " send counts, send displacements, "
         "receive counts and receive displacements (one per rank), got ", sc.size(), ", ",
         sd.size(), ", ", rc.size(), " and ", rd.size());
  if (c.is_self()) {
    wait_on_host(after);
    if (sc[0] != rc[0])
      fail(op, " on the size-1 group '", c.name(), "': sends ", sc[0], " elements to itself but "
           "expects to receive ", rc[0]);
    if (sc[0] > 0) std::memmove(recv + rd[0], send + sd[0], sc[0] * sizeof(T));
    return Request();
  }
  return Request(c.impl()->alltoallv(op, send, sc.data(), sd.data(), recv, rc.data(), rd.data(),
                                     dtype_of<T>(), after));
}

void check_peer(const Communicator& c, const char* op, int peer) {
  if (peer < 0 || peer >= c.size())
    fail(op, " on group '", c.name(), "': peer ", peer, " is outside the group of ", c.size());
  if (c.is_self())
    fail(op, " on the size-1 group '", c.name(), "': a group without MPI has no peer to talk to");
}

template <Element T>
Request start_send(const Communicator& c, const char* op, const T* data, size_t n, int peer,
                   int tag, const Event& after) {
  check_peer(c, op, peer);
  return Request(c.impl()->send(op, data, n, dtype_of<T>(), peer, tag, after));
}

template <Element T>
Request start_recv(const Communicator& c, const char* op, T* data, size_t n, int peer, int tag,
                   const Event& after) {
  check_peer(c, op, peer);
  return Request(c.impl()->recv(op, data, n, dtype_of<T>(), peer, tag, after));
}

Request start_barrier(const Communicator& c, const char* op) {
  if (c.is_self()) return Request();
  return Request(c.impl()->barrier(op));
}

}  // namespace

template <Element T> void Communicator::allreduce_sum(T* inout, size_t n) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_allreduce(*this, "allreduce_sum", inout, n, ReduceOp::Sum, {}).wait(timeout);
}
template <Element T> void Communicator::allreduce_max(T* inout, size_t n) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_allreduce(*this, "allreduce_max", inout, n, ReduceOp::Max, {}).wait(timeout);
}
template <Element T> void Communicator::allgather(const T* send, T* recv, size_t n) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_allgather(*this, "allgather", send, recv, n, {}).wait(timeout);
}
template <Element T>
void Communicator::reduce_scatter_sum(const T* send, T* recv, size_t n) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_reduce_scatter(*this, "reduce_scatter_sum", send, recv, n, {}).wait(timeout);
}
template <Element T> void Communicator::broadcast(T* data, size_t n, int root) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_broadcast(*this, "broadcast", data, n, root, {}).wait(timeout);
}
template <Element T>
void Communicator::alltoallv(const T* send, const std::vector<size_t>& sc,
                             const std::vector<size_t>& sd, T* recv,
                             const std::vector<size_t>& rc, const std::vector<size_t>& rd) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_alltoallv(*this, "alltoallv", send, sc, sd, recv, rc, rd, {}).wait(timeout);
}
template <Element T> void Communicator::send(const T* data, size_t n, int peer, int tag) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_send(*this, "send", data, n, peer, tag, {}).wait(timeout);
}
template <Element T> void Communicator::recv(T* data, size_t n, int peer, int tag) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_recv(*this, "recv", data, n, peer, tag, {}).wait(timeout);
}
void Communicator::barrier() const {
  const double timeout = collective_timeout();
  start_barrier(*this, "barrier").wait(timeout);
}

template <Element T>
Request Communicator::iallreduce_sum(T* inout, size_t n, const Event& after) const {
  return start_allreduce(*this, "iallreduce_sum", inout, n, ReduceOp::Sum, after);
}
template <Element T>
Request Communicator::iallreduce_max(T* inout, size_t n, const Event& after) const {
  return start_allreduce(*this, "iallreduce_max", inout, n, ReduceOp::Max, after);
}
template <Element T>
Request Communicator::iallgather(const T* send, T* recv, size_t n, const Event& after) const {
  return start_allgather(*this, "iallgather", send, recv, n, after);
}
template <Element T>
Request Communicator::ireduce_scatter_sum(const T* send, T* recv, size_t n,
                                          const Event& after) const {
  return start_reduce_scatter(*this, "ireduce_scatter_sum", send, recv, n, after);
}
template <Element T>
Request Communicator::ibroadcast(T* data, size_t n, int root, const Event& after) const {
  return start_broadcast(*this, "ibroadcast", data, n, root, after);
}
template <Element T>
Request Communicator::ialltoallv(const T* send, const std::vector<size_t>& sc,
                                 const std::vector<size_t>& sd, T* recv,
                                 const std::vector<size_t>& rc, const std::vector<size_t>& rd,
                                 const Event& after) const {
  return start_alltoallv(*this, "ialltoallv", send, sc, sd, recv, rc, rd, after);
}
template <Element T>
Request Communicator::isend(const T* data, size_t n, int peer, int tag, const Event& after) const {
  return start_send(*this, "isend", data, n, peer, tag, after);
}
template <Element T> Request Communicator::isend(std::vector<T> data, int peer, int tag) const {
  auto owned = std::make_shared<const std::vector<T>>(std::move(data));
  Request r = start_send(*this, "isend", owned->data(), owned->size(), peer, tag, {});
  r.keep_alive(owned);
  return r;
}
template <Element T>
Request Communicator::irecv(T* data, size_t n, int peer, int tag, const Event& after) const {
  return start_recv(*this, "irecv", data, n, peer, tag, after);
}
Request Communicator::ibarrier() const { return start_barrier(*this, "ibarrier"); }

#define TETRAD_INSTANTIATE_COLLECTIVES(T)                                                    \
  template void Communicator::allreduce_sum<T>(T*, size_t) const;                            \
  template void Communicator::allreduce_max<T>(T*, size_t) const;                            \
  template void Communicator::allgather<T>(const T*, T*, size_t) const;                      \
  template void Communicator::reduce_scatter_sum<T>(const T*, T*, size_t) const;             \
  template void Communicator::broadcast<T>(T*, size_t, int) const;                           \
  template void Communicator::send<T>(const T*, size_t, int, int) const;                     \
  template void Communicator::alltoallv<T>(const T*, const std::vector<size_t>&,             \
                                           const std::vector<size_t>&, T*,                   \
                                           const std::vector<size_t>&,                       \
                                           const std::vector<size_t>&) const;                \
  template Request Communicator::ialltoallv<T>(const T*, const std::vector<size_t>&,         \
                                               const std::vector<size_t>&, T*,               \
                                               const std::vector<size_t>&,                   \
                                               const std::vector<size_t>&, const Event&)     \
      const;                                                                                 \
  template void Communicator::recv<T>(T*, size_t, int, int) const;                           \
  template Request Communicator::iallreduce_sum<T>(T*, size_t, const Event&) const;          \
  template Request Communicator::iallreduce_max<T>(T*, size_t, const Event&) const;          \
  template Request Communicator::iallgather<T>(const T*, T*, size_t, const Event&) const;    \
  template Request Communicator::ireduce_scatter_sum<T>(const T*, T*, size_t, const Event&)  \
      const;                                                                                 \
  template Request Communicator::ibroadcast<T>(T*, size_t, int, const Event&) const;         \
  template Request Communicator::isend<T>(const T*, size_t, int, int, const Event&) const;   \
  template Request Communicator::isend<T>(std::vector<T>, int, int) const;                   \
  template Request Communicator::irecv<T>(T*, size_t, int, int, const Event&) const;

TETRAD_INSTANTIATE_COLLECTIVES(float)
TETRAD_INSTANTIATE_COLLECTIVES(double)
TETRAD_INSTANTIATE_COLLECTIVES(std::int32_t)
TETRAD_INSTANTIATE_COLLECTIVES(std::int64_t)
TETRAD_INSTANTIATE_COLLECTIVES(std::uint64_t)
TETRAD_INSTANTIATE_COLLECTIVES(std::uint16_t)
#undef TETRAD_INSTANTIATE_COLLECTIVES

}  // namespace tetrad::comm
