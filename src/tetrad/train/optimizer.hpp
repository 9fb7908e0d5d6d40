// AdamW over the flat parameter buffer, the learning-rate schedule and gradient clipping.
#pragma once
#include <cstdint>
#include <vector>

#include "tetrad/core/buffer.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/train/config.hpp"

namespace tetrad {

// Linear warm-up to the peak over warmup_steps, then cosine decay to lr * min_lr_ratio at
// max_steps. `step` is 0-based (the step about to be taken).
double learning_rate(const TrainConfig& t, int64_t step);

// AdamW with decoupled weight decay; which tensors decay follows the config (by ParamKind).
// Moments are fp32 buffers laid out like the parameters, so checkpoints and sharding slice them
// the same way.
class AdamW {
 public:
  AdamW(const ParamTable& table, const TrainConfig& t);
  // One update of every parameter. grad_scale multiplies the gradients first (clipping).
  // `step` is 1-based (bias correction).
  void update(float* params, const float* grads, double lr, double grad_scale, int64_t step);

  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  int64_t size() const { return int64_t(m_.size()); }

 private:
  struct Range { int64_t offset, numel; bool decay; };
  std::vector<Range> ranges_;  // contiguous runs of tensors with the same decay setting
  TrainConfig t_;
  Buffer<float> m_, v_;
};

// Global L2 norm of the gradient buffer, in double.
double grad_norm(const float* grads, int64_t n);

}  // namespace tetrad
