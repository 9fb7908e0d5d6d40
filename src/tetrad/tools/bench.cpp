#include "tetrad/tools/bench.hpp"

#include <mpi.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/profile.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/model/flops.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/memory_model.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/pipeline.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/backend/ceilings.hpp"
#include "tetrad/model/gemm_shapes.hpp"
#include "tetrad/train/optimizer.hpp"
#include "tetrad/train/step_runner.hpp"
#include "tetrad/train/trainer.hpp"
#include "tetrad/tools/bench_common.hpp"

namespace tetrad {

namespace {

using namespace bench_detail;

// Runs a shell command and returns its stdout ("" on failure).
std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// The PyTorch anchor: TETRAD_PYTORCH_PYTHON, else the venv bench/setup-pytorch.sh makes
// (.venv-pytorch in the working directory or the source tree), else a system Python with torch.
std::string default_anchor() {
  std::vector<std::string> pythons;
  if (const char* e = std::getenv("TETRAD_PYTORCH_PYTHON"); e && *e) pythons.push_back(e);
  for (const char* root : {".", TETRAD_SOURCE_DIR_STR})
    if (std::filesystem::exists(std::string(root) + "/.venv-pytorch/bin/python"))
      pythons.push_back(std::string(root) + "/.venv-pytorch/bin/python");
  pythons.push_back("/usr/bin/python3");
  pythons.push_back("python3");
  for (const std::string& py : pythons) {
    const std::string probe = std::string(py) + " -c 'import torch' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) {
      for (const char* script : {"bench/pytorch_gpt2.py", TETRAD_SOURCE_DIR_STR "/bench/pytorch_gpt2.py"})
        if (std::filesystem::exists(script)) return std::string(py) + " " + script;
    }
  }
  return "";
}


// ---- serial mode (run_bench) ------------------------------------------------------------------

// What a serial run times on: threads, the device, the peak MFU is reported against and the
// device's GEMM ceiling, the --json file and the PyTorch anchor command ("": none).
struct SerialMachine {
  int threads = 0;
  std::unique_ptr<backend::Backend> device_owner;
  backend::Backend* device = nullptr;
  bool on_gpu = false;
  backend::Precision precision = backend::Precision::FP32;
  bool bf16 = false;
  double fma_peak = 0;
  Measurement mfu_peak;
  std::string mfu_peak_name;
  double device_gemm_ceiling = 0;
  std::ofstream json_out;
  std::string anchor;
};

// Sets up `m` and prints the machine's lines: ceilings, libraries, device, precision, anchor.
void set_up_machine(const BenchOptions& opt, SerialMachine& m, std::ostream& out) {
  // The flags as the trainer's settings, refused before anything is measured.
  const RunConfig settings = bench_settings(opt, false);
  (void)resolve_settings(settings);
  const int threads = m.threads = opt.threads > 0 ? opt.threads : num_cores();
  omp_set_num_threads(threads);
  const dnnl_version_t* dv = dnnl_version();
  char mpi_version[MPI_MAX_LIBRARY_VERSION_STRING];
  int mpi_len = 0;
  MPI_Get_library_version(mpi_version, &mpi_len);
  std::string mpi_first_line(mpi_version, std::min<int>(mpi_len, 60));
  mpi_first_line = mpi_first_line.substr(0, mpi_first_line.find_first_of(",\n"));

  if (opt.batch < 0) fail("--batch ", opt.batch, ": expected a positive count (0: the standard batch)");
  // Where the model computes. A GPU is timed against its own peak and ceiling; the host CPU's
  // ceilings are still measured (quickly: they only describe the host there) for the log.
  m.device = &backend::cpu_backend();
  if (opt.device != "cpu") {
    m.device_owner = backend::create(opt.device);  // refuses naming what this build and machine lack
    m.device = m.device_owner.get();
  }
  backend::Backend* device = m.device;
  m.on_gpu = !(opt.device == "cpu" || opt.device == "cpu-strict");
  MachineCeilings ceil = measure_ceilings(threads, opt.quick_ceilings || m.on_gpu);
  out << ceil.to_text() << "libraries: oneDNN " << dv->major << "." << dv->minor << "." << dv->patch
      << ", " << mpi_first_line << "\n";
  m.fma_peak = ceil.fma.value;
  m.precision = run_precision(settings, *device).precision;  // as the run plan resolves it
  m.bf16 = m.precision == backend::Precision::BF16;
  // MFU against the peak of the arithmetic the run uses (bf16 matrix units or fp32 FMA; the CPU
  // backend's Backend::peak, here from the ceilings just measured).
  m.mfu_peak = m.bf16 ? ceil.bf16_peak : ceil.fma;
  m.mfu_peak_name =
      std::string(m.bf16 ? "bf16 matrix peak" : "fp32 FMA peak") + " (" + m.mfu_peak.basis + ")";
  // On a GPU: the device's peak (Backend::peak: its part's datasheet dense peak, else its measured
  // GEMM ceiling), and the GEMM ceiling the backend measures on a large square (fp32 TF32 or
  // bf16, cuBLASLt).
  if (m.on_gpu) {
    const backend::DevicePeak pk = device->peak(m.precision, threads);
    m.mfu_peak = Measurement{};
    m.mfu_peak.unit = "GFLOP/s";
    m.mfu_peak.value = pk.gflops;
    m.mfu_peak_name = pk.name;
    const backend::DeviceCeilings dc = device->ceilings(threads, opt.quick_ceilings);
    m.device_gemm_ceiling = m.bf16 ? dc.gemm_bf16_gflops : dc.gemm_fp32_gflops;
    out << "device: " << device->description() << "\n";
  } else if (opt.device != "cpu") {
    out << "device: " << device->description() << "\n";
  }
  if (m.bf16) out << "precision: bf16 GEMMs (fp32 accumulation, master weights, optimizer), "
                  << device->bf16_status().gemm_path << "\n";

  if (!opt.json_path.empty()) {
    m.json_out.open(opt.json_path);
    if (!m.json_out) fail("cannot write --json file '", opt.json_path, "'");
    m.json_out << nlohmann::json{{"machine", ceil.to_json()}}.dump() << "\n";
  }
  m.anchor = opt.anchor_cmd == "none" ? "" : (opt.anchor_cmd.empty() ? default_anchor() : opt.anchor_cmd);
  if (opt.anchor_cmd.empty() && m.anchor.empty())
    out << "anchor: PyTorch not importable (bash bench/setup-pytorch.sh makes its venv); ratios "
           "skipped\n";
}

// The rate of each shape's GEMM (sgemm, or the bf16 GEMM), GFLOP/s (0 where it failed).
std::vector<double> measure_model_ceiling(const std::vector<GemmShape>& shapes, bool bf16,
                                          int threads) {
  std::vector<double> rate;
  for (const GemmShape& s : shapes) {
    const Measurement m = bf16 ? measure_gemm_bf16(s, threads, 3) : measure_sgemm(s, threads, 3);
    rate.push_back(m.ok() ? m.value : 0);
  }
  return rate;
}

// bf16: oneDNN's matmul on bf16 operands (what the bf16 model stores) in the layouts the model's
// plan runs (parallel/gemm_layouts.hpp: the rule, or tuned at its construction), and in the
// fastest of NN/NT/TN/TT for each shape: the ceiling if every GEMM ran in its best layout.
struct LayoutCeiling {
  double step_layout_time = 0, best_layout_time = 0, bf16_flop = 0;
  std::string lines;  // one per shape
  double step_ceiling() const { return step_layout_time > 0 ? bf16_flop / step_layout_time / 1e9 : 0; }
  double best_ceiling() const { return best_layout_time > 0 ? bf16_flop / best_layout_time / 1e9 : 0; }
};

LayoutCeiling measure_layout_ceiling(const ModelConfig& mc, int64_t N,
                                     const parallel::GemmLayoutPlan& plan, int threads) {
  LayoutCeiling r;
  std::ostringstream layout_lines;
  for (const SiteGemm& g : model_site_gemms(mc, int(N))) {
    GemmShape s = g.shape;
    const parallel::GemmSiteLayout& l = plan.at(g.site);
    const bool fwd = g.pass == GemmPass::Fwd;
    const parallel::GemmForm f = fwd ? l.fwd : g.pass == GemmPass::Dx ? l.dx : l.dw;
    const std::string step_form = parallel::gemm_form_name(fwd, f);
    if (!fwd) s.transa = f.ta ? 'T' : 'N';
    // A transposed product Cᵀ = op(B)ᵀ·op(A)ᵀ is the plain [N, M] product with the operands'
    // roles and transposes swapped (its pass adding Cᵀ into C is not in this figure).
    GemmShape run = s;
    if (f.transposed) {
      run.M = s.N, run.N = s.M;
      run.transa = s.transb == 'T' ? 'N' : 'T';
      run.transb = s.transa == 'T' ? 'N' : 'T';
    }
    const Measurement used = measure_bf16_matmul(run, threads, 3);
    if (!used.ok()) continue;
    double best = used.value;
    std::string best_layout = step_form;
    for (const char* l : {"NN", "NT", "TN", "TT"}) {
      GemmShape t = s;
      t.transa = l[0], t.transb = l[1];
      if (!f.transposed && t.transa == s.transa && t.transb == s.transb) continue;
      const Measurement m = measure_bf16_matmul(t, threads, 3);
      if (m.ok() && m.value > best) best = m.value, best_layout = l;
    }
    r.bf16_flop += s.flop();
    r.step_layout_time += s.flop() / (used.value * 1e9);
    r.best_layout_time += s.flop() / (best * 1e9);
    layout_lines << "    " << std::left << std::setw(14) << s.name << std::right << " "
                 << s.M << "x" << s.N << "x" << s.K << ": step's " << step_form << " "
                 << std::fixed << std::setprecision(0) << used.value << " GFLOP/s, fastest "
                 << best_layout << " " << best << "\n";
  }
  r.lines = layout_lines.str();
  return r;
}

// One configuration's serial run: its shape, the timed steps and what was measured around them.
struct SerialRun {
  std::string name;
  ModelConfig mc;
  int B = 0, T = 0;
  int64_t N = 0;
  // The timed steps.
  double step_median = 0, total_time = 0;
  StepProfile profile;
  int64_t nparams = 0;
  parallel::ModelMemory mem;  // the memory formula for this model (parallel/memory_model.hpp)
  parallel::GemmLayoutPlan step_plan;
  int64_t peak_rss = 0;
  // Derived from them and the ceilings.
  double tok_s = 0, model_flops = 0, gemm_ceiling = 0;
  CeilingWindows ceiling;
  LayoutCeiling layouts;
};

// The one model on the trivial grid (1x1x1x1: every group this process), with the options the
// trainer's resolver gives this run on one rank (resolve_run_plan) and every overlap switch off
// (one rank has no collective to overlap): built, trained for warm-up + timed steps of the
// trainer's StepRunner; fills r's timed-step fields.
void run_serial_steps(const BenchOptions& opt, const SerialMachine& m, SerialRun& r,
                      std::ostream& out) {
  backend::Backend* device = m.device;
  parallel::ProcessGroups groups;
  Launch launch;
  launch.threads = m.threads;
  const RunPlan plan = resolve_run_plan(
      bench_run_config(bench_settings(opt, false), r.name, r.mc, r.B, r.T, 1, ""), launch, *device);
  parallel::ParallelOptions po = plan.model;
  po.device = device;
  po.overlap = parallel::OverlapOptions::all_off();
  parallel::ParallelTransformer model(r.mc, groups, plan.local_batch, plan.seq_len, po);
  r.step_plan = model.gemm_layout_plan();
  const std::string layout_summary = model.gemm_layout_summary() + " [--gemm-layouts " +
                                     opt.gemm_layouts + ": " + plan.layouts_why + "]";
  if (m.bf16) out << "  " << layout_summary << "\n";
  model.init_weights(1);
  AdamW adam = make_adam(model, *device);
  r.nparams = model.num_local_params();
  // The planner's and the trainer's formula, the same function (one rank, these options).
  r.mem = parallel::model_memory(r.mc, parallel::GridShape{}, parallel::GridCoord{}, r.B, r.T, po);
  const std::vector<int32_t> tokens = random_tokens(size_t(r.N + 1), r.mc.vocab_size);
  std::vector<double> times;
  TraceLog trace_log;
  StepProfile& profile = r.profile;
  if (!opt.trace_path.empty()) profile.trace = &trace_log;
  model.set_profile(&profile);
  // The trainer's step (train/step_runner.hpp) of one micro-batch, clipped at norm 1.
  StepOptions so;
  so.B = r.B;
  so.T = r.T;
  so.profile = &profile;
  StepRunner runner(model, adam, groups, so);
  for (int s = 0; s < opt.warmup + opt.steps; ++s) {
    if (s == opt.warmup) {
      profile.clear();
      trace_log.recording = true;
      trace_log.origin = std::chrono::steady_clock::now();
    }
    const auto t0 = std::chrono::steady_clock::now();
    runner.run(tokens.data(), tokens.data() + 1, double(r.N), 1e-4, s);
    device->queue().synchronize();  // a GPU's step ends when its queue has drained
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= opt.warmup) times.push_back(dt);
  }
  model.set_profile(nullptr);
  profile.trace = nullptr;  // trace_log ends here
  if (!opt.trace_path.empty()) {
    trace_log.recording = false;
    parallel::write_trace(comm::Communicator::self(), trace_log,
                          opt.configs.size() > 1 ? r.name + "." + opt.trace_path : opt.trace_path);
  }
  r.step_median = median(times);
  r.total_time = 0;
  for (double t : times) r.total_time += t;
}

