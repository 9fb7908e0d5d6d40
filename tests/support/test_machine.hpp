// The made-up machine of the planner's tests (test_planner, test_scaling). Header only.
#pragma once
#include "tetrad/planner/machine.hpp"

namespace tetrad_test {

// A made-up cluster: `ranks_per_node` ranks per node, fast inside, slower between nodes (flat
// network: no topology).
inline tetrad::planner::Machine test_machine(int ranks_per_node = 4) {
  tetrad::planner::Machine m;
  m.name = "test";
  m.ranks_per_node = ranks_per_node;
  m.peak_fp32 = 10e12;
  m.peak_bf16 = 100e12;
  m.gemm_efficiency = 0.7;
  m.memory_bytes = 40e9;
  m.memory_bandwidth = 1.5e12;
  m.intra_bandwidth = 200e9;
  m.intra_latency = 5e-6;
  m.inter_bandwidth = 100e9;  // per node
  m.inter_latency = 10e-6;
  return m;
}

}  // namespace tetrad_test
