// A per-rank watchdog for stalled training steps: a background thread that ends the job when the
// current phase (a training step, a validation pass, a checkpoint) runs longer than the timeout.
//
// Collectives already time out on their own (comm::collective_timeout(), naming the operation
// and group); the watchdog covers what they cannot: a rank stuck outside MPI (a hung kernel, a
// blocked file system, a deadlock) whose peers would otherwise wait in their next collective
// until its timeout, without knowing who stalled. The stalled rank itself reports, naming its
// rank, the step and the phase, then ends the whole job with MPI_Abort (called from the watchdog
// thread: the main thread is stuck, and Open MPI's abort does not need it).
//
// Not thread-safe beyond its contract: arm/disarm from one thread (the training loop).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace tetrad {

class Watchdog {
 public:
  // timeout_s <= 0: disabled (no thread). rank: named in the report.
  Watchdog(double timeout_s, int rank);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts (or restarts) the clock for `phase` of step `step` ("forward/backward", ...).
  void arm(int64_t step, const char* phase);
  void disarm();
  bool enabled() const { return timeout_ > 0; }

 private:
  void run();
  double timeout_;
  int rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, armed_ = false;
  int64_t step_ = 0;
  const char* phase_ = "";
  double deadline_ = 0;
  std::thread thread_;
};

}  // namespace tetrad
