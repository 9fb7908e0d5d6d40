// A machine description for the planner (docs/planner.md): what one rank can compute, how much
// memory it has, and how fast its collectives run inside a node and across nodes. A small TOML
// file a user can write (machines/*.toml); `tetrad plan --measure-machine` writes one for the
// machine it runs on.
//
// Units in the file carry their name (tflops, gb, gb_per_s, us); in the struct everything is SI
// (FLOP/s, bytes, bytes/s, seconds) so the model never converts.
//
// What this does not describe: topology beyond "inside a node / across nodes" (no fat-tree
// levels, no rail placement), congestion from other jobs, or per-message-size protocol changes;
// a measured table per group size (`[[network.measured]]`) replaces the two-level figures where
// present.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "tetrad/planner/network.hpp"

namespace tetrad::planner {

// Latency and bandwidth of one collective among `group_size` ranks of one node, measured and
// expressed in the ring model (planner.hpp): all-reduce t(n) = 2(g-1) latency + 2(g-1)/g n / bw,
// all-gather and reduce-scatter t(n) = (g-1) latency + (g-1)/g n / bw. MPI libraries use
// different algorithms (and buffers) for each, so each gets its own row.
struct MeasuredLink {
  std::string op = "all-reduce";  // "all-reduce" | "all-gather" | "reduce-scatter"
  int group_size = 2;
  double bandwidth = 0;  // bytes/s (bus bandwidth)
  double latency = 0;    // seconds per ring step
};

// The operand layouts of the trainer's three GEMMs per weight (parallel/parallel_linear.cpp, rows
// of activations are tokens): forward C[T, n] = A[T, k] W[n, k]^T ("nt"), input gradient
// C[T, k] = dY[T, n] W[n, k] ("nn"), weight gradient C[n, k] = dY[T, n]^T A[T, k] ("tn", the
// reduction runs over the tokens). A CPU library packs a transposed operand differently, so
// on a CPU each has its own measured lattice; GPU files price them alike.
enum class GemmOp { NN, NT, TN };
const char* gemm_op_name(GemmOp op);     // "nn" | "nt" | "tn"
GemmOp parse_gemm_op(const std::string& s);

// One measured GEMM shape (machine file's [[compute.gemm]], written by --measure-machine):
// C[m, n] += op(A)[m, k] op(B)[k, n] at `efficiency` x the FMA peak, every rank computing at once.
struct MeasuredGemm {
  int m = 0, n = 0, k = 0;
  double efficiency = 0;
  GemmOp op = GemmOp::NN;  // files written before the variants existed hold "nn" rows only
};

struct Machine {
  std::string name;         // "perlmutter"
  std::string description;  // one line: hardware and where the numbers come from
  int ranks_per_node = 1;
  double peak_fp32 = 0;       // FLOP/s per rank
  double peak_bf16 = 0;       // FLOP/s per rank; 0: no bf16 rate (bf16 plans are rejected)
  double gemm_efficiency = 1; // fraction of peak that large training GEMMs reach
  double attention_efficiency = 0;  // the same for the attention kernel; 0: gemm_efficiency
  // Shape-dependent GEMM efficiency (docs/planner.md, "GEMM efficiency by shape"). A GEMM's
  // output is cut into tile_m x tile_n tiles spread over compute_units (SMs): the last wave of
  // tiles leaves units idle (wave quantization), and a GEMM whose operands take longer to stream
  // from memory than to multiply runs at the memory's pace (roofline). 0 units: not modelled.
  int compute_units = 0;
  int gemm_tile_m = 128, gemm_tile_n = 128;
  // Units one running collective occupies while it overlaps compute (compute.collective_units):
  // NCCL runs each channel as one thread block that holds an SM to itself (NVIDIA/nccl#689),
  // two channels per NIC of the node (NVIDIA/nccl#438, #689). The overlapped GEMMs run on the
  // remaining compute_units - collective_units (docs/planner.md, "Overlap contention").
  // 0: not modelled (an overlapped collective is free).
  int collective_units = 0;
  // Measured slowdown of compute that runs beside a collective (compute.overlap_slowdown):
  // the overlapped kernels take (1 + s) times their time alone, from everything the two share
  // (SMs, HBM, L2, power). Lee et al., "Characterizing Compute-Communication Overlap in
  // GPU-Accelerated Distributed Deep Learning" (arXiv 2507.03114, 2025): 18.9% on average over
  // GPT and Llama layers on A100, H100, MI250 and MI210. 0: the SM share above alone.
  double overlap_slowdown = 0;
  // Measured efficiencies by shape (CPU files); when present they replace the analytic model:
  // a full lattice of m, n, k values, interpolated in log(m), log(n), log(k).
  std::vector<MeasuredGemm> gemm_shapes;
  double memory_bytes = 0;    // per rank
  double memory_bandwidth = 0;  // bytes/s per rank (elementwise work, optimizer)
  double intra_bandwidth = 0;   // bytes/s per rank, one direction, inside a node
  double intra_latency = 0;     // seconds per message inside a node
  // network.intra_pair_bandwidth_gb_per_s (optional): bytes/s, one direction, of the links that
  // join ONE pair of ranks of a node whose ranks are wired point to point (no switch): a Perlmutter
  // node's A100s each have 12 NVLink 3 links, 4 to each of the other three GPUs. A group of q
  // members of such a node reaches only its members' links: (q - 1) x this, at most
  // intra_bandwidth (intra_group_bandwidth). 0: a switched node (NVSwitch), every group gets
  // intra_bandwidth.
  double intra_pair_bandwidth = 0;
  double intra_group_bandwidth(int members_on_node) const {
    if (!(intra_pair_bandwidth > 0) || members_on_node < 2) return intra_bandwidth;
    return std::min(intra_bandwidth, (members_on_node - 1) * intra_pair_bandwidth);
  }
  double inter_bandwidth = 0;   // bytes/s per NODE (all NICs), one direction
  double inter_latency = 0;     // seconds per message across nodes
  std::vector<MeasuredLink> measured;  // optional, intra-node, by group size
  // Optional [network.topology]: how nodes are grouped above the node and what leaves a group
  // (network.hpp; docs/planner.md, "The network at scale"). Absent: every node pair gets
  // inter_bandwidth, however many nodes the job spans.
  NetworkTopology topology;
  std::string source;               // file it was read from ("" if built in code)

