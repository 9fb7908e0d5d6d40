// MpiEnvironment: the process's MPI lifetime as an RAII object (docs/parallel.md).
//
// Construct one at the top of main (or of a test main): it calls MPI_Init_thread asking for
// MPI_THREAD_SERIALIZED (OpenMP threads compute; the main thread calls MPI, and the progress
// thread of parallel/comm_schedule.hpp may call it while the main thread does not), requiring at
// least MPI_THREAD_FUNNELED, unless MPI is
// already initialised, and its destructor calls MPI_Finalize only if this object initialised MPI.
// So a library, a test and main can each make one without double initialisation.
//
// What this does not do: pick a grid or make communicators (comm/communicator.hpp,
// parallel/process_groups.hpp), or set error handlers on MPI_COMM_WORLD (each Communicator sets
// MPI_ERRORS_RETURN on its own duplicate).
//
// Failures: MPI_Init_thread failing, or MPI providing less than MPI_THREAD_FUNNELED, throws
// tetrad::Error. The destructor never throws; a failing MPI_Finalize is reported on stderr.
// Not thread-safe: construct and destroy on the main thread.
#pragma once

namespace tetrad::comm {

class MpiEnvironment {
 public:
  MpiEnvironment();                       // MPI_Init_thread(nullptr, nullptr, ...)
  MpiEnvironment(int* argc, char*** argv);  // passes main's arguments on to MPI
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int rank() const { return rank_; }  // in MPI_COMM_WORLD
  int size() const { return size_; }
  bool owns_mpi() const { return owns_; }  // this object initialised MPI and will finalise it

  // MPI_Init has been called and MPI_Finalize has not.
  static bool is_initialized();

  // Ends the whole job: MPI_Abort(MPI_COMM_WORLD, code) when MPI is initialised, else
  // std::_Exit(code). For a rank that caught an error its peers cannot know about (they would
  // otherwise wait for it until their collective timeout).
  [[noreturn]] static void abort(int code);

 private:
  bool owns_ = false;
  int rank_ = 0, size_ = 1;
};

}  // namespace tetrad::comm
