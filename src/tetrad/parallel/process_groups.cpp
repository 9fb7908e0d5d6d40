#include "tetrad/parallel/process_groups.hpp"

#include "tetrad/comm/transports.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

namespace {
using comm::Communicator;

// The group along `axis`: color = my rank with that coordinate zeroed, key = that coordinate.
Communicator split_axis(const Communicator& world, const GridShape& shape, const GridCoord& me,
                        Axis axis) {
  GridCoord base = me;
  coordinate(base, axis) = 0;
  return world.split(rank_of(base, shape), coordinate(me, axis), axis_name(axis));
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
    for (const Communicator* c : {&world, &x, &y, &z, &d, &zd, &p})
      if (!c->is_self()) c->stage_device_memory(staging);
  }
  staging->add(be);
}

void ProcessGroups::release_backend(backend::Backend& be) {
  if (host_) return host_->release_backend(be);
  if (staging && !be.capabilities().host_visible) staging->remove(be);
}

ProcessGroups::ProcessGroups()
    : world(Communicator::self("world")),
      x(Communicator::self("x")),
      y(Communicator::self("y")),
      z(Communicator::self("z")),
      d(Communicator::self("d")),
      zd(Communicator::self("zd")),
      p(Communicator::self("p")) {}

ProcessGroups::ProcessGroups(const Communicator& world_in, const GridShape& shape_in)
    : shape(shape_in),
      coord((validate_grid(shape_in, world_in.size()), coord_of(world_in.rank(), shape_in))),
      world(world_in.dup("world")),
      x(split_axis(world, shape, coord, Axis::X)),
      y(split_axis(world, shape, coord, Axis::Y)),
      z(split_axis(world, shape, coord, Axis::Z)),
      d(split_axis(world, shape, coord, Axis::D)),
      zd(world.split(rank_of(GridCoord{coord.x, coord.y, 0, 0, coord.p}, shape),
                     coord.z + shape.z * coord.d, "zd")),
      p(split_axis(world, shape, coord, Axis::P)) {
  // The splits must reproduce the grid's arithmetic; anything else is a bug here.
  for (Axis a : kAxesInRankOrder)
    TETRAD_CHECK(group(a).size() == extent(shape, a) && group(a).rank() == coordinate(coord, a),
                 "group ", axis_name(a), " of rank ", world.rank(), " does not match the grid");
  TETRAD_CHECK(zd.size() == shape.z * shape.d && zd.rank() == coord.z + shape.z * coord.d,
               "group zd of rank ", world.rank(), " does not match the grid");
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
    int n = 0;
    for (const Communicator* c : {&world, &x, &y, &z, &d, &zd, &p}) n += !c->is_self();
    const std::string v = comm::transport_version("nccl");
    return detail::concat("nccl", v.empty() ? "" : " " + v, " (", n,
                          " communicators; host values over mpi)");
  }
  return staging ? "mpi (device buffers staged through host memory)" : "mpi";
}

const comm::Communicator& ProcessGroups::group(Axis axis) const {
  switch (axis) {
    case Axis::X: return x;
    case Axis::Y: return y;
    case Axis::Z: return z;
    case Axis::P: return p;
    case Axis::D: return d;
  }
  TETRAD_CHECK(false, "unknown axis ", static_cast<int>(axis));
  return x;
}

std::string ProcessGroups::summary() const {
  const int r = world.rank();
  std::string s = detail::concat("rank ", r, " = ", to_string(coord), " of ", shape.to_string(), ":");
  for (Axis a : kAxesInRankOrder)
    if (a != Axis::P || shape.p > 1)
      s += detail::concat(" ", axis_name(a), " ", ranks_list(group_ranks(r, shape, a)));
  const Axis token_axes[] = {Axis::Z, Axis::D};
  s += " zd " + ranks_list(group_ranks(r, shape, token_axes));
  return s;
}

}  // namespace tetrad::parallel
