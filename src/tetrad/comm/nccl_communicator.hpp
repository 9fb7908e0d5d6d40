// The NCCL implementation of the communication interface (comm/communicator.hpp), for GPU runs
// (built with TETRAD_NCCL; the MPI implementation stays for CPU runs and for GPU runs without
// NCCL, staged through host memory). Buffers are device memory of the current CUDA device
// (Communicator::buffer_space() == BufferSpace::Device).
//
// One NCCL communicator per process group (x, y, z, pipeline, data and the combined groups):
// nccl_communicator(world) is made collectively from an MPI communicator (its rank 0 creates
// the ncclUniqueId, MPI broadcasts it over the group, every rank calls ncclCommInitRank on its
// own device); its dup() and split() are ncclCommSplit, so ProcessGroups(nccl_world, grid) makes
// every group of the grid on NCCL exactly as it does on MPI. One rank per GPU: NCCL refuses two
// ranks of one communicator on one GPU, so ranks that share a GPU must use the MPI communicator;
// nccl_communicator() detects it (PCI bus ids all-gathered over MPI) and says so.
//
// Streams and events: each communicator owns a dedicated stream. An operation first makes that
// stream wait for `after` (a CUDA event the caller recorded on its compute queue after producing
// the buffer: cudaStreamWaitEvent, no host round trip; an event without a native form is
// synchronized on the host), enqueues the NCCL call, and records a CUDA event: the Request's
// completion. Request::test() is cudaEventQuery (plus ncclCommGetAsyncError while pending);
// Request::event() is that CUDA event, so a backend queue waits for it on the device. So every
// overlap works as on the CPU: compute keeps running on its stream while the collective runs on
// the communicator's, and needs no host progress (Request::needs_host_progress() is false).
//
// Errors and timeouts: every NCCL and CUDA return code is checked (tetrad::Error naming the
// operation, the group, this rank, the device, the element count and NCCL's message).
// Request::wait(timeout) is the interface's (comm::collective_timeout() by default, published to
// comm::blocked_in_wait() for the trainer's watchdog); a timeout or an asynchronous NCCL error
// aborts the communicator (ncclCommAbort, so no kernel keeps spinning) and throws an Error
// naming the rank, "NCCL", the operation, group and count, the seconds waited and the setting
// that sets the timeout, as MPI timeouts do; the job must then end.
//
// Differences from MPI that callers must know: point-to-point messages are matched in the order
// they are posted per peer (NCCL has no tags: the tag only appears in descriptions), and a
// receive cannot check the sender's length. A send and a receive between the same two ranks are
// two operations on one stream, run in the order posted: post them in an order that cannot
// deadlock (one side sends first, the other receives first), which MPI does not require.
#pragma once
#include <string>

#include "tetrad/comm/communicator.hpp"

namespace tetrad::comm {

// Collective over `group` (a host-memory communicator: MPI): an NCCL communicator of the same
// ranks, in the same order, named `name` (default: the group's name). The current CUDA device is
// this rank's device.
Communicator nccl_communicator(const Communicator& group, std::string name = "");

// Collective over `group` (MPI): "" when every rank has a GPU of its own, else which ranks share
// one ("ranks 0 and 1 share GPU 0000:1b:00@node7"). train.comm = auto uses it to stay on MPI
// where NCCL would refuse.
std::string ranks_sharing_a_gpu(const Communicator& group);

// NCCL's version string ("2.28.3"), for logs.
std::string nccl_version();

}  // namespace tetrad::comm
