#include "tetrad/train/progress.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "tetrad/model/flops.hpp"
#include "tetrad/model/params.hpp"

namespace tetrad {

namespace {

std::string fixed1(double v) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << v;
  return o.str();
}

}  // namespace

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = long(s + 0.5);
  std::ostringstream os;
  if (t >= 3600) os << t / 3600 << "h" << std::setw(2) << std::setfill('0') << (t / 60) % 60 << "m";
  else if (t >= 60) os << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else os << t << "s";
  return os.str();
}

MfuPeak mfu_peak(double given, backend::Precision precision, backend::Backend& device) {
  if (given > 0)
    return {given, std::string(precision == backend::Precision::BF16 ? "bf16 matrix peak"
                                                                     : "fp32 FMA peak") +
                       " (given)"};
  return device.peak(precision, 0);
}

StepBreakdown breakdown_of(const StepProfile& prof, double step_s) {
  StepBreakdown bd;
  bd.step = step_s;
  bd.compute = prof.compute();
  bd.comm_exposed = prof.seconds[size_t(Phase::Comm)];
  bd.wait = prof.seconds[size_t(Phase::Wait)];
  bd.optimizer = prof.seconds[size_t(Phase::Optimizer)];
  bd.data = prof.seconds[size_t(Phase::Data)];
  bd.comm_issued = prof.comm_issued_s;
  bd.ring_pairs = prof.ring_pairs;
  bd.ring_pairs_doc_skipped = prof.ring_pairs_doc_skipped;
  return bd;
}

// MFU against the peak of the arithmetic the run's GEMMs use; HFU counts the FLOPs
// recomputation adds as well, against the same peak.
ProgressReporter::ProgressReporter(const RunConfig& cfg, const RunPlan& plan, const MfuPeak& peak,
                                   int world, std::ostream& out, bool quiet)
    : cfg_(cfg),
      plan_(plan),
      peak_(peak),
      world_(world),
      out_(out),
      quiet_(quiet),
      // The planner's convention (planner.hpp, AttentionFlops::Causal): causal attention counted
      // as half, a mixture of experts' active FLOPs, so the figures agree with `tetrad plan`.
      flops_tok_(flops_per_token(cfg.model, plan.seq_len, AttentionFlops::Causal)),
      hw_flops_tok_(flops_tok_ + recompute_flops_per_token(cfg.model, plan.seq_len, cfg.train.recompute,
                                                           AttentionFlops::Causal)),
      report_hfu_(cfg.train.recompute != "none") {}

void ProgressReporter::print_header(const parallel::ParallelTransformer& model,
                                    const parallel::ProcessGroups& model_groups,
                                    const std::string& transport_why,
                                    const backend::Backend& device, int threads) const {
  if (quiet_) return;
  const TrainConfig& t = cfg_.train;
  out_ << "model: " << family_name(cfg_.model.family) << " " << cfg_.model_name << ", "
       << model.table().total << " parameters; batch " << t.grad_accum << " x " << t.micro_batch
       << " x " << plan_.seq_len << " = " << plan_.tokens_per_step << " tokens/step; " << world_
       << " rank(s) x " << threads << " threads; MFU baseline: " << peak_.name << " "
       << std::fixed << std::setprecision(0) << peak_.gflops << " GFLOP/s per rank; MFU counts "
       << attention_flops_name(AttentionFlops::Causal)
       << (cfg_.model.moe() ? " and the active FLOPs (" + std::to_string(cfg_.model.experts_per_token) +
                                  " of " + std::to_string(cfg_.model.n_experts) + " experts per token)"
                            : std::string())
       << "\n" << std::defaultfloat;
  if (world_ > 1) out_ << model.overlap().summary() << "\n";
  if (t.device != "cpu") out_ << "device: " << device.description() << "\n";
  // After the model is made: its device registered with the groups (the staging is known).
  out_ << "comm: " << model_groups.transport_summary() << " (" << transport_why << ")\n";
}

void ProgressReporter::print_rank_shares(const parallel::ParallelTransformer& model,
                                         const parallel::ProcessGroups& groups,
                                         std::ostream& log) const {
  const TrainConfig& t = cfg_.train;
  const double MiB = double(1 << 20);
  for (int r = 0; r < world_; ++r) {
    if (r == groups.world.rank() && !quiet_) {
      log << groups.summary() << "; " << model.num_local_params() << " of " << model.table().total
          << " parameters, " << plan_.local_batch << " of " << t.micro_batch
          << " sequences per micro-batch" << "; memory: state " << std::fixed
          << std::setprecision(2) << double(model.state_bytes()) / MiB
          << " MiB (parallel.zero = " << cfg_.zero << "), activations "
          << double(model.activation_bytes()) / MiB << " MiB (train.recompute = " << t.recompute
          << "; none: " << double(model.activation_bytes(parallel::Recompute::None)) / MiB
          << " MiB, saved "
          << double(model.activation_bytes(parallel::Recompute::None) - model.activation_bytes()) / MiB
          << " MiB)";
      if (model.context_bytes() > 0)  // the context axis's exchange buffers
        log << ", context exchange " << double(model.context_bytes()) / MiB << " MiB ("
            << (model.options().cp_comm == parallel::ContextComm::Ring ? "ring" : "all-gather")
            << ")";
      if (model.expert_exchange_bound() > 0)  // the expert fold's scratch, grown as it is used
        log << ", expert exchange up to " << double(model.expert_exchange_bound()) / MiB
            << " MiB (dropless worst case)";
      log << std::defaultfloat << std::endl;
    }
    if (world_ > 1) groups.world.barrier();
  }
}

