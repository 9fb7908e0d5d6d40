// The planner's mixture-of-experts terms (planner.hpp, "the mixture-of-experts terms").
#include "tetrad/planner/planner.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "tetrad/core/error.hpp"
#include "tetrad/model/family.hpp"

namespace tetrad::planner {

int expert_fold_of(const PlanInput& in, const GridShape& g) {
  return g.e() > 1 ? g.e() : in.expert_parallel;
}

std::string expert_parallel_problem(const PlanInput& in, const GridShape& g) {
  const int ep = expert_fold_of(in, g);
  if (ep < 1) return "the expert-parallel axis E = " + std::to_string(ep) + " must be >= 1";
  if (g.e() > 1 && in.expert_parallel > 1 && g.e() != in.expert_parallel)
    return "the grid's e=" + std::to_string(g.e()) + " and expert_parallel = " +
           std::to_string(in.expert_parallel) + " disagree";
  if (ep == 1) return "";
  if (in.shard_over_context)
    return "the expert-parallel axis E = " + std::to_string(ep) + " with parameters sharded over "
           "the context axis (TorchTitan's layout) is not modelled";
  if (!in.model.moe())
    return "the expert-parallel axis E = " + std::to_string(ep) + " needs a mixture of experts (" +
           in.model.desc().display + " is dense)";
  const int cd = g.c() * g.d();
  if (cd % ep != 0)
    return "the expert-parallel axis E = " + std::to_string(ep) + " does not divide Gc x Gd = " +
           std::to_string(cd) + " (E is folded over the context and data ranks)";
  if (in.model.n_experts % ep != 0)
    return "the expert-parallel axis E = " + std::to_string(ep) + " does not divide model.n_experts = " +
           std::to_string(in.model.n_experts);
  return "";
}

std::vector<int> expert_parallel_candidates(const PlanInput& in, const GridShape& g) {
  if (const int ep = expert_fold_of(in, g); ep != 1) return {ep};  // fixed by the run
  if (!in.model.moe()) return {1};
  std::vector<int> out;
  const int limit = std::gcd(g.c() * g.d(), in.model.n_experts);
  for (int e = 1; e <= limit; ++e)
    if (limit % e == 0) out.push_back(e);
  return out;
}

std::vector<Estimate> estimate_expert_axis(const PlanInput& in, const GridShape& g, const Machine& m) {
  std::vector<Estimate> out;
  PlanInput a = in;
  for (int ep : expert_parallel_candidates(in, g)) {
    a.expert_parallel = ep;
    out.push_back(estimate(a, g, m));
  }
  return out;
}

std::string plan_label(const Estimate& e) {
  return grid_label(e.grid) + (e.expert_parallel > 1 ? " e" + std::to_string(e.expert_parallel) : "");
}

std::vector<int> expert_group_ranks(const GridShape& g, int ep) {
  const std::vector<int> cd = parallel::group_ranks(0, g, parallel::replica_axes());
  TETRAD_CHECK(ep >= 1 && cd.size() % size_t(ep) == 0);
  return std::vector<int>(cd.begin(), cd.begin() + ep);
}

std::vector<int> expert_data_group_ranks(const GridShape& g, int ep) {
  const std::vector<int> cd = parallel::group_ranks(0, g, parallel::replica_axes());
  TETRAD_CHECK(ep >= 1 && cd.size() % size_t(ep) == 0);
  std::vector<int> out;
  for (size_t j = 0; j < cd.size(); j += size_t(ep)) out.push_back(cd[j]);
  return out;
}

double alltoall_seconds(double bytes, const std::vector<int>& members, int world, const Machine& m) {
  const int gsize = int(members.size());
  if (gsize <= 1 || bytes <= 0) return 0;
  const int node0 = members[0] / m.ranks_per_node;
  std::set<int> nodes;
  int local = 0;  // members on rank members[0]'s node, itself included
  for (int r : members) {
    nodes.insert(r / m.ranks_per_node);
    local += r / m.ranks_per_node == node0;
  }
  double intra_bw = m.intra_bandwidth, intra_lat = m.intra_latency;
  const MeasuredLink* best = nullptr;  // a measured all-gather row, the nearest group size
  for (const auto& l : m.measured)
    if (l.op == "all-gather" && (!best || std::abs(l.group_size - local) < std::abs(best->group_size - local)))
      best = &l;
  if (best && nodes.size() == 1) intra_bw = best->bandwidth, intra_lat = best->latency;
  const double intra_bytes = bytes * double(local - 1) / gsize;
  const double inter_bytes = bytes * double(gsize - local) / gsize;
  const int sharing = std::max(1, std::min(m.ranks_per_node, world));  // ranks on one node's NICs
  const double inter_bw = m.inter_bandwidth / sharing;
  const double t_intra = intra_bytes > 0 ? intra_bytes / intra_bw : 0;
  const double t_inter = inter_bytes > 0 ? inter_bytes / inter_bw : 0;
  const double lat = nodes.size() > 1 ? m.inter_latency : intra_lat;
  return std::max(t_intra, t_inter) + (gsize - 1) * lat;
}

namespace {

// One expert's GEMM weights (gate|up and down): (mlp_in_factor + 1) x ffn x hidden.
double expert_numel(const ModelConfig& m) {
  return (m.desc().mlp_in_factor() + 1.0) * double(m.ffn) * m.n_embd;
}

}  // namespace

double expert_matrices(const Sizes& s, const GridShape& g, double Ls) {
  if (s.experts <= 0) return 0;
  return Ls * s.experts / s.ep * s.mlp() / (double(g.x()) * g.y() * g.z());
}

void add_moe_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s, double T,
                  double Ls, const Machine& m) {
  if (s.experts <= 0) return;
  const int ep = in.expert_parallel;
  const bool bf16 = in.precision == Precision::BF16;
  const double act_b = bf16 ? 2 : 4, w_b = in.dp_grad_comm_bytes > 0 ? in.dp_grad_comm_bytes : bf16 ? 2 : 4;
  if (ep > 1) {
    // The trainer's exchange (parallel/expert_parallel.cpp), not overlapped with computation
    // yet: exposed. Per layer per micro-batch, the rows: forward dispatch and combine; backward
    // the dispatch again (recomputed, not kept), the gradients' dispatch and combine; full
    // recomputation reruns the forward's two. Before each pass the counts per expert
    // (E x n_e / E int64 per rank, host memory): a latency-bound exchange.
    const std::vector<int> members = expert_group_ranks(g, ep);
    std::set<int> nodes;
    for (int r : members) nodes.insert(r / m.ranks_per_node);
    const bool full = in.recompute == Recompute::Full;
    auto add = [&](const char* what, double bytes, double calls) {
      CommItem it;
      it.c.what = what;
      it.c.axis = parallel::replica_axes();
      it.c.group = std::string("e");  // moved in: GCC 12 misreads a literal's copy (-Wrestrict)
      it.c.op = Op::AllToAll;
      it.c.bytes = bytes;
      it.c.calls = calls;
      it.c.inter_node = nodes.size() > 1;
      it.c.seconds = alltoall_seconds(bytes, members, g.size(), m);  // per call
      it.kind = kExposed;
      it.per_layer = calls;
      c.add_costed(it);
    };
    add("all-to-all of expert dispatch/combine", T * s.topk * s.H / (double(g.x()) * g.y()) * act_b,
        5 + (full ? 2 : 0));
    add("all-to-all of expert row counts", s.experts * 8, 2 + (full ? 1 : 0));
  }
  // The experts' gradients over the expert-data group (Gc Gd / E ranks), as add_data_comm's.
  const std::vector<int> edata = expert_data_group_ranks(g, ep);
  const double bytes = expert_matrices(s, without_context(g, in.shard_over_context), Ls) * w_b;
  if (edata.size() <= 1 || bytes <= 0) return;
  const Placement pl = place_ranks(edata, g, m);
  CommItem it;
  it.c.what = "expert-data all-reduce of expert grads";
  it.c.axis = parallel::replica_axes();
  it.c.group = ep > 1 ? "ed" : Collectives::grad_axes(g).name();
  it.c.op = Op::AllReduce;
  it.c.bytes = bytes;
  it.c.calls = 1;
  it.c.inter_node = pl.nodes > 1;
  it.c.groups = pl.groups;
  it.c.topology_limited = pl.topology_limited;
  it.c.seconds = collective_seconds(Op::AllReduce, bytes, pl);
  it.kind = kData;
  it.per_layer = 0;
  c.add_costed(it);
}

