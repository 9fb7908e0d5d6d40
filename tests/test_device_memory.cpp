// The before-the-first-step memory check (train/device_memory.hpp): the formula's terms plus the
// backend's reserve against the memory the device has for a rank, with the numbers in the message.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "tetrad/backend/backend.hpp"
#include "tetrad/train/device_memory.hpp"

namespace {

TEST(DeviceMemory, FitsOrSaysWhyWithTheFormulasNumbers) {
  using namespace tetrad;
  tetrad::planner::MemoryBreakdown m;
  const double G = double(1ull << 30);
  m.weights = 2 * G;
  m.grads = 2 * G;
  m.optimizer = 4 * G;
  m.gathered = 0;
  m.activations = 30 * G;
  const double reserve = backend_reserve_bytes(m);
  EXPECT_GE(reserve, 96.0 * (1 << 20));
  MemoryFit f;
  f.formula = m;
  f.workspace = reserve;
  f.device = "cuda:0";
  f.available_from = "cudaMemGetInfo 81920.0 MiB of 81920.0 MiB";
  FitContext c;
  c.rank = 3;
  c.world = 8;
  c.micro_batch = 16;
  // Exactly enough fits; a byte less does not; an unknown figure (0) is not checked.
  f.available = 38 * G + reserve;
  EXPECT_EQ(memory_fit_problem(f, c), "");
  f.available = 38 * G + reserve - 1;
  EXPECT_NE(memory_fit_problem(f, c), "");
  f.available = 0;
  EXPECT_EQ(memory_fit_problem(f, c), "");
  f.available = 20 * G;
  f.device = "cuda:0";
  const std::string why = memory_fit_problem(f, c);
  const double need_mib = (38 * G + reserve) / double(1 << 20);
  char need[64];
  std::snprintf(need, sizeof(need), "needs %.1f MiB per rank but 20480.0 MiB are available", need_mib);
  EXPECT_NE(why.find("rank 3 of 8: this run does not fit in memory on cuda:0"), std::string::npos) << why;
  EXPECT_NE(why.find(need), std::string::npos) << why;
  EXPECT_NE(why.find("(cudaMemGetInfo 81920.0 MiB of 81920.0 MiB)"), std::string::npos) << why;
  // The largest items first, in order.
  EXPECT_NE(why.find("largest items: activations 30720.0 MiB, optimizer state 4096.0 MiB, weights 2048.0 MiB"),
            std::string::npos) << why;
  EXPECT_NE(why.find("gradients 2048.0 MiB"), std::string::npos) << why;
  // What to change, against what the run has now.
  EXPECT_NE(why.find("parallel.grid"), std::string::npos) << why;
  EXPECT_NE(why.find("train.micro_batch (now 16)"), std::string::npos) << why;
  EXPECT_NE(why.find("train.recompute = \"selective\" or \"full\" (now \"none\")"), std::string::npos) << why;
  EXPECT_NE(why.find("train.precision = \"bf16\" (now fp32)"), std::string::npos) << why;
  // Advice already taken is not repeated.
  c.recompute = "full";
  c.bf16 = true;
  const std::string why2 = memory_fit_problem(f, c);
  EXPECT_EQ(why2.find("train.recompute"), std::string::npos) << why2;
  EXPECT_EQ(why2.find("train.precision"), std::string::npos) << why2;
  // The startup line: the formula's total against what is available.
  f.available = 40 * G;
  const std::string line = memory_fit_line(f);
  char want[96];
  std::snprintf(want, sizeof(want), "memory: formula %.1f MiB of 40960.0 MiB available on cuda:0", need_mib);
  EXPECT_EQ(line.rfind(want, 0), 0u) << line;
}

}  // namespace

#include "tetrad/planner/gpu_machines.hpp"

namespace {

TEST(GpuMachines, DriverNamesMapToMachineFilesAndPeaks) {
  using tetrad::planner::gpu_kind;
  EXPECT_EQ(gpu_kind("NVIDIA H200").machine, "h200-ib");
  EXPECT_EQ(gpu_kind("NVIDIA H200").bf16_tflops, 989);
  EXPECT_EQ(gpu_kind("NVIDIA H100 80GB HBM3").machine, "h100-ib");
  EXPECT_EQ(gpu_kind("NVIDIA H100 80GB HBM3").bf16_tflops, 989);
  EXPECT_EQ(gpu_kind("NVIDIA H100 PCIe").bf16_tflops, 756);
  EXPECT_EQ(gpu_kind("NVIDIA A100-SXM4-80GB").machine, "dgx-a100");
  EXPECT_EQ(gpu_kind("NVIDIA A100-SXM4-80GB").bf16_tflops, 312);
  EXPECT_EQ(gpu_kind("NVIDIA GeForce RTX 4090").machine, "");
  EXPECT_EQ(gpu_kind("NVIDIA GeForce RTX 4090").bf16_tflops, 0);
}

// The CPU backends' figure is the node's host memory (MemAvailable, or a cgroup's limit less its
// working set where lower), shared by the node's ranks; never more than the machine has.
TEST(DeviceMemory, CpuBackendsReportTheHostsAvailableMemory) {
  double mem_total = 0;
  {
    std::ifstream f("/proc/meminfo");
    std::string key, rest;
    double kb = 0;
    while (f >> key >> kb) {
      std::getline(f, rest);
      if (key == "MemTotal:") mem_total = kb * 1024;
    }
  }
  ASSERT_GT(mem_total, 0) << "no MemTotal in /proc/meminfo";
  for (const char* name : {"cpu", "cpu-strict"}) {
    auto be = tetrad::backend::create(name);
    const tetrad::backend::MemoryAvailable m = be->memory_available();
    EXPECT_TRUE(m.host_shared) << name;
    EXPECT_GT(m.available, 0u) << name << ": " << m.source;
    EXPECT_LE(m.available, m.total) << name;
    EXPECT_LE(double(m.total), mem_total) << name;
    EXPECT_TRUE(m.source == "MemAvailable" || m.source.starts_with("cgroup")) << m.source;
  }
  const auto h = tetrad::backend::host_memory_available();
  EXPECT_GT(h.available, 0u);
}

}  // namespace
