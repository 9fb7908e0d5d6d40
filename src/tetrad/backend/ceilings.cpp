#include "tetrad/backend/ceilings.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <sstream>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TETRAD_X86 1
#endif

#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/backend/cpu/attention.hpp"
#include "tetrad/backend/cpu/precision.hpp"

namespace tetrad {

namespace {

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// Sets the OpenMP thread count for the libraries called inside a scope, restores it after.
class OmpThreads {
 public:
  explicit OmpThreads(int n) : prev_(omp_get_max_threads()), n_(n > 0 ? n : prev_) {
    omp_set_num_threads(n_);
  }
  ~OmpThreads() { omp_set_num_threads(prev_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;
  int n() const { return n_; }

 private:
  int prev_, n_;
};

// Fills `samples` statistics: value = best (largest rate), median.
void finish(Measurement& m) {
  if (m.samples.empty()) return;
  std::vector<double> s = m.samples;
  std::sort(s.begin(), s.end());
  m.value = s.back();
  size_t n = s.size();
  m.median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

// Appends `reps` rates to m.samples: `work` over the seconds each call of `timed` returns, x 1e-9
// (GFLOP/s for FLOPs, GB/s for bytes).
template <typename Timed>
void sample_rates(Measurement& m, int reps, double work, Timed&& timed) {
  for (int r = 0; r < reps; ++r) m.samples.push_back(work / timed() * 1e-9);
}

// Calls `call` once untimed (page-in, thread pool, kernel generation), then samples `reps` calls
// timed on the wall clock.
template <typename Call>
void time_calls(Measurement& m, int reps, double work, Call&& call) {
  call();
  sample_rates(m, reps, work, [&] {
    const double t0 = now_s();
    call();
    return now_s() - t0;
  });
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
std::unique_ptr<T[], FreeDeleter> alloc_aligned(size_t n) {
  size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes > 0 ? bytes : 64);
  if (!p) fail("out of memory allocating ", bytes, " bytes for a ceiling measurement");
  return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(p));
}

// Deterministic values in [-1, 1), no denormals.
void fill(float* x, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = float(s >> 8) / float(1u << 23) - 1.0f;
  }
}

std::string fmt(double v, int prec = 1) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(prec);
  os << v;
  return os.str();
}

// ---------------------------------------------------------------- FMA peak kernels
//
// Each kernel runs `iters` iterations of `chains` independent c = c*a + b updates kept in
// registers, and returns the sum of the chains so the work cannot be dropped. a and b arrive as
// run-time values, so nothing folds; c converges to b/(1-a) = 1 (no overflow, no denormals).

using FmaKernel = float (*)(int64_t iters, float a, float b);

// The sum of every lane of a kernel's accumulators, stored to `lanes` by the kernel (only so the
// work cannot be dropped: the value is never read).
float sum_lanes(const float* lanes, int n) {
  float r = 0;
  for (int i = 0; i < n; ++i) r += lanes[i];
  return r;
}

#ifdef TETRAD_X86
// The chains are arrays, fully unrolled in the loop, so each stays in its own register (as the
// bf16 kernels below).
constexpr int kAvx512Chains = 16;
__attribute__((target("avx512f,fma"), noinline)) float fma_avx512(int64_t iters, float a,
                                                                   float b) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  __m512 c[kAvx512Chains];
  for (int j = 0; j < kAvx512Chains; ++j) c[j] = _mm512_set1_ps(0.01f * float(j));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < kAvx512Chains; ++j) c[j] = _mm512_fmadd_ps(c[j], va, vb);
  }
  alignas(64) float lanes[16 * kAvx512Chains];
  for (int j = 0; j < kAvx512Chains; ++j) _mm512_store_ps(lanes + 16 * j, c[j]);
  return sum_lanes(lanes, 16 * kAvx512Chains);
}

