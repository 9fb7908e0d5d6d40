// The tiny model trained 20 steps on the GPU ("cuda") against the same 20 steps on the CPU
// backend, through the harness the cpu-strict stand-in runs bit for bit
// (tests/device_model_harness.hpp, tests/test_device_model.cpp): parameters, gradients, Adam
// moments and activations on the device, the host touching them only through queue copies.
// The GPU's kernels sum in other orders than the CPU's, so the runs agree within rounding, not
// bitwise: fp32 losses within 1e-4 relative, gradient norms 1e-3, weights 1e-3 absolute; bf16
// (bf16 GEMM operands on both) losses within 2e-2 relative. Plus the checkpoint round trip on
// the device (bitwise: the same device both times). Without a GPU every test SKIPs with the
// runtime's reason (never counted as a pass).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "../device_model_harness.hpp"
#include "tetrad/backend/backend.hpp"

using namespace tetrad;
using namespace tetrad::parallel;

namespace {

constexpr int kGpuSteps = 20;

std::unique_ptr<backend::Backend> cuda_or_skip(std::string* why) {
  for (backend::BackendInfo& b : backend::backends())
    if (b.name == "cuda") {
      if (!b.available) {
        *why = b.why_not;
        return nullptr;
      }
      return b.create("cuda");
    }
  *why = "this build has no cuda backend";
  return nullptr;
}

void compare(Family f, backend::Precision p, double loss_tol, double gn_tol, double w_tol) {
  std::string why;
  auto be = cuda_or_skip(&why);
  if (!be) GTEST_SKIP() << "no GPU: " << why;
  const ModelConfig mc = device_model::tiny_model(f);
  ProcessGroups g;
  ParallelOptions po;
  po.precision = p;
  const device_model::Trace cpu =
      device_model::train(mc, g, po, kGpuSteps, nullptr, nullptr, kGpuSteps);
  po.device = be.get();
  const device_model::Trace gpu =
      device_model::train(mc, g, po, kGpuSteps, nullptr, nullptr, kGpuSteps);
  ASSERT_EQ(gpu.losses.size(), size_t(kGpuSteps));
  for (int s = 0; s < kGpuSteps; ++s) {
    EXPECT_NEAR(gpu.losses[s] / cpu.losses[s], 1.0, loss_tol) << "step " << s + 1;
    EXPECT_NEAR(gpu.grad_norms[s] / cpu.grad_norms[s], 1.0, gn_tol) << "step " << s + 1;
    std::printf("step %2d loss cpu %.7f %s %.7f\n", s + 1, cpu.losses[s], be->name().c_str(),
                gpu.losses[s]);
  }
  double worst = 0;
  for (size_t i = 0; i < cpu.weights.size(); ++i)
    for (size_t j = 0; j < cpu.weights[i].size(); ++j)
      worst = std::max(worst, std::fabs(double(cpu.weights[i][j]) - gpu.weights[i][j]));
  EXPECT_LT(worst, w_tol) << "largest weight difference after " << kGpuSteps << " steps";
  EXPECT_LT(gpu.losses.back(), gpu.losses.front());
}

TEST(GpuModel, Gpt2Fp32TwentyStepsAgainstTheCpu) {
  compare(Family::GPT2, backend::Precision::FP32, 1e-4, 1e-3, 1e-3);
}
TEST(GpuModel, LlamaFp32TwentyStepsAgainstTheCpu) {
  compare(Family::Llama, backend::Precision::FP32, 1e-4, 1e-3, 1e-3);
}
TEST(GpuModel, LlamaBf16TwentyStepsAgainstTheCpu) {
  compare(Family::Llama, backend::Precision::BF16, 2e-2, 1e-1, 2e-2);
}

// The model on NCCL process groups (ProcessGroups::on_nccl, what train.comm = nccl builds) of
// one rank: NCCL refuses two ranks on one GPU, so one GPU checks the construction, the model's
// host values going through the MPI twins (host()) and the run against the CPU; every
// collective of a grid is checked by CommConformance.nccl.* where there is one GPU per rank.
TEST(GpuModel, LlamaFp32OnNcclGroupsAgainstTheCpu) {
#if TETRAD_HAVE_NCCL
  std::string why;
  auto be = cuda_or_skip(&why);
  if (!be) GTEST_SKIP() << "no GPU: " << why;
  const ModelConfig mc = device_model::tiny_model(Family::Llama);
  ProcessGroups cpu_groups;
  ParallelOptions po;
  po.precision = backend::Precision::FP32;
  const device_model::Trace cpu =
      device_model::train(mc, cpu_groups, po, kGpuSteps, nullptr, nullptr, kGpuSteps);
  ProcessGroups g = ProcessGroups::on_nccl(comm::Communicator::self("world"), GridShape{});
  ASSERT_TRUE(g.on_nccl());
  EXPECT_STREQ(g.world.transport(), "NCCL");
  EXPECT_STREQ(g.host().world.transport(), "self");
  po.device = be.get();
  const device_model::Trace gpu =
      device_model::train(mc, g, po, kGpuSteps, nullptr, nullptr, kGpuSteps);
  ASSERT_EQ(gpu.losses.size(), size_t(kGpuSteps));
  for (int s = 0; s < kGpuSteps; ++s) {
    EXPECT_NEAR(gpu.losses[s] / cpu.losses[s], 1.0, 1e-4) << "step " << s + 1;
    EXPECT_NEAR(gpu.grad_norms[s] / cpu.grad_norms[s], 1.0, 1e-3) << "step " << s + 1;
  }
  EXPECT_LT(gpu.losses.back(), gpu.losses.front());
#else
  GTEST_SKIP() << "this build has no NCCL (TETRAD_NCCL)";
#endif
}

TEST(GpuModel, CheckpointRoundTripOnTheDevice) {
  std::string why;
  auto be = cuda_or_skip(&why);
  if (!be) GTEST_SKIP() << "no GPU: " << why;
  const ModelConfig mc = device_model::tiny_model(Family::Llama);
  ProcessGroups g;
  ParallelOptions po;
  po.device = be.get();
  const device_model::Trace whole = device_model::train(mc, g, po, device_model::kSteps);
  device_model::Saved saved;
  device_model::train(mc, g, po, device_model::kSteps / 2, nullptr, &saved);
  const device_model::Trace resumed = device_model::train(mc, g, po, device_model::kSteps, &saved);
  for (size_t s = 0; s < resumed.losses.size(); ++s)
    EXPECT_EQ(resumed.losses[s], whole.losses[s + device_model::kSteps / 2]) << "step " << s;
}

}  // namespace
