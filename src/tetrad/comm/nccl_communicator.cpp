// The NCCL implementation of the communication interface (nccl_communicator.hpp).
#include "tetrad/comm/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <vector>

#include "tetrad/comm/comm_impl.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::comm {

namespace {

ncclDataType_t to_nccl(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U64: return ncclUint64;
    case DType::U16: return ncclBfloat16;  // moved only (reductions refuse uint16)
  }
  return ncclFloat32;
}

void cuda_ok(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) fail("NCCL communicator: ", what, ": ", cudaGetErrorString(e));
}

// What an NCCL group owns: the ncclComm_t, its stream, a one-int device buffer for barriers.
struct NcclGroup {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int* barrier_word = nullptr;
  int rank = 0, size = 0, device = 0;
  std::string name;
  bool aborted = false;

  NcclGroup() = default;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
    if (!aborted && stream) cudaStreamSynchronize(stream);
    if (comm) {
      if (aborted) ncclCommAbort(comm);
      else ncclCommDestroy(comm);
    }
    if (barrier_word) cudaFree(barrier_word);
    if (stream) cudaStreamDestroy(stream);
  }
  std::string where() const {
    return detail::concat("group '", name, "' (rank ", rank, " of ", size, ", device ", device, ")");
  }
  void check(ncclResult_t r, const std::string& op) const {
    if (r != ncclSuccess && r != ncclInProgress)
      fail("NCCL ", op, " failed on ", where(), ": ", ncclGetErrorString(r), " (",
           comm ? ncclGetLastError(comm) : "", ")");
  }
  void abort() {
    if (comm && !aborted) ncclCommAbort(comm);
    comm = nullptr;
    aborted = true;
  }
  // The rest of the setup once `comm` exists: the stream and the barrier word.
  void finish_setup() {
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_ok(cudaMalloc(reinterpret_cast<void**>(&barrier_word), sizeof(int)), "cudaMalloc");
  }
};

// One enqueued NCCL operation: the CUDA event recorded after it on the group's stream is its
// completion.
class NcclOp final : public PendingOp {
 public:
  std::shared_ptr<NcclGroup> group_state;
  cudaEvent_t done = nullptr;
  ~NcclOp() override {
    // Released by the runtime once the event completes, even if it has not yet.
    if (done) cudaEventDestroy(done);
  }

  bool poll_native() override {
    if (group_state->aborted)
      fail("NCCL ", description(), ": the communicator of ", group_state->where(),
           " was aborted after an earlier error or timeout");
    const cudaError_t e = cudaEventQuery(done);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) cuda_ok(e, description());
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(group_state->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      const std::string where = group_state->where();
      group_state->abort();
      fail("NCCL ", description(), " failed asynchronously on ", where, ": ",
           ncclGetErrorString(async), "; the NCCL communicator was aborted");
    }
    return false;
  }

  bool on_timeout(double, std::string* note, bool* group_usable, bool* over) override {
    // Abort so that the NCCL kernels stop spinning; the job must end (as after an MPI timeout).
    group_state->abort();
    *note = " (the NCCL communicator was aborted)";
    *group_usable = false;
    *over = true;
    return false;
  }

  bool needs_host_progress() const override { return false; }
  NativeEvent native() const override { return {NativeEvent::Kind::CudaEvent, done}; }
};

class NcclImpl final : public CommImpl {
 public:
  explicit NcclImpl(std::shared_ptr<NcclGroup> g) : g_(std::move(g)) {}

  const char* transport() const override { return "NCCL"; }
  BufferSpace buffer_space() const override { return BufferSpace::Device; }
  int rank() const override { return g_->rank; }
  int size() const override { return g_->size; }
  const std::string& name() const override { return g_->name; }