constexpr int kAvx2Chains = 12;  // 12 accumulators + a + b = 14 of the 16 ymm registers
__attribute__((target("avx2,fma"), noinline)) float fma_avx2(int64_t iters, float a, float b) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  __m256 c[kAvx2Chains];
  for (int j = 0; j < kAvx2Chains; ++j) c[j] = _mm256_set1_ps(0.01f * float(j));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kAvx2Chains; ++j) c[j] = _mm256_fmadd_ps(c[j], va, vb);
  }
  alignas(32) float lanes[8 * kAvx2Chains];
  for (int j = 0; j < kAvx2Chains; ++j) _mm256_store_ps(lanes + 8 * j, c[j]);
  return sum_lanes(lanes, 8 * kAvx2Chains);
}
#endif

#ifdef TETRAD_X86
// ---------------------------------------------------------------- bf16 matrix peak kernels
//
// The same idea for the bf16 matrix units: independent accumulations held in registers (AMX
// tiles, or zmm registers for AVX512-BF16), operands loaded once, so only the multiply units are
// timed. Operands are bf16 copies of a and b; accumulators grow by 32·a·b per step (no overflow
// for any count the calibration reaches).

// One AMX step: 4 x TDPBF16PS, each C[16x16 fp32] += A[16x32 bf16] · B[32x16 bf16] (K = 32:
// 16 pairs per 64-byte row) = 2·16·16·32 FLOP; tiles 0-3 accumulate, 4-5 hold A, 6-7 hold B.
constexpr double kAmxFlopPerIter = 4.0 * 2 * 16 * 16 * 32;
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-bf16"), noinline)) float amx_bf16_loop(int64_t iters, float a,
                                                                          float b) {
  AmxTileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  alignas(64) uint16_t A[16 * 32], B[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) {
    A[i] = kernels::float_to_bf16(a * (1.0f + float(i % 7) * 1e-3f));
    B[i] = kernels::float_to_bf16(b * (1.0f + float(i % 5) * 1e-3f));
  }
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, A, 64);
  _tile_loadd(5, A, 64);
  _tile_loadd(6, B, 64);
  _tile_loadd(7, B, 64);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float lanes[4 * 16 * 16];
  _tile_stored(0, lanes, 64);
  _tile_stored(1, lanes + 256, 64);
  _tile_stored(2, lanes + 512, 64);
  _tile_stored(3, lanes + 768, 64);
  _tile_release();
  return sum_lanes(lanes, 4 * 16 * 16);
}

// AVX512-BF16: 16 independent zmm chains of VDPBF16PS (16 fp32 lanes, each += 2 bf16 products:
// 64 FLOP per instruction).
constexpr int kBf16Chains = 16;
__attribute__((target("avx512f,avx512bf16"), noinline)) float avx512_bf16_loop(int64_t iters,
                                                                              float a, float b) {
  const __m512bh va = _mm512_cvtne2ps_pbh(_mm512_set1_ps(a), _mm512_set1_ps(a));
  const __m512bh vb = _mm512_cvtne2ps_pbh(_mm512_set1_ps(b), _mm512_set1_ps(b));
  __m512 c[kBf16Chains];
  for (int j = 0; j < kBf16Chains; ++j) c[j] = _mm512_set1_ps(0.01f * float(j));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < kBf16Chains; ++j) c[j] = _mm512_dpbf16_ps(c[j], va, vb);
  }
  alignas(64) float lanes[16 * kBf16Chains];
  for (int j = 0; j < kBf16Chains; ++j) _mm512_store_ps(lanes + 16 * j, c[j]);
  return sum_lanes(lanes, 16 * kBf16Chains);
}
#endif

constexpr int kScalarChains = 8;
__attribute__((noinline)) float fma_scalar(int64_t iters, float a, float b) {
  float c[kScalarChains];
  for (int j = 0; j < kScalarChains; ++j) c[j] = 0.01f * j;
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kScalarChains; ++j) c[j] = c[j] * a + b;
  return sum_lanes(c, kScalarChains);
}

