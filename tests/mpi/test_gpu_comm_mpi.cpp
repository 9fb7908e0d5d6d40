// GPU communication under mpirun (2, 4, 8 ranks): NCCL communicators made from a unique id
// broadcast over MPI, collectives on device buffers against the same MPI collective on the host,
// and NCCL's refusal of two ranks on one GPU, which must come back as tetrad's error naming the
// ranks and the way out (the MPI communicator), not a hang. Without NCCL in the build, or without
// a GPU here, every test SKIPs with the reason (never counted as a pass).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "tetrad/comm/communicator.hpp"
#include "tetrad/core/error.hpp"

#if TETRAD_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "tetrad/backend/cuda/gpu_api.hpp"
#include "tetrad/backend/device_select.hpp"
#include "tetrad/comm/nccl_communicator.hpp"
#endif

namespace {

using tetrad::comm::Communicator;

#if TETRAD_HAVE_NCCL
namespace g = tetrad::gpu;

// Skips (every rank alike) unless each rank has a device; returns the device count.
int devices_or_skip() {
  std::string why;
  const int n = g::device_count(&why);
  int mine = n, fewest = 0;
  MPI_Allreduce(&mine, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return fewest;
}

// NCCL with one rank per communicator: the world split into singletons, each on its own
// device (local rank % devices): all-reduce, all-gather, reduce-scatter and broadcast of device
// buffers equal the host computation.
TEST(GpuCommMpi, NcclOnOneRankGroups) {
  const int ndev = devices_or_skip();
  if (ndev == 0) GTEST_SKIP() << "no CUDA device on some rank";
  Communicator world = Communicator::world();
  Communicator solo = world.split(world.rank(), 0, "solo");
  GPU_CHECK(g::gpuSetDevice(tetrad::backend::device_for_local_rank(
      tetrad::backend::local_rank_from_environment(), ndev)));
  Communicator nc = tetrad::comm::nccl_communicator(solo);
  ASSERT_EQ(nc.size(), 1);
  ASSERT_STREQ(nc.transport(), "NCCL");
  const size_t n = 1000;
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = float(i) * 0.5f + float(world.rank());
  float *d = nullptr, *r = nullptr;
  GPU_CHECK(g::gpuMalloc(reinterpret_cast<void**>(&d), n * 4));
  GPU_CHECK(g::gpuMalloc(reinterpret_cast<void**>(&r), n * 4));
  GPU_CHECK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
  nc.iallreduce_sum(d, n).wait();
  nc.iallgather(d, r, n).wait();
  nc.ibroadcast(r, n, 0).wait();
  std::vector<float> back(n);
  GPU_CHECK(cudaMemcpy(back.data(), r, n * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, h);  // a one-rank sum, gather and broadcast are the identity
  g::gpuFree(d);
  g::gpuFree(r);
}

// Several ranks of one communicator on one GPU: NCCL cannot run them; tetrad says so up front.
TEST(GpuCommMpi, TwoRanksOnOneGpuAreRefusedWithTheWayOut) {
  const int ndev = devices_or_skip();
  if (ndev == 0) GTEST_SKIP() << "no CUDA device on some rank";
  Communicator world = Communicator::world();
  if (world.size() <= ndev) GTEST_SKIP() << "every rank has its own GPU here (" << ndev << " devices)";
  GPU_CHECK(g::gpuSetDevice(world.rank() % ndev));
  try {
    Communicator nc = tetrad::comm::nccl_communicator(world);
    ADD_FAILURE() << "NCCL communicator over ranks sharing a GPU was created";
  } catch (const tetrad::Error& e) {
    EXPECT_NE(std::string(e.what()).find("share GPU"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MPI communicator"), std::string::npos) << e.what();
  }
}

// Ranks sharing one GPU communicate through MPI, staged through host memory: device -> host,
// MPI all-reduce, host -> device, against the host sum.
TEST(GpuCommMpi, RanksSharingAGpuGoThroughMpiStagedInHostMemory) {
  const int ndev = devices_or_skip();
  if (ndev == 0) GTEST_SKIP() << "no CUDA device on some rank";
  Communicator world = Communicator::world();
  GPU_CHECK(g::gpuSetDevice(world.rank() % ndev));
  const size_t n = 4096;
  std::vector<double> h(n), want(n, 0);
  for (size_t i = 0; i < n; ++i) h[i] = double(i % 97) + 0.25 * world.rank();
  for (int r = 0; r < world.size(); ++r)
    for (size_t i = 0; i < n; ++i) want[i] += double(i % 97) + 0.25 * r;
  double* d = nullptr;
  double* pinned = nullptr;
  GPU_CHECK(g::gpuMalloc(reinterpret_cast<void**>(&d), n * 8));
  GPU_CHECK(g::gpuMallocHost(reinterpret_cast<void**>(&pinned), n * 8));
  GPU_CHECK(cudaMemcpy(d, h.data(), n * 8, cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(pinned, d, n * 8, cudaMemcpyDeviceToHost));
  world.allreduce_sum(pinned, n);
  GPU_CHECK(cudaMemcpy(d, pinned, n * 8, cudaMemcpyHostToDevice));
  std::vector<double> back(n);
  GPU_CHECK(cudaMemcpy(back.data(), d, n * 8, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, want);
  g::gpuFree(d);
  g::gpuFreeHost(pinned);
}
#else
TEST(GpuCommMpi, NcclOnOneRankGroups) { GTEST_SKIP() << "built without NCCL (TETRAD_NCCL off or no CUDA)"; }
#endif

}  // namespace
