// Communication conformance: one suite, written once against the communication interface
// (comm/communicator.hpp), run against every communicator implementation this build has, under
// mpirun with 2, 4 and 8 ranks (CTest: CommConformance.n2, .n4, .n8). It is the suite a new
// implementation must pass, as the backend conformance suite is for a backend's ops.
//
// Implementations: "mpi" always; "nccl" where the build has NCCL (TETRAD_HAVE_NCCL), which needs
// one GPU per rank and SKIPs with the reason elsewhere (never counted as a pass).
//
// What each implementation must do:
// - every collective (all-reduce sum and max, all-gather, in place too, reduce-scatter, broadcast
//   from every root, point-to-point around a ring, barrier) equal a serial reference that every
//   rank computes from the inputs of all ranks (regenerated from their seeds): integer-valued data
//   exactly, for every element type; random real data in float within the rounding of a sum of
//   S terms and exactly for max, gather and broadcast; on the world and on split sub-groups;
//   outputs poisoned before each call (NaN / a sentinel), so an untouched output cannot pass;
// - asynchronous handles: several requests pending on several groups at once, completed in
//   reverse order; a large all-reduce completed by polling test() between compute chunks;
//   the completion as an Event (event().synchronize(), query()); an operation given an `after`
//   event does not read its input before that event completes;
// - bounded failure: a collective that a peer never joins fails its wait within the timeout with a
//   message naming the rank, the transport, the operation, group and count, the time waited and
//   the setting that sets the timeout; while it waits, blocked_in_wait() tells a watchdog thread
//   what it waits for; afterwards collective_failed() holds; a receive nobody answers fails the
//   same way;
// - bad arguments (a root or peer outside the group) are refused with an Error naming them.
//
// Harness: its own main (MpiEnvironment + GoogleTest); after each test the ranks agree on a
// communicator of their own whether any rank failed, so every rank reports it and mpirun exits
// non-zero.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/comm/communicator.hpp"
#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/event.hpp"

#if TETRAD_HAVE_NCCL
#include "tetrad/backend/device_select.hpp"
#include "tetrad/backend/cuda/gpu_api.hpp"
#include "tetrad/comm/nccl_communicator.hpp"
#endif

using namespace tetrad;
using comm::Communicator;
using comm::Request;

namespace {

const Communicator* g_world = nullptr;  // MPI world of the tests
const Communicator* g_sync = nullptr;   // the harness's own, for agreeing on results

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// ---- the implementations this build has ---------------------------------------------------------

struct Implementation {
  std::string name;
  // A communicator of every rank of `world`, or nullopt with *why_not set (the same on every rank).
  std::function<std::optional<Communicator>(const Communicator& world, std::string* why_not)> make;
};

std::vector<Implementation> implementations() {
  std::vector<Implementation> v;
  v.push_back({"mpi", [](const Communicator& world, std::string*) -> std::optional<Communicator> {
                 return world.dup("conf");
               }});
#if TETRAD_HAVE_NCCL
  v.push_back({"nccl", [](const Communicator& world, std::string* why) -> std::optional<Communicator> {
                 std::string reason;
                 const int ndev = gpu::device_count(&reason);
                 int neg = -ndev;  // the fewest devices of any rank: the max of the negated counts
                 world.allreduce_max(&neg, 1);
                 const int fewest = -neg;
                 if (fewest <= 0) {
                   *why = "no CUDA device on some rank" + (reason.empty() ? "" : " (" + reason + ")");
                   return std::nullopt;
                 }
                 // NCCL needs one GPU per rank; the ranks of one node share its devices.
                 const int local = backend::local_rank_from_environment();
                 int need = local + 1;
                 world.allreduce_max(&need, 1);
                 if (need > fewest) {
                   *why = "NCCL needs one GPU per rank: " + std::to_string(need) +
                          " ranks on a node, " + std::to_string(fewest) + " GPU(s)";
                   return std::nullopt;
                 }
                 GPU_CHECK(gpu::gpuSetDevice(backend::device_for_local_rank(local, ndev)));
                 return comm::nccl_communicator(world, "conf");
               }});
#endif
  return v;
}

// ---- buffers where the communicator wants them -----------------------------------------------

// Host memory for a host communicator; device memory of a backend for a device one (the CUDA
// backend for NCCL). upload/download copy whole buffers.
class Space {
 public:
  explicit Space(const Communicator& c) {
    if (c.buffer_space() == comm::BufferSpace::Device) device_ = backend::create("cuda");
  }
  struct Buf {
    std::vector<unsigned char> host;  // host space
    backend::DeviceBuffer dev;        // device space
    void* ptr = nullptr;
  };
  template <typename T> Buf make(const std::vector<T>& init) {
    Buf b;
    const size_t bytes = init.size() * sizeof(T);
    if (!device_) {
      b.host.resize(bytes + 1);
      if (bytes) std::memcpy(b.host.data(), init.data(), bytes);
      b.ptr = b.host.data();
    } else {
      b.dev = device_->alloc(bytes + 1);
      device_->queue().copy_to_device(b.dev.data(), init.data(), bytes);
      device_->queue().synchronize();
      b.ptr = b.dev.data();
    }
    return b;
  }
  template <typename T> void write(Buf& b, const std::vector<T>& v) {
    if (!device_) {
      if (!v.empty()) std::memcpy(b.ptr, v.data(), v.size() * sizeof(T));
    } else {
      device_->queue().copy_to_device(b.ptr, v.data(), v.size() * sizeof(T));
      device_->queue().synchronize();
    }
  }
  template <typename T> std::vector<T> read(const Buf& b, size_t n) {
    std::vector<T> out(n);
    if (!device_) {
      if (n) std::memcpy(out.data(), b.ptr, n * sizeof(T));
    } else {
      device_->queue().copy_to_host(out.data(), b.ptr, n * sizeof(T));
      device_->queue().synchronize();
    }
    return out;
  }

