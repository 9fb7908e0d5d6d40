// main() of the MPI GoogleTest executables: MPI up (and down at exit), GoogleTest's printer on
// rank 0 only so the log shows one copy of each result (TETRAD_TEST_ALL_RANKS=1 keeps every
// rank's). A failure on any rank still makes that rank, and so mpirun, exit non-zero.
// A test file that needs more (test_comm_mpi.cpp: a collective timeout and a result vote)
// defines its own main, which the linker then takes instead of this one (a static library).
#include <gtest/gtest.h>

#include <cstdlib>

#include "mpi_test.hpp"
#include "tetrad/comm/mpi_env.hpp"

int main(int argc, char** argv) {
  tetrad::comm::MpiEnvironment env(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (mpi_test::world_rank() != 0 && !std::getenv("TETRAD_TEST_ALL_RANKS")) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}
