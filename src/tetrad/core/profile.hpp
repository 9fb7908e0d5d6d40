// Where a training step's time goes: wall time accumulated per phase by scoped timers. Owned by
// the caller (the benchmark or the trainer) and handed to the model; a null profile costs one
// branch per kernel call. Not thread-safe: time the calling thread only (kernels inside are
// multithreaded, which is what the wall time should include).
#pragma once
#include <array>
#include <chrono>
#include <string>

namespace tetrad {

enum class Phase { Gemm, Attention, Norm, Activation, Embedding, Loss, Residual, Optimizer, Count };

inline const char* phase_name(Phase p) {
  static const char* names[] = {"gemm",     "attention", "norm",     "activation", "embedding",
                                "loss",     "residual",  "optimizer"};
  return names[int(p)];
}

struct StepProfile {
  std::array<double, size_t(Phase::Count)> seconds{};
  void clear() { seconds.fill(0); }
  double total() const {
    double t = 0;
    for (double s : seconds) t += s;
    return t;
  }
};

class ScopedPhase {
 public:
  ScopedPhase(StepProfile* p, Phase ph) : p_(p), ph_(ph) {
    if (p_) t0_ = std::chrono::steady_clock::now();
  }
  ~ScopedPhase() {
    if (p_)
      p_->seconds[size_t(ph_)] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  StepProfile* p_;
  Phase ph_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace tetrad
