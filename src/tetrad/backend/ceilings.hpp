// The host CPU's machine ceilings (backend level: the benchmark, the planner's machine
// measurement and the CPU backends' Backend::peak read them; measured with the CPU kernels of
// backend/cpu/), measured on every benchmark run (docs/benchmarks.md) and by
// the planner's machine measurement (planner/machine.hpp): the fp32 FMA peak of a register-only
// loop, the GEMM library on a large square and on the model's own shapes (model/gemm_shapes.hpp;
// fp32 dnnl_sgemm; bf16 inputs with fp32 output through the oneDNN matmul primitive), and memory
// bandwidth of a large copy. Model FLOP/s are reported as fractions of these, so a number means
// the same thing on any machine.
//
// Every measurement comes back as a Measurement: the number, the statistic behind it and a
// sentence saying how it was measured (kernel, ISA, shape, threads, repetitions). A ceiling that
// cannot be measured on this machine (no bf16 kernel in oneDNN for this CPU, say) has value 0
// and says why in `skipped`; it never throws for that.
//
// Thread counts: each function runs on exactly `threads` OpenMP threads (0 = omp_get_max_threads())
// and restores the caller's OpenMP setting afterwards. Functions are not meant to run
// concurrently with other work: they measure the whole machine.
//
// Not done here: timing assertions (tests never check speed), MPI collectives (see the
// distributed benchmarks), cache-level bandwidths.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tetrad {

struct Measurement {
  double value = 0;             // the ceiling: best repetition; 0 when not measured
  double median = 0;            // median repetition
  std::string unit;             // "GFLOP/s" | "GB/s"
  std::string method;           // how it was measured
  std::string skipped;          // non-empty: why there is no number
  std::string basis;            // short name of what the number is ("AMX-BF16 register loop")
  std::vector<double> samples;  // every timed repetition, in the unit above
  bool ok() const { return skipped.empty() && value > 0; }
  nlohmann::json to_json() const;
};

// C[M,N] = op(A)[M,K] · op(B)[K,N], row-major. transa == 'T': A is stored [K,M]; transb == 'T':
// B is stored [N,K]. 2·M·N·K floating-point operations.
struct GemmShape {
  std::string name;
  int M = 0, N = 0, K = 0;
  char transa = 'N', transb = 'N';
  double flop() const { return 2.0 * M * N * K; }
  std::string to_string() const;  // e.g. "qkv.fwd 1024x2304x768 NT"
};

// fp32 FMA peak: every thread runs a loop of independent fused multiply-adds held in registers
// (AVX-512: 16 zmm chains; AVX2+FMA: 12 ymm chains; otherwise 8 scalar multiply-add chains),
// calibrated to about `seconds` per repetition; best of `reps`.
Measurement measure_fma_peak(int threads, double seconds = 0.05, int reps = 5);
// bf16 matrix peak, the baseline of a bf16 run's MFU: a register-only loop like the FMA peak's
// on the AMX tiles (TDPBF16PS, 4 accumulator tiles) where AMX-BF16 is usable, else on the
// AVX512-BF16 units (VDPBF16PS, 16 zmm chains); on a CPU with neither (or capped below them by
// TETRAD_MAX_CPU_ISA), the measured ceiling of the bf16 GEMM the trainer runs there
// (measure_gemm_bf16 on a 1024 square, NT). `basis` says which.
Measurement measure_bf16_peak(int threads, double seconds = 0.05, int reps = 5);
// fp32 GEMM through dnnl_sgemm (row-major): one warm-up call, then `reps` timed calls.
Measurement measure_sgemm(const GemmShape& s, int threads, int reps);
// The bf16 GEMM the model runs in bf16 mode (kernels::gemm_bf16: fp32 in and out, operands
// rounded to bf16; native oneDNN matmul or emulated, backend/cpu/precision.hpp), timed like sgemm.
Measurement measure_gemm_bf16(const GemmShape& s, int threads, int reps);
// bf16 x bf16 -> f32 GEMM through the oneDNN matmul primitive (AMX or AVX-512-BF16 kernels):
// one warm-up, then `reps` timed executions. Skipped (value 0) when oneDNN has only its
// reference implementation for this CPU.
Measurement measure_bf16_matmul(const GemmShape& s, int threads, int reps);
// Copy of `bytes` between two buffers touched beforehand, split over the threads; counts
// 2·bytes per copy (read + write, the STREAM convention; write-allocate traffic is not counted).
Measurement measure_memory_bandwidth(size_t bytes, int threads, int reps = 5);

