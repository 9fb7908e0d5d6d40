// AdamW over the flat parameter buffer, the learning-rate schedule and gradient clipping.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/train/config.hpp"

namespace tetrad {

// Linear warm-up to the peak over warmup_steps, then cosine decay to lr * min_lr_ratio at
// max_steps. `step` is 0-based (the step about to be taken).
double learning_rate(const TrainConfig& t, int64_t step);

// AdamW with decoupled weight decay; which tensors decay follows the config (by ParamKind).
// Moments are fp32 buffers laid out like the parameters, so checkpoints and sharding slice them
// the same way.
// A contiguous run of the parameter buffer and whether weight decay applies to it.
// Its moments are at state_offset of the moment buffers and its gradient at grad_offset of the
// gradient buffer (-1: at `offset`, laid out like the parameters; ZeRO keeps them elsewhere).
struct DecayRange {
  int64_t offset, numel;
  bool decay;
  int64_t state_offset = -1, grad_offset = -1;
};
// Which tensors decay, by ParamKind and the config (norms, biases, embeddings excluded unless
// asked); `offsets`/`sizes` give where each table entry lives in the buffer being optimised
// (the whole tensor serially, a rank's shard in parallel). Adjacent equal runs are merged.
std::vector<DecayRange> decay_ranges(const ParamTable& table, const TrainConfig& t,
                                     const std::vector<int64_t>& offsets,
                                     const std::vector<int64_t>& sizes);
// The same with the moments and gradients of tensor i at state_offsets[i] / grad_offsets[i]
// (a parallel rank's optimizer layout under ZeRO); runs merge only where all three are adjacent.
std::vector<DecayRange> decay_ranges(const ParamTable& table, const TrainConfig& t,
                                     const std::vector<int64_t>& offsets,
                                     const std::vector<int64_t>& sizes,
                                     const std::vector<int64_t>& state_offsets,
                                     const std::vector<int64_t>& grad_offsets);

// The moments live on `backend` (its device memory) and the update runs through its op table
// (OpTable::adamw over each run); params and grads are device pointers of the same backend.
class AdamW {
 public:
  AdamW(const ParamTable& table, const TrainConfig& t,
        backend::Backend& be = backend::cpu_backend());
  // Over any buffer described by ranges (a rank's shards); total: elements of each moment buffer.
  AdamW(std::vector<DecayRange> ranges, int64_t total, const TrainConfig& t,
        backend::Backend& be = backend::cpu_backend());
  // One update of every parameter. grad_scale multiplies the gradients first (clipping).
  // `step` is 1-based (bias correction).
  void update(float* params, const float* grads, double lr, double grad_scale, int64_t step);
  // The same for the parameters at buffer offsets [lo, hi) only (the rest untouched): an update
  // split into intervals, in any order, gives the same bits as one whole update.
  void update(float* params, const float* grads, double lr, double grad_scale, int64_t step,
              int64_t lo, int64_t hi);
  // bf16 mixed precision: the same update, also writing each updated parameter rounded to bf16
  // into params_bf16 (laid out like params) in the same pass: the weight copy the next step's
  // GEMMs read, written once per step instead of converted at every GEMM (by OpTable::adamw's
  // p16 where Capabilities::adamw_bf16_copy, else by a cast after the update: the same bits).
  void update(float* params, uint16_t* params_bf16, const float* grads, double lr,
              double grad_scale, int64_t step, int64_t lo = 0,
              int64_t hi = std::numeric_limits<int64_t>::max());

  // Device pointers of the moments (host memory on the CPU backend: checkpoints read them).
  float* m() { return m_.as<float>(); }
  float* v() { return v_.as<float>(); }
  int64_t size() const { return size_; }

 private:
  std::vector<DecayRange> ranges_;  // contiguous runs of tensors with the same decay setting
  TrainConfig t_;
  backend::Backend* be_;
  int64_t size_;
  backend::DeviceBuffer m_, v_;
};

// Global L2 norm of the gradient buffer (a device pointer of `be`), in double.
double grad_norm(const float* grads, int64_t n, backend::Backend& be = backend::cpu_backend());
// Σ x² of a buffer of `be`, in double (OpTable::sum_squares, copied back to the host).
double sum_squares(const float* x, int64_t n, backend::Backend& be = backend::cpu_backend());

}  // namespace tetrad
