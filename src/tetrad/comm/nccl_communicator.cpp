// NCCL communicator (nccl_communicator.hpp).
#include "tetrad/comm/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <vector>
#include <cstring>
#include <thread>

#include "tetrad/core/error.hpp"

namespace tetrad::comm {

namespace {

ncclDataType_t to_nccl(NcclType t) {
  switch (t) {
    case NcclType::F32: return ncclFloat32;
    case NcclType::F64: return ncclFloat64;
    case NcclType::I32: return ncclInt32;
    case NcclType::I64: return ncclInt64;
    case NcclType::BF16: return ncclBfloat16;
  }
  return ncclFloat32;
}
const char* type_name(NcclType t) {
  switch (t) {
    case NcclType::F32: return "float";
    case NcclType::F64: return "double";
    case NcclType::I32: return "int32";
    case NcclType::I64: return "int64";
    case NcclType::BF16: return "bf16";
  }
  return "?";
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("NCCL communicator: ", what, ": ", cudaGetErrorString(e));
}

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int rank = 0, size = 0, device = 0;
  std::string name;
  bool aborted = false;
  ~Impl() {
    if (stream) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
    if (comm) {
      if (aborted) ncclCommAbort(comm);
      else ncclCommDestroy(comm);
    }
  }
  std::string where() const {
    return detail::concat("group '", name, "' (rank ", rank, " of ", size, ", device ", device, ")");
  }
  void check(ncclResult_t r, const std::string& op) const {
    if (r != ncclSuccess && r != ncclInProgress)
      fail("NCCL ", op, " failed on ", where(), ": ", ncclGetErrorString(r), " (",
           ncclGetLastError(comm), ")");
  }
};

struct NcclRequest::State {
  std::shared_ptr<NcclCommunicator::Impl> comm;
  cudaEvent_t done = nullptr;
  std::string what;
  ~State() {
    if (done) cudaEventDestroy(done);
  }
};

NcclRequest::NcclRequest(std::unique_ptr<State> s) : state_(std::move(s)) {}
NcclRequest::NcclRequest(NcclRequest&&) noexcept = default;
NcclRequest& NcclRequest::operator=(NcclRequest&&) noexcept = default;
NcclRequest::~NcclRequest() {
  // A pending request is waited for: its buffers and event must outlive the device work.
  if (state_ && state_->done) cudaEventSynchronize(state_->done);
}
CUevent_st* NcclRequest::event() const { return state_ ? state_->done : nullptr; }
std::string NcclRequest::description() const { return state_ ? state_->what : ""; }

bool NcclRequest::test() {
  if (!state_) return true;
  const cudaError_t e = cudaEventQuery(state_->done);
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) cuda_ok(e, state_->what.c_str());
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(state_->comm->comm, &async);
  if (async != ncclSuccess && async != ncclInProgress) {
    state_->comm->aborted = true;
    fail("NCCL ", state_->what, " failed asynchronously on ", state_->comm->where(), ": ",
         ncclGetErrorString(async));
  }
  return false;
}

void NcclRequest::wait() { wait(collective_timeout()); }

