// What every communication module shares (comm_base.hpp).
#include "tetrad/comm/comm_base.hpp"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "tetrad/core/error.hpp"

namespace tetrad::comm {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U64: return 8;
    case DType::U16: return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float";
    case DType::F64: return "double";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U64: return "uint64";
    case DType::U16: return "uint16";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Timeout setting

namespace {
std::atomic<double> g_timeout_set{0.0};  // > 0 once set_collective_timeout was called
std::mutex g_timeout_source_mu;
std::string g_timeout_source;  // the setting a user changes ("train.comm_timeout"), "" if none
// Set once a collective timed out: the job is ending (the group's state is unknown), so the
// requests still pending are not waited for again while the error unwinds; each would otherwise
// wait a whole timeout (a step with several prefetched all-gathers pending held the job many
// timeouts long).
std::atomic<bool> g_comm_failed{false};

double timeout_from_environment() {
  static const double value = [] {
    const char* text = std::getenv("TETRAD_COMM_TIMEOUT");
    if (text == nullptr || *text == '\0') return 300.0;
    char* end = nullptr;
    const double v = std::strtod(text, &end);
    if (end == text || *end != '\0' || !(v > 0))
      fail("TETRAD_COMM_TIMEOUT=\"", text, "\": expected a positive number of seconds");
    return v;
  }();
  return value;
}
}  // namespace

void set_collective_timeout(double seconds, const std::string& setting) {
  if (!(seconds > 0))
    fail("collective timeout: expected a positive number of seconds, got ", seconds);
  g_timeout_set.store(seconds);
  std::lock_guard<std::mutex> lock(g_timeout_source_mu);
  g_timeout_source = setting;
}

std::string collective_timeout_setting() {
  std::lock_guard<std::mutex> lock(g_timeout_source_mu);
  if (!g_timeout_source.empty()) return g_timeout_source;
  return std::string("the environment variable TETRAD_COMM_TIMEOUT (train.comm_timeout in a training config)");
}

bool collective_failed() { return g_comm_failed.load(); }
void clear_collective_failure() { g_comm_failed.store(false); }
void mark_collective_failed() { g_comm_failed.store(true); }

double collective_timeout() {
  const double set = g_timeout_set.load();
  return set > 0 ? set : timeout_from_environment();
}

// ---------------------------------------------------------------------------------------------
// What this process is blocked on (for the watchdog)

namespace {
std::mutex g_blocked_mu;
std::string g_blocked_what;  // "" when not blocked
std::chrono::steady_clock::time_point g_blocked_since;

}  // namespace

void BlockedMark::mark(const std::string& what, std::chrono::steady_clock::time_point since) {
  std::lock_guard<std::mutex> lock(g_blocked_mu);
  g_blocked_what = what;
  g_blocked_since = since;
  set = true;
}

BlockedMark::~BlockedMark() {
  if (!set) return;
  std::lock_guard<std::mutex> lock(g_blocked_mu);
  g_blocked_what.clear();
}

bool blocked_in_wait(std::string* what, double* seconds) {
  std::lock_guard<std::mutex> lock(g_blocked_mu);
  if (g_blocked_what.empty()) return false;
  if (what) *what = g_blocked_what;
  if (seconds)
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - g_blocked_since).count();
  return true;
}

}  // namespace tetrad::comm
