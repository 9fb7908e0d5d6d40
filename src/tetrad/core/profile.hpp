// Where a training step's time goes: wall time accumulated per phase by scoped timers. Owned by
// the caller (the benchmark or the trainer) and handed to the model; a null profile costs one
// branch per kernel call. Not thread-safe: time the calling thread only (kernels inside are
// multithreaded, which is what the wall time should include).
#pragma once
#include <array>
#include <chrono>
#include <string>

namespace tetrad {

enum class Phase {
  Gemm, Attention, Norm, Activation, Embedding, Loss, Residual, Optimizer, Comm, Count
};

inline const char* phase_name(Phase p) {
  static const char* names[] = {"gemm",     "attention", "norm",     "activation", "embedding",
                                "loss",     "residual",  "optimizer", "communication"};
  return names[int(p)];
}

// Phases are exclusive: a phase opened inside another (a collective inside a norm) pauses the
// outer one, so the seconds add up to the wall time spent inside any phase.
struct StepProfile {
  std::array<double, size_t(Phase::Count)> seconds{};
  int current = -1;  // innermost open phase
  std::chrono::steady_clock::time_point mark;
  void clear() { seconds.fill(0); }
  double total() const {
    double t = 0;
    for (double s : seconds) t += s;
    return t;
  }
};

class ScopedPhase {
 public:
  ScopedPhase(StepProfile* p, Phase ph) : p_(p) {
    if (!p_) return;
    const auto now = std::chrono::steady_clock::now();
    if (p_->current >= 0)
      p_->seconds[size_t(p_->current)] += std::chrono::duration<double>(now - p_->mark).count();
    outer_ = p_->current;
    p_->current = int(ph);
    p_->mark = now;
  }
  ~ScopedPhase() {
    if (!p_) return;
    const auto now = std::chrono::steady_clock::now();
    p_->seconds[size_t(p_->current)] += std::chrono::duration<double>(now - p_->mark).count();
    p_->current = outer_;
    p_->mark = now;
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  StepProfile* p_;
  int outer_ = -1;
};

}  // namespace tetrad
