#include "tetrad/comm/communicator.hpp"

#include <atomic>
#include <chrono>
#include <mutex>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::comm {

// ---------------------------------------------------------------------------------------------
// Timeout setting

namespace {
std::atomic<double> g_timeout_set{0.0};  // > 0 once set_collective_timeout was called
std::mutex g_timeout_source_mu;
std::string g_timeout_source;  // the setting a user changes ("train.comm_timeout"), "" if none
// Set once a collective timed out: the job is ending (the group's state is unknown), so the
// requests still pending are not waited for again while the error unwinds; each would otherwise
// wait a whole timeout (a step with several prefetched all-gathers pending held the job many
// timeouts long).
std::atomic<bool> g_comm_failed{false};


double timeout_from_environment() {
  static const double value = [] {
    const char* text = std::getenv("TETRAD_COMM_TIMEOUT");
    if (text == nullptr || *text == '\0') return 300.0;
    char* end = nullptr;
    const double v = std::strtod(text, &end);
    if (end == text || *end != '\0' || !(v > 0))
      fail("TETRAD_COMM_TIMEOUT=\"", text, "\": expected a positive number of seconds");
    return v;
  }();
  return value;
}
}  // namespace

void set_collective_timeout(double seconds, const std::string& setting) {
  if (!(seconds > 0))
    fail("collective timeout: expected a positive number of seconds, got ", seconds);
  g_timeout_set.store(seconds);
  std::lock_guard<std::mutex> lock(g_timeout_source_mu);
  g_timeout_source = setting;
}

std::string collective_timeout_setting() {
  std::lock_guard<std::mutex> lock(g_timeout_source_mu);
  if (!g_timeout_source.empty()) return g_timeout_source;
  return std::string("the environment variable TETRAD_COMM_TIMEOUT (train.comm_timeout in a training config)");
}

bool collective_failed() { return g_comm_failed.load(); }
void clear_collective_failure() { g_comm_failed.store(false); }

double collective_timeout() {
  const double set = g_timeout_set.load();
  return set > 0 ? set : timeout_from_environment();
}

// ---------------------------------------------------------------------------------------------
// Helpers

namespace {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(rc);
  return std::string(text, len);
}

bool mpi_finalized() {
  int finalized = 0;
  return MPI_Finalized(&finalized) != MPI_SUCCESS || finalized;
}

template <Element T> MPI_Datatype mpi_type();
template <> MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <> MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <> MPI_Datatype mpi_type<std::int32_t>() { return MPI_INT32_T; }
template <> MPI_Datatype mpi_type<std::int64_t>() { return MPI_INT64_T; }
template <> MPI_Datatype mpi_type<std::uint64_t>() { return MPI_UINT64_T; }

template <Element T> const char* type_name();
template <> const char* type_name<float>() { return "float"; }
template <> const char* type_name<double>() { return "double"; }
template <> const char* type_name<std::int32_t>() { return "int32"; }
template <> const char* type_name<std::int64_t>() { return "int64"; }
template <> const char* type_name<std::uint64_t>() { return "uint64"; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// The owner of a communicator's MPI_Comm

struct Communicator::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
  std::string name;
  Handle(MPI_Comm c, std::string n) : comm(c), name(std::move(n)) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    if (comm == MPI_COMM_NULL || mpi_finalized()) return;
    const int rc = MPI_Comm_free(&comm);
    if (rc != MPI_SUCCESS)
      std::fprintf(stderr, "tetrad: MPI_Comm_free of group '%s' failed: %s\n", name.c_str(),
                   mpi_error_string(rc).c_str());
  }
};

// What the request helpers below need of a Communicator's internals.
struct CommAccess {
  static std::shared_ptr<const void> handle(const Communicator& c) { return c.handle_; }
};

// ---------------------------------------------------------------------------------------------
// Request