 private:
  std::unique_ptr<backend::Backend> device_;
};

// ---- data ------------------------------------------------------------------------------------

// Deterministic per (rank, salt, i): every rank can regenerate every other rank's input.
uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}
// Integer-valued in [-500, 500) (exact in every type's sums), or non-negative for unsigned.
template <typename T> T int_input(int rank, long salt, size_t i) {
  const uint64_t h = mix(uint64_t(rank) * 1000003 + uint64_t(salt) * 7919 + i);
  if constexpr (std::is_unsigned_v<T>) return T(h % 1000);
  return T(long(h % 1000) - 500);
}
// Random real in [-1, 1).
float real_input(int rank, long salt, size_t i) {
  const uint64_t h = mix(uint64_t(rank) * 1000003 + uint64_t(salt) * 7919 + i + 0x9e3779b9ULL);
  return float(double(h >> 11) / double(1ULL << 53) * 2.0 - 1.0);
}
template <typename T> T poison() {
  if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::quiet_NaN();
  return T(0x5a5a5a5a);  // not a value int_input makes for n < 2^20
}
template <typename T> bool same(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) return std::memcmp(&a, &b, sizeof(T)) == 0;
  return a == b;
}

// ---- the fixture -----------------------------------------------------------------------------

class CommConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    for (const Implementation& im : implementations())
      if (im.name == GetParam()) {
        std::string why;
        comm_ = im.make(*g_world, &why);
        if (!comm_) GTEST_SKIP() << "communicator '" << GetParam() << "' cannot run here: " << why;
        space_.emplace(*comm_);
        return;
      }
    FAIL() << "no implementation named " << GetParam();
  }
  void TearDown() override {
    const int mine = HasFailure() ? 1 : 0;
    std::vector<int> all(g_sync->size());
    try {
      g_sync->allgather(&mine, all.data(), 1);
    } catch (const Error& e) {
      std::fprintf(stderr, "[rank %d] the ranks could not agree on the test result (%s); aborting\n",
                   g_sync->rank(), e.what());
      comm::MpiEnvironment::abort(1);
    }
    std::string failed;
    for (size_t r = 0; r < all.size(); ++r)
      if (all[r] && static_cast<int>(r) != g_sync->rank()) failed += " " + std::to_string(r);
    if (!failed.empty()) ADD_FAILURE() << "the test failed on rank(s)" << failed;
  }
  const Communicator& c() const { return *comm_; }
  Space& space() { return *space_; }

  // Every collective on `g` with integer data of type T, n elements per rank, against the serial
  // reference; blocking and non-blocking forms.
  template <typename T> void check_exact(const Communicator& g, long salt, size_t n);
  void check_real(const Communicator& g, long salt, size_t n);

  std::optional<Communicator> comm_;
  std::optional<Space> space_;
};

