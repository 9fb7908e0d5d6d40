// CPU feature detection, process memory queries and the ceiling measurements.
// Nothing here asserts a speed: the measurements are only checked to run and return sane values.
// DISABLED_PrintCeilings prints the full set of ceilings (run it by hand, docs/benchmarks.md).
#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/backend/ceilings.hpp"
#include "tetrad/model/gemm_shapes.hpp"

namespace tetrad {
namespace {

TEST(Cpu, FeaturesAreConsistent) {
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(&f, &cpu_features()) << "detected once and cached";
  auto implies = [](bool a, bool b) { return !a || b; };
  EXPECT_TRUE(implies(f.avx512bw || f.avx512vl || f.avx512_bf16, f.avx512f));
  EXPECT_TRUE(implies(f.avx512f, f.avx2 && f.fma));
  EXPECT_TRUE(implies(f.amx_bf16 || f.amx_int8, f.amx_tile));
  EXPECT_TRUE(implies(f.os_avx512, f.os_avx));
  EXPECT_TRUE(implies(f.amx_permitted, f.amx_tile));
  EXPECT_TRUE(implies(f.use_avx512(), f.use_avx2_fma()));
  EXPECT_TRUE(implies(f.use_amx_bf16(), f.amx_bf16));
  const std::string s = f.summary();
  EXPECT_NE(s.find("best: " + f.best_isa()), std::string::npos) << s;
  std::cout << "cpu: " << s << "\n";
}

#if defined(__x86_64__) || defined(__i386__)
// libgcc's own detection (cpuid plus XCR0) must agree with ours.
TEST(Cpu, AgreesWithCompilerRuntime) {
  const CpuFeatures& f = cpu_features();
  __builtin_cpu_init();
  EXPECT_EQ(f.fma && f.os_avx, bool(__builtin_cpu_supports("fma")));
  EXPECT_EQ(f.avx2 && f.os_avx, bool(__builtin_cpu_supports("avx2")));
  EXPECT_EQ(f.avx512f && f.os_avx512, bool(__builtin_cpu_supports("avx512f")));
  EXPECT_EQ(f.avx512bw && f.os_avx512, bool(__builtin_cpu_supports("avx512bw")));
  EXPECT_EQ(f.avx512vl && f.os_avx512, bool(__builtin_cpu_supports("avx512vl")));
}
#endif

// TETRAD_MAX_CPU_ISA: the cap only lowers what use_* report, level by level.
TEST(Cpu, IsaCapLowersEveryPathAboveIt) {
  CpuFeatures all;
  all.avx2 = all.fma = all.avx512f = all.avx512bw = all.avx512vl = all.avx512_bf16 = true;
  all.amx_tile = all.amx_bf16 = all.amx_int8 = true;
  all.os_avx = all.os_avx512 = all.amx_permitted = true;
  EXPECT_EQ(all.best_isa(), "amx-bf16");
  const CpuFeatures a2 = with_isa_cap(all, IsaLevel::Avx2);
  EXPECT_TRUE(a2.use_avx2_fma());
  EXPECT_FALSE(a2.use_avx512() || a2.use_avx512_bf16() || a2.use_amx_bf16());
  EXPECT_EQ(a2.best_isa(), "avx2+fma");
  EXPECT_NE(a2.summary().find("capped at avx2 (TETRAD_MAX_CPU_ISA)"), std::string::npos);
  const CpuFeatures a5 = with_isa_cap(all, IsaLevel::Avx512);
  EXPECT_TRUE(a5.use_avx512());
  EXPECT_FALSE(a5.use_avx512_bf16() || a5.use_amx_bf16());
  const CpuFeatures ab = with_isa_cap(all, IsaLevel::Avx512Bf16);
  EXPECT_TRUE(ab.use_avx512_bf16());
  EXPECT_FALSE(ab.use_amx_bf16());
  const CpuFeatures sc = with_isa_cap(all, IsaLevel::Scalar);
  EXPECT_EQ(sc.best_isa(), "scalar");
  // A cap never adds what the CPU lacks.
  CpuFeatures avx2_only;
  avx2_only.avx2 = avx2_only.fma = avx2_only.os_avx = true;
  EXPECT_FALSE(with_isa_cap(avx2_only, IsaLevel::Amx).use_avx512());
  for (IsaLevel l : {IsaLevel::Scalar, IsaLevel::Avx2, IsaLevel::Avx512, IsaLevel::Avx512Bf16,
                     IsaLevel::Amx})
    EXPECT_EQ(parse_isa_level(isa_level_name(l)), l);
  try {
    parse_isa_level("sse9");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TETRAD_MAX_CPU_ISA = \"sse9\""), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("avx2, avx512, avx512_bf16 or amx"), std::string::npos);
  }
}