volatile float g_sink = 0;        // results of the FMA kernels end here
volatile float g_fma_a = 0.999f;  // run-time operands: the compiler cannot fold the loop
volatile float g_fma_b = 0.001f;

// Runs the kernel on `threads` threads at once and returns the time that, with the FLOP of all
// threads, gives their summed rate: each thread's rate is its FLOP over its own CPU time
// (CLOCK_THREAD_CPUTIME_ID), so a register loop measures what the core does while it runs, not
// how much of the wall clock other processes left it. (Timed on the wall clock, the peak fell
// 10x on a loaded machine and `train` printed MFU over 100% against it.) On an idle machine the
// two clocks agree. Also returns the number of threads that actually ran.
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double run_fma(FmaKernel k, int threads, int64_t iters, int* ran) {
  const float a = g_fma_a, b = g_fma_b;
  float sum = 0;
  double inv_sum = 0;  // sum over threads of 1 / (that thread's CPU seconds)
  int team = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum, inv_sum)
  {
#pragma omp single
    team = omp_get_num_threads();
    // implicit barrier: everyone starts together
    const double c0 = thread_cpu_s();
    sum += k(iters, a, b);
    inv_sum += 1.0 / std::max(thread_cpu_s() - c0, 1e-9);
  }
  g_sink = g_sink + sum;
  if (ran) *ran = team;
  return double(team) / inv_sum;
}

// ---------------------------------------------------------------- oneDNN helpers

const char* isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
#if DNNL_VERSION_MAJOR < 3  // oneDNN 3 dropped the Xeon Phi ISAs
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
#endif
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    default: return "unknown";
  }
}

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream os;
  os << "oneDNN " << v->major << "." << v->minor << "." << v->patch << " (cpu isa "
     << isa_name(dnnl_get_effective_cpu_isa()) << ")";
  return os.str();
}

void check_shape(const GemmShape& s) {
  if (s.M <= 0 || s.N <= 0 || s.K <= 0)
    fail("GEMM shape ", s.to_string(), ": M, N and K must be positive");
  auto t = [](char c) { return c == 'N' || c == 'n' || c == 'T' || c == 't'; };
  if (!t(s.transa) || !t(s.transb))
    fail("GEMM shape ", s.to_string(), ": transa/transb must be 'N' or 'T'");
}
bool is_t(char c) { return c == 'T' || c == 't'; }

}  // namespace

// ---------------------------------------------------------------- public

nlohmann::json Measurement::to_json() const {
  nlohmann::json j;
  j["value"] = value;
  j["median"] = median;
  j["unit"] = unit;
  j["method"] = method;
  if (!skipped.empty()) j["skipped"] = skipped;
  if (!basis.empty()) j["basis"] = basis;
  j["samples"] = samples;
  return j;
}

double CeilingWindows::spread() const {
  if (!(before > 0) || !(after > 0)) return 0;
  return std::abs(before - after) / std::min(before, after);
}

std::string CeilingWindows::flag() const {
  if (!unstable()) return "";
  return "ceiling unstable: before " + fmt(before) + ", after " + fmt(after) + " GFLOP/s";
}

CeilingWindows ceiling_windows(const std::vector<double>& flop, const std::vector<double>& before,
                               const std::vector<double>& after, double achieved_gflops,
                               double tolerance) {
  TETRAD_CHECK(flop.size() == before.size() && flop.size() == after.size());
  // FLOP-weighted: total FLOPs over the total time at each shape's rate.
  double f[3] = {0, 0, 0}, t[3] = {0, 0, 0};
  for (size_t i = 0; i < flop.size(); ++i) {
    const double rates[3] = {before[i], after[i], std::max(before[i], after[i])};
    for (int k = 0; k < 3; ++k)
      if (rates[k] > 0) f[k] += flop[i], t[k] += flop[i] / rates[k];
  }
  CeilingWindows w;
  w.before = t[0] > 0 ? f[0] / t[0] : 0;
  w.after = t[1] > 0 ? f[1] / t[1] : 0;
  w.best = t[2] > 0 ? f[2] / t[2] : 0;
  w.achieved = achieved_gflops;
  w.tolerance = tolerance;
  return w;
}

