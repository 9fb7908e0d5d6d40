// ProcessGroups: the communicators of one rank's place in the process grid, built once per job
// (docs/parallel.md). Passed explicitly to whatever needs them; there is no global instance.
//
// Groups are looked up by the set of axes they span (group(AxisSet)): one for each axis, and
// tokens() over token_axes() (Z and D), the token-splitting group, over which loss sums and the
// gradients of replicated parameters (norm weights, biases) are summed. With a context axis
// (Gc > 1) two more: tokens() is then the group over token_share_axes() (Z, C and D) and
// replicas() the group over replica_axes() (C and D), over which the Z-sharded gradients are
// summed and ZeRO deals its pieces; with Gc = 1 replicas() is d() and no group spans C. The group over a set A: the ranks
// that differ from this one only in A's axes, ordered by position_in(coord, A) (exactly grid.hpp's
// group_ranks(rank, shape, A)), made with MPI_Comm_split(color = world rank with A's coordinates
// zeroed, key = that position). p() links the pipeline stages.
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
#include <utility>
#include <vector>

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

  // The group over `axes`: one axis, token_axes(), or with Gc > 1 token_share_axes() and
  // replica_axes(). Any other set is a bug (TETRAD_CHECK).
  const comm::Communicator& group(AxisSet axes) const;
  const comm::Communicator& x() const { return group(Axis::X); }
  const comm::Communicator& y() const { return group(Axis::Y); }
  const comm::Communicator& z() const { return group(Axis::Z); }
  const comm::Communicator& c() const { return group(Axis::C); }  // the context-parallel ranks
  const comm::Communicator& p() const { return group(Axis::P); }  // the pipeline stages
  const comm::Communicator& d() const { return group(Axis::D); }
  // Every rank that holds other tokens of the micro-batch (same x, y and stage): Z and D, named
  // "zd"; with Gc > 1 Z, C and D, named "zcd".
  const comm::Communicator& tokens() const { return group(token_axes_of(shape)); }
  // The ranks that hold the same parameter shards (data replicas): D, or with Gc > 1 C and D
  // ("cd"). Its size and this rank's place in it: replica_count(), replica_index().
  const comm::Communicator& replicas() const { return group(replica_axes_of(shape)); }
  int replica_count() const { return shape.size(replica_axes_of(shape)); }
  int replica_index() const { return position_in(coord, shape, replica_axes_of(shape)); }
  static AxisSet token_axes_of(const GridShape& s) {
    return s.c() > 1 ? token_share_axes() : token_axes();
  }
  static AxisSet replica_axes_of(const GridShape& s) {
    return s.c() > 1 ? replica_axes() : AxisSet(Axis::D);
  }
  // The expert-parallel groups (GridShape::e() = E > 1; grid.hpp's expert_rank and
  // expert_data_rank): experts() the E replica ranks whose experts together are the model's (the
  // dispatch's all-to-all, "e"), expert_replicas() the Gc x Gd / E ranks that hold the same
  // experts (their gradients' sum and ZeRO's pieces, "ed"). With E = 1 experts() is this rank
  // alone and expert_replicas() is replicas(). replicas_for(expert): the group a tensor's
  // replicas form, expert_replicas() for the experts' tensors.
  const comm::Communicator& experts() const { return experts_; }
  const comm::Communicator& expert_replicas() const {
    return shape.e() > 1 ? expert_replicas_ : replicas();
  }
  const comm::Communicator& replicas_for(bool expert) const {
    return expert ? expert_replicas() : replicas();
  }
  // Every group of a grid of this shape, in the order they are made (each axis, then the token
  // group, then with Gc > 1 the replica group).
  static std::vector<AxisSet> group_axes(const GridShape& shape);

  // A model on `be` uses these groups: where its memory is not host memory, the groups' host
  // communicators (MPI) stage its buffers through host memory from now on (device_staging.hpp).
  // release_backend undoes one use_backend. No-op on a host-visible backend.
  void use_backend(backend::Backend& be);
  void release_backend(backend::Backend& be);
  std::shared_ptr<BackendStaging> staging;  // null until a device backend uses the groups
  // One line, e.g. "rank 3 = (x1,y1,z0,d0) of 2x2x1x1: x [2,3] y [1,3] z [3] d [3] zd [3]"
  // (each group's world ranks in group order; "p [...]" too when Gp > 1, "e [...] ed [...]"
  // when E > 1).
  std::string summary() const;

 private:
  std::vector<std::pair<AxisSet, comm::Communicator>> groups_;  // in group_axes() order
  comm::Communicator experts_ = comm::Communicator::self("e");
  comm::Communicator expert_replicas_ = comm::Communicator::self("ed");
  std::shared_ptr<ProcessGroups> host_;  // the MPI twins of NCCL groups; null otherwise
};

}  // namespace tetrad::parallel
