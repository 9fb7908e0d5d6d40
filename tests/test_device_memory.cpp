// The before-the-first-step memory check of GPU runs (train/device_memory.hpp): the formula's
// terms plus the backend's reserve against the device's free memory, with the numbers in the
// message.
#include <gtest/gtest.h>

#include "tetrad/train/device_memory.hpp"

namespace {

TEST(DeviceMemory, FitsOrSaysWhyWithTheFormulasNumbers) {
  tetrad::planner::MemoryBreakdown m;
  const double G = double(1ull << 30);
  m.weights = 2 * G;
  m.grads = 2 * G;
  m.optimizer = 4 * G;
  m.gathered = 0;
  m.activations = 30 * G;
  const double reserve = tetrad::train::backend_reserve_bytes(m);
  EXPECT_GE(reserve, 96.0 * (1 << 20));
  EXPECT_EQ(tetrad::train::device_memory_problem(m, 38 * G + reserve, 80 * G, "cuda:0"), "");
  const std::string why = tetrad::train::device_memory_problem(m, 20 * G, 80 * G, "cuda:0 (NVIDIA H100)");
  EXPECT_NE(why.find("does not fit on cuda:0 (NVIDIA H100)"), std::string::npos) << why;
  EXPECT_NE(why.find("activations 30.00 GiB"), std::string::npos) << why;
  EXPECT_NE(why.find("optimizer 4.00 GiB"), std::string::npos) << why;
  EXPECT_NE(why.find("20.00 GiB of 80.00 GiB are free"), std::string::npos) << why;
  EXPECT_NE(why.find("train.recompute"), std::string::npos) << why;
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

}  // namespace
