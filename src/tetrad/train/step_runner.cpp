#include "tetrad/train/step_runner.hpp"

#include <chrono>
#include <cmath>

namespace tetrad {

StepVerdict NonFiniteGuard::judge(double loss, double grad_norm) {
  if (std::isfinite(loss) && std::isfinite(grad_norm)) {
    bad_steps_ = 0;
    return StepVerdict::Apply;
  }
  ++bad_steps_;
  return bad_steps_ >= max_bad_steps_ ? StepVerdict::Stop : StepVerdict::Skip;
}

double clip_scale(double grad_clip, double grad_norm) {
  return (grad_clip > 0 && grad_norm > grad_clip) ? grad_clip / grad_norm : 1.0;
}

StepRunner::StepRunner(parallel::ParallelTransformer& model, AdamW& adam,
                       const parallel::ProcessGroups& host_groups, const StepOptions& options)
    : model_(model), adam_(adam), g_(host_groups), o_(options), guard_(options.max_bad_steps) {
  if (g_.shape.p() > 1)
    pipe_ = std::make_unique<parallel::PipelineDriver>(model_, o_.schedule, o_.micro_batches);
  micro_losses_.reserve(size_t(o_.micro_batches));
}

// A collective the trainer calls itself (not the model): exposed communication, and issued too.
template <class F>
void StepRunner::host_comm(F&& f) {
  StepProfile* prof = o_.profile;
  const auto c0 = std::chrono::steady_clock::now();
  {
    ScopedPhase sp(prof, Phase::Comm, "trainer");
    f();
  }
  if (prof)
    prof->comm_issued_s +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
}

void StepRunner::sum_over_replicas(double* values, int n) {
  if (g_.tokens().size() > 1) host_comm([&] { g_.tokens().allreduce_sum(values, size_t(n)); });
}

void StepRunner::wait_for_slowest_rank() {
  if (g_.world.size() <= 1) return;
  ScopedPhase sp(o_.profile, Phase::Wait, "for the slowest rank");
  g_.world.barrier();
}

// The micro-batches' forward and backward, gradients accumulating in the model; this rank's
// Σ loss (on a pipeline: non-zero on the last stage only).
double StepRunner::forward_backward(const int32_t* inputs, const int32_t* targets,
                                    float grad_scale) {
  const int B = o_.B, T = o_.T;
  micro_losses_.clear();
  if (pipe_) return pipe_->step(inputs, targets, B, T, grad_scale);
  double loss_sum = 0;
  for (int m = 0; m < o_.micro_batches; ++m) {
    const size_t at = size_t(m) * B * T;
    micro_losses_.push_back(model_.forward_backward(inputs + at, targets + at, B, T, grad_scale));
    loss_sum += micro_losses_.back();
  }
  return loss_sum;
}

StepResult StepRunner::run(const int32_t* inputs, const int32_t* targets, double kept, double lr,
                           int64_t step) {
  StepProfile* prof = o_.profile;
  {
    ScopedPhase sp(prof, Phase::Other, "zero gradients");
    model_.begin_step(o_.micro_batches);
  }
  model_.take_moe_stats();  // forward passes outside the step (validation) do not count
  double loss_sum = forward_backward(inputs, targets, float(1.0 / kept));
  model_.reduce_gradients();
  parallel::MoeStats moe = model_.take_moe_stats();
  if (pipe_ && model_.config().moe()) {
    // Each layer's values are already the whole micro-batch's (the block shares the routing
    // over the token group); a pipeline's stages hold different layers: summed over P.
    double sums[5] = {double(moe.layers), moe.aux, moe.z, double(moe.dropped), double(moe.routed)};
    host_comm([&] { g_.p().allreduce_sum(sums, 5); });
    moe.layers = int64_t(sums[0]);
    moe.aux = sums[1];
    moe.z = sums[2];
    moe.dropped = int64_t(sums[3]);
    moe.routed = int64_t(sums[4]);
    // moe.load (the expert bias's load and the imbalance metric): each layer's counts are the
    // whole micro-batch's already and only its stage holds them (zeros elsewhere): summed over P
    // so the metric covers every layer (the bias update reads the rank's own layers alone).
    if (!moe.load.empty()) {
      std::vector<double> load(moe.load.begin(), moe.load.end());
      host_comm([&] { g_.p().allreduce_sum(load.data(), load.size()); });
      for (size_t i = 0; i < load.size(); ++i) moe.load[i] = int64_t(load[i]);
    }
  }
  // The loss of the global batch: its sequences are split over Z x D, and on a pipeline only the
  // last stage computes it.
  if (g_.tokens().size() > 1) host_comm([&] { g_.tokens().allreduce_sum(&loss_sum, 1); });
  if (pipe_) host_comm([&] { g_.p().allreduce_sum(&loss_sum, 1); });
  StepResult r;
  r.loss = loss_sum / kept;
  r.moe = moe;
  {
    ScopedPhase sp(prof, Phase::Optimizer, "grad norm");
    r.grad_norm = std::sqrt(model_.grad_sum_squares());
  }
  r.verdict = guard_.judge(r.loss, r.grad_norm);
  r.bad_steps = guard_.bad_steps();
  if (r.verdict != StepVerdict::Apply) return r;  // the weights stay as they were
  const double clip = clip_scale(o_.grad_clip, r.grad_norm);
  // AdamW; with ZeRO every D replica then gets the pieces the others updated, and with
  // parallel.prefetch_across_steps the next step's first weight gathers start meanwhile. With
  // bf16 GEMMs the same pass writes the bf16 weight copy the next step's GEMMs read.
  const float* grads = model_.grads();
  model_.apply_update([&](float* params, uint16_t* params16, int64_t lo, int64_t hi) {
    ScopedPhase sp(prof, Phase::Optimizer, "adamw");
    adam_.update(params, params16, grads, lr, clip, step + 1, lo, hi);
  });
  if (model_.config().moe_expert_bias()) {
    ScopedPhase sp(prof, Phase::Optimizer, "expert bias");
    model_.update_expert_bias(moe.load);
  }
  return r;
}

}  // namespace tetrad
