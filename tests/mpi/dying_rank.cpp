// A rank dies in the middle of a job: the job must end, never hang.
//
// Every rank joins one all-reduce (all alive); then rank 1 leaves with std::_Exit(3) (no
// MPI_Finalize, as a crash would) and the others start another all-reduce and wait on it with a
// 2 s timeout. Either Open MPI notices the dead rank and kills the job, or the wait times out
// with a tetrad::Error, which a survivor reports before ending the job with MPI_Abort. Run by
// tests/mpi/expect_job_ends.sh, which checks the job ends soon and with a non-zero status.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "tetrad/comm/communicator.hpp"
#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/core/error.hpp"

using namespace tetrad;

int main(int argc, char** argv) {
  comm::MpiEnvironment env(&argc, &argv);
  const comm::Communicator world = comm::Communicator::world();
  if (world.size() < 2) {
    std::fprintf(stderr, "dying_rank needs at least 2 ranks\n");
    return 1;
  }
  int alive = 1;
  world.allreduce_sum(&alive, 1);
  std::printf("rank %d: %d ranks alive\n", world.rank(), alive);
  std::fflush(stdout);
  if (world.rank() == 1) {
    std::fprintf(stderr, "rank 1: exiting with std::_Exit(3) in the middle of the job\n");
    std::_Exit(3);
  }
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  try {
    std::vector<float> grad(1024, 1.0f);
    comm::Request r = world.iallreduce_sum(grad.data(), grad.size());
    r.wait(2.0);
    std::fprintf(stderr, "rank %d: the all-reduce completed without rank 1 after %.2f s?!\n",
                 world.rank(), seconds());
    return 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: caught after %.2f s: %s\n", world.rank(), seconds(), e.what());
    std::fprintf(stderr, "rank %d: ending the job with MPI_Abort(2)\n", world.rank());
    comm::MpiEnvironment::abort(2);
  }
}
