// What changes in the network at scale (docs/planner.md, "The network at scale"): the level
// above the node. A machine file's optional [network.topology] describes how nodes are grouped
// (a Slingshot dragonfly group = one cabinet; a fat-tree's leaf group) and how much bandwidth
// leaves a group; the planner then caps the bandwidth of every collective whose ring crosses
// groups, and prices NCCL's tree all-reduce beside the ring for groups that span nodes.
//
// Every term is from a public description, not fitted (docs/planner.md gives each source):
//  - dragonfly: a group has `links_per_arc` global links to every other group (Kim et al.,
//    ISCA 2008; HPE Cray EX: 32 switches per group with up to 16 global ports each). Traffic
//    between two groups takes the direct arc (one global hop) or, routed adaptively, a detour
//    through a third group (two global hops: Valiant / UGAL routing, which Slingshot does). The
//    detour is free for the job only through groups it does not occupy; through one of its own
//    groups the second hop takes that group's global links from its own traffic, so the
//    bandwidth a job's cross-group rings get per group falls as the job spans more groups.
//  - fat-tree: a group (leaf / scalable unit) has its nodes' injection divided by the
//    oversubscription (blocking) factor above it; 1 = non-blocking (DGX SuperPOD).
//  - all-reduce across nodes: min(ring, NCCL's double binary tree), whose latency grows with
//    log2(nodes) instead of the ring's (g - 1) (NCCL 2.4; Sanders et al. 2009). All-gather and
//    reduce-scatter stay rings (NCCL has no tree for them): their latency grows with g - 1.
//
// Not modelled: other jobs' traffic (the groups outside the job count as idle), a scheduler
// that scatters the job's nodes over more groups than it needs (nodes are taken in order),
// hierarchical (two-level) algorithms, SHARP / switch reductions.
#pragma once
#include <string>
#include <vector>

namespace tetrad::planner {

struct NetworkTopology {
  enum class Kind { None, Dragonfly, FatTree };
  Kind kind = Kind::None;
  int nodes_per_group = 0;      // nodes of one dragonfly group / fat-tree leaf group
  int groups = 0;               // dragonfly: groups in the whole machine (the detours' pool)
  int links_per_arc = 0;        // dragonfly: global links between each pair of groups
  double link_bandwidth = 0;    // bytes/s per global link, one direction
  double oversubscription = 1;  // fat-tree: group injection / bandwidth above the group
  int nodes = 0;                // nodes of this kind in the machine (0: groups x nodes_per_group
                                // for a dragonfly, unbounded for a fat-tree)
  bool present() const { return kind != Kind::None; }
  // The most nodes a job can have (0: no bound known).
  long machine_nodes() const {
    if (nodes > 0) return nodes;
    return kind == Kind::Dragonfly ? long(groups) * nodes_per_group : 0;
  }
  // Bytes/s per direction one group of a job spanning `job_groups` groups can send to the
  // others (dragonfly: arcs to the job's other groups at one hop, detours through idle groups
  // at one of the job's hops, through the job's own groups at half; docs/planner.md), for ring
  // traffic whose partner groups are few. Fat-tree: nodes_per_group x node_injection /
  // oversubscription (independent of job_groups). 0 when job_groups < 2 (nothing leaves).
  double group_egress(int job_groups, double node_injection) const;
  void validate(const std::string& machine) const;  // throws Error naming the key
};
const char* topology_kind_name(NetworkTopology::Kind k);  // "none" | "dragonfly" | "fat-tree"
NetworkTopology::Kind parse_topology_kind(const std::string& s);

// Where one ring of an axis sits above the node level.
struct RingGroups {
  int job_nodes = 1;          // nodes the whole job takes (ranks / ranks_per_node, rounded up)
  int job_groups = 1;         // topology groups those nodes fill, taken in order
  int nodes_in_group = 1;     // of the job's nodes in its fullest group
  int ring_groups = 1;        // distinct groups the ring's members sit in
  int node_edges = 0;         // ring edges (consecutive members, and the wrap) between nodes
  int group_edges = 0;        // of which between groups
  double cross_fraction() const { return node_edges > 0 ? double(group_edges) / node_edges : 0.0; }
};
// `members`: the ranks of one ring in ring order; `job_ranks`: ranks of the whole job.
RingGroups ring_groups(const std::vector<int>& members, int job_ranks, int ranks_per_node,
                       const NetworkTopology& t);

// Bandwidth each ring edge gets once the topology is counted. Every node of the job sends
// `rings_per_node` rings' worth through its NICs, a fraction cross_fraction of those edges leave
// the group, and the group's nodes_in_group nodes share its egress:
//   beta <= group_egress(job_groups) / (nodes_in_group x rings_per_node x cross_fraction)
// Returns min(node_beta, that cap); node_beta when no edge crosses groups.
double topology_ring_bandwidth(double node_beta, double rings_per_node, const RingGroups& rg,
                               const NetworkTopology& t, double node_injection);

// NCCL's tree all-reduce over `nodes` nodes with `per_node` group members in each (a chain
// inside the node, a double binary tree between nodes): the reduce goes up and the broadcast
// down, each pipelined, so
//   t = 2 (ceil(log2 nodes) alpha_inter + (per_node - 1) alpha_intra) + 2 n / beta
// (each rank sends and receives the whole buffer once per direction; the ring's 2(g-1)/g n / beta
// is the same volume to within 1/g).
double tree_allreduce_seconds(double bytes, int nodes, int per_node, double inter_latency,
                              double intra_latency, double bandwidth);

}  // namespace tetrad::planner