std::string GemmShape::to_string() const {
  std::ostringstream os;
  if (!name.empty()) os << name << " ";
  os << M << "x" << N << "x" << K << " " << transa << transb;
  return os.str();
}

namespace {
// Times a register-only loop (the FMA and bf16 peaks): calibrate by growing the iteration count
// until one run takes 10 ms, then scale it to `seconds` using the fastest of three runs, never
// going below the calibration count (a run slowed by another process must not shrink the loop to
// nothing; these runs also bring the cores up to clock); then `reps` timed runs.
// flop_per_iter is per thread.
Measurement time_register_loop(FmaKernel kernel, double flop_per_iter, int threads,
                               double seconds, int reps, int* ran_out, int64_t* iters_out) {
  int ran = threads;
  int64_t iters = 1 << 10;
  double t = run_fma(kernel, threads, iters, &ran);
  while (t < 0.01 && iters < (int64_t(1) << 40)) {
    iters *= 4;
    t = run_fma(kernel, threads, iters, &ran);
  }
  for (int i = 0; i < 2; ++i) t = std::min(t, run_fma(kernel, threads, iters, &ran));
  iters = std::max(iters, int64_t(double(iters) * seconds / std::max(t, 1e-9)));
  Measurement m;
  m.unit = "GFLOP/s";
  // One thread's FLOPs over one thread's share of the time: the rate of all `ran` threads.
  sample_rates(m, reps, flop_per_iter * double(iters),
               [&] { return run_fma(kernel, threads, iters, &ran) / ran; });
  finish(m);
  *ran_out = ran;
  *iters_out = iters;
  return m;
}
}  // namespace

Measurement measure_fma_peak(int threads, double seconds, int reps) {
  if (threads <= 0) threads = omp_get_max_threads();
  if (reps <= 0) reps = 1;
  const CpuFeatures& cpu = cpu_features();
  FmaKernel kernel = fma_scalar;
  int lanes = 1, chains = kScalarChains;
  std::string what = "8 scalar multiply-add chains (baseline x86-64 code; the compiler may pack "
                     "them into SSE)";
#ifdef TETRAD_X86
  if (cpu.use_avx512()) {
    kernel = fma_avx512, lanes = 16, chains = kAvx512Chains;
    what = "AVX-512 vfmadd, 16 independent zmm chains";
  } else if (cpu.use_avx2_fma()) {
    kernel = fma_avx2, lanes = 8, chains = kAvx2Chains;
    what = "AVX2 vfmadd, 12 independent ymm chains";
  }
#endif
  const double flop_per_iter = 2.0 * lanes * chains;  // one FMA = 2 FLOP per lane

  int ran = threads;
  int64_t iters = 0;
  Measurement m = time_register_loop(kernel, flop_per_iter, threads, seconds, reps, &ran, &iters);
  m.basis = "fp32 FMA register loop";
  m.method = "register-only FMA loop: " + what + ", " + std::to_string(ran) + " thread(s) x " +
             std::to_string(iters) + " iterations (" + fmt(seconds * 1e3, 0) +
             " ms, each thread timed on its own CPU clock), best of " + std::to_string(reps);
  return m;
}