template <typename T> void CommConformance::check_exact(const Communicator& g, long salt, size_t n) {
  SCOPED_TRACE("group '" + g.name() + "' size " + std::to_string(g.size()) + " n " +
               std::to_string(n) + " type " + comm::dtype_name(comm::dtype_of<T>()));
  const int S = g.size(), r = g.rank();
  auto input = [&](int rank, long s) {
    std::vector<T> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = int_input<T>(rank, s, i);
    return v;
  };
  for (int blocking = 0; blocking < 2; ++blocking) {
    SCOPED_TRACE(blocking ? "blocking" : "non-blocking");
    const long s = salt * 2 + blocking;
    // all-reduce sum and max (in place)
    for (int max = 0; max < 2; ++max) {
      auto b = space().make(input(r, s + 100 * max));
      if (blocking) max ? g.allreduce_max(static_cast<T*>(b.ptr), n) : g.allreduce_sum(static_cast<T*>(b.ptr), n);
      else {
        Request q = max ? g.iallreduce_max(static_cast<T*>(b.ptr), n) : g.iallreduce_sum(static_cast<T*>(b.ptr), n);
        q.wait();
        EXPECT_FALSE(q.pending());
      }
      const auto got = space().read<T>(b, n);
      std::vector<T> want = input(0, s + 100 * max);
      for (int k = 1; k < S; ++k) {
        const auto x = input(k, s + 100 * max);
        for (size_t i = 0; i < n; ++i) want[i] = max ? std::max(want[i], x[i]) : T(want[i] + x[i]);
      }
      for (size_t i = 0; i < n; ++i)
        ASSERT_TRUE(same(got[i], want[i])) << (max ? "allreduce_max" : "allreduce_sum") << " element " << i;
    }
    // all-gather, and in place
    {
      auto send = space().make(input(r, s + 200));
      auto recv = space().make(std::vector<T>(size_t(S) * n, poison<T>()));
      std::vector<T> inplace_init(size_t(S) * n, poison<T>());
      const auto mine = input(r, s + 200);
      std::copy(mine.begin(), mine.end(), inplace_init.begin() + std::ptrdiff_t(size_t(r) * n));
      auto inplace = space().make(inplace_init);
      T* ip = static_cast<T*>(inplace.ptr);
      if (blocking) {
        g.allgather(static_cast<const T*>(send.ptr), static_cast<T*>(recv.ptr), n);
        g.allgather(ip + size_t(r) * n, ip, n);
      } else {
        Request a = g.iallgather(static_cast<const T*>(send.ptr), static_cast<T*>(recv.ptr), n);
        Request b = g.iallgather(ip + size_t(r) * n, ip, n);
        b.wait();
        a.wait();
      }
      const auto got = space().read<T>(recv, size_t(S) * n);
      const auto got_ip = space().read<T>(inplace, size_t(S) * n);
      for (int k = 0; k < S; ++k) {
        const auto want = input(k, s + 200);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(same(got[size_t(k) * n + i], want[i])) << "allgather block " << k << " element " << i;
          ASSERT_TRUE(same(got_ip[size_t(k) * n + i], want[i])) << "in-place allgather block " << k << " element " << i;
        }
      }
    }
    // reduce-scatter: S blocks in, block r of the sum out
    {
      auto all_in = [&](int rank) {
        std::vector<T> v(size_t(S) * n);
        for (size_t i = 0; i < v.size(); ++i) v[i] = int_input<T>(rank, s + 300, i);
        return v;
      };
      auto send = space().make(all_in(r));
      auto recv = space().make(std::vector<T>(n, poison<T>()));
      if (blocking) g.reduce_scatter_sum(static_cast<const T*>(send.ptr), static_cast<T*>(recv.ptr), n);
      else g.ireduce_scatter_sum(static_cast<const T*>(send.ptr), static_cast<T*>(recv.ptr), n).wait();
      const auto got = space().read<T>(recv, n);
      std::vector<T> want(n, T(0));
      for (int k = 0; k < S; ++k) {
        const auto x = all_in(k);
        for (size_t i = 0; i < n; ++i) want[i] = T(want[i] + x[size_t(r) * n + i]);
      }
      for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same(got[i], want[i])) << "reduce_scatter_sum element " << i;
    }
    // broadcast from every root
    for (int root = 0; root < S; ++root) {
      auto b = space().make(r == root ? input(root, s + 400 + root) : std::vector<T>(n, poison<T>()));
      if (blocking) g.broadcast(static_cast<T*>(b.ptr), n, root);
      else g.ibroadcast(static_cast<T*>(b.ptr), n, root).wait();
      const auto got = space().read<T>(b, n);
      const auto want = input(root, s + 400 + root);
      for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same(got[i], want[i])) << "broadcast root " << root << " element " << i;
    }
    // point-to-point around the ring: send to r+1, receive from r-1 (even ranks send first, odd
    // ranks receive first, an order in which no implementation can deadlock)
    if (S > 1) {
      const int next = (r + 1) % S, prev = (r + S - 1) % S;
      auto out = space().make(input(r, s + 500));
      auto in = space().make(std::vector<T>(n, poison<T>()));
      const int tag = 40 + blocking;
      auto do_send = [&] {
        if (blocking) g.send(static_cast<const T*>(out.ptr), n, next, tag);
        else g.isend(static_cast<const T*>(out.ptr), n, next, tag).wait();
      };
      auto do_recv = [&] {
        if (blocking) g.recv(static_cast<T*>(in.ptr), n, prev, tag);
        else g.irecv(static_cast<T*>(in.ptr), n, prev, tag).wait();
      };
      if (r % 2 == 0) {
        do_send();
        do_recv();
      } else {
        do_recv();
        do_send();
      }
      const auto got = space().read<T>(in, n);
      const auto want = input(prev, s + 500);
      for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same(got[i], want[i])) << "recv from " << prev << " element " << i;
    }
    if (blocking) g.barrier();
    else g.ibarrier().wait();
  }
}

