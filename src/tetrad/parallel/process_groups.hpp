// ProcessGroups: the communicators of one rank's place in the process grid, built once per job
// (docs/parallel.md). Passed explicitly to whatever needs them; there is no global instance.
//
// Group along axis A: the ranks that differ from this one only in A, ordered by the A coordinate
// (exactly grid.hpp's group_ranks(rank, shape, A)), made with MPI_Comm_split(color = world rank
// with the A coordinate zeroed, key = the A coordinate). `zd` is the token-splitting group: the
// ranks with the same (x, y) and pipeline stage p, ordered by z + Gz*d; gradients of replicated
// parameters (norm weights, biases) are summed over it. `p` links the pipeline stages.
//
// Groups on NCCL (on_nccl): every group is an NCCL communicator (ncclCommSplit of the world,
// which comm::nccl_communicator made from MPI), and host() holds the same groups on MPI. NCCL
// collectives move device memory only, so values the host holds (loss sums, norms summed into
// host doubles, flags, checkpoint tensors gathered into host vectors) must go through host();
// NCCL refuses a host buffer with an error saying so.
//
// What this does not do: reordering ranks for the network topology (rank order is the grid's),
// or choosing the grid.
//
// Failures: a grid whose product is not the world size throws tetrad::Error ("grid 2x2x1x1 needs
// 4 ranks but mpirun started 2 ..."); MPI failures while splitting throw tetrad::Error naming the
// group. Not thread-safe (communicator creation is collective; main thread only).
#pragma once
#include <memory>
#include <string>

#include "tetrad/backend/backend.hpp"
#include "tetrad/comm/communicator.hpp"
#include "tetrad/parallel/device_staging.hpp"
#include "tetrad/parallel/grid.hpp"

namespace tetrad::parallel {

struct ProcessGroups {
  // Serial: grid 1x1x1x1, every group Communicator::self(); needs no MPI.
  ProcessGroups();
  // Collective over `world`: validates the grid against world.size() and splits every group.
  // `world` is duplicated, so the caller's communicator stays its own.
  ProcessGroups(const comm::Communicator& world, const GridShape& shape);

  // Collective over `world` (MPI): the groups on NCCL, host() the same groups on MPI. The
  // current CUDA device is this rank's. Only in a build with NCCL (TETRAD_HAVE_NCCL); refused
  // elsewhere, and NCCL refuses two ranks of the grid on one GPU.
  static ProcessGroups on_nccl(const comm::Communicator& world, const GridShape& shape);

  // The groups that move host memory: *this, unless these are NCCL's (then their MPI twins).
  const ProcessGroups& host() const { return host_ ? *host_ : *this; }
  bool on_nccl() const { return host_ != nullptr; }
  // For the run's log: "nccl 2.28.3 (7 communicators; host values over mpi)", "mpi (device
  // buffers staged through host memory)", "mpi", or "none (one rank)" for the serial groups.
  std::string transport_summary() const;

  GridShape shape;
  GridCoord coord;
  comm::Communicator world;  // all ranks, rank order = grid rank order
  comm::Communicator x, y, z, d;
  comm::Communicator zd;  // the Z and data axes together: same (x, y, p)
  comm::Communicator p;   // the pipeline stages: same (x, y, z, d)

  // The group along one axis.
  const comm::Communicator& group(Axis axis) const;

  // A model on `be` uses these groups: where its memory is not host memory, the groups' host
  // communicators (MPI) stage its buffers through host memory from now on (device_staging.hpp).
  // release_backend undoes one use_backend. No-op on a host-visible backend.
  void use_backend(backend::Backend& be);
  void release_backend(backend::Backend& be);
  std::shared_ptr<BackendStaging> staging;  // null until a device backend uses the groups
  // One line, e.g. "rank 3 = (x1,y1,z0,d0) of 2x2x1x1: x [2,3] y [1,3] z [3] d [3] zd [3]"
  // (each group's world ranks in group order; "p [...]" too when Gp > 1).
  std::string summary() const;

 private:
  std::shared_ptr<ProcessGroups> host_;  // the MPI twins of NCCL groups; null otherwise
};

}  // namespace tetrad::parallel