Measurement measure_bf16_peak(int threads, double seconds, int reps) {
  if (threads <= 0) threads = omp_get_max_threads();
  if (reps <= 0) reps = 1;
  const CpuFeatures& cpu = cpu_features();
  int ran = threads;
  int64_t iters = 0;
  Measurement m;
#ifdef TETRAD_X86
  if (cpu.use_amx_bf16() || cpu.use_avx512_bf16()) {
    const bool amx = cpu.use_amx_bf16();
    m = amx ? time_register_loop(amx_bf16_loop, kAmxFlopPerIter, threads, seconds, reps, &ran,
                                 &iters)
            : time_register_loop(avx512_bf16_loop, 64.0 * kBf16Chains, threads, seconds, reps,
                                 &ran, &iters);
    m.basis = amx ? "AMX-BF16 register loop" : "AVX512-BF16 register loop";
    m.method = std::string("register-only bf16 loop: ") +
               (amx ? "AMX TDPBF16PS on 4 accumulator tiles (16x16 fp32 += 16x32 bf16 x 32x16 "
                      "bf16, operands in tiles 4-7)"
                    : "AVX512-BF16 VDPBF16PS, 16 independent zmm chains") +
               ", " + std::to_string(ran) + " thread(s) x " + std::to_string(iters) +
               " iterations (" + fmt(seconds * 1e3, 0) + " ms, each thread timed on its own CPU clock), best of " + std::to_string(reps);
    return m;
  }
#endif
  // No bf16 matrix instructions usable here: the ceiling is what the bf16 GEMM the trainer runs
  // (emulated: bf16-rounded operands through sgemm) reaches on a large square.
  const int n = 1024;
  m = measure_gemm_bf16(GemmShape{"square", n, n, n, 'N', 'T'}, threads, std::max(reps, 2));
  m.basis = "bf16 GEMM ceiling";
  m.method = "no AMX-BF16 or AVX512-BF16 usable here (" + cpu.best_isa() +
             "), so the measured bf16 GEMM ceiling: " + m.method;
  return m;
}

namespace {
// Times a row-major GEMM on fp32 buffers shaped as `s` says: one warm-up call (page-in, thread
// pool, kernel generation), then `reps` timed calls; the method line is completed by the caller.
template <typename Gemm>
Measurement time_fp32_gemm(const GemmShape& s, int threads, int reps, Gemm&& gemm) {
  check_shape(s);
  if (reps <= 0) reps = 1;
  OmpThreads omp(threads);
  const bool ta = is_t(s.transa), tb = is_t(s.transb);
  const int64_t M = s.M, N = s.N, K = s.K;
  const int64_t lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
  auto A = alloc_aligned<float>(size_t(M * K));
  auto B = alloc_aligned<float>(size_t(K * N));
  auto C = alloc_aligned<float>(size_t(M * N));
  fill(A.get(), size_t(M * K), 1);
  fill(B.get(), size_t(K * N), 2);
  std::memset(C.get(), 0, size_t(M * N) * sizeof(float));
  Measurement m;
  m.unit = "GFLOP/s";
  time_calls(m, reps, s.flop(),
             [&] { gemm(ta, tb, M, N, K, A.get(), lda, B.get(), ldb, C.get(), ldc); });
  finish(m);
  m.method = s.to_string() + ", " + std::to_string(omp.n()) + " thread(s), 1 warm-up + " +
             std::to_string(reps) + " timed calls, best";
  return m;
}
}  // namespace

Measurement measure_sgemm(const GemmShape& s, int threads, int reps) {
  Measurement m = time_fp32_gemm(
      s, threads, reps,
      [&](bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc) {
        dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B,
                                      ldb, 0.0f, C, ldc);
        if (st != dnnl_success)
          fail("dnnl_sgemm failed on ", s.to_string(), " (status ", int(st), ")");
      });
  m.method = "dnnl_sgemm row-major " + m.method + "; " + onednn_description();
  return m;
}

Measurement measure_gemm_bf16(const GemmShape& s, int threads, int reps) {
  Measurement m = time_fp32_gemm(
      s, threads, reps,
      [](bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
         const float* B, int64_t ldb, float* C, int64_t ldc) {
        kernels::gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
      });
  m.method = "kernels::gemm_bf16 " + m.method + ", fp32 in/out with bf16 operands: " +
             kernels::bf16_matmul_path();
  return m;
}