void ProgressReporter::print_precision(const parallel::ParallelTransformer& model,
                                       const backend::Backend& device,
                                       const std::string& layouts_resumed) const {
  if (quiet_) return;
  const TrainConfig& t = cfg_.train;
  const std::string attn_path = &model.compute_backend() == &backend::cpu_backend()
                                    ? " (" + backend::cpu_backend().bf16_status().attention_path + ")"
                                    : std::string();
  const bool attn_bf16 = model.attention_precision() == backend::Precision::BF16;
  if (plan_.bf16())
    out_ << "precision: bf16 GEMMs, fp32 master weights and optimizer; "
         << device.capabilities().gemm_bf16_path
         << (t.precision == "auto" ? " (auto: " + plan_.precision_why + ")" : "")
         << "; attention " << (attn_bf16 ? "bf16 products" + attn_path : std::string("fp32"))
         << (t.attention_precision == "auto" ? " (auto)" : "")
         << (t.activation_precision == "fp32" ? "; activations fp32 (train.activation_precision)"
                                              : "")
         << "\n";
  else if (attn_bf16)
    out_ << "precision: fp32 GEMMs; attention bf16 products" << attn_path << "\n";
  else if (t.precision == "auto")
    out_ << "precision: fp32 (auto: " << plan_.precision_why << ")\n";
  if (plan_.bf16())
    out_ << model.gemm_layout_summary() << " [train.gemm_layouts = "
         << (plan_.model.gemm_layout_plan.empty() ? t.gemm_layouts : std::string("<plan>")) << ": "
         << plan_.layouts_why << "]"
         << (layouts_resumed.empty() ? std::string() : "; on resume: " + layouts_resumed) << "\n";
}

void add_moe_metrics(StepMetrics& m, const parallel::MoeStats& s, bool moe) {
  m.moe = moe;
  if (!moe) return;
  m.moe_aux_loss = s.mean_aux();
  m.moe_z_loss = s.mean_z();
  m.expert_load_min = std::max<int64_t>(s.min_rows, 0);
  m.expert_load_max = std::max<int64_t>(s.max_rows, 0);
  m.expert_dropped = s.dropped;
  m.expert_load_imbalance = s.load_imbalance();
}

void ProgressReporter::start(int64_t start_step) {
  start_step_ = start_step;
  run_start_ = std::chrono::steady_clock::now();
}

StepMetrics ProgressReporter::measure(int64_t done, double loss, double lr, double grad_norm,
                                      double dropped_fraction, const StepBreakdown& time,
                                      std::chrono::steady_clock::time_point end) const {
  StepMetrics m;
  m.step = done;
  m.loss = loss;
  m.lr = lr;
  m.grad_norm = grad_norm;
  m.time = time;
  m.dropped_fraction = dropped_fraction;
  m.elapsed_s = std::chrono::duration<double>(end - run_start_).count();
  m.tokens_per_s = double(plan_.tokens_per_step) / time.step;
  m.mfu = flops_tok_ * m.tokens_per_s / (peak_.gflops * 1e9 * world_);
  m.hfu = hw_flops_tok_ * m.tokens_per_s / (peak_.gflops * 1e9 * world_);
  m.report_hfu = report_hfu_;
  m.peak_name = peak_.name;
  m.peak_gflops = peak_.gflops;
  return m;
}

void ProgressReporter::print_step(const StepMetrics& m, bool masking) const {
  const int64_t done = m.step, max_steps = cfg_.train.max_steps;
  if (quiet_ || !(done % cfg_.train.log_interval == 0 || done == max_steps || done == start_step_ + 1))
    return;
  const double eta = m.elapsed_s / double(done - start_step_) * double(max_steps - done);
  out_ << "step " << std::setw(5) << done << "/" << max_steps << " | loss " << std::fixed
       << std::setprecision(4) << m.loss << " | lr " << std::scientific << std::setprecision(2)
       << m.lr << " | gnorm " << std::fixed << std::setprecision(3) << m.grad_norm << " | "
       << std::setprecision(0) << m.tokens_per_s << " tok/s | MFU "
       // Above 100%, the peak was measured low (a disturbed register loop): no fraction of it
       // means anything, so none is printed (the header names the peak).
       << (m.mfu > 1 ? std::string("n/a (above the peak: measured low)") : fixed1(100 * m.mfu) + "%")
       << (m.report_hfu ? " | HFU " + (m.hfu > 1 ? std::string("n/a") : fixed1(100 * m.hfu) + "%")
                        : std::string())
       << " | "
       << format_duration(m.elapsed_s) << " elapsed, ETA " << format_duration(eta)
       << (masking ? " | dropped " + std::to_string(int(100 * m.dropped_fraction + 0.5)) + "%"
                   : std::string())
       << std::defaultfloat << std::endl;
  if (m.moe)
    out_ << "           experts: aux loss " << std::fixed << std::setprecision(4) << m.moe_aux_loss
         << " | z-loss " << m.moe_z_loss << " | load " << m.expert_load_min << ".."
         << m.expert_load_max << " tokens per expert | busiest " << std::setprecision(2)
         << m.expert_load_imbalance << "x the mean | dropped " << m.expert_dropped
         << std::defaultfloat << std::endl;
  const StepBreakdown& bd = m.time;
  auto pct = [&](double s) { return std::to_string(int(100 * s / bd.step + 0.5)) + "%"; };
  out_ << "           time: compute " << pct(bd.compute) << " | comm exposed "
       << pct(bd.comm_exposed) << " (" << int(100 * bd.hidden_fraction() + 0.5)
       << "% of comm hidden) | wait " << pct(bd.wait) << " | optimizer " << pct(bd.optimizer)
       << " | data " << pct(bd.data) << std::endl;
}

}  // namespace tetrad