// The report lines of a serial run after its steps: step time, tokens/s, MFU, the GEMM ceilings,
// memory, the time split and compute by phase. Returns the phases' seconds per step (--json).
nlohmann::json print_serial(const BenchOptions& opt, const SerialMachine& m, const SerialRun& r,
                            std::ostream& out) {
  backend::Backend* device = m.device;
  const parallel::ModelMemory& mem = r.mem;
  const double model_flops = r.model_flops, gemm_ceiling = r.gemm_ceiling;
  const CeilingWindows& ceiling = r.ceiling;
  // Memory that training needs, by the formula the planner and the trainer's fit check use:
  // fp32 parameters, gradients and Adam moments, the bf16 weight copy (bf16), staging buffers,
  // and the activation buffer (bf16 where bf16 activations are stored).
  const double needed = double(mem.total());
  std::ostringstream mem_terms;
  mem_terms << std::fixed << std::setprecision(1) << "params " << mem.params / 1048576.0;
  if (mem.params16 > 0) mem_terms << " + bf16 copy " << mem.params16 / 1048576.0;
  mem_terms << " + grads " << mem.grads / 1048576.0 << " + Adam " << mem.optimizer / 1048576.0
            << " + staging " << (mem.gathered + mem.staging) / 1048576.0 << " + activations "
            << mem.activations / 1048576.0;

  out << std::fixed << std::setprecision(3);
  out << "  step time (median of " << opt.steps << ", after " << opt.warmup
      << " warm-up): " << r.step_median << " s\n";
  out << std::setprecision(1);
  out << "  tokens/s:         " << r.tok_s << "\n";
  out << "  model FLOP/s:     " << model_flops / 1e9
      << " GFLOP/s  (6*N_matmul + 6*L*A*T per token: " << attention_flops_name(AttentionFlops::Causal)
      << (r.mc.moe() ? "; N_matmul active: the " + std::to_string(r.mc.experts_per_token) + " of " +
                           std::to_string(r.mc.n_experts) + " experts a token is routed to and the router"
                     : std::string())
      << ", as `tetrad plan` and `tetrad train` count)\n";
  // Above 100% the peak was measured low (a disturbed register loop): no fraction of it means
  // anything, so none is printed (the JSON row keeps the ratio, with mfu_above_peak).
  const double mfu = model_flops / (m.mfu_peak.value * 1e9);
  out << "  MFU:              ";
  if (mfu > 1) out << "n/a (above the peak: measured low)";
  else out << 100 * mfu << "%";
  out << " of the " << m.mfu_peak_name << ", " << m.mfu_peak.value << " GFLOP/s\n";
  const char* ceiling_of = m.bf16 ? "the bf16 GEMM" : "sgemm";
  if (m.on_gpu) {
    out << "  GEMM ceiling:     " << 100 * model_flops / (gemm_ceiling * 1e9) << "% of "
        << ceiling_of << " on " << device->name() << " (" << gemm_ceiling << " GFLOP/s)\n";
  } else if (ceiling.unstable()) {
    // No fraction: neither window measured the machine the step ran on.
    out << "  GEMM ceiling:     " << ceiling.flag() << " (" << ceiling_of
        << " on this model's shapes, measured before and after the steps: spread "
        << 100 * ceiling.spread() << "%";
    if (ceiling.step_above())
      out << "; the step's " << model_flops / 1e9 << " model GFLOP/s beat the best of them, "
          << ceiling.best;
    out << "); no fraction of it is given\n";
  } else {
    out << "  GEMM ceiling:     " << 100 * model_flops / (gemm_ceiling * 1e9) << "% of "
        << ceiling_of << " on this model's shapes (" << gemm_ceiling
        << " GFLOP/s, each shape's best of before the steps " << ceiling.before << " and after "
        << ceiling.after << ": spread " << 100 * ceiling.spread() << "%)\n";
  }
  const double best_layout_ceiling = r.layouts.best_ceiling();
  if (best_layout_ceiling > 0) {
    out << "  bf16 GEMM ceiling on this model's shapes (oneDNN matmul, bf16 operands):\n"
        << r.layouts.lines << std::setprecision(1)
        << "    FLOP-weighted: " << r.layouts.step_ceiling() << " GFLOP/s in the step's layouts, "
        << best_layout_ceiling << " in the fastest layouts; model FLOP/s = "
        << 100 * model_flops / (best_layout_ceiling * 1e9) << "% of the fastest-layout ceiling\n";
    const std::string choices = backend::cpu_backend().bf16_status().layout_choices;
    if (!choices.empty()) {
      out << "  layout choices (kernels::gemm_bf16):\n";
      std::istringstream lines(choices);
      for (std::string l; std::getline(lines, l);) out << "    " << l << "\n";
    }
  }
  if (!device->capabilities().host_visible)
    out << "  memory:           on " << device->name() << ": " << needed / 1048576.0
        << " MiB by the formula (" << mem_terms.str() << "); the host process's peak RSS follows\n";
  out << "  memory:           peak RSS " << r.peak_rss / 1048576.0 << " MiB vs "
      << needed / 1048576.0 << " MiB by the formula (" << mem_terms.str() << "): "
      << std::setprecision(2) << double(r.peak_rss) / needed << "x\n";
  out << "  time split:       compute 100% | exposed communication 0% | idle 0% (1 rank)\n";
  out << "  compute by phase: ";
  nlohmann::json phases;
  // "other" is Phase::Other (model code outside the named kernels) plus the step time no
  // phase recorded (loop overhead): one entry, so the shares add up to 100%.
  const double untimed = std::max(0.0, r.total_time - r.profile.total());
  for (int ph = 0; ph < int(Phase::Count); ++ph) {
    const double sec = r.profile.seconds[ph] + (Phase(ph) == Phase::Other ? untimed : 0.0);
    phases[phase_name(Phase(ph))] = sec / opt.steps;
    out << phase_name(Phase(ph)) << " " << std::setprecision(1) << 100 * sec / r.total_time << "%"
        << (ph + 1 < int(Phase::Count) ? ", " : "\n");
  }
  return phases;
}