Measurement measure_bf16_matmul(const GemmShape& s, int threads, int reps) {
  check_shape(s);
  if (reps <= 0) reps = 1;
  OmpThreads omp(threads);
  using dnnl::memory;
  using dt = memory::data_type;
  Measurement m;
  m.unit = "GFLOP/s";
  const int64_t M = s.M, N = s.N, K = s.K;
  const bool ta = is_t(s.transa), tb = is_t(s.transb);
  std::string impl;
  try {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    // op(A) is [M,K]; stored [K,M] when transposed. op(B) is [K,N]; stored [N,K] when transposed.
    memory::desc a_md({M, K}, dt::bf16, ta ? memory::dims{1, M} : memory::dims{K, 1});
    memory::desc b_md({K, N}, dt::bf16, tb ? memory::dims{1, K} : memory::dims{N, 1});
    memory::desc c_md({M, N}, dt::f32, memory::dims{N, 1});
#if DNNL_VERSION_MAJOR >= 3
    dnnl::matmul::primitive_desc pd(eng, a_md, b_md, c_md);
#else
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), eng);
#endif
    impl = pd.impl_info_str();
    m.method = "oneDNN matmul bf16 x bf16 -> f32 " + s.to_string() + ", kernel " + impl + ", " +
               std::to_string(omp.n()) + " thread(s), 1 warm-up + " + std::to_string(reps) +
               " timed, best; " + onednn_description();
    if (impl.rfind("ref", 0) == 0) {
      m.skipped = "oneDNN has only its reference bf16 matmul (" + impl +
                  ") on this CPU; it needs AVX-512 (core/bf16) or AMX";
      return m;
    }
    memory a(a_md, eng), b(b_md, eng), c(c_md, eng);
    // Values do not matter for speed; use a spread of small bf16 numbers (no denormals).
    auto fill_bf16 = [](memory& mem, size_t n, uint32_t seed) {
      auto* p = static_cast<uint16_t*>(mem.get_data_handle());
      uint32_t x = seed;
      for (size_t i = 0; i < n; ++i) {
        x = x * 1664525u + 1013904223u;
        p[i] = uint16_t(0x3e00u + ((x >> 16) & 0x3ffu)) | uint16_t((x & 1u) << 15);
      }
    };
    fill_bf16(a, size_t(M * K), 1);
    fill_bf16(b, size_t(K * N), 2);
    dnnl::matmul prim(pd);
    time_calls(m, reps, s.flop(), [&] {
      prim.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
      strm.wait();
    });
  } catch (const dnnl::error& e) {
    m.samples.clear();
    if (e.status == dnnl_unimplemented)
      m.skipped = "oneDNN has no bf16 matmul for this CPU (" + onednn_description() +
                  "); it needs AVX-512 (avx512_core) or AMX";
    else
      m.skipped = std::string("oneDNN bf16 matmul failed: ") + e.what() + " (status " +
                  std::to_string(int(e.status)) + ")";
    if (m.method.empty()) m.method = "oneDNN matmul bf16 x bf16 -> f32 " + s.to_string();
    return m;
  }
  finish(m);
  return m;
}

Measurement measure_memory_bandwidth(size_t bytes, int threads, int reps) {
  if (threads <= 0) threads = omp_get_max_threads();
  if (reps <= 0) reps = 1;
  bytes = std::max<size_t>(bytes / 64 * 64, 64 * size_t(threads));
  auto src = alloc_aligned<char>(bytes);
  auto dst = alloc_aligned<char>(bytes);
  int ran = threads;
  auto copy = [&](bool first_touch) {
    double t0 = 0, t1 = 0;
#pragma omp parallel num_threads(threads)
    {
      int id = omp_get_thread_num(), nt = omp_get_num_threads();
      size_t per = (bytes / nt + 63) / 64 * 64;
      size_t lo = std::min(bytes, per * id), hi = std::min(bytes, lo + per);
      if (first_touch) {  // pages land on the thread (and NUMA node) that copies them
        std::memset(src.get() + lo, 1 + id, hi - lo);
        std::memset(dst.get() + lo, 0, hi - lo);
      }
#pragma omp barrier
#pragma omp single
      {
        ran = nt;
        t0 = now_s();
      }
      std::memcpy(dst.get() + lo, src.get() + lo, hi - lo);
#pragma omp barrier
#pragma omp single
      t1 = now_s();
    }
    return t1 - t0;
  };
  copy(true);  // touch + warm-up
  Measurement m;
  m.unit = "GB/s";
  sample_rates(m, reps, 2.0 * double(bytes), [&] { return copy(false); });
  finish(m);
  m.method = "memcpy of " + fmt(double(bytes) / (1 << 20), 0) + " MiB split over " +
             std::to_string(ran) + " thread(s), counting read+write (2x bytes), 1 warm-up + " +
             std::to_string(reps) + " timed, best";
  return m;
}

