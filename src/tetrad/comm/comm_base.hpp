// What every communication module shares (comm/communicator.hpp, comm/comm_impl.hpp and the
// implementations): the element types, reduction ops and buffer spaces of the interface, the
// process-wide collective timeout and failure state, what the main thread is blocked on (for the
// watchdog), and the host-driven progress of the MPI implementation.
#pragma once
#include <chrono>
#include <concepts>
#include <memory>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tetrad::comm {

// The element types the collectives accept. uint16_t carries bf16 bit patterns (the bf16 weight
// copy's all-gathers move half the bytes of fp32): moved, never reduced (a sum or max over
// uint16_t throws, since integer arithmetic on bf16 bits would be silently wrong).
template <typename T>
concept Element = std::same_as<T, float> || std::same_as<T, double> ||
                  std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t> ||
                  std::same_as<T, std::uint64_t> || std::same_as<T, std::uint16_t>;

enum class DType : uint8_t { F32, F64, I32, I64, U64, U16 };
template <Element T> constexpr DType dtype_of() {
  if constexpr (std::same_as<T, float>) return DType::F32;
  else if constexpr (std::same_as<T, double>) return DType::F64;
  else if constexpr (std::same_as<T, std::int32_t>) return DType::I32;
  else if constexpr (std::same_as<T, std::int64_t>) return DType::I64;
  else if constexpr (std::same_as<T, std::uint16_t>) return DType::U16;
  else return DType::U64;
}
size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "float", "double", "int32", "int64", "uint64", "uint16"

enum class ReduceOp : uint8_t { Sum, Max };

// Where an implementation's buffers must live: host memory (MPI) or the current device's memory
// (NCCL). A GPU run over MPI stages device buffers through pinned host memory.
enum class BufferSpace : uint8_t { Host, Device };

// How a communicator that moves host memory (MPI) reaches device memory the host cannot read
// (a GPU's, or cpu-strict's): a GPU run without NCCL stages its buffers through host memory.
// Filled by the layer that knows the backend (parallel/device_staging.hpp), since comm/ and
// backend/ do not include each other. Copies are complete when they return; to_host is called
// after the operation's `after` event, to_device when the operation has completed, before
// Request::test() reports it (so a queue that waits for the request sees the data on the
// device). Thread-safe: called from whichever thread starts or completes an operation.
class DeviceStaging {
 public:
  virtual ~DeviceStaging() = default;
  virtual bool host_readable(const void* p) const = 0;
  virtual void to_host(void* host, const void* device, size_t bytes) = 0;
  virtual void to_device(void* device, const void* host, size_t bytes) = 0;
};

// Process-wide timeout (seconds) of blocking calls and of Request::wait(). Default 300 s, or the
// value of the environment variable TETRAD_COMM_TIMEOUT when set (an invalid value throws
// tetrad::Error from the first collective_timeout() call); set_collective_timeout() overrides
// both. Must be > 0 (infinity allowed: no timeout). Thread-safe.
// `setting`: what a user changes to set it (e.g. "train.comm_timeout"), named in timeout errors.
void set_collective_timeout(double seconds, const std::string& setting = "");
double collective_timeout();
// What sets it, for messages: the `setting` given to set_collective_timeout, else the
// environment variable (and the config key that sets it in training).
std::string collective_timeout_setting();
// True once a collective of this process timed out (Request::wait threw): the group's state is
// unknown and the job is ending, so a pending Request destroyed from then on (the unwinding of
// the error: prefetched all-gathers, queued reductions) is not waited for again (each would wait a
// whole timeout) but tested once and leaked: the job ends within about one timeout however many
// requests are pending. wait() itself keeps its timeout (a timed-out request may be waited out
// later). clear_collective_failure(): for a caller that provoked a timeout on purpose and goes on
// (tests).
bool collective_failed();
void clear_collective_failure();

// What this process is blocked on right now, for a watchdog on another thread: true while the
// main thread waits in Request::wait past its first quick polls, with the operation's description
// ("allreduce_sum of 2 double on group 'world'") and the seconds waited so far. Thread-safe.
bool blocked_in_wait(std::string* what, double* seconds);

// This process's rank in the job (MPI_COMM_WORLD), for messages; -1 when MPI is not running.
int job_rank();

// Host-driven progress (the MPI implementation: Open MPI moves a non-blocking collective forward
// only inside MPI calls). host_progress_available(): a helper thread may drive it while the main
// thread computes (MPI initialised with at least MPI_THREAD_SERIALIZED). drive_host_progress():
// one call into the progress engine (an MPI_Iprobe); the caller keeps it apart from the main
// thread's MPI calls (parallel/comm_schedule.cpp's ProgressScope). Implementations that progress
// on their own (NCCL, on the device) need neither: Request::needs_host_progress() says which.
bool host_progress_available();
void drive_host_progress();

// Marks this process's collective state failed (a collective timed out: PendingOp::wait).
void mark_collective_failed();

// Publishes a slow wait for blocked_in_wait() while it lasts (PendingOp::wait).
struct BlockedMark {
  bool set = false;
  void mark(const std::string& what, std::chrono::steady_clock::time_point since);
  ~BlockedMark();
};

}  // namespace tetrad::comm