struct Request::State {
  MPI_Request request = MPI_REQUEST_NULL;
  const char* op = "";    // "iallreduce_sum", "recv", ... (string literals)
  const char* type = "";  // "float"; "" for a barrier
  size_t count = 0;    // elements per rank
  std::string extra;   // " from rank 1, tag 7"
  std::string group;   // the communicator's name
  int rank = 0, size = 1;
  bool is_recv = false;
  MPI_Datatype datatype = MPI_DATATYPE_NULL;  // for checking a receive's length
  bool timed_out = false;
  std::vector<std::shared_ptr<const void>> keep;

  std::string description() const {
    std::string s = op;
    if (*type != '\0') s += detail::concat(" of ", count, " ", type);
    s += extra;
    s += detail::concat(" on group '", group, "' (rank ", rank, " of ", size, ")");
    return s;
  }
};

namespace {
std::unique_ptr<Request::State> new_state(const Communicator& comm, const char* op,
                                          const char* type, size_t count,
                                          MPI_Datatype datatype) {
  auto s = std::make_unique<Request::State>();
  s->op = op;
  s->type = type;
  s->count = count;
  s->group = comm.name();
  s->rank = comm.rank();
  s->size = comm.size();
  s->datatype = datatype;
  s->keep.push_back(CommAccess::handle(comm));  // the MPI_Comm outlives the operation
  return s;
}

// MPI takes int counts.
int to_count(size_t n, const Request::State& s) {
  if (n > static_cast<size_t>(INT_MAX))
    fail("MPI ", s.description(), ": ", n, " elements is more than MPI's int count allows (",
         INT_MAX, "); split the buffer");
  return static_cast<int>(n);
}

Request started(std::unique_ptr<Request::State> s, int rc) {
  if (rc != MPI_SUCCESS) fail("MPI ", s->description(), " failed to start: ", mpi_error_string(rc));
  return Request(std::move(s));
}
}  // namespace

Request::Request() = default;
Request::Request(std::unique_ptr<State> state) : state_(std::move(state)) {}
Request::Request(Request&& other) noexcept = default;

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    if (pending()) finish_in_destructor();
    state_ = std::move(other.state_);
  }
  return *this;
}

Request::~Request() {
  if (pending()) finish_in_destructor();
}

bool Request::pending() const { return state_ && state_->request != MPI_REQUEST_NULL; }

std::string Request::description() const { return state_ ? state_->description() : ""; }

void Request::keep_alive(std::shared_ptr<const void> owner) {
  if (pending()) state_->keep.push_back(std::move(owner));
  // A complete (or empty) request needs nothing kept: `owner` is released here.
}

namespace {
// The bookkeeping once MPI reports completion: check a receive's length, drop the keep-alives.
void completed(Request::State& s, const MPI_Status& status) {
  s.keep.clear();
  if (!s.is_recv) return;
  int got = 0;
  const int rc = MPI_Get_count(&status, s.datatype, &got);
  if (rc != MPI_SUCCESS) fail("MPI ", s.description(), ": MPI_Get_count failed: ", mpi_error_string(rc));
  if (got < 0 || static_cast<size_t>(got) != s.count)
    fail("MPI ", s.description(), ": received ", got, " elements, expected ", s.count,
         " (the sender and receiver disagree on the message length)");
}
}  // namespace

bool Request::test() {
  if (!pending()) return true;
  int flag = 0;
  MPI_Status status;
  const int rc = MPI_Test(&state_->request, &flag, &status);
  if (rc != MPI_SUCCESS) {
    // A failed operation is finished as far as we are concerned; MPI releases the request.
    state_->request = MPI_REQUEST_NULL;
    state_->keep.clear();
    fail("MPI ", state_->description(), " failed: ", mpi_error_string(rc));
  }
  if (!flag) return false;
  completed(*state_, status);
  return true;
}