double fma_peak_gflops(int threads) { return measure_fma_peak(threads).value; }
double bf16_peak_gflops(int threads) { return measure_bf16_peak(threads).value; }
double sgemm_gflops(int M, int N, int K, char transa, char transb, int reps) {
  return measure_sgemm(GemmShape{"", M, N, K, transa, transb}, 0, reps).value;
}
double bf16_matmul_gflops(int M, int N, int K) {
  return measure_bf16_matmul(GemmShape{"", M, N, K, 'N', 'N'}, 0, 5).value;
}
double memory_bandwidth_gbs(size_t bytes, int threads) {
  return measure_memory_bandwidth(bytes, threads).value;
}

std::vector<GemmResult> measure_gemms(const std::vector<GemmShape>& shapes, int threads, int reps,
                                      bool with_bf16) {
  std::vector<GemmResult> out;
  for (const GemmShape& s : shapes) {
    GemmResult r;
    r.shape = s;
    r.fp32 = measure_sgemm(s, threads, reps);
    if (with_bf16) r.bf16 = measure_bf16_matmul(s, threads, reps);
    out.push_back(std::move(r));
  }
  return out;
}

MachineCeilings measure_ceilings(int threads, bool quick) {
  const double t0 = now_s();
  MachineCeilings mc;
  mc.cores = num_cores();
  mc.threads = threads > 0 ? threads : mc.cores;
  mc.cpu = cpu_features().summary();
  mc.onednn = onednn_description();
  const double fma_s = quick ? 0.02 : 0.05;
  const int reps = quick ? 3 : 5;
  mc.fma_1thread = measure_fma_peak(1, fma_s, reps);
  mc.fma = mc.threads == 1 ? mc.fma_1thread : measure_fma_peak(mc.threads, fma_s, reps);
  mc.bf16_peak = measure_bf16_peak(mc.threads, fma_s, reps);
  const int n = quick ? 1024 : 3072;
  mc.square = GemmShape{"square", n, n, n, 'N', 'N'};
  mc.sgemm_square = measure_sgemm(mc.square, mc.threads, 3);
  mc.bf16_square = measure_bf16_matmul(mc.square, mc.threads, quick ? 3 : 5);
  mc.memory = measure_memory_bandwidth(size_t(quick ? 128 : 256) << 20, mc.threads, reps);
  mc.seconds = now_s() - t0;
  return mc;
}