// The --json row of a serial run (without the PyTorch fields).
nlohmann::json serial_json(const BenchOptions& opt, const SerialMachine& m, const SerialRun& r,
                           const nlohmann::json& phases) {
  const double model_flops = r.model_flops, gemm_ceiling = r.gemm_ceiling;
  const CeilingWindows& ceiling = r.ceiling;
  const bool on_gpu = m.on_gpu;
  nlohmann::json j = {{"config", r.name}, {"family", family_name(r.mc.family)},
                      {"device", m.device->name()},
                      {"precision", opt.precision}, {"batch", r.B}, {"seq", r.T}, {"threads", m.threads},
                      {"params", r.nparams}, {"median_step_s", r.step_median},
                      {"tokens_per_s", r.tok_s}, {"model_gflops", model_flops / 1e9},
                      {"mfu", model_flops / (m.mfu_peak.value * 1e9)},
                      {"mfu_above_peak", model_flops > m.mfu_peak.value * 1e9},
                      {"mfu_attention", "causal"},
                      {"mfu_peak", m.mfu_peak_name}, {"mfu_peak_gflops", m.mfu_peak.value},
                      {"mfu_fma", model_flops / (m.fma_peak * 1e9)},
                      {"gemm_ceiling_gflops", gemm_ceiling},
                      {"gemm_ceiling_before_gflops", ceiling.before},
                      {"gemm_ceiling_after_gflops", ceiling.after},
                      {"gemm_ceiling_spread", ceiling.spread()},
                      {"gemm_ceiling_unstable", !on_gpu && ceiling.unstable()},
                      // null where the ceiling is unstable: no window saw the step's machine
                      {"frac_gemm_ceiling", !on_gpu && ceiling.unstable()
                                                ? nlohmann::json(nullptr)
                                                : nlohmann::json(model_flops / (gemm_ceiling * 1e9))},
                      {"peak_rss_mb", r.peak_rss / 1048576.0},
                      {"needed_mb", double(r.mem.total()) / 1048576.0},
                      {"phase_seconds_per_step", phases}};
  if (m.bf16) {
    j["gemm_layouts"] = r.step_plan.to_string();
    j["gemm_layouts_source"] = r.step_plan.source;
  }
  const double best_layout_ceiling = r.layouts.best_ceiling();
  if (best_layout_ceiling > 0) {
    j["bf16_ceiling_step_layouts_gflops"] = r.layouts.step_ceiling();
    j["bf16_ceiling_fastest_layouts_gflops"] = best_layout_ceiling;
    j["frac_bf16_fastest_layout_ceiling"] = model_flops / (best_layout_ceiling * 1e9);
  }
  return j;
}

