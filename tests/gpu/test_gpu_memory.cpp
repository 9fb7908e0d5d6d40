// The CUDA backend's figures the trainer reads: the memory for its fit check
// (Backend::memory_available: cudaMemGetInfo): free <= total, the device's own memory (not the
// host's), and an allocation lowers it by at least its size; and the MFU baseline (the train
// command's mfu_peak through Backend::peak): the GPU part's datasheet peak, or its measured GEMM
// ceiling for a part the table lacks, never the host CPU's measured FMA or bf16 peak. Without a
// GPU the tests SKIP with the runtime's reason.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "tetrad/backend/backend.hpp"
#include "tetrad/backend/gpu_parts.hpp"
#include "tetrad/train/progress.hpp"

namespace {

std::unique_ptr<tetrad::backend::Backend> cuda_backend(std::string* why) {
  *why = "this build has no cuda backend";
  for (tetrad::backend::BackendInfo& b : tetrad::backend::backends())
    if (b.name == "cuda") {
      if (b.available) return b.create("cuda");
      *why = b.why_not;
    }
  return nullptr;
}

TEST(GpuMemory, CudaReportsTheDevicesFreeMemory) {
  std::string why;
  std::unique_ptr<tetrad::backend::Backend> be = cuda_backend(&why);
  if (!be) GTEST_SKIP() << "no GPU: " << why;
  const tetrad::backend::MemoryAvailable before = be->memory_available();
  EXPECT_EQ(before.source, "cudaMemGetInfo");
  EXPECT_FALSE(before.host_shared);
  EXPECT_GT(before.available, 0u);
  EXPECT_LE(before.available, before.total);
  EXPECT_GE(before.devices, 1);
  EXPECT_EQ(be->name(), "cuda:" + std::to_string(before.index));
  const size_t bytes = size_t(256) << 20;
  ASSERT_GT(before.available, bytes);
  tetrad::backend::DeviceBuffer buf = be->alloc(bytes);
  const tetrad::backend::MemoryAvailable after = be->memory_available();
  EXPECT_LE(after.available + bytes, before.available)
      << "free " << before.available << " -> " << after.available << " after " << bytes;
}

// train --device cuda once divided by the host CPU's measured peak: the peak now comes from the
// backend the run is on (train/progress.cpp, mfu_peak -> Backend::peak).
TEST(GpuPeak, MfuBaselineIsTheGpusDatasheetOrMeasuredPeak) {
  using tetrad::backend::Precision;
  std::string why;
  std::unique_ptr<tetrad::backend::Backend> be = cuda_backend(&why);
  if (!be) GTEST_SKIP() << "no GPU: " << why;
  const std::string desc = be->description();
  const tetrad::backend::GpuPart part = tetrad::backend::gpu_part(desc.substr(0, desc.find(',')));
  for (Precision p : {Precision::BF16, Precision::FP32}) {
    const tetrad::MfuPeak pk = tetrad::mfu_peak(0, p, *be);
    std::printf("MFU baseline (%s): %s, %.0f GFLOP/s\n", p == Precision::BF16 ? "bf16" : "fp32",
                pk.name.c_str(), pk.gflops);
    EXPECT_EQ(pk.name.find("FMA"), std::string::npos) << pk.name << ": the host CPU's peak";
    EXPECT_EQ(pk.name.find("register loop"), std::string::npos) << pk.name;
    if (part.bf16_tflops > 0) {
      EXPECT_NE(pk.name.find("(datasheet)"), std::string::npos) << pk.name;
      EXPECT_DOUBLE_EQ(pk.gflops, 1000 * (p == Precision::BF16 ? part.bf16_tflops : part.fp32_tflops));
    } else {
      EXPECT_NE(pk.name.find("measured GEMM ceiling"), std::string::npos) << pk.name;
      EXPECT_GT(pk.gflops, 1000.0) << "a GPU's GEMM ceiling is above a TFLOP/s";
    }
  }
}

}  // namespace