// Under CTest's CpuBranch.* runs (tests/CMakeLists.txt) the process was started with a cap:
// tetrad's dispatch and oneDNN's both stay at or below it.
TEST(Cpu, EnvironmentCapReachesTetradAndOneDnn) {
  const char* want = std::getenv("TETRAD_TEST_EXPECT_ISA_CAP");
  const CpuFeatures& f = cpu_features();
  if (!want) {
    EXPECT_FALSE(f.capped() && !std::getenv("TETRAD_MAX_CPU_ISA"));
    return;
  }
  const IsaLevel cap = parse_isa_level(want);
  EXPECT_EQ(f.max_isa, cap);
  if (!f.allows(IsaLevel::Avx512)) {
    EXPECT_FALSE(f.use_avx512());
  }
  if (!f.allows(IsaLevel::Avx512Bf16)) {
    EXPECT_FALSE(f.use_avx512_bf16());
  }
  if (!f.allows(IsaLevel::Amx)) {
    EXPECT_FALSE(f.use_amx_bf16());
  }
  const dnnl_cpu_isa_t eff = dnnl_get_effective_cpu_isa();
  std::cout << "cap " << want << ": " << f.best_isa() << ", oneDNN effective isa " << int(eff) << "\n";
  if (cap == IsaLevel::Avx2) {
    EXPECT_TRUE(eff == dnnl_cpu_isa_avx2 || eff == dnnl_cpu_isa_avx || eff == dnnl_cpu_isa_sse41)
        << int(eff);
  }
  if (cap != IsaLevel::Amx) {
    EXPECT_NE(eff, dnnl_cpu_isa_avx512_core_amx);
  }
}

TEST(Ceilings, Bf16PeakUsesTheWidestBf16UnitsAllowed) {
  const CpuFeatures& f = cpu_features();
  const Measurement m = measure_bf16_peak(1, 0.01, 2);
  ASSERT_TRUE(m.ok()) << m.skipped;
  EXPECT_TRUE(std::isfinite(m.value));
  const std::string want = f.use_amx_bf16()      ? "AMX-BF16 register loop"
                           : f.use_avx512_bf16() ? "AVX512-BF16 register loop"
                                                 : "bf16 GEMM ceiling";
  EXPECT_EQ(m.basis, want) << m.method;
  EXPECT_FALSE(m.method.empty());
  std::cout << "bf16 peak, 1 thread: " << m.value << " GFLOP/s (" << m.method << ")\n";
  EXPECT_EQ(measure_fma_peak(1, 0.01, 1).basis, "fp32 FMA register loop");
}

TEST(Cpu, CoresAndMemory) {
  int n = num_cores();
  EXPECT_GE(n, 1);
  unsigned hw = std::thread::hardware_concurrency();
  if (hw > 0) {
    EXPECT_LE(n, int(hw));
  }

  EXPECT_GT(peak_rss_bytes(), 0);
  const int64_t before = current_rss_bytes();
  EXPECT_GT(before, 0);
  const size_t bytes = size_t(64) << 20;
  std::vector<char> block(bytes);
  std::memset(block.data(), 1, bytes);  // touch every page
  const int64_t after = current_rss_bytes();
  EXPECT_GE(after - before, int64_t(bytes / 2)) << "before " << before << " after " << after;
  EXPECT_GE(peak_rss_bytes(), after - (int64_t(1) << 20));  // maxrss is in KiB: allow rounding
  EXPECT_EQ(block[bytes - 1], 1);
}

TEST(Ceilings, FmaPeakRuns) {
  double g = fma_peak_gflops(1);
  EXPECT_GT(g, 1.0);
  EXPECT_TRUE(std::isfinite(g));
  Measurement m = measure_fma_peak(2, 0.01, 2);
  EXPECT_TRUE(m.ok());
  EXPECT_EQ(m.samples.size(), 2u);
  EXPECT_GE(m.value, m.median);
  EXPECT_FALSE(m.method.empty());
}