void NcclRequest::wait(double timeout_s) {
  if (test()) return;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (long polls = 1;; ++polls) {
    if (test()) return;
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited >= timeout_s) {
      // Abort so that the NCCL kernels stop spinning; the job must end (as after an MPI timeout).
      ncclCommAbort(state_->comm->comm);
      state_->comm->comm = nullptr;
      state_->comm->aborted = true;
      const std::string what = state_->what, where = state_->comm->where();
      state_->done = nullptr;  // the event may never fire: leak it rather than wait in ~State
      fail(what, " on ", where, " did not complete within ", timeout_s,
           " s (a peer died or diverged); the NCCL communicator was aborted");
    }
    if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclCommunicator::NcclCommunicator(NcclCommunicator&&) noexcept = default;
NcclCommunicator& NcclCommunicator::operator=(NcclCommunicator&&) noexcept = default;
NcclCommunicator::~NcclCommunicator() = default;

NcclCommunicator NcclCommunicator::create(const Communicator& group) {
  auto impl = std::make_shared<Impl>();
  impl->rank = group.rank();
  impl->size = group.size();
  impl->name = group.name();
  cuda_ok(cudaGetDevice(&impl->device), "cudaGetDevice");
  // NCCL refuses two ranks of one communicator on one GPU: detect it first and say what to do.
  {
    cudaDeviceProp p{};
    cuda_ok(cudaGetDeviceProperties(&p, impl->device), "cudaGetDeviceProperties");
    char bus[32] = {0};
    std::snprintf(bus, sizeof(bus), "%04x:%02x:%02x", p.pciDomainID, p.pciBusID, p.pciDeviceID);
    std::vector<char> all(size_t(impl->size) * sizeof(bus));
    if (!group.is_self()) group.allgather(reinterpret_cast<const int32_t*>(bus),
                                          reinterpret_cast<int32_t*>(all.data()), sizeof(bus) / 4);
    else std::memcpy(all.data(), bus, sizeof(bus));
    for (int r = 0; r < impl->size; ++r)
      if (r != impl->rank && std::strncmp(all.data() + size_t(r) * sizeof(bus), bus, sizeof(bus)) == 0)
        fail("NCCL communicator for group '", impl->name, "': ranks ", impl->rank, " and ", r,
             " share GPU ", bus, "; NCCL needs one GPU per rank (run one rank per GPU, or use the "
             "MPI communicator: comm backend 'mpi')");
  }
  ncclUniqueId id;
  if (impl->rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      fail("ncclGetUniqueId failed for group '", impl->name, "': ", ncclGetErrorString(r));
  }
  static_assert(sizeof(ncclUniqueId) % 8 == 0, "unique id is broadcast as 64-bit words");
  if (!group.is_self())
    group.broadcast(reinterpret_cast<std::int64_t*>(&id), sizeof(id) / 8, 0);
  impl->check(ncclCommInitRank(&impl->comm, impl->size, id, impl->rank), "ncclCommInitRank");
  cuda_ok(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return NcclCommunicator(std::move(impl));
}

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }
const std::string& NcclCommunicator::name() const { return impl_->name; }
CUstream_st* NcclCommunicator::stream() const { return impl_->stream; }

namespace {
NcclRequest finish(const std::shared_ptr<NcclCommunicator::Impl>& c, std::string what) {
  auto st = std::make_unique<NcclRequest::State>();
  st->comm = c;
  st->what = std::move(what);
  cuda_ok(cudaEventCreateWithFlags(&st->done, cudaEventDisableTiming), "cudaEventCreate");
  cuda_ok(cudaEventRecord(st->done, c->stream), "cudaEventRecord");
  return NcclRequest(std::move(st));
}
void order_after(const NcclCommunicator::Impl& c, CUevent_st* after) {
  if (after) cuda_ok(cudaStreamWaitEvent(c.stream, after, 0), "cudaStreamWaitEvent");
}
std::string describe(const char* op, size_t n, NcclType t, const std::string& group) {
  return detail::concat(op, " of ", n, " ", type_name(t), " on group '", group, "'");
}
}  // namespace

NcclRequest NcclCommunicator::allreduce(void* inout, size_t n, NcclType t, bool max,
                                        CUevent_st* after) const {
  const std::string what = describe(max ? "allreduce_max" : "allreduce_sum", n, t, impl_->name);
  order_after(*impl_, after);
  impl_->check(ncclAllReduce(inout, inout, n, to_nccl(t), max ? ncclMax : ncclSum, impl_->comm,
                             impl_->stream), what);
  return finish(impl_, what);
}
NcclRequest NcclCommunicator::allgather_raw(const void* s, void* r, size_t n, NcclType t,
                                            CUevent_st* after) const {
  const std::string what = describe("allgather", n, t, impl_->name);
  order_after(*impl_, after);
  impl_->check(ncclAllGather(s, r, n, to_nccl(t), impl_->comm, impl_->stream), what);
  return finish(impl_, what);
}
NcclRequest NcclCommunicator::reduce_scatter_raw(const void* s, void* r, size_t n, NcclType t,
                                                 CUevent_st* after) const {
  const std::string what = describe("reduce_scatter_sum", n, t, impl_->name);
  order_after(*impl_, after);
  impl_->check(ncclReduceScatter(s, r, n, to_nccl(t), ncclSum, impl_->comm, impl_->stream), what);
  return finish(impl_, what);
}
NcclRequest NcclCommunicator::broadcast_raw(void* d, size_t n, NcclType t, int root,
                                            CUevent_st* after) const {
  const std::string what = describe("broadcast", n, t, impl_->name);
  order_after(*impl_, after);
  impl_->check(ncclBroadcast(d, d, n, to_nccl(t), root, impl_->comm, impl_->stream), what);
  return finish(impl_, what);
}
NcclRequest NcclCommunicator::p2p(void* d, size_t n, NcclType t, int peer, bool is_send,
                                  CUevent_st* after) const {
  const std::string what = detail::concat(describe(is_send ? "send" : "recv", n, t, impl_->name),
                                          is_send ? " to " : " from ", "rank ", peer);
  if (peer < 0 || peer >= impl_->size || peer == impl_->rank)
    fail("NCCL ", what, ": peer must be another rank of the group (size ", impl_->size, ")");
  order_after(*impl_, after);
  if (is_send) impl_->check(ncclSend(d, n, to_nccl(t), peer, impl_->comm, impl_->stream), what);
  else impl_->check(ncclRecv(d, n, to_nccl(t), peer, impl_->comm, impl_->stream), what);
  return finish(impl_, what);
}

std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  return detail::concat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

}  // namespace tetrad::comm
