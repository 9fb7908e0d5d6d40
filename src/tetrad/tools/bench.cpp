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
#include <nlohmann/json.hpp>
#include <sstream>

#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/profile.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/model/transformer.hpp"
#include "tetrad/tools/ceilings.hpp"
#include "tetrad/train/optimizer.hpp"

namespace tetrad {

namespace {

// Standard micro-batch of each configuration (benchmarks.md).
int standard_batch(const std::string& name) {
  if (name == "gpt2-124m") return 1;
  return 4;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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

std::string default_anchor() {
  for (const char* py : {"/usr/bin/python3", "python3"}) {
    const std::string probe = std::string(py) + " -c 'import torch' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) {
      for (const char* script : {"bench/pytorch_gpt2.py", TETRAD_SOURCE_DIR_STR "/bench/pytorch_gpt2.py"})
        if (std::filesystem::exists(script)) return std::string(py) + " " + script;
    }
  }
  return "";
}

}  // namespace

void run_bench(const BenchOptions& opt, std::ostream& out) {
  const int threads = opt.threads > 0 ? opt.threads : num_cores();
  omp_set_num_threads(threads);
  const dnnl_version_t* dv = dnnl_version();
  char mpi_version[MPI_MAX_LIBRARY_VERSION_STRING];
  int mpi_len = 0;
  MPI_Get_library_version(mpi_version, &mpi_len);
  std::string mpi_first_line(mpi_version, std::min<int>(mpi_len, 60));
  mpi_first_line = mpi_first_line.substr(0, mpi_first_line.find_first_of(",\n"));

  MachineCeilings ceil = measure_ceilings(threads, opt.quick_ceilings);
  out << ceil.to_text() << "libraries: oneDNN " << dv->major << "." << dv->minor << "." << dv->patch
      << ", " << mpi_first_line << "\n";
  const double fma_peak = ceil.fma.value;

  std::ofstream json_out;
  if (!opt.json_path.empty()) {
    json_out.open(opt.json_path);
    if (!json_out) fail("cannot write --json file '", opt.json_path, "'");
    json_out << nlohmann::json{{"machine", ceil.to_json()}}.dump() << "\n";
  }
  std::string anchor = opt.anchor_cmd == "none" ? "" : (opt.anchor_cmd.empty() ? default_anchor() : opt.anchor_cmd);
  if (opt.anchor_cmd.empty() && anchor.empty())
    out << "anchor: PyTorch not importable (apt-get install python3-torch); ratios skipped\n";

  for (const std::string& name : opt.configs) {
    const ModelConfig mc = named_model(name);
    const int B = standard_batch(name), T = mc.max_seq;
    const int64_t N = int64_t(B) * T;
    out << "\n== " << name << " (" << family_name(mc.family) << ", L=" << mc.n_layer
        << " C=" << mc.n_embd << " heads=" << mc.n_head << " ffn=" << mc.ffn
        << " V=" << mc.vocab_size << ", B=" << B << " T=" << T << ", fp32)\n";

    // GEMM ceiling on the model's own shapes: total GEMM FLOPs / total time at measured rates.
    auto gemms = measure_gemms(model_gemm_shapes(mc, int(N)), threads, 3);
    double gemm_flop = 0, gemm_time = 0;
    for (const auto& g : gemms)
      if (g.fp32.ok()) {
        gemm_flop += g.shape.flop();
        gemm_time += g.shape.flop() / (g.fp32.value * 1e9);
      }
    const double gemm_ceiling = gemm_time > 0 ? gemm_flop / gemm_time / 1e9 : 0;

    const int64_t rss_before = current_rss_bytes();
    double step_median = 0, total_time = 0;
    StepProfile profile;
    int64_t nparams = 0, act_bytes = 0;
    {
      TrainConfig tc;
      Transformer<float> model(mc, B, T);
      model.init_weights(1);
      AdamW adam(model.table(), tc);
      nparams = model.num_params();
      act_bytes = model.activation_bytes();
      Rng rng(7);
      std::vector<int32_t> tokens(N + 1);
      for (auto& t : tokens) t = int32_t(rng.next_u64() % uint64_t(mc.vocab_size));
      std::vector<double> times;
      model.set_profile(&profile);
      for (int s = 0; s < opt.warmup + opt.steps; ++s) {
        if (s == opt.warmup) profile.clear();
        const auto t0 = std::chrono::steady_clock::now();
        {
          ScopedPhase sp(&profile, Phase::Optimizer);
          model.zero_grads();
        }
        model.forward_backward(tokens.data(), tokens.data() + 1, B, T, 1.0f / float(N));
        {
          ScopedPhase sp(&profile, Phase::Optimizer);
          const double gn = grad_norm(model.grads(), model.num_params());
          adam.update(model.params(), model.grads(), 1e-4, gn > 1 ? 1 / gn : 1, s + 1);
        }
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s >= opt.warmup) times.push_back(dt);
      }
      step_median = median(times);
      total_time = 0;
      for (double t : times) total_time += t;
    }
    const int64_t peak_rss = peak_rss_bytes();
    const double tok_s = double(N) / step_median;
    const double model_flops = flops_per_token(mc, T) * tok_s;
    // Memory that training needs: parameters, gradients, two Adam moments (fp32) + activations.
    const double needed = 16.0 * double(nparams) + double(act_bytes);

    out << std::fixed << std::setprecision(3);
    out << "  step time (median of " << opt.steps << ", after " << opt.warmup
        << " warm-up): " << step_median << " s\n";
    out << std::setprecision(1);
    out << "  tokens/s:         " << tok_s << "\n";
    out << "  model FLOP/s:     " << model_flops / 1e9
        << " GFLOP/s  (6*N_matmul + 12*L*C*T per token, PaLM appendix B)\n";
    out << "  MFU:              " << 100 * model_flops / (fma_peak * 1e9)
        << "% of the FMA peak (" << fma_peak << " GFLOP/s)\n";
    out << "  GEMM ceiling:     " << 100 * model_flops / (gemm_ceiling * 1e9)
        << "% of sgemm on this model's shapes (" << gemm_ceiling << " GFLOP/s)\n";
    out << "  memory:           peak RSS " << peak_rss / 1048576.0 << " MiB vs "
        << needed / 1048576.0 << " MiB needed (params+grads+Adam " << 16.0 * nparams / 1048576.0
        << " + activations " << act_bytes / 1048576.0 << "): " << std::setprecision(2)
        << double(peak_rss) / needed << "x\n";
    out << "  time split:       compute 100% | exposed communication 0% | idle 0% (1 rank)\n";
    out << "  compute by phase: ";
    nlohmann::json phases;
    for (int ph = 0; ph < int(Phase::Count); ++ph) {
      const double share = profile.seconds[ph] / total_time;
      phases[phase_name(Phase(ph))] = profile.seconds[ph] / opt.steps;
      out << phase_name(Phase(ph)) << " " << std::setprecision(1) << 100 * share << "%"
          << (ph + 1 < int(Phase::Count) ? ", " : "");
    }
    out << ", other " << 100 * (1 - profile.total() / total_time) << "%\n";
    (void)rss_before;

    nlohmann::json j = {{"config", name}, {"family", family_name(mc.family)},
                        {"precision", "fp32"}, {"batch", B}, {"seq", T}, {"threads", threads},
                        {"params", nparams}, {"median_step_s", step_median},
                        {"tokens_per_s", tok_s}, {"model_gflops", model_flops / 1e9},
                        {"mfu_fma", model_flops / (fma_peak * 1e9)},
                        {"gemm_ceiling_gflops", gemm_ceiling},
                        {"frac_gemm_ceiling", model_flops / (gemm_ceiling * 1e9)},
                        {"peak_rss_mb", peak_rss / 1048576.0}, {"needed_mb", needed / 1048576.0},
                        {"phase_seconds_per_step", phases}};

    if (!anchor.empty() && mc.family == Family::GPT2) {
      std::ostringstream cmd;
      cmd << anchor << " --config " << name << " --threads " << threads << " --steps "
          << opt.steps << " --warmup " << opt.warmup << " --precision fp32 2>/dev/null";
      const std::string res = run_capture(cmd.str());
      try {
        const auto line = res.substr(res.rfind('{'));
        auto pj = nlohmann::json::parse(line);
        const double pt = pj.at("tokens_per_s").get<double>();
        out << std::setprecision(1) << "  PyTorch " << pj.value("torch_version", "?")
            << " fp32:    " << pt << " tokens/s -> tetrad/PyTorch = " << std::setprecision(2)
            << tok_s / pt << "x\n";
        j["pytorch_tokens_per_s"] = pt;
        j["ratio_vs_pytorch"] = tok_s / pt;
      } catch (const std::exception&) {
        out << "  PyTorch anchor failed to run: " << cmd.str() << "\n";
      }
    }
    out << std::defaultfloat;
    if (json_out) json_out << j.dump() << "\n";
  }
}

}  // namespace tetrad
