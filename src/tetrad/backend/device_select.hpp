// Which GPU a rank uses: one rank per GPU, the node-local rank choosing the device. Host logic
// only (no device runtime), so it is compiled and tested in every build.
#pragma once
#include <string>

namespace tetrad::backend {

// The node-local rank from the launcher's environment, first found of OMPI_COMM_WORLD_LOCAL_RANK
// (Open MPI), SLURM_LOCALID (srun), MPI_LOCALRANKID (MPICH, Intel MPI), LOCAL_RANK (torchrun
// style); 0 when none is set. A value that is not a non-negative integer throws Error naming the
// variable and its value. *source (when given) gets the variable's name or "none".
int local_rank_from_environment(std::string* source = nullptr);

// The device of a rank: local_rank % device_count (ranks_per_node > device_count then shares
// GPUs, which only the MPI communicator allows; NCCL refuses two ranks on one GPU).
// device_count <= 0 throws Error.
int device_for_local_rank(int local_rank, int device_count);

// Parses "cuda" (-1: choose by local rank) or "cuda:N" (N >= 0); anything else throws Error
// naming the accepted forms.
int parse_device_index(const std::string& name, const std::string& family);

}  // namespace tetrad::backend
