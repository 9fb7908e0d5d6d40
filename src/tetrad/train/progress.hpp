// What a training run reports as it goes: the run's header lines (model, batch, ranks, the MFU
// baseline, overlap, device, transport; each rank's share; precision), and for every step its
// model and hardware FLOP utilisation (MFU, HFU), where its time went, the console line and the
// ETA. MFU is counted against the peak of the arithmetic the run's GEMMs use on the device it
// runs on (mfu_peak).
#pragma once
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

#include "tetrad/backend/backend.hpp"
#include "tetrad/core/profile.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/config.hpp"
#include "tetrad/train/metrics_log.hpp"
#include "tetrad/train/run_plan.hpp"

namespace tetrad {

// "1h02m", "3m05s", "42s" ("?" when not finite or negative).
std::string format_duration(double s);

// The peak MFU is counted against, per rank: the device's peak of the arithmetic the run's GEMMs
// use (Backend::peak: on a CPU the bf16 matrix peak for a bf16 run, the fp32 FMA peak otherwise;
// on a GPU its datasheet peak); given > 0: that figure.
using MfuPeak = backend::DevicePeak;
MfuPeak mfu_peak(double given, backend::Precision precision, backend::Backend& device);

// Where the step's time went, from the profile of the step and its wall time.
StepBreakdown breakdown_of(const StepProfile& prof, double step_s);

// A step's mixture-of-experts figures into its record (a dense model, moe false: none).
void add_moe_metrics(StepMetrics& m, const parallel::MoeStats& s, bool moe);

class ProgressReporter {
 public:
  ProgressReporter(const RunConfig& cfg, const RunPlan& plan, const MfuPeak& peak, int world,
                   std::ostream& out, bool quiet);

  // "model: ..." (the run's size and MFU baseline), overlap, device and transport lines.
  void print_header(const parallel::ParallelTransformer& model,
                    const parallel::ProcessGroups& model_groups, const std::string& transport_why,
                    const backend::Backend& device, int threads) const;
  // One line per rank, in rank order (collective): its coordinates, parameters, batch, memory.
  void print_rank_shares(const parallel::ParallelTransformer& model,
                         const parallel::ProcessGroups& groups, std::ostream& log) const;
  // "precision: ..." and the GEMM layouts (bf16), as resolved by the plan and the model.
  void print_precision(const parallel::ParallelTransformer& model, const backend::Backend& device,
                       const std::string& layouts_resumed) const;

  // The clock of the ETA starts now; step counts from `start_step`.
  void start(int64_t start_step);
  // The record of step `done` (1-based) that took `time.step` seconds and ended at `end`.
  StepMetrics measure(int64_t done, double loss, double lr, double grad_norm,
                      double dropped_fraction, const StepBreakdown& time,
                      std::chrono::steady_clock::time_point end) const;
  // The console lines of a step (every train.log_interval steps, the first and the last; a
  // mixture of experts' router losses and expert load on a line of their own).
  void print_step(const StepMetrics& m, bool masking) const;

 private:
  const RunConfig& cfg_;
  const RunPlan& plan_;
  MfuPeak peak_;
  int world_;
  std::ostream& out_;
  bool quiet_;
  double flops_tok_, hw_flops_tok_;
  bool report_hfu_;
  std::chrono::steady_clock::time_point run_start_;
  int64_t start_step_ = 0;
};

}  // namespace tetrad