  std::shared_ptr<PendingOp> allreduce(const char* op, void* inout, size_t n, DType t, ReduceOp r,
                                       const Event& after) override {
    auto s = new_op(op, t, n);
    require_device_memory(*s, inout, n);
    order_after(after);
    g_->check(ncclAllReduce(inout, inout, n, to_nccl(t), r == ReduceOp::Max ? ncclMax : ncclSum,
                            live(*s), g_->stream),
              s->description());
    return finish(std::move(s));
  }
  std::shared_ptr<PendingOp> allgather(const char* op, const void* send, void* recv, size_t n,
                                       DType t, const Event& after) override {
    auto s = new_op(op, t, n);
    require_device_memory(*s, send, n);
    require_device_memory(*s, recv, n);
    order_after(after);
    g_->check(ncclAllGather(send, recv, n, to_nccl(t), live(*s), g_->stream), s->description());
    return finish(std::move(s));
  }
  std::shared_ptr<PendingOp> reduce_scatter(const char* op, const void* send, void* recv,
                                            size_t n, DType t, const Event& after) override {
    auto s = new_op(op, t, n);
    require_device_memory(*s, send, n);
    require_device_memory(*s, recv, n);
    order_after(after);
    g_->check(ncclReduceScatter(send, recv, n, to_nccl(t), ncclSum, live(*s), g_->stream),
              s->description());
    return finish(std::move(s));
  }
  std::shared_ptr<PendingOp> broadcast(const char* op, void* data, size_t n, DType t, int root,
                                       const Event& after) override {
    auto s = new_op(op, t, n);
    s->extra = detail::concat(" from root ", root);
    require_device_memory(*s, data, n);
    order_after(after);
    g_->check(ncclBroadcast(data, data, n, to_nccl(t), root, live(*s), g_->stream),
              s->description());
    return finish(std::move(s));
  }
  // ncclSend / ncclRecv with every peer in one group call; this rank's own block is a copy on
  // the group's stream.
  std::shared_ptr<PendingOp> alltoallv(const char* op, const void* send, const size_t* sc,
                                       const size_t* sd, void* recv, const size_t* rc,
                                       const size_t* rd, DType t, const Event& after) override {
    size_t total = 0;
    for (int i = 0; i < g_->size; ++i) total += sc[i];
    auto s = new_op(op, t, total);
    require_device_memory(*s, send, total);
    require_device_memory(*s, recv, total);
    order_after(after);
    const size_t e = dtype_size(t);
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    const int me = g_->rank;
    if (sc[me] != rc[me])
      fail("NCCL ", s->description(), ": sends ", sc[me], " elements to itself but expects ",
           rc[me]);
    if (sc[me] > 0)
      cuda_ok(cudaMemcpyAsync(out + rd[me] * e, in + sd[me] * e, sc[me] * e,
                              cudaMemcpyDeviceToDevice, g_->stream),
              "cudaMemcpyAsync");
    ncclComm_t comm = live(*s);
    g_->check(ncclGroupStart(), "ncclGroupStart");
    for (int i = 0; i < g_->size; ++i) {
      if (i == me) continue;
      if (sc[i] > 0)
        g_->check(ncclSend(in + sd[i] * e, sc[i], to_nccl(t), i, comm, g_->stream),
                  s->description());
      if (rc[i] > 0)
        g_->check(ncclRecv(out + rd[i] * e, rc[i], to_nccl(t), i, comm, g_->stream),
                  s->description());
    }
    g_->check(ncclGroupEnd(), s->description());
    return finish(std::move(s));
  }
  std::shared_ptr<PendingOp> send(const char* op, const void* data, size_t n, DType t, int peer,
                                  int tag, const Event& after) override {
    auto s = new_op(op, t, n);
    s->extra = detail::concat(" to rank ", peer, ", tag ", tag);
    check_peer(*s, peer);
    require_device_memory(*s, data, n);
    order_after(after);
    g_->check(ncclSend(data, n, to_nccl(t), peer, live(*s), g_->stream), s->description());
    return finish(std::move(s));
  }
  std::shared_ptr<PendingOp> recv(const char* op, void* data, size_t n, DType t, int peer, int tag,
                                  const Event& after) override {
    auto s = new_op(op, t, n);
    s->extra = detail::concat(" from rank ", peer, ", tag ", tag);
    s->is_recv = true;
    check_peer(*s, peer);
    require_device_memory(*s, data, n);
    order_after(after);
    g_->check(ncclRecv(data, n, to_nccl(t), peer, live(*s), g_->stream), s->description());
    return finish(std::move(s));
  }
  std::shared_ptr<PendingOp> barrier(const char* op) override {
    // NCCL has no barrier: an all-reduce of one word completes only when every rank has joined.
    auto s = std::make_shared<NcclOp>();
    describe_untyped(*s, op);
    s->group_state = g_;
    g_->check(ncclAllReduce(g_->barrier_word, g_->barrier_word, 1, ncclInt32, ncclSum, live(*s),
                            g_->stream),
              s->description());
    return finish(std::move(s));
  }

  std::shared_ptr<CommImpl> dup(const std::string& name) override {
    return split(0, g_->rank, name);
  }
  std::shared_ptr<CommImpl> split(int color, int key, const std::string& name) override {
    auto g = std::make_shared<NcclGroup>();
    g->name = name;
    g->device = g_->device;
    if (g_->aborted) fail("NCCL split of ", g_->where(), ": the communicator was aborted");
    g_->check(ncclCommSplit(g_->comm, color, key, &g->comm, nullptr),
              detail::concat("ncclCommSplit into '", name, "'"));
    g->check(ncclCommCount(g->comm, &g->size), "ncclCommCount");
    g->check(ncclCommUserRank(g->comm, &g->rank), "ncclCommUserRank");
    g->finish_setup();
    return std::make_shared<NcclImpl>(std::move(g));
  }

