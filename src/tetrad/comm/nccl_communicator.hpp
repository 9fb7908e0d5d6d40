// NCCL implementation of tetrad's communication for GPU runs (built with TETRAD_NCCL; the MPI
// Communicator stays for CPU runs and for GPU runs without NCCL, staged through host memory).
//
// One NcclCommunicator per process group (x, y, z, pipeline, data and the combined groups), made
// collectively from that group's MPI Communicator: its rank 0 creates the ncclUniqueId, MPI
// broadcasts it over the group, every rank calls ncclCommInitRank on its own device (one rank per
// GPU: NCCL refuses two ranks of one communicator on one GPU, so several ranks sharing a GPU must
// use the MPI communicator instead; create() says so when it detects it).
//
// Streams and ordering: each communicator owns a dedicated stream. A collective first makes that
// stream wait for `after` (an event the caller recorded on its compute stream after producing the
// buffer), enqueues the NCCL call, and records a completion event; NcclRequest::event() lets a
// compute stream wait for it (no host round trip), NcclRequest::test()/wait() let the host poll.
// So overlap works as on the CPU: compute keeps running on its stream while the collective runs
// on the communicator's.
//
// Errors and timeouts: every NCCL return code is checked (tetrad::Error naming the collective,
// the group, this rank, the element count and NCCL's message). wait(timeout) polls the event and
// ncclCommGetAsyncError; a timeout or an asynchronous error aborts the communicator
// (ncclCommAbort, so no kernel keeps spinning) and throws an Error naming the rank, the group,
// the collective, the count and the seconds waited, as the CPU watchdog reports MPI timeouts
// (comm::collective_timeout() is the default). Not yet: publishing the wait to
// comm::blocked_in_wait() for the trainer's watchdog thread (the timeout itself ends the job).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tetrad/comm/communicator.hpp"

struct CUstream_st;
struct CUevent_st;

namespace tetrad::comm {

enum class NcclType : uint8_t { F32, F64, I32, I64, BF16 };
template <typename T> constexpr NcclType nccl_type_of();
template <> constexpr NcclType nccl_type_of<float>() { return NcclType::F32; }
template <> constexpr NcclType nccl_type_of<double>() { return NcclType::F64; }
template <> constexpr NcclType nccl_type_of<std::int32_t>() { return NcclType::I32; }
template <> constexpr NcclType nccl_type_of<std::int64_t>() { return NcclType::I64; }
template <> constexpr NcclType nccl_type_of<std::uint16_t>() { return NcclType::BF16; }  // bf16 bits

class NcclCommunicator;

class NcclRequest {
 public:
  NcclRequest() = default;  // complete
  NcclRequest(NcclRequest&&) noexcept;
  NcclRequest& operator=(NcclRequest&&) noexcept;
  ~NcclRequest();
  bool test();                 // the collective has completed on the device
  void wait();                 // timeout collective_timeout()
  void wait(double timeout_s);
  CUevent_st* event() const;   // completion event (nullptr when empty)
  std::string description() const;

  struct State;
  explicit NcclRequest(std::unique_ptr<State> s);

 private:
  std::unique_ptr<State> state_;
};

class NcclCommunicator {
 public:
  // Collective over `group`. The current CUDA device is this rank's device.
  static NcclCommunicator create(const Communicator& group);
  NcclCommunicator(NcclCommunicator&&) noexcept;
  NcclCommunicator& operator=(NcclCommunicator&&) noexcept;
  ~NcclCommunicator();

  int rank() const;
  int size() const;
  const std::string& name() const;
  CUstream_st* stream() const;  // the dedicated communication stream

  // All asynchronous: device buffers; `after` (may be null) is waited for on the communication
  // stream first. Counts are elements per rank (as Communicator's).
  template <typename T> NcclRequest allreduce_sum(T* inout, size_t n, CUevent_st* after) const {
    return allreduce(inout, n, nccl_type_of<T>(), false, after);
  }
  template <typename T> NcclRequest allreduce_max(T* inout, size_t n, CUevent_st* after) const {
    return allreduce(inout, n, nccl_type_of<T>(), true, after);
  }
  template <typename T>
  NcclRequest allgather(const T* send, T* recv, size_t n_per_rank, CUevent_st* after) const {
    return allgather_raw(send, recv, n_per_rank, nccl_type_of<T>(), after);
  }
  template <typename T>
  NcclRequest reduce_scatter_sum(const T* send, T* recv, size_t n_per_rank, CUevent_st* after) const {
    return reduce_scatter_raw(send, recv, n_per_rank, nccl_type_of<T>(), after);
  }
  template <typename T> NcclRequest broadcast(T* data, size_t n, int root, CUevent_st* after) const {
    return broadcast_raw(data, n, nccl_type_of<T>(), root, after);
  }
  template <typename T> NcclRequest send(const T* data, size_t n, int peer, CUevent_st* after) const {
    return p2p(const_cast<T*>(data), n, nccl_type_of<T>(), peer, true, after);
  }
  template <typename T> NcclRequest recv(T* data, size_t n, int peer, CUevent_st* after) const {
    return p2p(data, n, nccl_type_of<T>(), peer, false, after);
  }

  struct Impl;

 private:
  explicit NcclCommunicator(std::shared_ptr<Impl> impl);
  NcclRequest allreduce(void* inout, size_t n, NcclType t, bool max, CUevent_st* after) const;
  NcclRequest allgather_raw(const void* s, void* r, size_t n, NcclType t, CUevent_st* after) const;
  NcclRequest reduce_scatter_raw(const void* s, void* r, size_t n, NcclType t, CUevent_st* after) const;
  NcclRequest broadcast_raw(void* d, size_t n, NcclType t, int root, CUevent_st* after) const;
  NcclRequest p2p(void* d, size_t n, NcclType t, int peer, bool is_send, CUevent_st* after) const;
  std::shared_ptr<Impl> impl_;
};

// NCCL's version string ("2.27.7"), for logs.
std::string nccl_version();

}  // namespace tetrad::comm