namespace {
std::mutex g_blocked_mu;
std::string g_blocked_what;  // "" when not blocked
std::chrono::steady_clock::time_point g_blocked_since;

// Publishes a slow wait for blocked_in_wait() while it lasts.
struct BlockedMark {
  bool set = false;
  void mark(const std::string& what, std::chrono::steady_clock::time_point since) {
    std::lock_guard<std::mutex> lock(g_blocked_mu);
    g_blocked_what = what;
    g_blocked_since = since;
    set = true;
  }
  ~BlockedMark() {
    if (!set) return;
    std::lock_guard<std::mutex> lock(g_blocked_mu);
    g_blocked_what.clear();
  }
};
}  // namespace

bool blocked_in_wait(std::string* what, double* seconds) {
  std::lock_guard<std::mutex> lock(g_blocked_mu);
  if (g_blocked_what.empty()) return false;
  if (what) *what = g_blocked_what;
  if (seconds)
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - g_blocked_since).count();
  return true;
}

void Request::wait() { wait(collective_timeout()); }

void Request::wait(double timeout_s) {
  if (test()) return;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  BlockedMark blocked;
  for (long polls = 1;; ++polls) {
    if (test()) return;
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited >= timeout_s) {
      State& s = *state_;
      if (s.is_recv) {
        // A receive can be cancelled cleanly; if the message arrived meanwhile, it is complete.
        MPI_Status status;
        int rc = MPI_Cancel(&s.request);
        if (rc == MPI_SUCCESS) rc = MPI_Wait(&s.request, &status);
        int cancelled = 0;
        if (rc == MPI_SUCCESS) rc = MPI_Test_cancelled(&status, &cancelled);
        s.request = MPI_REQUEST_NULL;
        s.keep.clear();
        if (rc != MPI_SUCCESS)
          fail("MPI ", s.description(), " timed out after ", waited,
               " s and cancelling it failed: ", mpi_error_string(rc));
        if (!cancelled) {
          completed(s, status);
          return;
        }
      } else {
        s.timed_out = true;
      }
      if (!s.is_recv) g_comm_failed.store(true);
      char waited_text[32];
      std::snprintf(waited_text, sizeof waited_text, "%.2f", waited);
      int world_rank = -1;
      if (!mpi_finalized()) MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      fail("rank ", world_rank, ": MPI ", s.description(), " did not complete within ", timeout_s,
           " s (waited ", waited_text, " s): a peer rank may have died or stalled, or the ranks of "
           "the group called different operations",
           s.is_recv ? " (the receive was cancelled)" : "", ". The timeout is ",
           collective_timeout_setting(), "; raise it if the peers are only slow");
    }
    // Spin first (most operations finish within microseconds), then stop burning a core that a
    // peer rank may need (oversubscribed runs), then poll every 200 us.
    if (polls < 2000) continue;
    if (!blocked.set) blocked.mark(state_->description(), start);
    if (waited < 0.01)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void Request::finish_in_destructor() noexcept {
  State& s = *state_;
  if (mpi_finalized()) {
    std::fprintf(stderr, "tetrad: %s was still pending when MPI was finalised; its buffers are leaked\n",
                 s.description().c_str());
    (void)state_.release();
    return;
  }
  if (!s.timed_out && g_comm_failed.load()) {
    // The job is ending after a timeout: one last test, no waiting, no warning for each.
    try {
      test();
    } catch (const std::exception&) {
    }
  } else if (!s.timed_out) {
    const auto start = std::chrono::steady_clock::now();
    double timeout = 300;
    try {
      timeout = collective_timeout();
    } catch (const std::exception&) {
      // An invalid TETRAD_COMM_TIMEOUT was reported where it was read; use the default here.
    }
    try {
      wait(timeout);
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
      test();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tetrad: %s\n", e.what());
    }
  }
  if (pending()) {
    // MPI may still write into the buffers and a collective cannot be cancelled: keep everything.
    std::fprintf(stderr,
                 "tetrad: %s never completed; its request and buffers are leaked on purpose\n",
                 s.description().c_str());
    (void)state_.release();
  }
}

// ---------------------------------------------------------------------------------------------
// Communicator: construction

Communicator::Communicator(MPI_Comm comm, std::string name)
    : handle_(std::make_shared<Handle>(comm, name)), comm_(comm), name_(std::move(name)) {
  int rc = MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm_, &rank_);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm_, &size_);
  if (rc != MPI_SUCCESS)
    fail("MPI: setting up communicator '", name_, "' failed: ", mpi_error_string(rc));
}

