// What every MPI test shares: the rank and size of MPI_COMM_WORLD. The main() that starts MPI
// and GoogleTest is mpi_test_main.cpp (linked into every tests/mpi/test_*.cpp that has none).
#pragma once
#include <mpi.h>

namespace mpi_test {

inline int world_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace mpi_test
