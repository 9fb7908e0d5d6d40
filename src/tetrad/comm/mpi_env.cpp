#include "tetrad/comm/mpi_env.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tetrad/core/error.hpp"

namespace tetrad::comm {

namespace {
std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, len);
}
}  // namespace

MpiEnvironment::MpiEnvironment() : MpiEnvironment(nullptr, nullptr) {}

MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int initialized = 0, finalized = 0;
  TETRAD_CHECK(MPI_Initialized(&initialized) == MPI_SUCCESS);
  TETRAD_CHECK(MPI_Finalized(&finalized) == MPI_SUCCESS);
  if (finalized) fail("MpiEnvironment: MPI has already been finalised in this process");
  int provided = 0;
  if (!initialized) {
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) fail("MPI_Init_thread failed: ", mpi_error_string(rc));
    owns_ = true;
  } else {
    TETRAD_CHECK(MPI_Query_thread(&provided) == MPI_SUCCESS);
  }
  if (provided < MPI_THREAD_FUNNELED)
    fail("MPI provides thread level ", provided, " but tetrad needs MPI_THREAD_FUNNELED (",
         MPI_THREAD_FUNNELED, "): OpenMP threads run while the main thread calls MPI");
  // MPI_COMM_WORLD keeps its default handler (errors are fatal) for these two queries: they
  // cannot fail on an initialised world.
  TETRAD_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_) == MPI_SUCCESS);
  TETRAD_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_) == MPI_SUCCESS);
}

MpiEnvironment::~MpiEnvironment() {
  if (!owns_) return;
  int finalized = 0;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  const int rc = MPI_Finalize();
  if (rc != MPI_SUCCESS)
    std::fprintf(stderr, "tetrad: rank %d: MPI_Finalize failed: %s\n", rank_,
                 mpi_error_string(rc).c_str());
}

bool MpiEnvironment::is_initialized() {
  int initialized = 0, finalized = 0;
  TETRAD_CHECK(MPI_Initialized(&initialized) == MPI_SUCCESS);
  TETRAD_CHECK(MPI_Finalized(&finalized) == MPI_SUCCESS);
  return initialized && !finalized;
}

void MpiEnvironment::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (is_initialized()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this covers the serial case
}

}  // namespace tetrad::comm
