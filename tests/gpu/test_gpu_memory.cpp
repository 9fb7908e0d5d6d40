// The CUDA backend's memory figure for the trainer's fit check (Backend::memory_available:
// cudaMemGetInfo): free <= total, the device's own memory (not the host's), and an allocation
// lowers it by at least its size. Without a GPU the test SKIPs with the runtime's reason.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tetrad/backend/backend.hpp"

namespace {

TEST(GpuMemory, CudaReportsTheDevicesFreeMemory) {
  std::unique_ptr<tetrad::backend::Backend> be;
  std::string why = "this build has no cuda backend";
  for (tetrad::backend::BackendInfo& b : tetrad::backend::backends())
    if (b.name == "cuda") {
      if (b.available) be = b.create("cuda");
      else why = b.why_not;
    }
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

}  // namespace