Communicator Communicator::self(std::string name) {
  Communicator c;
  c.name_ = std::move(name);
  c.rank_ = 0;
  c.size_ = 1;
  return c;
}

Communicator Communicator::world(std::string name) {
  if (!MpiEnvironment::is_initialized())
    fail("Communicator::world: MPI is not initialised (construct a comm::MpiEnvironment first)");
  return duplicate(MPI_COMM_WORLD, std::move(name));
}

Communicator Communicator::duplicate(MPI_Comm comm, std::string name) {
  MPI_Comm out = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(comm, &out);
  if (rc != MPI_SUCCESS)
    fail("MPI_Comm_dup for group '", name, "' failed: ", mpi_error_string(rc));
  return Communicator(out, std::move(name));
}

Communicator Communicator::dup(std::string name) const {
  check_usable();
  if (is_self()) return self(std::move(name));
  return duplicate(comm_, std::move(name));
}

Communicator Communicator::split(int color, int key, std::string name) const {
  check_usable();
  TETRAD_CHECK(color >= 0, "split of '", name_, "': color must be >= 0, got ", color);
  if (is_self()) return self(std::move(name));
  MPI_Comm out = MPI_COMM_NULL;
  const int rc = MPI_Comm_split(comm_, color, key, &out);
  if (rc != MPI_SUCCESS)
    fail("MPI_Comm_split of group '", name_, "' into '", name, "' failed: ", mpi_error_string(rc));
  return Communicator(out, std::move(name));
}

Communicator::Communicator(Communicator&& other) noexcept
    : handle_(std::move(other.handle_)),
      comm_(other.comm_),
      name_(std::move(other.name_)),
      rank_(other.rank_),
      size_(other.size_) {
  other.comm_ = MPI_COMM_NULL;
  other.size_ = 0;
}

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    handle_ = std::move(other.handle_);
    comm_ = other.comm_;
    name_ = std::move(other.name_);
    rank_ = other.rank_;
    size_ = other.size_;
    other.comm_ = MPI_COMM_NULL;
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

bool Communicator::is_self() const {
  check_usable();
  return comm_ == MPI_COMM_NULL;
}

MPI_Comm Communicator::native() const {
  check_usable();
  return comm_;
}

// ---------------------------------------------------------------------------------------------
// Communicator: operations. Each `start_*` launches one non-blocking MPI call under the name `op`
// (so a blocking call's errors carry the blocking name); blocking calls wait on it.

namespace {

template <Element T>
Request start_allreduce(const Communicator& c, const char* op, T* inout, size_t n, MPI_Op mpi_op) {
  if (c.is_self()) return Request();
  auto s = new_state(c, op, type_name<T>(), n, mpi_type<T>());
  const int count = to_count(n, *s);
  const int rc = MPI_Iallreduce(MPI_IN_PLACE, inout, count, mpi_type<T>(), mpi_op, c.native(),
                                &s->request);
  return started(std::move(s), rc);
}

template <Element T>
Request start_allgather(const Communicator& c, const char* op, const T* send, T* recv, size_t n) {
  if (c.is_self()) {
    if (send != recv && n > 0) std::memmove(recv, send, n * sizeof(T));
    return Request();
  }
  auto s = new_state(c, op, type_name<T>(), n, mpi_type<T>());
  const int count = to_count(n, *s);
  const bool in_place = send == recv + static_cast<size_t>(c.rank()) * n;
  const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, count, mpi_type<T>(), recv, count,
                                mpi_type<T>(), c.native(), &s->request);
  return started(std::move(s), rc);
}

