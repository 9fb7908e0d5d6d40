#include "tetrad/comm/transports.hpp"

#include "tetrad/core/error.hpp"
#if TETRAD_HAVE_NCCL
#include "tetrad/comm/nccl_communicator.hpp"
#endif

namespace tetrad::comm {

namespace {

constexpr bool kHaveNccl = TETRAD_HAVE_NCCL;

bool is_cuda(const std::string& device) { return device.rfind("cuda", 0) == 0; }

}  // namespace

std::vector<TransportInfo> transports() {
  std::vector<TransportInfo> list;
  list.push_back({"mpi", true, "", false, true});
  list.push_back({"nccl", kHaveNccl,
                  kHaveNccl ? "" : "this build has no NCCL (configure with -DTETRAD_CUDA=ON "
                                   "-DTETRAD_NCCL=ON where CUDA and NCCL are installed)",
                  true, false});
  return list;
}

void check_transport(const std::string& setting, const std::string& device, int pipeline_stages) {
  if (setting != "auto" && setting != "mpi" && setting != "nccl")
    fail("train.comm = \"", setting, "\": expected \"auto\", \"mpi\" or \"nccl\"");
  if (setting != "nccl") return;
  // Refused, never ignored: NCCL moves GPU memory only, and only a build with it has it.
  if (!is_cuda(device))
    fail("train.comm = \"nccl\" needs train.device = \"cuda\" (NCCL moves GPU memory), but "
         "train.device = \"", device, "\"; use train.comm = \"mpi\" or \"auto\"");
  if (!kHaveNccl)
    fail("train.comm = \"nccl\": this build has no NCCL (configure with -DTETRAD_CUDA=ON "
         "-DTETRAD_NCCL=ON where CUDA and NCCL are installed); use train.comm = \"mpi\" or "
         "\"auto\"");
  if (pipeline_stages > 1)
    fail("train.comm = \"nccl\" with a pipeline axis (", pipeline_stages, " stages): the "
         "pipeline's point-to-point messages are not run on NCCL yet (NCCL matches them in "
         "posting order, and the schedules assume MPI's tags); use train.comm = \"mpi\" or "
         "\"auto\"");
}

TransportChoice choose_transport(const std::string& setting, const std::string& device,
                                 int pipeline_stages, const Communicator& world) {
  check_transport(setting, device, pipeline_stages);
  TransportChoice c{setting == "nccl" ? "nccl" : "mpi", "train.comm = " + setting};
  if (setting != "auto") return c;
  if (!is_cuda(device)) c.why += ": train.device = " + device;
  else if (!kHaveNccl) c.why += ": this build has no NCCL";
  else if (world.size() == 1) c.why += ": one rank";
  else if (pipeline_stages > 1) c.why += ": the pipeline's point-to-point runs on MPI";
  else {
#if TETRAD_HAVE_NCCL
    // NCCL refuses two ranks on one GPU (e.g. a 2-rank grid on one device): stay on MPI.
    // Collective, and every rank gets the same answer.
    const std::string shared = ranks_sharing_a_gpu(world);
    if (shared.empty()) c.name = "nccl";
    else c.why += ": " + shared;
#endif
  }
  return c;
}

Communicator transport_communicator(const std::string& name, const Communicator& group,
                                    const std::string& label) {
  if (name == "mpi") return group.dup(label);
  if (name == "nccl") {
#if TETRAD_HAVE_NCCL
    return nccl_communicator(group, label);
#else
    fail("NCCL process groups (train.comm = nccl): this build has no NCCL (configure with "
         "-DTETRAD_CUDA=ON -DTETRAD_NCCL=ON where CUDA and NCCL are installed)");
#endif
  }
  fail("unknown transport \"", name, "\"; this build has: mpi", kHaveNccl ? ", nccl" : "");
}

std::string transport_version(const std::string& name) {
#if TETRAD_HAVE_NCCL
  if (name == "nccl") return nccl_version();
#endif
  (void)name;
  return "";
}

}  // namespace tetrad::comm
