// The planner's mixture-of-experts terms (issue 32; docs/planner.md, "Mixture of experts"):
// the expert-parallel axis E folded over the context and data ranks (Megatron-Core's parallel
// folding: rank j of a C x D group, c fastest, is expert rank j mod E of expert-data rank j / E),
// its all-to-all (dispatch and combine, forward and backward), the expert gradients' reduction
// over the expert-data group (Gc Gd / E ranks), the experts' memory per rank, and E in the grid
// search. FLOPs are the ACTIVE ones (Sizes::block_matmul: k experts and the router per token),
// so MFU is on active FLOPs.
//
// Not modelled: routing imbalance (every expert gets its average share of the tokens: T k / n_e
// rows each; a dropless run with uneven load is slower than predicted), the capacity factor's
// drops, overlap of the all-to-all with the experts' GEMMs, experts split over X and Y (the trainer
// runs a mixture of experts with Gx = Gy = 1).
#pragma once
#include <string>
#include <vector>

#include "tetrad/planner/planner.hpp"

namespace tetrad::planner {

// Why in.expert_parallel cannot run on g ("" if it can): a dense model has E = 1 only; for a
// mixture of experts E divides Gc x Gd and model.n_experts.
std::string expert_parallel_problem(const PlanInput& in, const GridShape& g);
// The E plan() tries on g: {1} for a dense model; every E dividing both Gc x Gd and n_experts.
std::vector<int> expert_parallel_candidates(const PlanInput& in, const GridShape& g);
// g estimated at each candidate E (plan()'s search; each is a row of the ranking).
std::vector<Estimate> estimate_expert_axis(const PlanInput& in, const GridShape& g, const Machine& m);
// "1x1x2x1x4 e2": grid_label with E > 1 appended.
std::string plan_label(const Estimate& e);

// Ranks of rank 0's expert group (the first E members of its C x D group) and of its
// expert-data group (every E-th member).
std::vector<int> expert_group_ranks(const GridShape& g, int ep);
std::vector<int> expert_data_group_ranks(const GridShape& g, int ep);

// Seconds of one all-to-all in which each member sends `bytes` (its whole send buffer, 1/g of it
// to each member, itself included): the (g - 1)/g that leaves the rank, the share to members on
// its node at the node's per-rank bandwidth (a measured all-gather row of the machine file, same
// per-rank volume, where it has one) and the share to other nodes through the node's NICs, shared
// by every rank of the node (all of them are in some expert group at once); the two run at once,
// so the slower sets the time; plus (g - 1) message latencies, inter-node ones when it spans nodes.
double alltoall_seconds(double bytes, const std::vector<int>& members, int world, const Machine& m);

// Expert weights a rank stores for Ls layers: n_experts / E experts, split over X, Y and Z.
double expert_matrices(const Sizes& s, const GridShape& g, double Ls);

// Per layer per micro-batch: the dispatch and combine all-to-alls over E (forward 2, backward 2,
// full recomputation 2 more: the dispatch is recomputed with the layer), T x k x H activations
// per rank each, exposed. Per step: the expert gradients all-reduced over the expert-data group
// (Gc Gd / E ranks; the dense gradients keep add_data_comm's group).
void add_moe_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s, double T,
                  double Ls, const Machine& m);

// The experts' bytes per rank at E, by class (the layout of in.memory_model): weights, gradients
// and optimizer states of n_experts / E experts (ZeRO over the expert-data group Gc Gd / E: its
// 1/E of the experts in pieces over Gc Gd / E ranks), and in tetrad's layout the Z gather slots,
// the reduce-scatter's landing buffer and the gradient blocks that hold a layer's experts.
// memory_per_rank = memory_per_rank_all_experts + expert_memory(E) - expert_memory(1).
MemoryBreakdown expert_memory(const PlanInput& in, const GridShape& g, int ep);

}  // namespace tetrad::planner
