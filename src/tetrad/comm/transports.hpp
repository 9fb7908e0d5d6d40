// The transports of the model's process groups (train.comm): the one file that knows every
// communicator implementation compiled in and the rules for choosing one, as backend/registry.cpp
// knows every backend. MPI is always there (host memory; device buffers staged through it); NCCL
// only in a build with it (TETRAD_HAVE_NCCL: no other file above comm/ tests that macro). The
// trainer's own groups stay on MPI whatever is chosen here (the values it reduces live in host
// memory); this is the choice for the model's.
#pragma once
#include <string>
#include <vector>

#include "tetrad/comm/communicator.hpp"

namespace tetrad::comm {

// One entry per transport this build knows. available: compiled in (why_not says why not).
// device_memory_only: moves device memory only (needs a GPU device). pipeline: runs the
// pipeline's tagged point-to-point messages (NCCL matches them in posting order, not by tag).
struct TransportInfo {
  std::string name;  // "mpi" | "nccl"
  bool available = false;
  std::string why_not;
  bool device_memory_only = false;
  bool pipeline = true;
};
std::vector<TransportInfo> transports();

// train.comm = "auto" | "mpi" | "nccl" checked before a run starts, on the device it names
// (train.device) and, where known, the grid's pipeline stages (0: not known yet, grid auto; the
// trainer checks again once the grid is chosen). Throws Error saying why and what to use instead:
// an unknown setting, NCCL without a cuda device, in a build without it, or with a pipeline axis.
void check_transport(const std::string& setting, const std::string& device, int pipeline_stages);

// What train.comm resolves to for this job: name "mpi" | "nccl" and why, for the log
// ("train.comm = auto: one rank"). "auto" is NCCL where the device is cuda, the build has NCCL,
// there is more than one rank, no pipeline axis and no two ranks share a GPU; MPI otherwise.
// Collective over `world` (MPI) when it has to ask whether ranks share a GPU; every rank gets
// the same answer. Calls check_transport first.
struct TransportChoice {
  std::string name;
  std::string why;
};
TransportChoice choose_transport(const std::string& setting, const std::string& device,
                                 int pipeline_stages, const Communicator& world);

// Collective over `group` (MPI): a communicator of transport `name` over the same ranks in the
// same order, named `label` ("nccl": the current CUDA device is this rank's). Throws Error for a
// transport this build lacks.
Communicator transport_communicator(const std::string& name, const Communicator& group,
                                    const std::string& label);
// The transport's library version for logs ("2.28.3"; "" where it has none to give).
std::string transport_version(const std::string& name);

}  // namespace tetrad::comm
