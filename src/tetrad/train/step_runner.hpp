// One optimizer step of the parallel model, written once: the trainer's loop, `bench` (one rank
// and grids) and the contract tests (tests/mpi/contract.hpp, tests/device_model_harness.hpp,
// tests/mpi/test_overlap_mpi.cpp) all run this, so "every grid trains exactly like one rank" is
// tested on the trainer's own step, not on a copy of it.
//
// The step: begin (zero gradients, arm the data-parallel buckets), the micro-batches' forward and
// backward (or the pipeline schedule's, Gp > 1), the gradient reductions, the loss summed over the
// grid, the gradient norm, the non-finite guard, clipping and the AdamW update (with ZeRO's
// all-gather and the next step's first gathers, ParallelTransformer::apply_update). What comes
// before (data, loss mask, the loss normaliser) and after (logs, metrics, checkpoints) is the
// caller's.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tetrad/core/profile.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/pipeline.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/optimizer.hpp"

namespace tetrad {

// What becomes of a step once its loss and gradient norm are known.
enum class StepVerdict {
  Apply,  // finite: clip and update
  Skip,   // non-finite loss or gradient: no update (the weights stay as they were)
  Stop,   // non-finite train.max_bad_steps times in a row: the run stops
};

// The non-finite guard: a pure function of the loss, the gradient norm and how many steps in a
// row were non-finite before (kept here), so it is tested without a model (test_step_runner).
class NonFiniteGuard {
 public:
  explicit NonFiniteGuard(int max_bad_steps) : max_bad_steps_(max_bad_steps) {}
  StepVerdict judge(double loss, double grad_norm);
  int bad_steps() const { return bad_steps_; }  // consecutive non-finite steps, this one included

 private:
  int max_bad_steps_;
  int bad_steps_ = 0;
};

// The factor the gradients are multiplied by in the update: grad_clip / norm above the clip
// (global-norm clipping), else 1; grad_clip <= 0 turns clipping off.
double clip_scale(double grad_clip, double grad_norm);

struct StepOptions {
  int micro_batches = 1;  // forward/backward passes per step (train.grad_accum)
  int B = 1, T = 1;       // this rank's sequences per micro-batch, tokens per sequence
  double grad_clip = 1.0;
  int max_bad_steps = 5;
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::OneFOneB;  // Gp > 1 only
  // The profile the model records into (ParallelTransformer::set_profile): the runner's own
  // phases (zeroing, the trainer's collectives, norm, AdamW) go there too. Null: not timed.
  StepProfile* profile = nullptr;
};

struct StepResult {
  double loss = 0;       // mean loss per kept target of the global batch
  double grad_norm = 0;  // global L2 norm before clipping
  StepVerdict verdict = StepVerdict::Apply;
  int bad_steps = 0;  // non-finite steps in a row, this one included (0 when finite)
  // A mixture of experts' router losses and expert load over the step's micro-batches: the
  // losses, layer counts, routed and dropped choices summed over every rank of the batch; the
  // least and most rows one expert computed, of this rank's layers (empty for a dense model).
  parallel::MoeStats moe;
};

class StepRunner {
 public:
  // host_groups: the groups over which host values (loss sums, target counts) are summed: the
  // model's own, or their MPI twins where the model's are NCCL's (ProcessGroups::host()).
  // Gp > 1: the runner drives the step through a PipelineDriver of its own (pipeline()).
  StepRunner(parallel::ParallelTransformer& model, AdamW& adam,
             const parallel::ProcessGroups& host_groups, const StepOptions& options);

  // One step. inputs/targets: this rank's micro_batches x [B, T] tokens (targets < 0 dropped by
  // the loss mask); kept: targets kept over the whole global batch (every rank, every
  // micro-batch): the loss is Σ loss / kept. lr: this step's learning rate; step: 0-based.
  StepResult run(const int32_t* inputs, const int32_t* targets, double kept, double lr,
                 int64_t step);

  // Host values summed over the Z x D ranks (the ranks that split the batch's sequences), timed
  // as the trainer's own communication (exposed and issued).
  void sum_over_replicas(double* values, int n);
  // Load imbalance: waits for the slowest rank (Phase::Wait) before any collective of the step
  // would absorb that wait into "communication". No-op on one rank.
  void wait_for_slowest_rank();

  // Gp > 1: the pipeline driver the steps run through (validation's forward_loss too); else null.
  parallel::PipelineDriver* pipeline() { return pipe_.get(); }
  // This rank's Σ loss of each micro-batch of the last step, before any reduction (empty with a
  // pipeline): the overlap test compares them bit for bit.
  const std::vector<double>& micro_losses() const { return micro_losses_; }

 private:
  double forward_backward(const int32_t* inputs, const int32_t* targets, float grad_scale);
  template <class F>
  void host_comm(F&& f);

  parallel::ParallelTransformer& model_;
  AdamW& adam_;
  const parallel::ProcessGroups& g_;
  StepOptions o_;
  NonFiniteGuard guard_;
  std::unique_ptr<parallel::PipelineDriver> pipe_;
  std::vector<double> micro_losses_;
};

}  // namespace tetrad