void CommConformance::check_real(const Communicator& g, long salt, size_t n) {
  SCOPED_TRACE("real data, group '" + g.name() + "' n " + std::to_string(n));
  const int S = g.size(), r = g.rank();
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = real_input(r, salt, i);
  // sum: within the rounding of S float terms of magnitude < 1 (any order of summation)
  {
    auto b = space().make(mine);
    g.iallreduce_sum(static_cast<float*>(b.ptr), n).wait();
    const auto got = space().read<float>(b, n);
    for (size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int k = 0; k < S; ++k) want += double(real_input(k, salt, i));
      ASSERT_FALSE(std::isnan(got[i])) << "element " << i;
      ASSERT_LE(std::fabs(double(got[i]) - want), 2.0 * S * 1.2e-7) << "allreduce_sum element " << i;
    }
  }
  // max: exact
  {
    auto b = space().make(mine);
    g.iallreduce_max(static_cast<float*>(b.ptr), n).wait();
    const auto got = space().read<float>(b, n);
    for (size_t i = 0; i < n; ++i) {
      float want = real_input(0, salt, i);
      for (int k = 1; k < S; ++k) want = std::max(want, real_input(k, salt, i));
      ASSERT_TRUE(same(got[i], want)) << "allreduce_max element " << i;
    }
  }
}

// ---- the tests -------------------------------------------------------------------------------

TEST_P(CommConformance, DescribesItself) {
  EXPECT_EQ(c().size(), g_world->size());
  EXPECT_EQ(c().rank(), g_world->rank());
  EXPECT_EQ(c().name(), "conf");
  EXPECT_FALSE(c().is_self());
  EXPECT_STREQ(c().transport(), GetParam() == "mpi" ? "MPI" : "NCCL");
}

TEST_P(CommConformance, EveryCollectiveMatchesTheSerialReferenceForEveryType) {
  long salt = 1;
  for (size_t n : {size_t(1), size_t(7), size_t(1000)}) {
    check_exact<float>(c(), salt++, n);
    check_exact<double>(c(), salt++, n);
    check_exact<std::int32_t>(c(), salt++, n);
    check_exact<std::int64_t>(c(), salt++, n);
    check_exact<std::uint64_t>(c(), salt++, n);
    ASSERT_FALSE(HasFatalFailure());
  }
  // A larger buffer: the libraries' segmented / pipelined paths.
  check_exact<float>(c(), salt++, 70000);
}