// The numbers only (the forms above with their defaults; sgemm and bf16 use the caller's
// OpenMP thread count).
double fma_peak_gflops(int threads);
double bf16_peak_gflops(int threads);
double sgemm_gflops(int M, int N, int K, char transa, char transb, int reps);
double bf16_matmul_gflops(int M, int N, int K);
double memory_bandwidth_gbs(size_t bytes, int threads);

// A model-shape GEMM ceiling measured in two windows, before and after the timed steps: on a
// shared host whose clock moves, the same shapes measured 1636 and 689 GFLOP/s in two processes
// minutes apart, and a step once ran at 134% of the ceiling measured before it. The ceiling is
// the best of the two windows per shape; it is unstable when the windows differ by more than
// `tolerance` of the lower, or when the step's rate beats the best (then neither window saw the
// machine the step ran on, and a fraction above 100% means nothing).
struct CeilingWindows {
  double before = 0, after = 0;  // GFLOP/s of each window, FLOP-weighted over the shapes
  double best = 0;               // FLOP-weighted over the shapes, each at its better window
  double achieved = 0;           // the step's rate on the same work, GFLOP/s
  double tolerance = 0.2;
  // |before - after| / min(before, after); 0 when a window is missing.
  double spread() const;
  bool step_above() const { return best > 0 && achieved > best; }
  bool unstable() const { return spread() > tolerance || step_above(); }
  // "ceiling unstable: before 1636.0, after 689.0 GFLOP/s" ("" when stable).
  std::string flag() const;
};
// flop[i]: FLOPs of shape i; before[i], after[i]: its rate in each window (GFLOP/s; 0 or less:
// not measured, left out of that window, and of `best` when neither has it).
CeilingWindows ceiling_windows(const std::vector<double>& flop, const std::vector<double>& before,
                               const std::vector<double>& after, double achieved_gflops,
                               double tolerance = 0.2);

struct GemmResult {
  GemmShape shape;
  Measurement fp32;  // dnnl_sgemm
  Measurement bf16;  // oneDNN matmul; left empty unless asked for
};
std::vector<GemmResult> measure_gemms(const std::vector<GemmShape>& shapes, int threads, int reps,
                                      bool with_bf16 = false);

struct MachineCeilings {
  int threads = 0;           // threads the multi-threaded ceilings ran on
  int cores = 0;             // num_cores()
  std::string cpu;           // cpu_features().summary()
  std::string onednn;        // oneDNN version and the ISA it dispatches to
  Measurement fma_1thread;   // FMA peak, one thread
  Measurement fma;           // FMA peak, `threads` threads
  Measurement bf16_peak;     // bf16 matrix peak (measure_bf16_peak), `threads` threads
  GemmShape square;          // the large square below
  Measurement sgemm_square;  // fp32 dnnl_sgemm
  Measurement bf16_square;   // bf16 oneDNN matmul
  Measurement memory;        // large copy
  std::vector<GemmResult> model_gemms;  // optional: filled by the caller via measure_gemms
  double seconds = 0;        // time spent measuring

  std::string to_text() const;  // a few aligned lines for benchmark output
  nlohmann::json to_json() const;
};

// The CPU attention kernel's forward + backward on a `small`-like shape (2 x 512 tokens, 8 heads
// of 64), in executed causal FLOPs per second (fwd + bwd counted as 3 forwards, as the planner
// does): the median of `reps` after a warm-up, on `threads` threads (planner/machine's rate).
double attention_gflops(int threads, int reps);

// Measures the ceilings above on `threads` threads (0 = num_cores()). quick: shorter loops and
// a 1024 square (well under a second); otherwise a 3072 square and longer loops (a few seconds).
MachineCeilings measure_ceilings(int threads, bool quick);

}  // namespace tetrad
