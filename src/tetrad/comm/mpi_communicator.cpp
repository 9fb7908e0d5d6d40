// The MPI implementation of the communication interface (mpi_communicator.hpp).
#include "tetrad/comm/mpi_communicator.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "tetrad/comm/comm_impl.hpp"
#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::comm {

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

bool mpi_running() {
  int up = 0;
  if (MPI_Initialized(&up) != MPI_SUCCESS || !up) return false;
  return !mpi_finalized();
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U64: return MPI_UINT64_T;
    case DType::U16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

// An MPI host-side completion: the host waits for events it is given to start after.
void wait_on_host(const Event& after) {
  if (!after.empty() && !after.query()) after.synchronize();
}

// An in-place sum over a group of two ranks, as two exchanges of halves (a reduce-scatter, then
// an all-gather) by point-to-point messages. Open MPI's MPI_Iallreduce (libnbc) runs an in-place
// sum on fewer than 4 ranks as a binomial reduce then broadcast: the whole buffer travels to rank
// 0, rank 0 sums it while rank 1 waits, and the whole result travels back, three full passes in
// a row; here each rank receives the half it owns, sums it and sends it back, both at once (the
// X axis all-reduces activations in every forward: 2.5x faster on 4 MiB, 2 ranks on 2 cores).
// The same bits: each element is the sum of the two ranks' values, a + b = b + a in IEEE
// arithmetic, computed once and sent to the other rank.
//
// Steps (advance(), from MPI_Test polls): the other half is sent and this rank's half received
// into a scratch buffer at the start; once it arrived, it is added into this rank's half, which is
// sent back; once the first send is complete (its buffer is free), the other half's sum is
// received in place. Each operation has its own tags (the group's sequence number: ranks start a
// group's collectives in the same order), so concurrent sums never take each other's messages.
// A reduce-scatter on two ranks is the first exchange alone (scatter_only): each rank sends the
// peer's block and sums its own, instead of libnbc's reduce of the whole buffer to rank 0 and
// scatter of the halves (1.2-2.1x slower on 12-64 MiB, 2 ranks on 2 loaded cores).
struct PairSum {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  DType dtype = DType::F32;
  int peer = 0, tag = 0;
  const char* mine = nullptr;  // this rank's block of the input
  char* sum = nullptr;         // where its sum goes (mine itself for the all-reduce)
  char* other = nullptr;       // the peer's block: sent, then (all-reduce) received summed
  int n_mine = 0, n_other = 0;
  bool scatter_only = false;   // a reduce-scatter: done once this rank's block is summed
  std::unique_ptr<char[]> scratch;  // the peer's values of this rank's block
  MPI_Request send1 = MPI_REQUEST_NULL, recv1 = MPI_REQUEST_NULL;
  MPI_Request send2 = MPI_REQUEST_NULL, recv2 = MPI_REQUEST_NULL;
  bool summed = false, receiving = false;

  // 0 on success, else the failing MPI call's code.
  int start() {
    int rc = MPI_Irecv(scratch.get(), n_mine, type, peer, tag, comm, &recv1);
    if (rc == MPI_SUCCESS) rc = MPI_Isend(other, n_other, type, peer, tag, comm, &send1);
    return rc;
  }
  // Moves the exchange on; true when complete. *rc: the failing MPI call's code.
  bool advance(int* rc) {
    int flag = 0;
    if (!summed) {
      if ((*rc = MPI_Test(&recv1, &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return false;
      if (flag) {
        if (dtype == DType::F64) add<double>();
        else add<float>();
        scratch.reset();
        summed = true;
        if (!scatter_only &&
            (*rc = MPI_Isend(sum, n_mine, type, peer, tag + 1, comm, &send2)) != MPI_SUCCESS)
          return false;
      }
    }
    if (!receiving) {
      if ((*rc = MPI_Test(&send1, &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return false;
      if (flag) {
        receiving = true;
        if (!scatter_only &&
            (*rc = MPI_Irecv(other, n_other, type, peer, tag + 1, comm, &recv2)) != MPI_SUCCESS)
          return false;
      }
    }
    if (!summed || !receiving) return false;
    if (scatter_only) return true;
    MPI_Request last[2] = {send2, recv2};
    *rc = MPI_Testall(2, last, &flag, MPI_STATUSES_IGNORE);
    send2 = last[0], recv2 = last[1];
    return *rc == MPI_SUCCESS && flag;
  }
  // sum = mine + the peer's values (a + b = b + a: the bits of any two-operand sum).
  template <typename T> void add() const {
    const T* a = reinterpret_cast<const T*>(mine);
    const T* b = reinterpret_cast<const T*>(scratch.get());
    T* c = reinterpret_cast<T*>(sum);
    for (int i = 0; i < n_mine; ++i) c[i] = a[i] + b[i];
  }
};

// One started MPI operation: its MPI_Request is its completion event (or a PairSum's messages).
class MpiOp final : public PendingOp {
 public:
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Datatype datatype = MPI_DATATYPE_NULL;  // for checking a receive's length
  std::unique_ptr<PairSum> pair;              // a two-rank sum instead of `request`

  // Device buffers staged through host memory (MpiImpl::host_side): the host copies MPI works on,
  // and those to copy back to the device once the operation completes.
  struct Staged {
    std::unique_ptr<char[]> host;
    void* device = nullptr;
    size_t bytes = 0;
    bool back = false;
  };
  std::shared_ptr<DeviceStaging> staging;
  std::vector<Staged> staged;
  // MPI_Ialltoallv's counts and displacements, which must live until it completes.
  std::vector<int> counts_displs;

  bool poll_native() override {
    int flag = 0;
    MPI_Status status;
    if (pair) {
      int rc = MPI_SUCCESS;
      const bool done = pair->advance(&rc);
      if (rc != MPI_SUCCESS)  // finished as far as we are concerned, as a failed MPI_Test
        fail("MPI ", description(), " failed: ", mpi_error_string(rc));
      if (!done) return false;
      pair.reset();
      completed(status);
      return true;
    }
    const int rc = MPI_Test(&request, &flag, &status);
    if (rc != MPI_SUCCESS) {
      // A failed operation is finished as far as we are concerned; MPI releases the request.
      request = MPI_REQUEST_NULL;
      fail("MPI ", description(), " failed: ", mpi_error_string(rc));
    }
    if (!flag) return false;
    completed(status);
    return true;
  }

  bool on_timeout(double waited, std::string* note, bool* group_usable, bool* over) override {
    if (!is_recv) {
      // A collective (or a send) cannot be cancelled: it stays pending; a late peer may still
      // complete it (wait() again), but the group's state is unknown.
      *group_usable = false;
      *over = false;
      return false;
    }
    // A receive can be cancelled cleanly; if the message arrived meanwhile, it is complete.
    MPI_Status status;
    int rc = MPI_Cancel(&request);
    if (rc == MPI_SUCCESS) rc = MPI_Wait(&request, &status);
    int cancelled = 0;
    if (rc == MPI_SUCCESS) rc = MPI_Test_cancelled(&status, &cancelled);
    request = MPI_REQUEST_NULL;
    if (rc != MPI_SUCCESS)
      fail("MPI ", description(), " timed out after ", waited,
           " s and cancelling it failed: ", mpi_error_string(rc));
    if (!cancelled) {
      completed(status);
      return true;
    }
    *note = " (the receive was cancelled)";
    *group_usable = true;
    *over = true;
    return false;
  }

  bool library_finalized() const override { return mpi_finalized(); }

 private:
  // MPI reported completion: check a receive's length; staged results go back to the device.
  void completed(const MPI_Status& status) {
    for (Staged& b : staged)
      if (b.back) staging->to_device(b.device, b.host.get(), b.bytes);
    staged.clear();
    if (!is_recv) return;
    int got = 0;
    const int rc = MPI_Get_count(&status, datatype, &got);
    if (rc != MPI_SUCCESS)
      fail("MPI ", description(), ": MPI_Get_count failed: ", mpi_error_string(rc));
    if (got < 0 || static_cast<size_t>(got) != count)
      fail("MPI ", description(), ": received ", got, " elements, expected ", count,
           " (the sender and receiver disagree on the message length)");
  }
};

// One MPI communicator, owned: a duplicate or a split, freed (MPI_Comm_free) when the last
// Communicator and pending operation let go of it; skipped if MPI is already finalised.
class MpiImpl final : public CommImpl {
 public:
  MpiImpl(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
    int rc = MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm_, &rank_);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm_, &size_);
    if (rc != MPI_SUCCESS)
      fail("MPI: setting up communicator '", name_, "' failed: ", mpi_error_string(rc));
  }
  ~MpiImpl() override {
    if (comm_ == MPI_COMM_NULL || mpi_finalized()) return;
    const int rc = MPI_Comm_free(&comm_);
    if (rc != MPI_SUCCESS)
      std::fprintf(stderr, "tetrad: MPI_Comm_free of group '%s' failed: %s\n", name_.c_str(),
                   mpi_error_string(rc).c_str());
  }
  MpiImpl(const MpiImpl&) = delete;
  MpiImpl& operator=(const MpiImpl&) = delete;

  static std::shared_ptr<CommImpl> duplicate(MPI_Comm comm, const std::string& name) {
    MPI_Comm out = MPI_COMM_NULL;
    const int rc = MPI_Comm_dup(comm, &out);
    if (rc != MPI_SUCCESS)
      fail("MPI_Comm_dup for group '", name, "' failed: ", mpi_error_string(rc));
    return std::make_shared<MpiImpl>(out, name);
  }

  MPI_Comm native() const { return comm_; }
  const char* transport() const override { return "MPI"; }
  BufferSpace buffer_space() const override { return BufferSpace::Host; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  std::shared_ptr<PendingOp> allreduce(const char* op, void* inout, size_t n, DType t, ReduceOp r,
                                       const Event& after) override {
    auto s = new_op(op, t, n);
    const int count = to_count(n, *s);
    wait_on_host(after);
    inout = host_side(*s, inout, n * dtype_size(t), true, true);
    if (size_ == 2 && r == ReduceOp::Sum && (t == DType::F32 || t == DType::F64) && n >= 2) {
      const int rc = start_pair_sum(*s, inout, n, t);
      return started(std::move(s), rc);
    }
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, inout, count, mpi_type(t),
                                  r == ReduceOp::Max ? MPI_MAX : MPI_SUM, comm_, &s->request);
    return started(std::move(s), rc);
  }
  std::shared_ptr<PendingOp> allgather(const char* op, const void* send, void* recv, size_t n,
                                       DType t, const Event& after) override {
    auto s = new_op(op, t, n);
    const int count = to_count(n, *s);
    const bool in_place =
        send == static_cast<const char*>(recv) + static_cast<size_t>(rank_) * n * dtype_size(t);
    wait_on_host(after);
    const size_t bytes = n * dtype_size(t);
    recv = host_side(*s, recv, bytes * static_cast<size_t>(size_), in_place, true);
    if (!in_place) send = host_side(*s, send, bytes, true, false);
    const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, count, mpi_type(t), recv, count,
                                  mpi_type(t), comm_, &s->request);
    return started(std::move(s), rc);
  }
  // In place when recv = send + rank·n (as NCCL's ncclReduceScatter and this rank's block of
  // the input): MPI forbids aliased buffers, so the pair exchange sums there directly, and
  // otherwise libnbc reads a copy of the input.
  std::shared_ptr<PendingOp> reduce_scatter(const char* op, const void* send, void* recv,
                                            size_t n, DType t, const Event& after) override {
    auto s = new_op(op, t, n);
    const int count = to_count(n, *s);
    wait_on_host(after);
    const size_t bytes = n * dtype_size(t), whole = bytes * static_cast<size_t>(size_);
    const bool in_place = recv == static_cast<const char*>(send) + static_cast<size_t>(rank_) * bytes;
    if (in_place) {
      char* all = host_side(*s, static_cast<char*>(recv) - static_cast<size_t>(rank_) * bytes,
                            whole, true, true);
      send = all;
      recv = all + static_cast<size_t>(rank_) * bytes;
    } else {
      send = host_side(*s, send, whole, true, false);
      recv = host_side(*s, recv, bytes, false, true);
    }
    if (size_ == 2 && (t == DType::F32 || t == DType::F64) && n >= 1) {
      const int rc = start_pair_scatter(*s, static_cast<const char*>(send), static_cast<char*>(recv), n, t);
      return started(std::move(s), rc);
    }
    if (in_place) {  // a copy of the input, alive until the operation completes
      MpiOp::Staged copy;
      copy.host = std::make_unique<char[]>(whole);
      std::memcpy(copy.host.get(), send, whole);
      send = copy.host.get();
      s->staged.push_back(std::move(copy));
    }
    const int rc =
        MPI_Ireduce_scatter_block(send, recv, count, mpi_type(t), MPI_SUM, comm_, &s->request);
    return started(std::move(s), rc);
  }
  std::shared_ptr<PendingOp> broadcast(const char* op, void* data, size_t n, DType t, int root,
                                       const Event& after) override {
    auto s = new_op(op, t, n);
    s->extra = detail::concat(" from root ", root);
    const int count = to_count(n, *s);
    wait_on_host(after);
    data = host_side(*s, data, n * dtype_size(t), rank_ == root, rank_ != root);
    const int rc = MPI_Ibcast(data, count, mpi_type(t), root, comm_, &s->request);
    return started(std::move(s), rc);
  }
  std::shared_ptr<PendingOp> alltoallv(const char* op, const void* send, const size_t* sc,
                                       const size_t* sd, void* recv, const size_t* rc,
                                       const size_t* rd, DType t, const Event& after) override {
    const size_t S = static_cast<size_t>(size_);
    size_t total = 0, send_end = 0, recv_end = 0;  // elements sent; each buffer's extent
    for (size_t i = 0; i < S; ++i) {
      total += sc[i];
      send_end = std::max(send_end, sc[i] ? sd[i] + sc[i] : 0);
      recv_end = std::max(recv_end, rc[i] ? rd[i] + rc[i] : 0);
    }
    auto s = new_op(op, t, total);
    std::vector<int>& v = s->counts_displs;  // send counts, send displs, recv counts, recv displs
    v.resize(4 * S);
    for (size_t i = 0; i < S; ++i) {
      v[i] = to_count(sc[i], *s), v[S + i] = to_count(sd[i], *s);
      v[2 * S + i] = to_count(rc[i], *s), v[3 * S + i] = to_count(rd[i], *s);
    }
    wait_on_host(after);
    const size_t e = dtype_size(t);
    send = host_side(*s, send, send_end * e, true, false);
    recv = host_side(*s, recv, recv_end * e, true, true);  // filled: blocks not received stay
    const int rc_ = MPI_Ialltoallv(send, v.data(), v.data() + S, mpi_type(t), recv, v.data() + 2 * S,
                                   v.data() + 3 * S, mpi_type(t), comm_, &s->request);
    return started(std::move(s), rc_);
  }
  std::shared_ptr<PendingOp> send(const char* op, const void* data, size_t n, DType t, int peer,
                                  int tag, const Event& after) override {
    auto s = new_op(op, t, n);
    s->extra = detail::concat(" to rank ", peer, ", tag ", tag);
    const int count = to_count(n, *s);
    wait_on_host(after);
    data = host_side(*s, data, n * dtype_size(t), true, false);
    const int rc = MPI_Isend(data, count, mpi_type(t), peer, tag, comm_, &s->request);
    return started(std::move(s), rc);
  }
  std::shared_ptr<PendingOp> recv(const char* op, void* data, size_t n, DType t, int peer, int tag,
                                  const Event& after) override {
    auto s = new_op(op, t, n);
    s->extra = detail::concat(" from rank ", peer, ", tag ", tag);
    s->is_recv = true;
    const int count = to_count(n, *s);
    wait_on_host(after);
    data = host_side(*s, data, n * dtype_size(t), false, true);
    const int rc = MPI_Irecv(data, count, mpi_type(t), peer, tag, comm_, &s->request);
    return started(std::move(s), rc);
  }
  std::shared_ptr<PendingOp> barrier(const char* op) override {
    auto s = std::make_shared<MpiOp>();
    describe_untyped(*s, op);
    const int rc = MPI_Ibarrier(comm_, &s->request);
    return started(std::move(s), rc);
  }

  std::shared_ptr<CommImpl> dup(const std::string& name) override {
    auto d = duplicate(comm_, name);
    d->stage_device_memory(staging_);
    return d;
  }
  std::shared_ptr<CommImpl> split(int color, int key, const std::string& name) override {
    MPI_Comm out = MPI_COMM_NULL;
    const int rc = MPI_Comm_split(comm_, color, key, &out);
    if (rc != MPI_SUCCESS)
      fail("MPI_Comm_split of group '", name_, "' into '", name, "' failed: ", mpi_error_string(rc));
    auto g = std::make_shared<MpiImpl>(out, name);
    g->stage_device_memory(staging_);
    return g;
  }
  void stage_device_memory(std::shared_ptr<DeviceStaging> staging) override {
    staging_ = std::move(staging);
  }

 private:
  // The host memory MPI works on for `p` (bytes): p itself where the host can read it; else a
  // host copy the operation owns, filled from the device now when `fill` (the input; the caller
  // has waited for its `after` event) and copied back to p on completion when `back`.
  template <typename P>
  P* host_side(MpiOp& s, P* p, size_t bytes, bool fill, bool back) const {
    if (!staging_ || !p || bytes == 0 || staging_->host_readable(p)) return p;
    MpiOp::Staged b;
    b.host = std::make_unique<char[]>(bytes);
    b.device = const_cast<void*>(static_cast<const void*>(p));
    b.bytes = bytes;
    b.back = back;
    if (fill) staging_->to_host(b.host.get(), p, bytes);
    P* h = reinterpret_cast<P*>(b.host.get());
    s.staging = staging_;
    s.staged.push_back(std::move(b));
    return h;
  }

  // The two-rank in-place sum (PairSum above) of n elements at `data` (host memory).
  int start_pair_sum(MpiOp& s, void* data, size_t n, DType t) {
    const size_t half = n / 2, es = dtype_size(t);
    // Rank 0 owns [0, half), rank 1 [half, n).
    const size_t mine0 = rank_ == 0 ? 0 : half, other0 = rank_ == 0 ? half : 0;
    char* d = static_cast<char*>(data);
    return start_pair(s, d + mine0 * es, d + mine0 * es, d + other0 * es,
                      rank_ == 0 ? half : n - half, n - (rank_ == 0 ? half : n - half), t, false);
  }
  // The two-rank reduce-scatter of blocks of n elements: send [2n] (host memory), this rank's
  // block's sum into recv [n] (which may be its block of send).
  int start_pair_scatter(MpiOp& s, const char* send, char* recv, size_t n, DType t) {
    const size_t es = dtype_size(t);
    const char* mine = send + static_cast<size_t>(rank_) * n * es;
    char* other = const_cast<char*>(send) + static_cast<size_t>(1 - rank_) * n * es;  // only sent
    return start_pair(s, mine, recv, other, n, n, t, true);
  }
  int start_pair(MpiOp& s, const char* mine, char* sum, char* other, size_t n_mine,
                 size_t n_other, DType t, bool scatter_only) {
    constexpr int kTagBase = 20000, kTagSlots = 4096;  // tags 20000-28191, two per operation
    auto p = std::make_unique<PairSum>();
    p->comm = comm_;
    p->type = mpi_type(t);
    p->dtype = t;
    p->peer = 1 - rank_;
    p->tag = kTagBase + 2 * int(pair_seq_++ % kTagSlots);
    p->mine = mine;
    p->sum = sum;
    p->other = other;
    p->n_mine = int(n_mine);
    p->n_other = int(n_other);
    p->scatter_only = scatter_only;
    p->scratch.reset(new char[n_mine * dtype_size(t)]);
    const int rc = p->start();
    s.pair = std::move(p);
    return rc;
  }

  std::shared_ptr<MpiOp> new_op(const char* op, DType t, size_t n) const {
    auto s = std::make_shared<MpiOp>();
    describe(*s, op, t, n);
    s->datatype = mpi_type(t);
    return s;
  }
  // MPI takes int counts.
  static int to_count(size_t n, const MpiOp& s) {
    if (n > static_cast<size_t>(INT_MAX))
      fail("MPI ", s.description(), ": ", n, " elements is more than MPI's int count allows (",
           INT_MAX, "); split the buffer");
    return static_cast<int>(n);
  }
  static std::shared_ptr<PendingOp> started(std::shared_ptr<MpiOp> s, int rc) {
    if (rc != MPI_SUCCESS) fail("MPI ", s->description(), " failed to start: ", mpi_error_string(rc));
    return s;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  int rank_ = 0, size_ = 0;
  uint64_t pair_seq_ = 0;  // two-rank sums started on this group (their tags)
  std::shared_ptr<DeviceStaging> staging_;  // null: every buffer is host memory
};

}  // namespace

Communicator Communicator::world(std::string name) {
  if (!MpiEnvironment::is_initialized())
    fail("Communicator::world: MPI is not initialised (construct a comm::MpiEnvironment first)");
  return mpi_duplicate(MPI_COMM_WORLD, std::move(name));
}

Communicator mpi_duplicate(MPI_Comm comm, std::string name) {
  return Communicator(MpiImpl::duplicate(comm, name));
}

MPI_Comm mpi_native(const Communicator& c) {
  const auto* m = dynamic_cast<const MpiImpl*>(c.impl());
  return m ? m->native() : MPI_COMM_NULL;
}

int job_rank() {
  if (!mpi_running()) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

bool host_progress_available() {
  if (!mpi_running()) return false;
  int level = 0;
  MPI_Query_thread(&level);
  return level >= MPI_THREAD_SERIALIZED;
}

void drive_host_progress() {
  // Any MPI call runs Open MPI's progress engine; a probe is the cheapest that has no effect.
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
}

}  // namespace tetrad::comm
