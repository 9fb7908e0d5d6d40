// The parts of comm/ that need no MPI: Communicator::self(), the collective timeout setting and
// the transport rules (comm/transports.hpp).
// (Everything else runs under mpirun: tests/mpi/test_comm_mpi.cpp.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tetrad/comm/communicator.hpp"
#include "tetrad/comm/transports.hpp"
#include "tetrad/core/error.hpp"

using namespace tetrad;

namespace {
bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }
}  // namespace

// Runs first (declaration order), before any set_collective_timeout. CTest also runs it with
// TETRAD_COMM_TIMEOUT=7.5 and =soon (CommTimeoutEnv.*).
TEST(Comm, CollectiveTimeoutDefaultsTo300SecondsOrTheEnvironment) {
  const char* env = std::getenv("TETRAD_COMM_TIMEOUT");
  if (env == nullptr || *env == '\0') {
    EXPECT_EQ(comm::collective_timeout(), 300.0);
  } else if (std::string(env) == "soon") {
    try {
      comm::collective_timeout();
      FAIL() << "TETRAD_COMM_TIMEOUT=soon was accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "TETRAD_COMM_TIMEOUT=\"soon\": expected a positive number of seconds"))
          << e.what();
    }
    comm::set_collective_timeout(4);  // an explicit setting does not need the environment
    EXPECT_EQ(comm::collective_timeout(), 4.0);
  } else {
    EXPECT_EQ(comm::collective_timeout(), std::strtod(env, nullptr));
  }
}

TEST(Comm, SelfCommunicatorCollectivesAreLocal) {
  comm::Communicator self = comm::Communicator::self("serial");
  float v[3] = {1, 2, 3};
  self.allreduce_sum(v, 3);
  self.allreduce_max(v, 3);
  EXPECT_EQ(v[2], 3.0f);
  double src[2] = {4, 5}, dst[2] = {0, 0};
  self.allgather(src, dst, 2);
  EXPECT_EQ(dst[1], 5.0);
  int64_t a[2] = {7, 8}, b[2] = {0, 0};
  self.reduce_scatter_sum(a, b, 2);
  EXPECT_EQ(b[0], 7);
  self.broadcast(a, 2, 0);
  self.barrier();
  comm::Request r = self.iallreduce_sum(v, 3);
  EXPECT_TRUE(r.test());
  EXPECT_FALSE(r.pending());
  r.wait(0.0);
  try {
    self.send(v, 3, 0, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "'serial'")) << e.what();
  }
  // A move carries the group over to the new name.
  comm::Communicator moved = std::move(self);
  EXPECT_EQ(moved.name(), "serial");
  EXPECT_EQ(moved.size(), 1);
}

TEST(Comm, CollectiveTimeoutCanBeSet) {
  const double before = comm::collective_timeout();
  EXPECT_GT(before, 0);
  comm::set_collective_timeout(12.5);
  EXPECT_EQ(comm::collective_timeout(), 12.5);
  EXPECT_THROW(comm::set_collective_timeout(0), Error);
  EXPECT_THROW(comm::set_collective_timeout(-1), Error);
  comm::set_collective_timeout(before);
}

// train.comm's rules in one place (comm/transports.hpp): what config validation and the trainer
// refuse, and what "auto" picks and says, on one rank without MPI.
TEST(Transports, RefusalsAndTheAutoChoiceAreOneRule) {
  bool mpi = false, nccl_known = false;
  for (const comm::TransportInfo& t : comm::transports()) {
    if (t.name == "mpi") mpi = t.available && t.pipeline;
    if (t.name == "nccl") nccl_known = t.device_memory_only && !t.pipeline;
  }
  EXPECT_TRUE(mpi);
  EXPECT_TRUE(nccl_known);
  auto refusal = [](const std::string& setting, const std::string& device, int stages) {
    try {
      comm::check_transport(setting, device, stages);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_TRUE(contains(refusal("bogus", "cpu", 0), "expected \"auto\", \"mpi\" or \"nccl\""));
  EXPECT_TRUE(contains(refusal("nccl", "cpu", 0),
                       "train.comm = \"nccl\" needs train.device = \"cuda\" (NCCL moves GPU "
                       "memory), but train.device = \"cpu\""));
  if (TETRAD_HAVE_NCCL) {
    EXPECT_EQ(refusal("nccl", "cuda", 0), "");
    EXPECT_TRUE(contains(refusal("nccl", "cuda:1", 2), "with a pipeline axis"));
  } else {
    EXPECT_TRUE(contains(refusal("nccl", "cuda", 0), "this build has no NCCL"));
  }
  EXPECT_EQ(refusal("mpi", "cuda", 4), "");
  EXPECT_EQ(refusal("auto", "cuda", 4), "");

  const comm::Communicator self = comm::Communicator::self("world");
  comm::TransportChoice c = comm::choose_transport("auto", "cpu", 1, self);
  EXPECT_EQ(c.name, "mpi");
  EXPECT_EQ(c.why, "train.comm = auto: train.device = cpu");
  c = comm::choose_transport("auto", "cuda", 1, self);
  EXPECT_EQ(c.name, "mpi");
  EXPECT_EQ(c.why, TETRAD_HAVE_NCCL ? "train.comm = auto: one rank"
                                    : "train.comm = auto: this build has no NCCL");
  c = comm::choose_transport("mpi", "cuda", 2, self);
  EXPECT_EQ(c.name, "mpi");
  EXPECT_EQ(c.why, "train.comm = mpi");
  EXPECT_THROW(comm::choose_transport("nccl", "cpu-strict", 1, self), Error);
}
