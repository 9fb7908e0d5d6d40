#include "tetrad/train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tetrad/core/error.hpp"


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

std::vector<DecayRange> decay_ranges(const ParamTable& table, const TrainConfig& t,
                                     const std::vector<int64_t>& offsets,
                                     const std::vector<int64_t>& sizes,
                                     const std::vector<int64_t>& state_offsets,
                                     const std::vector<int64_t>& grad_offsets) {
  std::vector<DecayRange> ranges;
  for (size_t i = 0; i < table.specs.size(); ++i) {
    if (sizes[i] == 0) continue;
    const ParamSpec& s = table.specs[i];
    if (s.kind == ParamKind::Buffer) continue;  // not trained: AdamW leaves it as it is
    bool decay = true;
    if (s.kind == ParamKind::Embedding) decay = t.decay_embeddings;
    if (s.kind == ParamKind::Norm) decay = t.decay_norms;
    if (s.kind == ParamKind::Bias) decay = t.decay_biases;
    if (!ranges.empty()) {
      DecayRange& b = ranges.back();
      if (b.decay == decay && b.offset + b.numel == offsets[i] &&
          b.state_offset + b.numel == state_offsets[i] && b.grad_offset + b.numel == grad_offsets[i]) {
        b.numel += sizes[i];
        continue;
      }
    }
    ranges.push_back({offsets[i], sizes[i], decay, state_offsets[i], grad_offsets[i]});
  }
  return ranges;
}

std::vector<DecayRange> decay_ranges(const ParamTable& table, const TrainConfig& t,
                                     const std::vector<int64_t>& offsets,
                                     const std::vector<int64_t>& sizes) {
  return decay_ranges(table, t, offsets, sizes, offsets, offsets);
}

namespace {
std::vector<DecayRange> whole_tensor_ranges(const ParamTable& table, const TrainConfig& t) {
  std::vector<int64_t> off, size;
  for (const auto& s : table.specs) {
    off.push_back(s.offset);
    size.push_back(s.numel);
  }
  return decay_ranges(table, t, off, size);
}
}  // namespace

AdamW::AdamW(const ParamTable& table, const TrainConfig& t, backend::Backend& be)
    : AdamW(whole_tensor_ranges(table, t), table.total, t, be) {}

AdamW::AdamW(std::vector<DecayRange> ranges, int64_t total, const TrainConfig& t,
             backend::Backend& be)
    : ranges_(std::move(ranges)),
      t_(t),
      be_(&be),
      size_(total),
      m_(be.alloc_array<float>(size_t(total))),
      v_(be.alloc_array<float>(size_t(total))) {}

void AdamW::update(float* params, const float* grads, double lr, double grad_scale,
                   int64_t step) {
  update(params, grads, lr, grad_scale, step, 0, std::numeric_limits<int64_t>::max());
}

void AdamW::update(float* params, const float* grads, double lr, double grad_scale, int64_t step,
                   int64_t lo, int64_t hi) {
  update(params, nullptr, grads, lr, grad_scale, step, lo, hi);
}

void AdamW::update(float* params, uint16_t* params_bf16, const float* grads, double lr,
                   double grad_scale, int64_t step, int64_t lo, int64_t hi) {
  // A backend without the fused copy (Capabilities::adamw_bf16_copy) gets the same bits from
  // the plain update followed by a cast of each run (one more pass over the parameters).
  const bool fused = params_bf16 && be_->capabilities().adamw_bf16_copy;
  for (const auto& r : ranges_) {
    // The part of this run inside [lo, hi); the update is elementwise, so any split is exact.
    const int64_t a = std::max(lo, r.offset), b = std::min(hi, r.offset + r.numel);
    if (a >= b) continue;
    const int64_t skip = a - r.offset;
    const int64_t so = (r.state_offset < 0 ? r.offset : r.state_offset) + skip;
    const int64_t go = (r.grad_offset < 0 ? r.offset : r.grad_offset) + skip;
    backend::AdamWArgs u;
    u.p = params + a;
    u.g = grads + go;
    u.m = m() + so;
    u.v = v() + so;
    u.n = b - a;
    u.lr = float(lr);
    u.beta1 = float(t_.beta1);
    u.beta2 = float(t_.beta2);
    u.eps = float(t_.adam_eps);
    u.weight_decay = r.decay ? float(t_.weight_decay) : 0.0f;
    u.grad_scale = float(grad_scale);
    u.step = step;
    u.p16 = fused ? params_bf16 + a : nullptr;
    be_->ops().adamw(be_->queue(), u);
    if (params_bf16 && !fused)
      be_->ops().cast_f32_to_bf16(be_->queue(), params_bf16 + a, params + a, b - a);
  }
}

double sum_squares(const float* x, int64_t n, backend::Backend& be) {
  backend::Queue& q = be.queue();
  if (be.capabilities().host_visible) {
    double s = 0;
    be.ops().sum_squares(q, &s, x, n);
    q.synchronize();
    return s;
  }
  backend::DeviceBuffer out = be.alloc_array<double>(1);
  be.ops().sum_squares(q, out.as<double>(), x, n);
  double s = 0;
  q.copy_to_host(&s, out.data(), sizeof s);
  q.synchronize();
  return s;
}

double grad_norm(const float* grads, int64_t n, backend::Backend& be) {
  return std::sqrt(sum_squares(grads, n, be));
}

}  // namespace tetrad