template <Element T>
Request start_reduce_scatter(const Communicator& c, const char* op, const T* send, T* recv,
                             size_t n) {
  if (c.is_self()) {
    if (send != recv && n > 0) std::memmove(recv, send, n * sizeof(T));
    return Request();
  }
  auto s = new_state(c, op, type_name<T>(), n, mpi_type<T>());
  const int count = to_count(n, *s);
  const int rc = MPI_Ireduce_scatter_block(send, recv, count, mpi_type<T>(), MPI_SUM, c.native(),
                                           &s->request);
  return started(std::move(s), rc);
}

template <Element T>
Request start_broadcast(const Communicator& c, const char* op, T* data, size_t n, int root) {
  TETRAD_CHECK(root >= 0 && root < c.size(), op, " on group '", c.name(), "': root ", root,
               " is outside the group of ", c.size());
  if (c.is_self()) return Request();
  auto s = new_state(c, op, type_name<T>(), n, mpi_type<T>());
  s->extra = detail::concat(" from root ", root);
  const int count = to_count(n, *s);
  const int rc = MPI_Ibcast(data, count, mpi_type<T>(), root, c.native(), &s->request);
  return started(std::move(s), rc);
}

void check_peer(const Communicator& c, const char* op, int peer) {
  TETRAD_CHECK(peer >= 0 && peer < c.size(), op, " on group '", c.name(), "': peer ", peer,
               " is outside the group of ", c.size());
  if (c.is_self())
    fail(op, " on the size-1 group '", c.name(), "': a group without MPI has no peer to talk to");
}

template <Element T>
Request start_send(const Communicator& c, const char* op, const T* data, size_t n, int peer,
                   int tag) {
  check_peer(c, op, peer);
  auto s = new_state(c, op, type_name<T>(), n, mpi_type<T>());
  s->extra = detail::concat(" to rank ", peer, ", tag ", tag);
  const int count = to_count(n, *s);
  const int rc = MPI_Isend(data, count, mpi_type<T>(), peer, tag, c.native(), &s->request);
  return started(std::move(s), rc);
}

template <Element T>
Request start_recv(const Communicator& c, const char* op, T* data, size_t n, int peer, int tag) {
  check_peer(c, op, peer);
  auto s = new_state(c, op, type_name<T>(), n, mpi_type<T>());
  s->extra = detail::concat(" from rank ", peer, ", tag ", tag);
  s->is_recv = true;
  const int count = to_count(n, *s);
  const int rc = MPI_Irecv(data, count, mpi_type<T>(), peer, tag, c.native(), &s->request);
  return started(std::move(s), rc);
}

Request start_barrier(const Communicator& c, const char* op) {
  if (c.is_self()) return Request();
  auto s = new_state(c, op, "", 0, MPI_DATATYPE_NULL);
  const int rc = MPI_Ibarrier(c.native(), &s->request);
  return started(std::move(s), rc);
}

}  // namespace

template <Element T> void Communicator::allreduce_sum(T* inout, size_t n) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_allreduce(*this, "allreduce_sum", inout, n, MPI_SUM).wait(timeout);
}
template <Element T> void Communicator::allreduce_max(T* inout, size_t n) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_allreduce(*this, "allreduce_max", inout, n, MPI_MAX).wait(timeout);
}
template <Element T> void Communicator::allgather(const T* send, T* recv, size_t n) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_allgather(*this, "allgather", send, recv, n).wait(timeout);
}
template <Element T>
void Communicator::reduce_scatter_sum(const T* send, T* recv, size_t n) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_reduce_scatter(*this, "reduce_scatter_sum", send, recv, n).wait(timeout);
}
template <Element T> void Communicator::broadcast(T* data, size_t n, int root) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_broadcast(*this, "broadcast", data, n, root).wait(timeout);
}
template <Element T> void Communicator::send(const T* data, size_t n, int peer, int tag) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_send(*this, "send", data, n, peer, tag).wait(timeout);
}
template <Element T> void Communicator::recv(T* data, size_t n, int peer, int tag) const {
  const double timeout = collective_timeout();  // before starting: it may throw
  start_recv(*this, "recv", data, n, peer, tag).wait(timeout);
}
void Communicator::barrier() const {
  const double timeout = collective_timeout();
  start_barrier(*this, "barrier").wait(timeout);
}

