#include "tetrad/train/optimizer.hpp"

#include <cmath>

#include "tetrad/kernels/ops.hpp"

namespace tetrad {

double learning_rate(const TrainConfig& t, int64_t step) {
  if (step < t.warmup_steps) return t.lr * double(step + 1) / double(t.warmup_steps);
  const double min_lr = t.lr * t.min_lr_ratio;
  const int64_t decay_steps = t.max_steps - t.warmup_steps;
  if (decay_steps <= 1) return t.lr;
  double progress = double(step - t.warmup_steps) / double(decay_steps - 1);
  if (progress > 1) progress = 1;
  return min_lr + 0.5 * (t.lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

AdamW::AdamW(const ParamTable& table, const TrainConfig& t)
    : t_(t), m_(table.total), v_(table.total) {
  for (const auto& s : table.specs) {
    bool decay = true;
    if (s.kind == ParamKind::Embedding) decay = t.decay_embeddings;
    if (s.kind == ParamKind::Norm) decay = t.decay_norms;
    if (s.kind == ParamKind::Bias) decay = t.decay_biases;
    if (!ranges_.empty() && ranges_.back().decay == decay &&
        ranges_.back().offset + ranges_.back().numel == s.offset)
      ranges_.back().numel += s.numel;
    else
      ranges_.push_back({s.offset, s.numel, decay});
  }
}

void AdamW::update(float* params, const float* grads, double lr, double grad_scale,
                   int64_t step) {
  for (const auto& r : ranges_)
    kernels::adamw_update<float>(params + r.offset, grads + r.offset, m_.data() + r.offset,
                                 v_.data() + r.offset, r.numel, float(lr), float(t_.beta1),
                                 float(t_.beta2), float(t_.adam_eps),
                                 r.decay ? float(t_.weight_decay) : 0.0f, float(grad_scale),
                                 step);
}

double grad_norm(const float* grads, int64_t n) {
  return std::sqrt(kernels::sum_squares(grads, n));
}

}  // namespace tetrad