 private:
  std::shared_ptr<NcclOp> new_op(const char* op, DType t, size_t n) const {
    auto s = std::make_shared<NcclOp>();
    describe(*s, op, t, n);
    s->group_state = g_;
    return s;
  }
  ncclComm_t live(const NcclOp& s) const {
    if (g_->aborted)
      fail("NCCL ", s.description(), ": the communicator of ", g_->where(),
           " was aborted after an earlier error or timeout");
    return g_->comm;
  }
  // NCCL reads and writes its buffers from the device: pageable host memory (a host scalar, a
  // std::vector) would fault inside the kernel or fail obscurely, so it is refused here with the
  // place it belongs (host values go through the MPI twins, ProcessGroups::host()).
  void require_device_memory(const NcclOp& s, const void* p, size_t n) const {
    if (n == 0 || p == nullptr) return;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      a.type = cudaMemoryTypeUnregistered;
    }
    if (a.type == cudaMemoryTypeUnregistered)
      fail("NCCL ", s.description(), " on ", g_->where(), ": the buffer is host memory, but NCCL "
           "moves device memory (host values go through the MPI groups, ProcessGroups::host())");
  }
  void check_peer(const NcclOp& s, int peer) const {
    if (peer == g_->rank)
      fail("NCCL ", s.description(), ": a rank cannot send to or receive from itself");
  }
  void order_after(const Event& after) const {
    const NativeEvent e = after.native();
    if (e.kind == NativeEvent::Kind::CudaEvent) {
      cuda_ok(cudaStreamWaitEvent(g_->stream, static_cast<cudaEvent_t>(e.handle), 0),
              "cudaStreamWaitEvent");
    } else if (!after.empty() && !after.query()) {
      after.synchronize();  // an event of the host (an MPI request)
    }
  }
  std::shared_ptr<PendingOp> finish(std::shared_ptr<NcclOp> s) const {
    cuda_ok(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming), "cudaEventCreate");
    cuda_ok(cudaEventRecord(s->done, g_->stream), "cudaEventRecord");
    return s;
  }
  std::shared_ptr<NcclGroup> g_;
};

}  // namespace

std::string ranks_sharing_a_gpu(const Communicator& group) {
  int device = 0;
  cuda_ok(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp p{};
  cuda_ok(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  // The host name too: PCI bus ids repeat from node to node.
  char id[96] = {0};
  char host[64] = {0};
  gethostname(host, sizeof(host) - 1);
  std::snprintf(id, sizeof(id), "%04x:%02x:%02x@%s", p.pciDomainID, p.pciBusID, p.pciDeviceID, host);
  static_assert(sizeof(id) % 4 == 0, "ids travel as 32-bit words");
  std::vector<char> all(size_t(group.size()) * sizeof(id));
  group.allgather(reinterpret_cast<const int32_t*>(id), reinterpret_cast<int32_t*>(all.data()),
                  sizeof(id) / 4);
  for (int a = 0; a < group.size(); ++a)
    for (int b = a + 1; b < group.size(); ++b)
      if (std::strncmp(all.data() + size_t(a) * sizeof(id), all.data() + size_t(b) * sizeof(id),
                       sizeof(id)) == 0)
        return detail::concat("ranks ", a, " and ", b, " share GPU ",
                              std::string(all.data() + size_t(a) * sizeof(id)));
  return "";
}

Communicator nccl_communicator(const Communicator& group, std::string name) {
  if (name.empty()) name = group.name();
  if (group.buffer_space() != BufferSpace::Host)
    fail("nccl_communicator for group '", name, "': the unique id travels over a host-memory "
         "communicator (MPI), but '", group.name(), "' is ", group.transport());
  auto g = std::make_shared<NcclGroup>();
  g->rank = group.rank();
  g->size = group.size();
  g->name = name;
  cuda_ok(cudaGetDevice(&g->device), "cudaGetDevice");
  // NCCL refuses two ranks of one communicator on one GPU: detect it first and say what to do.
  if (const std::string shared = ranks_sharing_a_gpu(group); !shared.empty())
    fail("NCCL communicator for group '", name, "': ", shared, "; NCCL needs one GPU per rank "
         "(run one rank per GPU, or use the MPI communicator: train.comm = mpi)");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (g->rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      fail("ncclGetUniqueId failed for group '", name, "': ", ncclGetErrorString(r));
  }
  static_assert(sizeof(ncclUniqueId) % 8 == 0, "the unique id is broadcast as 64-bit words");
  group.broadcast(reinterpret_cast<std::int64_t*>(&id), sizeof(id) / 8, 0);
  g->check(ncclCommInitRank(&g->comm, g->size, id, g->rank), "ncclCommInitRank");
  g->finish_setup();
  return Communicator(std::make_shared<NcclImpl>(std::move(g)));
}

std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  return detail::concat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

}  // namespace tetrad::comm