// dnnl_sgemm, row-major, against a naive loop, in all four transpose combinations; and the
// storage convention GemmShape documents (transa == 'T': A stored [K,M]; transb == 'T': B [N,K]).
TEST(Ceilings, SgemmMatchesNaiveLoop) {
  const int M = 37, N = 53, K = 29;
  std::vector<float> A(M * K), B(K * N);
  for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.37f * float(i)) + 0.1f;
  for (size_t i = 0; i < B.size(); ++i) B[i] = std::cos(0.23f * float(i)) - 0.2f;
  for (char ta : {'N', 'T'}) {
    for (char tb : {'N', 'T'}) {
      const bool at = ta == 'T', bt = tb == 'T';
      const int lda = at ? M : K, ldb = bt ? K : N;
      std::vector<float> C(M * N, 123.0f);
      ASSERT_EQ(dnnl_sgemm(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), N),
                dnnl_success);
      double max_err = 0;
      for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
          double ref = 0;
          for (int k = 0; k < K; ++k) {
            double a = at ? A[k * M + i] : A[i * K + k];
            double b = bt ? B[j * K + k] : B[k * N + j];
            ref += a * b;
          }
          max_err = std::max(max_err, std::abs(ref - double(C[i * N + j])));
        }
      }
      EXPECT_LT(max_err, 1e-4) << "transa=" << ta << " transb=" << tb;
      Measurement m = measure_sgemm(GemmShape{"t", M, N, K, ta, tb}, 0, 2);
      EXPECT_TRUE(m.ok()) << m.method;
    }
  }
  EXPECT_THROW(measure_sgemm(GemmShape{"bad", 0, 4, 4, 'N', 'N'}, 1, 1), Error);
  EXPECT_THROW(measure_sgemm(GemmShape{"bad", 4, 4, 4, 'X', 'N'}, 1, 1), Error);
}

TEST(Ceilings, Bf16MatmulMeasuresOrSaysWhyNot) {
  Measurement m = measure_bf16_matmul(GemmShape{"t", 64, 96, 128, 'N', 'T'}, 0, 2);
  EXPECT_FALSE(m.method.empty());
  if (m.ok()) {
    EXPECT_EQ(m.samples.size(), 2u);
  } else {
    EXPECT_FALSE(m.skipped.empty());
    EXPECT_EQ(m.value, 0.0);
    std::cout << "bf16 matmul skipped: " << m.skipped << "\n";
  }
}

TEST(Ceilings, MemoryBandwidthRuns) {
  Measurement m = measure_memory_bandwidth(size_t(8) << 20, 2, 2);
  EXPECT_TRUE(m.ok());
  EXPECT_EQ(m.unit, "GB/s");
}

// The forward GEMMs of all layers add up to the model's matmul FLOPs (model_config.cpp):
// flops_per_token = 6·N_matmul + 12·L·C·T, and the forward pass is 2·N_matmul per token.
TEST(Ceilings, ModelGemmShapesMatchFlopCount) {
  for (const char* name : {"gpt2-124m", "llama-small"}) {
    ModelConfig c = named_model(name);
    const int T = 256;
    std::vector<GemmShape> shapes = model_gemm_shapes(c, T);
    ASSERT_EQ(shapes.size(), 15u);
    double fwd = 0, all = 0;
    for (const GemmShape& s : shapes) {
      const double per = s.name.rfind("lm_head", 0) == 0 ? 1.0 : double(c.n_layer);
      if (s.name.find(".fwd") != std::string::npos) fwd += per * s.flop();
      all += per * s.flop();
    }
    const double matmul_per_token = flops_per_token(c, c.max_seq) - 12.0 * c.n_layer * c.n_embd * c.max_seq;
    EXPECT_NEAR(fwd, T * matmul_per_token / 3.0, 1e-9 * fwd) << name;
    EXPECT_NEAR(all, T * matmul_per_token, 1e-9 * all) << name;
  }
  ModelConfig g = named_model("gpt2-124m");
  std::vector<GemmShape> s = model_gemm_shapes(g, 1024);
  const GemmShape& dw = s.back();
  EXPECT_EQ(dw.name, "lm_head.dw");
  EXPECT_EQ(dw.M, 50304);
  EXPECT_EQ(dw.N, 768);
  EXPECT_EQ(dw.K, 1024);
  EXPECT_EQ(dw.transa, 'T');
}