MemoryBreakdown expert_memory(const PlanInput& in, const GridShape& g, int ep) {
  MemoryBreakdown b;
  const ModelConfig& m = in.model;
  if (!m.moe()) return b;
  TETRAD_CHECK(in.memory_model == MemoryModel::Reference,
               "expert_memory: tetrad's layout is model_memory's (memory_of_grid)");
  const GridShape gf = without_context(g, in.shard_over_context);
  const double xy = double(gf.x()) * gf.y();
  const double Ls = stage_layer_count(layer_split_of(in, g), g.p());
  const double layer = double(m.n_experts) / ep * expert_numel(m) / xy;  // a layer's, before Z
  const double local = Ls * layer / gf.z();                              // what a rank stores
  const bool bf16 = in.precision == Precision::BF16;
  // The textbook layout (reference_memory_of_stage): bf16 weights and gradients, 12 bytes of
  // fp32 master weights and moments; ZeRO over D (E = 1) or the expert-data group.
  const double rep = ep == 1 ? g.d() : double(g.c()) * g.d() / ep;
  const double bw = bf16 ? 2 : 4, opt = bf16 ? 12 : 8;
  b.weights = bw * local;
  b.grads = bw * local / (in.zero >= 2 ? rep : 1);
  b.optimizer = opt * local / (in.zero >= 1 ? rep : 1);
  if (gf.z() > 1) b.gathered = 2 * bw * layer;
  return b;
}

MemoryBreakdown memory_per_rank(const PlanInput& in, const GridShape& g) {
  const int ep = expert_fold_of(in, g);
  GridShape ge = g;
  if (in.memory_model == MemoryModel::Tetrad || ep == 1 || !in.model.moe())
    return memory_of_grid(in, ge.set_e(in.memory_model == MemoryModel::Tetrad ? ep : 1));
  // The textbook layout of the published rows: E = 1's, its experts replaced by their 1/E.
  MemoryBreakdown b = memory_of_grid(in, ge.set_e(1));
  const MemoryBreakdown e = expert_memory(in, g, ep), one = expert_memory(in, g, 1);
  b.weights += e.weights - one.weights;
  b.grads += e.grads - one.grads;
  b.optimizer += e.optimizer - one.optimizer;
  b.gathered += e.gathered - one.gathered;
  b.staging += e.staging - one.staging;
  return b;
}

}  // namespace tetrad::planner
