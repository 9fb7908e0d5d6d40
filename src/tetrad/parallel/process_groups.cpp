#include "tetrad/parallel/process_groups.hpp"

#include "tetrad/comm/transports.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

namespace {
using comm::Communicator;

// The group over `axes`: color = my rank with those coordinates zeroed, key = my position in it.
Communicator split_axes(const Communicator& world, const GridShape& shape, const GridCoord& me,
                        AxisSet axes) {
  GridCoord base = me;
  for (Axis a : axes.axes()) base[a] = 0;
  return world.split(rank_of(base, shape), position_in(me, shape, axes), axes.name());
}

std::string ranks_list(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(ranks[i]);
  }
  return s + "]";
}
}  // namespace

void ProcessGroups::use_backend(backend::Backend& be) {
  if (be.capabilities().host_visible) return;
  // NCCL takes the device pointers as they are; the MPI twins stage what reaches them (e.g. a
  // device shard all-gathered into a host vector for a checkpoint).
  if (host_) return host_->use_backend(be);
  if (!staging) {
    staging = std::make_shared<BackendStaging>();
    if (!world.is_self()) world.stage_device_memory(staging);
    for (const auto& [axes, c] : groups_)
      if (!c.is_self()) c.stage_device_memory(staging);
    for (const comm::Communicator* c : {&experts_, &expert_replicas_})
      if (!c->is_self()) c->stage_device_memory(staging);
  }
  staging->add(be);
}

void ProcessGroups::release_backend(backend::Backend& be) {
  if (host_) return host_->release_backend(be);
  if (staging && !be.capabilities().host_visible) staging->remove(be);
}

std::vector<AxisSet> ProcessGroups::group_axes(const GridShape& shape) {
  std::vector<AxisSet> sets(kAxesInRankOrder.begin(), kAxesInRankOrder.end());
  sets.push_back(token_axes_of(shape));
  if (shape.c() > 1) sets.push_back(replica_axes());
  return sets;
}

ProcessGroups::ProcessGroups() : world(Communicator::self("world")) {
  for (AxisSet axes : group_axes(shape)) groups_.emplace_back(axes, Communicator::self(axes.name()));
}

ProcessGroups::ProcessGroups(const Communicator& world_in, const GridShape& shape_in)
    : shape(shape_in),
      coord((validate_grid(shape_in, world_in.size()), coord_of(world_in.rank(), shape_in))),
      world(world_in.dup("world")) {
  for (AxisSet axes : group_axes(shape))
    groups_.emplace_back(axes, split_axes(world, shape, coord, axes));
  // The splits must reproduce the grid's arithmetic; anything else is a bug here.
  for (const auto& [axes, c] : groups_)
    TETRAD_CHECK(c.size() == shape.size(axes) && c.rank() == position_in(coord, shape, axes),
                 "group ", axes.name(), " of rank ", world.rank(), " does not match the grid");
  if (shape.e() > 1) {
    // Colours: the ranks with the same coordinates off the replica axes (base) and the same
    // expert-data rank form an expert group; with the same expert rank, an expert-data group.
    GridCoord b = coord;
    for (Axis a : replica_axes().axes()) b[a] = 0;
    const int base = rank_of(b, shape), E = shape.e(), Gr = shape.size(replica_axes());
    const int er = expert_rank(coord, shape), edr = expert_data_rank(coord, shape);
    experts_ = world.split(base * (Gr / E) + edr, er, "e");
    expert_replicas_ = world.split(base * E + er, edr, "ed");
    TETRAD_CHECK(experts_.size() == E && experts_.rank() == er &&
                     expert_replicas_.size() == Gr / E && expert_replicas_.rank() == edr,
                 "the expert groups of rank ", world.rank(), " do not match the grid");
  }
}

ProcessGroups ProcessGroups::on_nccl(const Communicator& world, const GridShape& shape) {
  // Refused (comm/transports.hpp) in a build without NCCL, before any group is made.
  for (const comm::TransportInfo& t : comm::transports())
    if (t.name == "nccl" && !t.available)
      fail("NCCL process groups (train.comm = nccl): ", t.why_not);
  auto host = std::make_shared<ProcessGroups>(world, shape);
  // The NCCL world in grid rank order (the MPI twins' world), then every group split from it.
  ProcessGroups g(comm::transport_communicator("nccl", host->world, "world"), shape);
  g.host_ = std::move(host);
  return g;
}

std::string ProcessGroups::transport_summary() const {
  if (world.is_self()) return "none (one rank)";
  if (host_) {
    int n = !world.is_self();
    for (const auto& [axes, c] : groups_) n += !c.is_self();
    const std::string v = comm::transport_version("nccl");
    return detail::concat("nccl", v.empty() ? "" : " " + v, " (", n,
                          " communicators; host values over mpi)");
  }
  return staging ? "mpi (device buffers staged through host memory)" : "mpi";
}

const comm::Communicator& ProcessGroups::group(AxisSet axes) const {
  for (const auto& [a, c] : groups_)
    if (a == axes) return c;
  TETRAD_CHECK(false, "no process group over axes \"", axes.name(), "\"");
  return world;
}

std::string ProcessGroups::summary() const {
  const int r = world.rank();
  std::string s =
      detail::concat("rank ", r, " = ", to_string(coord), " of ", shape.to_string(), ":");
  for (const auto& [axes, c] : groups_)
    if ((axes != AxisSet(Axis::P) || shape.p() > 1) && (axes != AxisSet(Axis::C) || shape.c() > 1))
      s += detail::concat(" ", axes.name(), " ", ranks_list(group_ranks(r, shape, axes)));
  if (shape.e() > 1) {
    // The replica ranks (C x D) of this rank, split by the fold.
    const std::vector<int> reps = group_ranks(r, shape, replica_axes());
    std::vector<int> e, ed;
    for (int q : reps) {
      const GridCoord c = coord_of(q, shape);
      if (expert_data_rank(c, shape) == expert_data_rank(coord, shape)) e.push_back(q);
      if (expert_rank(c, shape) == expert_rank(coord, shape)) ed.push_back(q);
    }
    s += detail::concat(" e ", ranks_list(e), " ed ", ranks_list(ed));
  }
  return s;
}

}  // namespace tetrad::parallel