  double peak(bool bf16) const { return bf16 ? peak_bf16 : peak_fp32; }
  double attention_eff() const { return attention_efficiency > 0 ? attention_efficiency : gemm_efficiency; }
  void validate() const;  // throws Error naming the field and what was expected

  // Fraction of peak(bf16) a GEMM C[m, n] = A[m, k] B[k, n] sustains (elements of `bytes` each):
  // measured lattice if the file has one; otherwise
  //   gemm_efficiency x wave(m, n), capped by the roofline AI x memory_bandwidth / peak, where
  //   wave = tiles / (ceil(tiles / compute_units) x compute_units), tiles = ceil(m/tm)·ceil(n/tn)
  //   AI = 2mnk / (bytes·(mk + kn + mn)).
  // `op`: which lattice a measured file uses (falls back to the "nn" rows when the file has none
  // of that variant); the analytic model prices every variant alike.
  double gemm_eff(double m, double n, double k, bool bf16, GemmOp op = GemmOp::NN) const;
  // Fraction of the compute rate a collective running beside the kernels takes from them: the
  // larger of its SMs' share (collective_units / compute_units) and the measured slowdown's
  // s / (1 + s) (the measurement includes the SMs).
  double contended_fraction() const {
    const double sm = compute_units > 0 && collective_units > 0 ? double(collective_units) / compute_units : 0.0;
    return std::max(sm, overlap_slowdown / (1 + overlap_slowdown));
  }
};

// Reads a machine file; throws Error naming the file, the key and what was expected.
Machine load_machine_file(const std::string& path);
// `name_or_path`: a path to a .toml file, or the name of a shipped file (machines/NAME.toml,
// looked up in ./machines and in the source tree's machines/).
Machine load_machine(const std::string& name_or_path);
// The names of the shipped machine files.
std::vector<std::string> shipped_machines();
// The file text (documented TOML); load_machine_file(save) gives the same machine back.
std::string machine_to_toml(const Machine& m);

// Measures this machine with every rank of MPI_COMM_WORLD (1 rank when MPI is not initialised):
// FMA peak and sgemm with all ranks computing at once (so sharing cores is included), memory
// bandwidth, and ring all-reduce latency and bandwidth for every group size 2..N that divides N
// (groups of consecutive ranks, all groups at once). `threads` OpenMP threads per rank.
// Collective over the world; the result is the same on every rank.
Machine measure_machine(const std::string& name, int threads, bool quick);

}  // namespace tetrad::planner