// uint16_t carries bf16 bit patterns (the bf16 weight copy's all-gathers): gathered and broadcast
// bit for bit (NaN and infinity patterns included), never reduced (a sum of the bits would be
// silently wrong, so reductions throw naming the type).
TEST_P(CommConformance, Bf16BitsAreGatheredAndBroadcastNotReduced) {
  const int S = c().size(), r = c().rank();
  for (size_t n : {size_t(1), size_t(7), size_t(5000)}) {
    auto input = [&](int rank) {
      std::vector<uint16_t> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = uint16_t(rank * 7919 + i * 31 + 1);
      v[0] = rank % 2 ? 0x7fc1 : 0xff80;  // a NaN, -infinity
      return v;
    };
    for (int blocking = 0; blocking < 2; ++blocking) {
      auto send = space().make(input(r));
      auto recv = space().make(std::vector<uint16_t>(size_t(S) * n, 0));
      if (blocking) {
        c().allgather(static_cast<const uint16_t*>(send.ptr), static_cast<uint16_t*>(recv.ptr), n);
      } else {
        Request q = c().iallgather(static_cast<const uint16_t*>(send.ptr), static_cast<uint16_t*>(recv.ptr), n);
        q.wait();
      }
      const auto got = space().read<uint16_t>(recv, size_t(S) * n);
      for (int k = 0; k < S; ++k) {
        const auto want = input(k);
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(got[size_t(k) * n + i], want[i]) << "allgather block " << k << " element " << i;
      }
    }
    auto b = space().make(r == 0 ? input(0) : std::vector<uint16_t>(n, 0));
    c().broadcast(static_cast<uint16_t*>(b.ptr), n, 0);
    const auto got = space().read<uint16_t>(b, n);
    const auto want = input(0);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << "broadcast element " << i;
  }
  uint16_t x[4] = {1, 2, 3, 4};
  try {
    c().allreduce_sum(x, 1);
    FAIL() << "a sum of uint16 bit patterns was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "uint16")) << e.what();
  }
  try {
    (void)c().ireduce_scatter_sum(x, x, 1);
    FAIL() << "a reduce-scatter of uint16 bit patterns was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "not reduced")) << e.what();
  }
}

TEST_P(CommConformance, RealDataWithinRounding) {
  check_real(c(), 11, 5);
  check_real(c(), 12, 100000);
}

// The variable all-to-all (the expert-parallel dispatch): rank r sends count(r, j) elements to
// rank j, 0 included, from blocks with gaps between them, into blocks laid out in reverse rank
// order with gaps; the counts exchanged first with unit counts, as the dispatch does. Outputs
// poisoned: every block must arrive and every gap stay untouched.
namespace {
template <typename T>
void check_alltoallv(const Communicator& g, Space& space, long salt, bool blocking) {
  SCOPED_TRACE("alltoallv on group '" + g.name() + "' size " + std::to_string(g.size()) +
               (blocking ? " blocking" : " non-blocking") + " type " +
               comm::dtype_name(comm::dtype_of<T>()));
  const size_t S = size_t(g.size()), r = size_t(g.rank());
  auto count = [&](size_t from, size_t to) { return size_t((from * 3 + to * 5 + size_t(salt)) % 4) * 3; };
  auto value = [&](size_t from, size_t to, size_t i) { return int_input<T>(int(from), salt + long(to), i); };
  // The counts: this rank's sends to every rank, received as every rank's send to this one.
  std::vector<size_t> ones(S, 1), iota(S), mine(S), theirs(S, 7777);
  for (size_t j = 0; j < S; ++j) iota[j] = j, mine[j] = count(r, j);
  auto cs = space.make(std::vector<uint64_t>(mine.begin(), mine.end()));
  auto cr = space.make(std::vector<uint64_t>(S, 7777));
  g.alltoallv(static_cast<const uint64_t*>(cs.ptr), ones, iota, static_cast<uint64_t*>(cr.ptr), ones, iota);
  const auto got_counts = space.read<uint64_t>(cr, S);
  for (size_t j = 0; j < S; ++j) {
    ASSERT_EQ(got_counts[j], count(j, r)) << "count from rank " << j;
    theirs[j] = size_t(got_counts[j]);
  }
  // Send blocks in rank order with a gap of 1 before each; receive blocks in reverse rank order,
  // a gap of 2 before each.
  std::vector<size_t> sd(S), rd(S);
  size_t send_n = 0, recv_n = 0;
  for (size_t j = 0; j < S; ++j) sd[j] = send_n + 1, send_n += 1 + mine[j];
  for (size_t k = S; k-- > 0;) rd[k] = recv_n + 2, recv_n += 2 + theirs[k];
  std::vector<T> in(send_n, poison<T>());
  for (size_t j = 0; j < S; ++j)
    for (size_t i = 0; i < mine[j]; ++i) in[sd[j] + i] = value(r, j, i);
  auto send = space.make(in);
  auto recv = space.make(std::vector<T>(recv_n, poison<T>()));
  if (blocking) {
    g.alltoallv(static_cast<const T*>(send.ptr), mine, sd, static_cast<T*>(recv.ptr), theirs, rd);
  } else {
    Request q = g.ialltoallv(static_cast<const T*>(send.ptr), mine, sd, static_cast<T*>(recv.ptr), theirs, rd);
    q.wait();
    EXPECT_FALSE(q.pending());
  }
  const auto got = space.read<T>(recv, recv_n);
  std::vector<char> covered(recv_n, 0);
  for (size_t k = 0; k < S; ++k)
    for (size_t i = 0; i < theirs[k]; ++i) {
      covered[rd[k] + i] = 1;
      ASSERT_TRUE(same(got[rd[k] + i], value(k, r, i))) << "block from rank " << k << " element " << i;
    }
  for (size_t i = 0; i < recv_n; ++i)
    if (!covered[i]) {
      ASSERT_TRUE(same(got[i], poison<T>())) << "gap element " << i << " was written";
    }
}
}  // namespace

