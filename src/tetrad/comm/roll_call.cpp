// The roll call of a timed-out job (roll_call.hpp).
#include "tetrad/comm/roll_call.hpp"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "tetrad/core/error.hpp"

namespace tetrad::comm {

namespace {

std::atomic<MPI_Comm> g_comm{MPI_COMM_NULL};
std::atomic<double> g_grace{0};
bool g_held = false;
std::atomic<int64_t> g_step{0};
std::atomic<const char*> g_phase{""};
constexpr int kTag = 31;
constexpr int kAnswerBytes = 1024;

std::string activity() {
  const int64_t step = g_step.load();
  const char* phase = g_phase.load();
  if (step <= 0) return "before the first step";
  return detail::concat("at step ", step, *phase ? std::string(" (") + phase + ")" : std::string());
}

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", s);
  return text;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += detail::concat(" and ", ranks.size() - 8, " more");
  return s;
}

// A roll call asked for by another thread (the watchdog) and its verdict.
std::atomic<bool> g_requested{false};
std::mutex g_verdict_mu;
std::condition_variable g_verdict_cv;
bool g_verdict_ready = false;
std::string g_verdict;

}  // namespace

void enable_roll_call(double grace_s) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size <= 1 || g_comm.load() != MPI_COMM_NULL) return;
  MPI_Comm comm = MPI_COMM_NULL;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &comm) != MPI_SUCCESS) fail("enable_roll_call: MPI_Comm_dup failed");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);  // a dead peer is an answer, not an abort
  g_grace = grace_s;
  g_comm = comm;
}

bool roll_call_enabled() { return g_comm.load() != MPI_COMM_NULL; }

void set_activity(int64_t step, const char* phase) {
  g_step.store(step);
  g_phase.store(phase ? phase : "");
}

double roll_call_grace() { return g_comm.load() == MPI_COMM_NULL ? 0.0 : g_grace.load(); }

void request_roll_call() {
  if (g_comm.load() == MPI_COMM_NULL) return;
  {
    std::lock_guard<std::mutex> lock(g_verdict_mu);
    g_verdict_ready = false;
  }
  g_requested.store(true);
}

bool roll_call_requested() { return g_requested.load(std::memory_order_relaxed); }

void serve_roll_call(const std::string& operation, double waited_s, double frozen_s) {
  if (!g_requested.load(std::memory_order_relaxed) || !g_requested.exchange(false)) return;
  const std::string verdict = roll_call(operation, waited_s, frozen_s);
  {
    std::lock_guard<std::mutex> lock(g_verdict_mu);
    g_verdict = verdict;
    g_verdict_ready = true;
  }
  g_verdict_cv.notify_all();
}

bool roll_call_verdict(std::string* verdict, double timeout_s) {
  std::unique_lock<std::mutex> lock(g_verdict_mu);
  if (!g_verdict_cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                             [] { return g_verdict_ready; }))
    return false;
  if (verdict) *verdict = g_verdict;
  return true;
}

std::string roll_call(const std::string& operation, double waited_s, double frozen_s) {
  const MPI_Comm comm = g_comm.load();
  if (comm == MPI_COMM_NULL || g_held) return "";
  g_held = true;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // This process did not run for most of its wait: it is the one its peers waited for.
  if (frozen_s > 1.0 && frozen_s > 0.4 * waited_s)
    return detail::concat("rank ", rank, " stopped progressing: this rank did not run for ",
                          seconds(frozen_s), " s (stopped, e.g. by SIGSTOP, or not scheduled by "
                          "the machine) ", activity(), ", waiting in this operation; its peers "
                          "timed out waiting for it");
  // Answer everyone (never waited for: a stopped peer may never take it), then listen.
  static std::string answer;
  answer = detail::concat("rank ", rank, " ", activity(), ", waiting ", seconds(waited_s), " s in ",
                          operation);
  if (answer.size() > kAnswerBytes - 1) answer.resize(kAnswerBytes - 1);
  static std::vector<MPI_Request> sends;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    MPI_Request req;
    if (MPI_Isend(answer.data(), int(answer.size()), MPI_CHAR, r, kTag, comm, &req) == MPI_SUCCESS)
      sends.push_back(req);
  }
  std::map<int, std::string> heard;
  std::vector<char> buf(kAnswerBytes);
  MPI_Request recv = MPI_REQUEST_NULL;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (int(heard.size()) < size - 1 && elapsed() < g_grace.load()) {
    if (recv == MPI_REQUEST_NULL &&
        MPI_Irecv(buf.data(), kAnswerBytes, MPI_CHAR, MPI_ANY_SOURCE, kTag, comm, &recv) != MPI_SUCCESS)
      break;
    int done = 0;
    MPI_Status st;
    if (MPI_Test(&recv, &done, &st) != MPI_SUCCESS) break;
    if (done) {
      int n = 0;
      MPI_Get_count(&st, MPI_CHAR, &n);
      heard[st.MPI_SOURCE] = std::string(buf.data(), size_t(n > 0 ? n : 0));
      recv = MPI_REQUEST_NULL;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (recv != MPI_REQUEST_NULL) {
    MPI_Cancel(&recv);
    MPI_Request_free(&recv);
  }
  std::vector<int> silent;
  for (int r = 0; r < size; ++r)
    if (r != rank && !heard.count(r)) silent.push_back(r);
  std::string answers = answer;
  size_t listed = 0;
  for (const auto& [r, a] : heard) {
    if (++listed > 3) {
      answers += detail::concat("; and ", heard.size() - 3, " more");
      break;
    }
    answers += "; " + a;
  }
  if (silent.empty())
    return detail::concat("every rank answered the roll call, so none has stopped: they wait in "
                          "different operations or are slow (", answers, ")");
  return detail::concat(rank_list(silent), " stopped progressing: ",
                        silent.size() == 1 ? "it" : "they",
                        " did not answer the roll call of the job's ranks within ", seconds(g_grace.load()),
                        " s; the ", heard.size() + 1, " rank(s) still running answered (", answers,
                        ")");
}

}  // namespace tetrad::comm