// The PyTorch anchor on the same configuration and CPU (GPT-2 family only): its line, and its
// fields in j.
void compare_pytorch(const BenchOptions& opt, const SerialMachine& m, const SerialRun& r,
                     nlohmann::json& j, std::ostream& out) {
  if (m.on_gpu && !m.anchor.empty())
    out << "  PyTorch anchor: skipped (it runs on the CPU; the GPU's anchors are llm.c and "
           "PyTorch on the GPU, docs/gpu.md)\n";
  if (m.anchor.empty() || m.on_gpu || r.mc.family != Family::GPT2) return;
  std::ostringstream cmd;
  cmd << m.anchor << " --config " << r.name << " --threads " << m.threads << " --steps "
      << opt.steps << " --warmup " << opt.warmup << " --precision " << opt.precision
      << " 2>/dev/null";
  const std::string res = run_capture(cmd.str());
  try {
    const auto line = res.substr(res.rfind('{'));
    auto pj = nlohmann::json::parse(line);
    const double pt = pj.at("tokens_per_s").get<double>();
    out << std::setprecision(1) << "  PyTorch " << pj.value("torch_version", "?") << " "
        << opt.precision << " (" << pj.value("attention", "explicit") << " attention):";
    if (pj.contains("modes")) {
      for (const auto& [mode, res_mode] : pj["modes"].items()) {
        if (res_mode.contains("tokens_per_s"))
          out << " " << mode << " " << res_mode["tokens_per_s"].get<double>() << " tokens/s;";
        else
          out << " " << mode << " failed;";
      }
    }
    out << " -> tetrad / PyTorch " << pj.value("best_mode", "eager") << " (the faster) = "
        << std::setprecision(2) << r.tok_s / pt << "x\n";
    j["pytorch_tokens_per_s"] = pt;
    j["pytorch_best_mode"] = pj.value("best_mode", "eager");
    if (pj.contains("modes")) j["pytorch_modes"] = pj["modes"];
    j["ratio_vs_pytorch"] = r.tok_s / pt;
  } catch (const std::exception&) {
    out << "  PyTorch anchor failed to run: " << cmd.str() << "\n";
  }
}

