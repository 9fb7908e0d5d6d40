// The contract's step (contract.hpp, parallel_run) on a backend whose memory the host cannot
// read ("cpu-strict", backend/cpu/strict_backend.hpp) against the same step on "cpu", on every
// grid of the world size: bit-identical losses, gradient norms, weights and Adam moments. On
// cpu-strict every collective gets device pointers, which the MPI communicator stages through
// host memory (parallel/device_staging.hpp), as a GPU run without NCCL does; any host access to
// the model's device memory faults. The CPU stand-in for the multi-rank GPU tests.
// Runs under mpirun -n 2, 4, 8: the default options on every grid; on 2 and 4 ranks also every
// overlap switch on, ZeRO 1 and 2, full recomputation and, on pipeline grids, the interleaved
// schedule (8 oversubscribed ranks on two cores would take minutes).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "contract.hpp"
#include "tetrad/backend/backend.hpp"

using namespace contract;

namespace {

constexpr int kSteps = 4;

void expect_identical(const Run& a, const Run& b, const std::string& where) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << where;
  for (size_t s = 0; s < a.losses.size(); ++s) {
    EXPECT_EQ(a.losses[s], b.losses[s]) << where << ": loss of step " << s + 1;
    EXPECT_EQ(a.grad_norms[s], b.grad_norms[s]) << where << ": grad norm of step " << s + 1;
  }
  for (size_t i = 0; i < a.weights.size(); ++i) {
    EXPECT_EQ(std::memcmp(a.weights[i].data(), b.weights[i].data(), a.weights[i].size() * 4), 0)
        << where << ": weights of tensor " << i;
    EXPECT_EQ(std::memcmp(a.m[i].data(), b.m[i].data(), a.m[i].size() * 4), 0)
        << where << ": first moment of tensor " << i;
    EXPECT_EQ(std::memcmp(a.v[i].data(), b.v[i].data(), a.v[i].size() * 4), 0)
        << where << ": second moment of tensor " << i;
  }
}

// Every option set this grid can run: the defaults, and (world size <= 4) the rest.
std::vector<std::pair<std::string, ParallelOptions>> option_sets(const GridShape& s) {
  std::vector<std::pair<std::string, ParallelOptions>> out;
  out.emplace_back("defaults", ParallelOptions{});
  if (world_size() > 4) return out;
  ParallelOptions ov;
  ov.overlap.backward_allreduce = true;
  ov.overlap.reduce_scatter = true;
  ov.overlap.prefetch_depth = 1;
  ov.overlap.prefetch_across_steps = true;
  ov.overlap.dp_overlap = true;
  ov.overlap.dp_bucket_mb = 0.01;
  ov.overlap.forward_chunks = 2;
  out.emplace_back("every overlap switch", ov);
  if (s.d() > 1) {
    ParallelOptions z1;
    z1.zero = 1;
    z1.reduce_scatter_chunk_bytes = 256;
    out.emplace_back("zero 1", z1);
    ParallelOptions z2;
    z2.zero = 2;
    z2.recompute = Recompute::Full;
    out.emplace_back("zero 2, full recompute", z2);
  }
  if (s.p() > 1) {
    ParallelOptions v2;
    v2.virtual_stages = 2;
    out.emplace_back("interleaved pipeline", v2);
  }
  return out;
}

void check_all_grids(Family family) {
  const ModelConfig mc = tiny_model(family, 4);
  std::unique_ptr<tetrad::backend::Backend> strict = tetrad::backend::create("cpu-strict");
  int tested = 0;
  for (const GridShape& shape : contract_grids(mc)) {
    ProcessGroups g(comm::Communicator::world(), shape);
    for (auto [name, po] : option_sets(shape)) {
      if (shape.p() > 1 && mc.n_layer % (shape.p() * po.virtual_stages) != 0) continue;
      const Run cpu = parallel_run(mc, g, kSteps, po);
      po.device = strict.get();
      const Run dev = parallel_run(mc, g, kSteps, po);
      expect_identical(cpu, dev, family_name(family) + " grid " + shape.to_string() + ", " + name);
      ++tested;
    }
  }
  EXPECT_GT(tested, 0);
  if (world_rank() == 0)
    std::printf("[ %s ] %d grid/option runs of %d ranks on cpu-strict, bit-identical to cpu\n",
                family_name(family).c_str(), tested, world_size());
}

// The same on the GPU ("cuda"; every rank on the node-local GPU, MPI staging through host
// memory: two ranks may share one GPU, which NCCL would refuse), within rounding: the GPU's
// kernels sum in other orders than the CPU's. SKIPs on every rank alike without a GPU.
TEST(DeviceModelMpi, CudaEveryGridMatchesTheCpuWithinRounding) {
  std::string why = "this build has no cuda backend";
  bool available = false;
  for (const auto& b : tetrad::backend::backends())
    if (b.name == "cuda") {
      available = b.available;
      why = b.why_not;
    }
  int mine = available ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) GTEST_SKIP() << "no GPU on some rank: " << why;
  std::unique_ptr<tetrad::backend::Backend> gpu = tetrad::backend::create("cuda");
  for (Family family : {Family::GPT2, Family::Llama}) {
    const ModelConfig mc = tiny_model(family, 4);
    for (const GridShape& shape : contract_grids(mc)) {
      ProcessGroups g(comm::Communicator::world(), shape);
      ParallelOptions po;
      const contract::Run cpu = parallel_run(mc, g, kSteps, po);
      po.device = gpu.get();
      const contract::Run dev = parallel_run(mc, g, kSteps, po);
      const std::string where = family_name(family) + " grid " + shape.to_string();
      for (size_t s = 0; s < cpu.losses.size(); ++s)
        EXPECT_NEAR(dev.losses[s] / cpu.losses[s], 1.0, 1e-4) << where << " step " << s + 1;
      EXPECT_LT(worst_weight_difference(cpu, dev, mc), 1e-3) << where;
    }
  }
}

TEST(DeviceModelMpi, Gpt2EveryGridOnDeviceMemoryMatchesTheCpuBitForBit) {
  check_all_grids(Family::GPT2);
}
TEST(DeviceModelMpi, LlamaEveryGridOnDeviceMemoryMatchesTheCpuBitForBit) {
  check_all_grids(Family::Llama);
}

}  // namespace
