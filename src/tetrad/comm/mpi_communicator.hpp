// The MPI implementation of the communication interface (comm/communicator.hpp): host buffers,
// non-blocking MPI collectives, completion by MPI_Test. The first implementation; CPU runs and
// GPU runs without NCCL (staged through host memory) use it.
//
// Every communicator has MPI_ERRORS_RETURN set on its own duplicate or split of MPI_COMM_WORLD;
// every MPI return code is checked. Communicator::world() makes the root of a job's groups;
// everything else comes from its dup() and split().
//
// What this does not do: MPI_THREAD_MULTIPLE, counts above INT_MAX per rank (an Error).
#pragma once
// The C API only: no deprecated C++ bindings (Open MPI's mpicxx.h, MPICH's equivalent).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string>

#include "tetrad/comm/communicator.hpp"

namespace tetrad::comm {

// A duplicate of `comm` (which stays the caller's) named `name`. Collective over `comm`.
Communicator mpi_duplicate(MPI_Comm comm, std::string name);
// The MPI_Comm behind `c`: MPI_COMM_NULL for self() and for a communicator of another transport.
MPI_Comm mpi_native(const Communicator& c);

}  // namespace tetrad::comm