template <Element T> Request Communicator::iallreduce_sum(T* inout, size_t n) const {
  return start_allreduce(*this, "iallreduce_sum", inout, n, MPI_SUM);
}
template <Element T> Request Communicator::iallreduce_max(T* inout, size_t n) const {
  return start_allreduce(*this, "iallreduce_max", inout, n, MPI_MAX);
}
template <Element T> Request Communicator::iallgather(const T* send, T* recv, size_t n) const {
  return start_allgather(*this, "iallgather", send, recv, n);
}
template <Element T>
Request Communicator::ireduce_scatter_sum(const T* send, T* recv, size_t n) const {
  return start_reduce_scatter(*this, "ireduce_scatter_sum", send, recv, n);
}
template <Element T> Request Communicator::ibroadcast(T* data, size_t n, int root) const {
  return start_broadcast(*this, "ibroadcast", data, n, root);
}
template <Element T>
Request Communicator::isend(const T* data, size_t n, int peer, int tag) const {
  return start_send(*this, "isend", data, n, peer, tag);
}
template <Element T> Request Communicator::isend(std::vector<T> data, int peer, int tag) const {
  auto owned = std::make_shared<const std::vector<T>>(std::move(data));
  Request r = start_send(*this, "isend", owned->data(), owned->size(), peer, tag);
  r.keep_alive(owned);
  return r;
}
template <Element T> Request Communicator::irecv(T* data, size_t n, int peer, int tag) const {
  return start_recv(*this, "irecv", data, n, peer, tag);
}
Request Communicator::ibarrier() const { return start_barrier(*this, "ibarrier"); }

#define TETRAD_INSTANTIATE_COLLECTIVES(T)                                                  \
  template void Communicator::allreduce_sum<T>(T*, size_t) const;                          \
  template void Communicator::allreduce_max<T>(T*, size_t) const;                          \
  template void Communicator::allgather<T>(const T*, T*, size_t) const;                    \
  template void Communicator::reduce_scatter_sum<T>(const T*, T*, size_t) const;           \
  template void Communicator::broadcast<T>(T*, size_t, int) const;                         \
  template void Communicator::send<T>(const T*, size_t, int, int) const;                   \
  template void Communicator::recv<T>(T*, size_t, int, int) const;                         \
  template Request Communicator::iallreduce_sum<T>(T*, size_t) const;                      \
  template Request Communicator::iallreduce_max<T>(T*, size_t) const;                      \
  template Request Communicator::iallgather<T>(const T*, T*, size_t) const;                \
  template Request Communicator::ireduce_scatter_sum<T>(const T*, T*, size_t) const;       \
  template Request Communicator::ibroadcast<T>(T*, size_t, int) const;                     \
  template Request Communicator::isend<T>(const T*, size_t, int, int) const;               \
  template Request Communicator::isend<T>(std::vector<T>, int, int) const;                 \
  template Request Communicator::irecv<T>(T*, size_t, int, int) const;

TETRAD_INSTANTIATE_COLLECTIVES(float)
TETRAD_INSTANTIATE_COLLECTIVES(double)
TETRAD_INSTANTIATE_COLLECTIVES(std::int32_t)
TETRAD_INSTANTIATE_COLLECTIVES(std::int64_t)
TETRAD_INSTANTIATE_COLLECTIVES(std::uint64_t)
#undef TETRAD_INSTANTIATE_COLLECTIVES

}  // namespace tetrad::comm
