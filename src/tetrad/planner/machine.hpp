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
#include <string>
#include <vector>

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

struct Machine {
  std::string name;         // "perlmutter"
  std::string description;  // one line: hardware and where the numbers come from
  int ranks_per_node = 1;
  double peak_fp32 = 0;       // FLOP/s per rank
  double peak_bf16 = 0;       // FLOP/s per rank; 0: no bf16 rate (bf16 plans are rejected)
  double gemm_efficiency = 1; // fraction of peak that large training GEMMs reach
  double attention_efficiency = 0;  // the same for the attention kernel; 0: gemm_efficiency
  double memory_bytes = 0;    // per rank
  double memory_bandwidth = 0;  // bytes/s per rank (elementwise work, optimizer)
  double intra_bandwidth = 0;   // bytes/s per rank, one direction, inside a node
  double intra_latency = 0;     // seconds per message inside a node
  double inter_bandwidth = 0;   // bytes/s per NODE (all NICs), one direction
  double inter_latency = 0;     // seconds per message across nodes
  std::vector<MeasuredLink> measured;  // optional, intra-node, by group size
  std::string source;               // file it was read from ("" if built in code)

  double peak(bool bf16) const { return bf16 ? peak_bf16 : peak_fp32; }
  double attention_eff() const { return attention_efficiency > 0 ? attention_efficiency : gemm_efficiency; }
  void validate() const;  // throws Error naming the field and what was expected
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
