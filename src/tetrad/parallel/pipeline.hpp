// The pipeline driver (Gp > 1): one optimizer step's micro-batches through the stages in the
// order pipeline_schedule() gives (1F1B or interleaved), activations sent forward and their
// gradients backward between neighbouring stages with non-blocking point-to-point messages on
// the P group (docs/parallel.md, "The pipeline").
//
// Each rank runs its chunks (virtual stages j = c Gp + p, layers layer_split().layers(j)) of
// one ParallelTransformer: the forward of a micro-batch's chunk, then its activations stashed
// (ParallelTransformer::stash) until that chunk's backward. The output of a forward is sent with
// isend as soon as it exists (the send owns a copy), and the receive of the next op's input is
// posted before this op's compute, so messages travel while the stage computes.
//
// Every stage must be given the same micro-batches (the data loader's slot does not depend on
// p). Only the last stage computes the loss; step() returns this rank's share (0 elsewhere), so
// sum it over P (and Z x D) for the global figure. Not thread-safe; collective over the grid.
#pragma once
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/pipeline_schedule.hpp"

namespace tetrad::parallel {

class PipelineDriver {
 public:
  PipelineDriver(ParallelTransformer& model, PipelineSchedule schedule, int micro_batches);

  // The step's micro-batches (inputs/targets: micro_batches x [B, T], the same on every stage):
  // forwards, loss with d(grad_scale * Σ loss), backwards; gradients accumulate in the model.
  // Returns this rank's Σ loss over kept targets (non-zero on the last stage only).
  double step(const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale);
  // Forward and loss of one micro-batch through every stage (validation). Same return rule.
  double forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T);

  // Seconds this rank spent waiting for its neighbours during the last step() (the bubble,
  // plus any communication not hidden), and in all of it.
  double last_wait_s() const { return wait_s_; }
  double last_step_s() const { return step_s_; }
  // Seconds of compute of each op of the last step(), in the order of this stage's op list
  // (pipeline_schedule), excluding the waits for its input.
  const std::vector<double>& last_op_s() const { return op_s_; }

  // Bytes of activation memory the pipeline adds on this rank beyond the model's one activation
  // buffer, by the schedule: the largest total of stashes alive at once (walking this stage's op
  // list, each forward's chunk stash until its backward), plus the two receive buffers and one
  // outgoing copy of a [B, T, C/Gx] hidden state. The memory benchmark adds it to its formula.
  int64_t stash_peak_bytes(int B, int T);

 private:
  struct Chunk {
    int l0, l1;
    bool embed, head;
  };
  Chunk chunk(int c) const;

  ParallelTransformer& m_;
  ProcessGroups& g_;
  PipelineSchedule schedule_;
  int m_micro_, v_, p_, s_;
  double wait_s_ = 0, step_s_ = 0;
  std::vector<double> op_s_;
};

}  // namespace tetrad::parallel
