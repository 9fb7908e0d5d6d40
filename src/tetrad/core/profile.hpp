// Where a training step's time goes: wall time accumulated per phase by scoped timers, and
// optionally a timeline of every timed region and collective (TraceLog, written as Chrome
// trace-event JSON by `--trace`). Owned by the caller (the benchmark or the trainer) and handed to
// the model; a null profile costs one branch per kernel call, a profile without a trace a clock
// read. Not thread-safe: time the calling thread only (kernels inside are multithreaded, which is
// what the wall time should include).
#pragma once
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tetrad {

// Compute phases first (Gemm .. Residual and Other), then the ones the step breakdown reports on
// their own. Comm is *exposed* communication: time the calling thread is blocked in a collective
// (a blocking call, or the wait() of a non-blocking one); communication running behind compute
// is counted by StepProfile::comm_issued_s instead.
enum class Phase {
  Gemm, Attention, Norm, Activation, Embedding, Loss, Residual, Optimizer, Comm,
  Data,   // reading and masking the step's tokens
  Wait,   // waiting for the slowest rank before the step's first collective (load imbalance)
  Other,  // model code outside the named kernels (bias adds, copies, bookkeeping): compute
  Count
};

inline const char* phase_name(Phase p) {
  static const char* names[] = {"gemm",     "attention", "norm",      "activation",
                                "embedding", "loss",     "residual",  "optimizer",
                                "communication", "data", "wait",      "other"};
  return names[int(p)];
}

inline bool is_compute(Phase p) {
  return p != Phase::Optimizer && p != Phase::Comm && p != Phase::Data && p != Phase::Wait &&
         p != Phase::Count;
}

using SteadyTime = std::chrono::steady_clock::time_point;

// A timeline: complete events ("ph":"X") on tracks of one rank. Track 0 is the rank's compute
// thread; every communication group gets its own track, named after the group ("x", "zd", ...).
// Events on track 0 nest (scoped timers); on a communication track an event starts no earlier
// than the previous one there ended (collectives of one group run in issue order), so the
// timeline shows the queue rather than overlapping slices, with the real issue time in args.
struct TraceEvent {
  double ts = 0, dur = 0;  // microseconds since the log's origin
  int track = 0;
  std::string name;
  std::string args;  // the inside of a JSON object ("\"bytes\":4096") or empty
};

class TraceLog {
 public:
  bool recording = false;  // events are kept only while true
  SteadyTime origin = std::chrono::steady_clock::now();
  std::vector<std::string> tracks{"compute"};
  std::vector<TraceEvent> events;

  int track(const std::string& name) {
    for (size_t i = 0; i < tracks.size(); ++i)
      if (tracks[i] == name) return int(i);
    tracks.push_back(name);
    last_end_.resize(tracks.size(), 0.0);
    return int(tracks.size() - 1);
  }
  void add(int track, std::string name, SteadyTime start, SteadyTime end, std::string args = {}) {
    if (!recording) return;
    double ts = std::chrono::duration<double, std::micro>(start - origin).count();
    const double te = std::chrono::duration<double, std::micro>(end - origin).count();
    if (track > 0) {
      last_end_.resize(tracks.size(), 0.0);
      ts = std::max(ts, last_end_[size_t(track)]);
      last_end_[size_t(track)] = std::max(ts, te);
    }
    events.push_back(TraceEvent{ts, std::max(0.0, te - ts), track, std::move(name), std::move(args)});
  }
  // This rank's events and track names as comma-separated trace-event objects, pid = rank.
  std::string json_events(int rank) const;

 private:
  std::vector<double> last_end_{0.0};
};

// Phases are exclusive: a phase opened inside another (a collective inside a norm) pauses the
// outer one, so the seconds add up to the wall time spent inside any phase.
struct StepProfile {
  std::array<double, size_t(Phase::Count)> seconds{};
  double comm_issued_s = 0;  // wall time with a collective in flight (hidden or exposed)
  // The context ring's causally visible (query chunk, key chunk) pairs (parallel/context_ring.cpp)
  // and, of those, the ones skipped because the document mask hides every key of the pair from
  // every query (forward and backward passes counted alike).
  int64_t ring_pairs = 0, ring_pairs_doc_skipped = 0;
  int current = -1;          // innermost open phase
  SteadyTime mark;
  TraceLog* trace = nullptr;  // optional timeline
  int layer = -2;             // the model's current layer for event names (-1: embedding/head)
  void clear() {
    seconds.fill(0);
    comm_issued_s = 0;
    ring_pairs = ring_pairs_doc_skipped = 0;
  }
  double total() const {
    double t = 0;
    for (double s : seconds) t += s;
    return t;
  }
  double compute() const {
    double t = 0;
    for (int p = 0; p < int(Phase::Count); ++p)
      if (is_compute(Phase(p))) t += seconds[size_t(p)];
    return t;
  }
  bool tracing() const { return trace && trace->recording; }
};

// "gemm qkv L3"-style names for the timeline (only built while tracing).
inline std::string event_name(const char* base, const char* what, int layer) {
  std::string s = base;
  if (what && *what) {
    s += ' ';
    s += what;
  }
  if (layer >= 0) s += " L" + std::to_string(layer);
  else if (layer == -1) s += " top";
  return s;
}

class ScopedPhase {
 public:
  // what/m/n/k name the event on the timeline (e.g. "qkv", 512, 96, 64 for a GEMM).
  ScopedPhase(StepProfile* p, Phase ph, const char* what = nullptr, int64_t m = 0, int64_t n = 0,
              int64_t k = 0)
      : p_(p), what_(what), m_(m), n_(n), k_(k) {
    if (!p_) return;
    const auto now = std::chrono::steady_clock::now();
    if (p_->current >= 0)
      p_->seconds[size_t(p_->current)] += std::chrono::duration<double>(now - p_->mark).count();
    outer_ = p_->current;
    p_->current = int(ph);
    p_->mark = now;
    start_ = now;
  }
  ~ScopedPhase() {
    if (!p_) return;
    const auto now = std::chrono::steady_clock::now();
    const Phase ph = Phase(p_->current);
    p_->seconds[size_t(p_->current)] += std::chrono::duration<double>(now - p_->mark).count();
    p_->current = outer_;
    p_->mark = now;
    if (p_->tracing()) {
      std::string args;
      if (m_ > 0)
        args = "\"m\":" + std::to_string(m_) + ",\"n\":" + std::to_string(n_) + ",\"k\":" +
               std::to_string(k_);
      p_->trace->add(0, event_name(phase_name(ph), what_, p_->layer), start_, now, std::move(args));
    }
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  StepProfile* p_;
  const char* what_;
  int64_t m_, n_, k_;
  int outer_ = -1;
  SteadyTime start_;
};

}  // namespace tetrad