// The model-shape ceiling of two windows (before and after a benchmark's steps): each shape at
// its better window, FLOP-weighted; flagged when the windows are more than 20% apart or the step
// beat the best, never otherwise. Pure arithmetic on given rates (no timing).
TEST(Ceilings, TwoWindowsFlagAMovingClock) {
  const std::vector<double> flop = {2e9, 6e9};
  // Steady: 1000 and 900 GFLOP/s on the two shapes in both windows, the step at 600.
  CeilingWindows w = ceiling_windows(flop, {1000, 900}, {1000, 900}, 600);
  const double steady = 8e9 / (2e9 / 1000 + 6e9 / 900);
  EXPECT_DOUBLE_EQ(w.before, steady);
  EXPECT_DOUBLE_EQ(w.after, steady);
  EXPECT_DOUBLE_EQ(w.best, steady);
  EXPECT_DOUBLE_EQ(w.spread(), 0);
  EXPECT_FALSE(w.unstable());
  EXPECT_EQ(w.flag(), "");
  // Each shape at its better window: the best is above both windows' figures.
  w = ceiling_windows(flop, {1000, 800}, {700, 900}, 600);
  EXPECT_DOUBLE_EQ(w.best, steady);
  EXPECT_GT(w.best, std::max(w.before, w.after));
  EXPECT_LT(w.spread(), 0.2);
  EXPECT_FALSE(w.unstable());
  // The host's clock moved: 1636 before, 689 after (measured on this project's machine).
  w = ceiling_windows({1e9}, {1636}, {689}, 600);
  EXPECT_NEAR(w.spread(), (1636.0 - 689) / 689, 1e-12);
  EXPECT_TRUE(w.unstable());
  EXPECT_FALSE(w.step_above());
  EXPECT_EQ(w.flag(), "ceiling unstable: before 1636.0, after 689.0 GFLOP/s");
  // Within 20% but the step beat the best (134% of the ceiling): flagged too.
  w = ceiling_windows({1e9}, {300}, {320}, 1.34 * 320);
  EXPECT_LT(w.spread(), 0.2);
  EXPECT_TRUE(w.step_above());
  EXPECT_TRUE(w.unstable());
  EXPECT_EQ(w.flag(), "ceiling unstable: before 300.0, after 320.0 GFLOP/s");
  // Just inside and just outside the tolerance.
  EXPECT_FALSE(ceiling_windows({1e9}, {100}, {119.9}, 50).unstable());
  EXPECT_TRUE(ceiling_windows({1e9}, {100}, {120.1}, 50).unstable());
  EXPECT_TRUE(ceiling_windows({1e9}, {120.1}, {100}, 50).unstable());
  // A shape not measured in a window (0) is left out of that window only.
  w = ceiling_windows(flop, {0, 900}, {1000, 900}, 100);
  EXPECT_DOUBLE_EQ(w.before, 900);
  EXPECT_DOUBLE_EQ(w.best, steady);
  // Nothing measured: no ceiling, no flag from the spread.
  w = ceiling_windows({}, {}, {}, 100);
  EXPECT_EQ(w.best, 0);
  EXPECT_FALSE(w.unstable());
}

TEST(Ceilings, QuickMeasurementReports) {
  MachineCeilings mc = measure_ceilings(2, /*quick=*/true);
  EXPECT_EQ(mc.threads, 2);
  EXPECT_TRUE(mc.fma_1thread.ok());
  EXPECT_TRUE(mc.fma.ok());
  EXPECT_TRUE(mc.sgemm_square.ok());
  EXPECT_TRUE(mc.memory.ok());
  EXPECT_TRUE(mc.bf16_square.ok() || !mc.bf16_square.skipped.empty());
  const std::string text = mc.to_text();
  EXPECT_NE(text.find("FMA peak"), std::string::npos);
  nlohmann::json j = mc.to_json();
  EXPECT_GT(j["fma_peak"]["value"].get<double>(), 0.0);
  EXPECT_EQ(j["threads"].get<int>(), 2);
  std::cout << text;
}

// By hand: test_cpu --gtest_also_run_disabled_tests --gtest_filter='*PrintCeilings*'
TEST(Ceilings, DISABLED_PrintCeilings) {
  const int threads = num_cores();
  MachineCeilings mc = measure_ceilings(threads, /*quick=*/false);
  std::vector<GemmShape> shapes = {{"square", 4096, 4096, 4096, 'N', 'N'}};
  // gpt2-124m over 1024 tokens, as [in, out] products and their weight gradients.
  const int T = 1024, C = 768;
  for (auto [n, in, out] : {std::tuple{"qkv", C, 3 * C}, std::tuple{"fc", C, 4 * C},
                            std::tuple{"fc_proj", 4 * C, C}, std::tuple{"lm_head", C, 50304}}) {
    shapes.push_back({std::string(n) + ".x*W", T, out, in, 'N', 'N'});
    shapes.push_back({std::string(n) + ".xT*dy", in, out, T, 'T', 'N'});
  }
  for (const GemmShape& s : model_gemm_shapes(named_model("gpt2-124m"), T)) shapes.push_back(s);
  mc.model_gemms = measure_gemms(shapes, threads, 3, /*with_bf16=*/true);
  GemmResult big;
  big.shape = {"bf16 square", 8192, 8192, 8192, 'N', 'N'};
  big.bf16 = measure_bf16_matmul(big.shape, threads, 2);
  std::cout << mc.to_text();
  std::cout << "bf16 8192^3: "
            << (big.bf16.ok() ? std::to_string(big.bf16.value) : "n/a: " + big.bf16.skipped) << "\n";
  std::cout << mc.to_json().dump() << "\n";
}

}  // namespace
}  // namespace tetrad
