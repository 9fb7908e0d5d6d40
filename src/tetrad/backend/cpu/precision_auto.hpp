// What precision "auto" means on this CPU: the faster of fp32 and bf16 GEMMs, measured (issue 29).
//
// "bf16 GEMMs run natively here" is not the rule a user wants: on a CPU with AVX512-BF16 but no
// AMX (Cooper Lake, Zen 4/5, VMs that hide AMX) oneDNN's bf16 matmul runs at about half of
// sgemm's rate (machine-notes.md: ~190 against ~360 GFLOP/s), and bf16 trains slower than fp32.
// So where bf16 GEMMs are native, a short probe times both on a transformer layer's three GEMM
// layouts (forward NT, input gradient NN, weight gradient TN; operands bf16-stored as the model
// stores them, random values) with the fp32 and bf16 runs interleaved (a disturbance hits both),
// the fastest run of each (other processes only slow a run down), FLOP-weighted over the shapes. bf16 is chosen when it is at least kBf16Margin times fp32's rate;
// below that, fp32 (when they are close, fp32: the same speed at full precision), and the reason
// says which case it was. Where bf16 GEMMs would be emulated, fp32 without measuring (emulation
// is always slower than fp32).
//
// The measurement is kept per machine (backend/machine_cache.hpp: CPU, features, ISA cap, oneDNN
// version, thread count), so it runs once per machine and thread count, and ranks of a job on
// one node agree (the first measures under the cache's lock, the others read its answer).
// TETRAD_PRECISION_AUTO = fp32 | bf16 still forces the choice (backend/cpu/precision.hpp).
#pragma once
#include <string>

#include "tetrad/backend/precision.hpp"

namespace tetrad::kernels {

using backend::Precision;

// What precision "auto" means on this CPU (a bad TETRAD_PRECISION_AUTO throws Error naming the
// choices): TETRAD_PRECISION_AUTO=fp32|bf16 if set, fp32 where bf16 GEMMs would be emulated, else
// measured_precision() below; and why, one phrase ("bf16 GEMMs 1790 GFLOP/s >= 120% of ...").
Precision auto_precision();
std::string auto_precision_reason();

// bf16 must be this much faster than fp32 to be chosen.
constexpr double kBf16Margin = 1.2;

// The probe's GEMM rates (GFLOP/s; 0: not measured).
struct PrecisionRates {
  double fp32 = 0, bf16 = 0;
  std::string shapes;  // what was measured, e.g. "NT 1024x2304x768, NN ..., TN ..."
  int reps = 0;        // timed runs of each precision per shape
};

// The rule, on given rates (tests feed fake ones: no timing). why: "bf16 GEMMs 1790 GFLOP/s >=
// 1.2 x fp32 402 ..." and the like.
backend::PrecisionChoice choose_precision(const PrecisionRates& r, double margin = kBf16Margin);

// Times the probe (a few hundred ms) on `threads` OpenMP threads (0: the current count), `reps`
// interleaved runs of each precision per shape after one warm-up each. Native bf16 GEMMs only.
PrecisionRates measure_precision_rates(int threads, int reps = 5);

// precision "auto" on a CPU with native bf16 GEMMs: the cached measurement for this machine and
// thread count (OpenMP's current count), measured and cached first where there is none, or
// always when `remeasure`. `source`: where the figures came from ("measured now, cached in
// PATH", "cached in PATH, measured 2026-12-05 00:41 UTC", "measured now; not cached: ...").
struct MeasuredChoice {
  backend::PrecisionChoice choice;
  PrecisionRates rates;
  std::string source;
};
// TETRAD_PRECISION_AUTO=measure in the environment makes every call remeasure. The answer is
// kept for the process per thread count; forget_measured_precision() drops it (tests).
MeasuredChoice measured_precision(bool remeasure = false);
void forget_measured_precision();

// The cache entry measured_precision reads and writes for `threads` threads.
std::string precision_cache_entry(int threads);

}  // namespace tetrad::kernels