TEST_P(CommConformance, AlltoallvMovesVariableBlocks) {
  for (int blocking = 0; blocking < 2; ++blocking) {
    check_alltoallv<float>(c(), space(), 3, blocking);
    check_alltoallv<std::int32_t>(c(), space(), 4, blocking);
    check_alltoallv<double>(c(), space(), 5, blocking);
    ASSERT_FALSE(HasFatalFailure());
  }
  const int r = c().rank(), S = c().size();
  const Communicator half = c().split(r % 2, (r % 2) ? S - r : r, "half");
  check_alltoallv<float>(half, space(), 6, false);
  // Every rank sends nothing: completes, touches nothing.
  const std::vector<size_t> zero(size_t(S), 0);
  float x = 1.0f, y = 2.0f;
  c().alltoallv(&x, zero, zero, &y, zero, zero);
  EXPECT_EQ(y, 2.0f);
  // The size-1 group copies its own block.
  const Communicator self = Communicator::self();
  float a[3] = {1, 2, 3}, b[4] = {0, 0, 0, 0};
  self.alltoallv(a, {2}, {1}, b, {2}, {2});
  EXPECT_EQ(b[1], 0.0f);
  EXPECT_EQ(b[2], 2.0f);
  EXPECT_EQ(b[3], 3.0f);
}

TEST_P(CommConformance, SubGroupsFromSplitAndDup) {
  const int r = c().rank(), S = c().size();
  // Even and odd ranks, the odd ones in reverse order; and a duplicate of the whole group.
  const Communicator half = c().split(r % 2, (r % 2) ? S - r : r, "half");
  const Communicator copy = c().dup("copy");
  EXPECT_STREQ(half.transport(), c().transport());
  EXPECT_EQ(half.size(), (S + 1 - r % 2) / 2);
  EXPECT_EQ(half.rank(), (r % 2) ? (half.size() - 1 - r / 2) : r / 2);
  EXPECT_EQ(copy.size(), S);
  EXPECT_EQ(copy.rank(), r);
  check_exact<float>(half, 21, 33);
  check_exact<std::int64_t>(copy, 22, 33);
}

TEST_P(CommConformance, RequestsOnSeveralGroupsCompleteInAnyOrder) {
  const int r = c().rank();
  const Communicator a = c().dup("a"), b = c().split(r % 2, r, "b"), d = c().dup("d");
  auto ba = space().make(std::vector<float>(64, 1.0f));
  auto bb = space().make(std::vector<float>(64, 2.0f));
  auto bd = space().make(std::vector<float>(64, 3.0f));
  Request ra = a.iallreduce_sum(static_cast<float*>(ba.ptr), 64);
  Request rb = b.iallreduce_sum(static_cast<float*>(bb.ptr), 64);
  Request rd = d.iallreduce_sum(static_cast<float*>(bd.ptr), 64);
  rd.wait();
  rb.wait();
  ra.wait();
  EXPECT_EQ(space().read<float>(ba, 64)[63], 1.0f * a.size());
  EXPECT_EQ(space().read<float>(bb, 64)[0], 2.0f * b.size());
  EXPECT_EQ(space().read<float>(bd, 64)[10], 3.0f * d.size());
}

