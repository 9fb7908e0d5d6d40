#include "tetrad/planner/network.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "tetrad/core/error.hpp"

namespace tetrad::planner {

const char* topology_kind_name(NetworkTopology::Kind k) {
  switch (k) {
    case NetworkTopology::Kind::None: return "none";
    case NetworkTopology::Kind::Dragonfly: return "dragonfly";
    case NetworkTopology::Kind::FatTree: return "fat-tree";
  }
  return "none";
}

NetworkTopology::Kind parse_topology_kind(const std::string& s) {
  if (s == "none") return NetworkTopology::Kind::None;
  if (s == "dragonfly") return NetworkTopology::Kind::Dragonfly;
  if (s == "fat-tree") return NetworkTopology::Kind::FatTree;
  fail("network.topology kind '", s, "': expected dragonfly, fat-tree or none");
}

void NetworkTopology::validate(const std::string& machine) const {
  if (kind == Kind::None) return;
  if (nodes_per_group < 1)
    fail("machine '", machine, "': network.topology.nodes_per_group must be >= 1 (got ",
         nodes_per_group, ")");
  if (nodes < 0) fail("machine '", machine, "': network.topology.nodes must be >= 0 (0: not stated)");
  if (kind == Kind::Dragonfly) {
    if (groups < 2)
      fail("machine '", machine, "': network.topology.groups must be >= 2 for a dragonfly (got ",
           groups, ")");
    if (links_per_arc < 1)
      fail("machine '", machine, "': network.topology.links_per_arc must be >= 1 (global links "
           "between each pair of groups; got ", links_per_arc, ")");
    if (!(link_bandwidth > 0))
      fail("machine '", machine, "': network.topology.link_bandwidth_gb_per_s must be > 0");
  } else if (!(oversubscription >= 1)) {
    fail("machine '", machine, "': network.topology.oversubscription must be >= 1 (1: non-blocking; got ",
         oversubscription, ")");
  }
}

double NetworkTopology::group_egress(int job_groups, double node_injection) const {
  if (kind == Kind::None || job_groups < 2) return 0;
  if (kind == Kind::FatTree) return nodes_per_group * node_injection / oversubscription;
  // A group's ring traffic goes to one partner group. The direct arc carries it at one global
  // hop; a detour through a group the job does not occupy costs the job one of its own global
  // links (the second hop is on the idle group's links); a detour through one of the job's other
  // k - 2 groups also takes a global link that group needs for its own traffic: half each.
  const int k = std::min(job_groups, groups);
  const double arc = links_per_arc * link_bandwidth;
  return arc * (1.0 + double(groups - k) + 0.5 * double(k - 2));
}

RingGroups ring_groups(const std::vector<int>& members, int job_ranks, int ranks_per_node,
                       const NetworkTopology& t) {
  RingGroups rg;
  const int rpn = std::max(1, ranks_per_node);
  rg.job_nodes = (std::max(1, job_ranks) + rpn - 1) / rpn;
  const int npg = t.present() ? t.nodes_per_group : rg.job_nodes;
  rg.job_groups = (rg.job_nodes + npg - 1) / npg;
  rg.nodes_in_group = std::min(npg, rg.job_nodes);
  const size_t g = members.size();
  std::set<int> groups;
  for (int r : members) groups.insert(r / rpn / npg);
  rg.ring_groups = int(groups.size());
  if (g < 2) return rg;
  for (size_t i = 0; i < g; ++i) {
    const int a = members[i], b = members[(i + 1) % g];
    const int na = a / rpn, nb = b / rpn;
    if (na == nb) continue;
    ++rg.node_edges;
    if (na / npg != nb / npg) ++rg.group_edges;
  }
  return rg;
}

double topology_ring_bandwidth(double node_beta, double rings_per_node, const RingGroups& rg,
                               const NetworkTopology& t, double node_injection) {
  if (!t.present() || rg.group_edges == 0 || rg.job_groups < 2) return node_beta;
  const double egress = t.group_egress(rg.job_groups, node_injection);
  const double demand_per_beta = rg.nodes_in_group * std::max(1.0, rings_per_node) * rg.cross_fraction();
  return std::min(node_beta, egress / demand_per_beta);
}

double tree_allreduce_seconds(double bytes, int nodes, int per_node, double inter_latency,
                              double intra_latency, double bandwidth) {
  const double depth = nodes > 1 ? std::ceil(std::log2(double(nodes))) : 0.0;
  return 2.0 * (depth * inter_latency + std::max(0, per_node - 1) * intra_latency) +
         2.0 * bytes / bandwidth;
}

}  // namespace tetrad::planner