// One configuration of a serial run: its header, the model's GEMM ceiling before the steps, the
// steps, the ceilings after them, the report lines, the anchor and the --json row.
void bench_config(const BenchOptions& opt, SerialMachine& m, const std::string& name,
                  std::ostream& out) {
  SerialRun r;
  r.name = name;
  r.mc = named_model(name);
  const ModelConfig& mc = r.mc;
  r.B = opt.batch > 0 ? opt.batch : standard_batch(name);
  r.T = bench_seq(opt.seq, mc, name);
  r.N = int64_t(r.B) * r.T;
  out << "\n== " << name << " (" << family_name(mc.family) << ", L=" << mc.n_layer
      << " C=" << mc.n_embd << " heads=" << mc.n_head << " ffn=" << mc.ffn
      << " V=" << mc.vocab_size << ", B=" << r.B << " T=" << r.T << ", " << opt.precision << ")\n";

  // GEMM ceiling on the model's own shapes: total GEMM FLOPs / total time at measured rates
  // (of the GEMM this precision runs: sgemm, or the bf16 GEMM), measured in two windows, here
  // and again after the timed steps: the host's clock moves between them on a shared machine
  // (CeilingWindows, backend/ceilings.hpp), so each shape takes its better window and the
  // line says when the two disagree.
  std::vector<GemmShape> ceiling_shapes;
  std::vector<double> ceiling_flop;
  if (!m.on_gpu)  // the host's GEMM says nothing about the GPU's: device_gemm_ceiling
    for (const GemmShape& s : model_gemm_shapes(mc, int(r.N))) {
      ceiling_shapes.push_back(s);
      ceiling_flop.push_back(s.flop());
    }
  const std::vector<double> ceiling_before = measure_model_ceiling(ceiling_shapes, m.bf16, m.threads);

  run_serial_steps(opt, m, r, out);
  r.peak_rss = peak_rss_bytes();
  // The bf16 layout ceilings, measured after the model's steps (its plan is known then).
  if (m.bf16 && !m.on_gpu && m.device->bf16_status().native)
    r.layouts = measure_layout_ceiling(mc, r.N, r.step_plan, m.threads);
  r.tok_s = double(r.N) / r.step_median;
  r.model_flops = flops_per_token(mc, r.T, AttentionFlops::Causal) * r.tok_s;  // the planner's count
  r.ceiling = ceiling_windows(ceiling_flop, ceiling_before,
                              measure_model_ceiling(ceiling_shapes, m.bf16, m.threads),
                              r.model_flops / 1e9);
  r.gemm_ceiling = m.on_gpu ? m.device_gemm_ceiling : r.ceiling.best;

  const nlohmann::json phases = print_serial(opt, m, r, out);
  nlohmann::json j = serial_json(opt, m, r, phases);
  compare_pytorch(opt, m, r, j, out);
  out << std::defaultfloat;
  if (m.json_out) m.json_out << j.dump() << "\n";
}

}  // namespace

RunConfig bench_settings(const BenchOptions& opt, bool grids) {
  // The flag takes a mode only (a plan's text is train.gemm_layouts'); named as the user wrote it.
  if (opt.gemm_layouts != "auto" && opt.gemm_layouts != "rule" && opt.gemm_layouts != "tune")
    fail("--gemm-layouts \"", opt.gemm_layouts, "\": expected \"auto\", \"rule\" or \"tune\"");
  RunConfig cfg;
  cfg.train.precision = opt.precision;
  cfg.train.gemm_layouts = opt.gemm_layouts;
  cfg.train.device = opt.device;
  if (grids) {
    cfg.zero = opt.zero;
    cfg.train.recompute = opt.recompute;
    cfg.schedule = opt.schedule;
    cfg.virtual_stages = opt.virtual_stages;
    cfg.pipeline_layers = opt.pipeline_layers;
  }
  return cfg;
}

void run_bench(const BenchOptions& opt, std::ostream& out) {
  SerialMachine m;
  set_up_machine(opt, m, out);
  for (const std::string& name : opt.configs) bench_config(opt, m, name, out);
}

}  // namespace tetrad