TEST_P(CommConformance, RequestCompletesWhilePolledBetweenComputeChunks) {
  const size_t n = 1 << 18;
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = float((c().rank() + 1) * long(i % 1000));
  auto b = space().make(h);
  Request q = c().iallreduce_sum(static_cast<float*>(b.ptr), n);
  double acc = 0;
  long polls = 0;
  bool done = false;
  for (int chunk = 0; chunk < 4000 && !done; ++chunk) {
    for (int i = 0; i < 2000; ++i) acc += std::sqrt(double(i + chunk));
    ++polls;
    done = q.test();
  }
  q.wait(60.0);
  EXPECT_FALSE(q.pending());
  EXPECT_TRUE(q.test());
  EXPECT_GT(acc, 0);
  EXPECT_GT(polls, 0);
  const auto got = space().read<float>(b, n);
  const long S = c().size();
  for (size_t i : {size_t(0), size_t(1), size_t(999), size_t(12345), n - 1})
    ASSERT_EQ(got[i], float(S * (S + 1) / 2 * long(i % 1000))) << i;
}

TEST_P(CommConformance, CompletionIsAnEvent) {
  auto b = space().make(std::vector<double>(4096, 0.5));
  Request q = c().iallreduce_sum(static_cast<double*>(b.ptr), 4096);
  const Event e = q.event();
  e.synchronize();  // what a queue that cannot wait on the device does
  EXPECT_TRUE(e.query());
  EXPECT_TRUE(q.test());
  EXPECT_FALSE(q.pending());
  EXPECT_TRUE(q.event().query());  // a complete request's event is complete
  EXPECT_TRUE(Request().event().query());
  if (GetParam() == "nccl") {
    EXPECT_EQ(e.native().kind, NativeEvent::Kind::CudaEvent);
    EXPECT_FALSE(q.needs_host_progress());
  } else {
    EXPECT_TRUE(q.needs_host_progress());
  }
  EXPECT_EQ(space().read<double>(b, 4096)[4095], 0.5 * c().size());
}

// An event that is not complete until synchronized, and writes the input when it is: it stands
// for compute that produces the buffer. An operation must not read the buffer before it.
struct ProducerEvent final : Event::Impl {
  std::function<void()> produce;
  bool done = false;
  bool query() override { return done; }
  void synchronize() override {
    if (!done) produce();
    done = true;
  }
};

TEST_P(CommConformance, OperationStartsAfterItsEvent) {
  const size_t n = 1000;
  auto b = space().make(std::vector<float>(n, poison<float>()));
  auto producer = std::make_shared<ProducerEvent>();
  Space* sp = &space();
  const int r = c().rank();
  producer->produce = [sp, &b, n, r] { sp->write(b, std::vector<float>(n, float(r + 1))); };
  c().iallreduce_sum(static_cast<float*>(b.ptr), n, Event(producer)).wait();
  EXPECT_TRUE(producer->done);
  const long S = c().size();
  const auto got = space().read<float>(b, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], float(S * (S + 1) / 2)) << i;
}

TEST_P(CommConformance, BadArgumentsAreRefusedNamingThem) {
  float x = 0;
  try {
    (void)c().ibroadcast(&x, 1, c().size());
    FAIL() << "a root outside the group was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "root " + std::to_string(c().size()) + " is outside the group")) << e.what();
  }
  try {
    (void)c().isend(&x, 1, -1, 0);
    FAIL() << "a peer outside the group was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "peer -1 is outside the group")) << e.what();
  }
  // alltoallv with counts for another group size
  try {
    const std::vector<size_t> one(1, 0);
    c().alltoallv(&x, one, one, &x, one, one);
    FAIL() << "alltoallv with one count on a group of " << c().size() << " was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "expected " + std::to_string(c().size()) + " send counts")) << e.what();
  }
}

