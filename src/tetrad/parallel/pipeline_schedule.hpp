// Pipeline schedules as pure functions (no MPI): which forward and backward passes each pipeline
// stage runs, in order, for one optimizer step of m micro-batches over Gp stages
// (docs/parallel.md, "Pipeline schedules").
//
//   1F1B (PipeDream-Flush, Narayanan et al. 2021): stage s runs min(p - s - 1, m) warm-up
//   forwards, then alternates one forward and one backward, then drains the remaining
//   backwards. At most p - s micro-batches are in flight on stage s. Bubble: (p - 1) / m of the
//   ideal time.
//   Interleaved (Megatron-LM's virtual pipeline): each rank holds v model chunks; chunk c of stage
//   s is virtual stage c*p + s, so a micro-batch visits every rank v times. Micro-batches go in
//   groups of p through chunk 0, then chunk 1, ...; backwards mirror it from the last chunk.
//   Needs m % p == 0. Bubble: (p - 1) / (v m).
//
// simulate_pipeline() runs the per-stage lists against their dependencies (a forward of virtual
// stage j needs the forward of j - 1; a backward needs the backward of j + 1 and its own forward)
// with fixed times per chunk, which both proves the order deadlock-free and gives the bubble.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tetrad::parallel {

enum class PipelineSchedule { OneFOneB, Interleaved };
PipelineSchedule parse_pipeline_schedule(const std::string& text);  // "1f1b" | "interleaved"
const char* schedule_name(PipelineSchedule s);

struct PipeOp {
  bool forward = true;
  int micro = 0;  // micro-batch, 0..m-1
  int chunk = 0;  // model chunk on this rank, 0..v-1 (virtual stage chunk * p + stage)
  bool operator==(const PipeOp&) const = default;
};

// The ops of `stage` (0..p-1) for m micro-batches and v chunks per rank (v = 1 for 1F1B).
// Throws tetrad::Error for p, m, v < 1, v > 1 with 1F1B, or an interleaved m not divisible by p.
std::vector<PipeOp> pipeline_schedule(PipelineSchedule s, int p, int stage, int m, int v);

// "F0 F1 B0 F2 B1 B2" (chunk as a suffix when v > 1: "F0.1").
std::string to_string(const std::vector<PipeOp>& ops, int v);

struct PipelineTiming {
  double makespan = 0;  // time from the first forward to the last backward
  double ideal = 0;     // one stage's busy time: m v (t_f + t_b)
  double bubble() const { return (makespan - ideal) / ideal; }  // idle fraction of the ideal
  int max_in_flight = 0;  // most micro-batch chunks forwarded but not yet backwarded, any stage
  std::vector<double> busy;  // per stage: the sum of its ops' durations
  // Idle over busy time, mean over the stages (what the benchmark measures; equals bubble() when
  // every stage is equally busy).
  double mean_bubble() const;
};
// t_f, t_b: time of one chunk's forward / backward. Throws tetrad::Error if the lists deadlock.
PipelineTiming simulate_pipeline(PipelineSchedule s, int p, int m, int v, double t_f, double t_b);
// The same with each op's own duration: duration(stage, i, op) for op i of that stage's list
// (e.g. measured times, so unequal stages and slow messages show). ideal is then the busiest
// stage's time.
PipelineTiming simulate_pipeline(
    PipelineSchedule s, int p, int m, int v,
    const std::function<double(int stage, size_t index, const PipeOp& op)>& duration);

}  // namespace tetrad::parallel