std::string MachineCeilings::to_text() const {
  std::ostringstream os;
  auto line = [&](const std::string& label, const Measurement& m, const std::string& extra) {
    os << "  " << label;
    if (label.size() < 28) os << std::string(28 - label.size(), ' ');
    if (m.ok()) {
      os << fmt(m.value) << " " << m.unit << " (median " << fmt(m.median) << ")" << extra;
    } else {
      os << "n/a: " << (m.skipped.empty() ? "not measured" : m.skipped);
    }
    os << "\n";
  };
  auto of_peak = [&](const Measurement& m) {
    return fma.ok() && m.ok() ? ", " + fmt(100.0 * m.value / fma.value, 0) + "% of FMA peak"
                              : std::string();
  };
  os << "machine: " << cores << " cores, " << threads << " threads; " << cpu << "; " << onednn
     << "\n";
  os << "ceilings (" << fmt(seconds, 1) << " s to measure):\n";
  line("fp32 FMA peak, 1 thread", fma_1thread, "");
  line("fp32 FMA peak, " + std::to_string(threads) + " threads", fma, "");
  line("bf16 matrix peak, " + std::to_string(threads) + " thr", bf16_peak,
       " [" + bf16_peak.basis + "]");
  std::string sq = std::to_string(square.M) + "^3";
  line("sgemm " + sq, sgemm_square, of_peak(sgemm_square));
  line("bf16 matmul " + sq, bf16_square, "");
  line("memory copy", memory, "");
  if (!model_gemms.empty()) {
    os << "model GEMMs (fp32 dnnl_sgemm" << (model_gemms[0].bf16.method.empty() ? "" : " | bf16")
       << "):\n";
    for (const GemmResult& g : model_gemms) {
      std::string label = g.shape.to_string();
      os << "  " << label;
      if (label.size() < 40) os << std::string(40 - label.size(), ' ');
      os << (g.fp32.ok() ? fmt(g.fp32.value) : std::string("n/a")) << " GFLOP/s"
         << of_peak(g.fp32);
      if (!g.bf16.method.empty())
        os << " | bf16 " << (g.bf16.ok() ? fmt(g.bf16.value) + " GFLOP/s" : std::string("n/a"));
      os << "\n";
    }
  }
  return os.str();
}

nlohmann::json MachineCeilings::to_json() const {
  nlohmann::json j;
  j["threads"] = threads;
  j["cores"] = cores;
  j["cpu"] = cpu;
  j["onednn"] = onednn;
  j["fma_peak_1thread"] = fma_1thread.to_json();
  j["fma_peak"] = fma.to_json();
  j["bf16_peak"] = bf16_peak.to_json();
  j["square"] = {{"M", square.M}, {"N", square.N}, {"K", square.K}};
  j["sgemm_square"] = sgemm_square.to_json();
  j["bf16_matmul_square"] = bf16_square.to_json();
  j["memory_copy"] = memory.to_json();
  if (!model_gemms.empty()) {
    nlohmann::json g = nlohmann::json::array();
    for (const GemmResult& r : model_gemms) {
      nlohmann::json e = {{"name", r.shape.name}, {"M", r.shape.M},
                          {"N", r.shape.N},       {"K", r.shape.K},
                          {"transa", std::string(1, r.shape.transa)},
                          {"transb", std::string(1, r.shape.transb)},
                          {"fp32", r.fp32.to_json()}};
      if (!r.bf16.method.empty()) e["bf16"] = r.bf16.to_json();
      g.push_back(std::move(e));
    }
    j["model_gemms"] = std::move(g);
  }
  j["seconds"] = seconds;
  return j;
}

// The planner's attention rate (planner/machine.cpp), measured here beside the kernels it times.
double attention_gflops(int threads, int reps) {
  const int B = 2, T = 512, H = 8, hd = 64, C = H * hd;
  const size_t n = size_t(B) * T * C;
  std::vector<float> q(n), k(n), v(n), out(n), dout(n), dq(n), dk(n), dv(n), lse(size_t(B) * H * T);
  uint32_t s = 12345;
  for (auto* buf : {&q, &k, &v, &dout})
    for (auto& x : *buf) {
      s = s * 1664525u + 1013904223u;
      x = float(s >> 8) / float(1u << 23) - 1.0f;
    }
  kernels::AttentionDims d{B, T, T, H, H, hd, C, C, C, int64_t(T) * C, int64_t(T) * C, int64_t(T) * C};
  Measurement m;
  {
    OmpThreads omp(threads);
    time_calls(m, reps, 3 * kernels::attention_forward_flops(d), [&] {
      kernels::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), d);
      kernels::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                  k.data(), v.data(), out.data(), lse.data(), d);
    });
  }
  std::sort(m.samples.begin(), m.samples.end());
  return m.samples[m.samples.size() / 2];
}

}  // namespace tetrad