// Rank 0 enters a collective nobody else joins. Its wait must fail within the timeout, naming
// everything a user needs, tell a watchdog what it is blocked on meanwhile, and leave
// collective_failed() set. For an implementation whose timed-out collective stays pending (MPI),
// the others then join and the same request completes; one that aborts (NCCL) is over.
TEST_P(CommConformance, CollectiveNobodyJoinsTimesOutNamingEverything) {
  if (c().size() < 2) GTEST_SKIP() << "needs two ranks";
  const Communicator lonely = c().dup("lonely");
  auto b = space().make(std::vector<std::int32_t>(3, c().rank() + 1));
  const double before = comm::collective_timeout();
  if (c().rank() == 0) {
    comm::set_collective_timeout(0.6, "train.comm_timeout");
    Request q = lonely.iallreduce_sum(static_cast<std::int32_t*>(b.ptr), 3);
    std::atomic<bool> seen{false};
    std::string seen_what;
    std::thread watchdog([&] {
      for (int i = 0; i < 500 && !seen; ++i) {
        std::string what;
        double s = 0;
        if (comm::blocked_in_wait(&what, &s)) {
          seen_what = what;
          seen = true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    try {
      q.wait();
      ADD_FAILURE() << "the all-reduce completed without the other ranks";
    } catch (const Error& e) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string msg = e.what();
      const std::string transport = c().transport();
      EXPECT_TRUE(contains(msg, "rank 0: " + transport + " iallreduce_sum of 3 int32 on group 'lonely' (rank 0 of "))
          << msg;
      EXPECT_TRUE(contains(msg, "did not complete within 0.6 s (waited ")) << msg;
      EXPECT_TRUE(contains(msg, "The timeout is train.comm_timeout")) << msg;
      EXPECT_GE(waited, 0.6);
      EXPECT_LT(waited, 10.0);
    }
    watchdog.join();
    EXPECT_TRUE(seen) << "blocked_in_wait() never reported the wait";
    EXPECT_TRUE(contains(seen_what, "iallreduce_sum of 3 int32 on group 'lonely'")) << seen_what;
    EXPECT_TRUE(comm::collective_failed());
    comm::set_collective_timeout(before);
    if (q.pending()) {
      // Still pending (MPI): the peers join late and it completes after all.
      g_sync->barrier();
      q.wait(30.0);
      EXPECT_EQ(space().read<std::int32_t>(b, 3)[2], c().size() * (c().size() + 1) / 2);
    } else {
      g_sync->barrier();
    }
    comm::clear_collective_failure();  // provoked on purpose: the test goes on
  } else {
    g_sync->barrier();
    if (GetParam() == "mpi") lonely.allreduce_sum(static_cast<std::int32_t*>(b.ptr), 3);
  }
  g_sync->barrier();
}

TEST_P(CommConformance, ReceiveNobodyAnswersTimesOut) {
  if (c().size() < 2) GTEST_SKIP() << "needs two ranks";
  const Communicator side = c().dup("side");
  if (c().rank() == 0) {
    auto b = space().make(std::vector<float>(4, 0.0f));
    Request q = side.irecv(static_cast<float*>(b.ptr), 4, 1, 999);  // rank 1 never sends
    try {
      q.wait(0.5);
      ADD_FAILURE() << "the receive completed";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(contains(msg, std::string(c().transport()) + " irecv of 4 float from rank 1, tag 999 on group 'side'")) << msg;
      EXPECT_TRUE(contains(msg, "within 0.5 s")) << msg;
    }
    EXPECT_FALSE(q.pending());  // cancelled (MPI) or aborted (NCCL): over either way
    comm::clear_collective_failure();
  }
  g_sync->barrier();
}

std::vector<std::string> implementation_names() {
  std::vector<std::string> v;
  for (const Implementation& im : implementations()) v.push_back(im.name);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Impl, CommConformance, ::testing::ValuesIn(implementation_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Ranks other than 0 print only their failures, prefixed with their rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  comm::MpiEnvironment env(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  // A diverged test ends in a timeout error, not a hang.
  if (!std::getenv("TETRAD_COMM_TIMEOUT")) comm::set_collective_timeout(60);
  int rc = 1;
  {
    const Communicator world = Communicator::world("world");
    const Communicator sync = Communicator::world("test-sync");
    g_world = &world;
    g_sync = &sync;
    if (world.rank() != 0 && !std::getenv("TETRAD_TEST_ALL_RANKS")) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter(world.rank()));
    }
    rc = RUN_ALL_TESTS();
    g_world = nullptr;
    g_sync = nullptr;
  }
  return rc;
}
