// Matrix-multiply precision: fp32, or bf16 mixed precision (issue 5).
//
// bf16 mixed precision here means what AMP / Megatron mean on hardware with bf16 matrix units:
// the operands of every float GEMM (weights and activations, forward and backward) are rounded to
// bfloat16 (8-bit mantissa, round to nearest even) and the products are accumulated in fp32; the
// master weights, gradients, optimizer state, norms, softmax, attention and the loss stay fp32.
// The precision is chosen per call, never process-wide: the op table's GEMM takes it in
// GemmArgs::precision, which the model sets from its own setting (ParallelOptions::precision,
// filled by the trainer, the benchmark and the inference commands from their configs);
// kernels::gemm<float> is always fp32 and gemm_bf16 below is the bf16 product.
//
// Two ways to run a bf16 GEMM, chosen at run time:
//   * native: oneDNN's matmul primitive with bf16 inputs and fp32 output, which oneDNN runs on
//     AMX-BF16 or AVX512-BF16 — only where the CPU has one of them and oneDNN builds the
//     primitive (probed once);
//   * emulated: the operands rounded to bf16 into fp32 scratch, then the fp32 sgemm. The products
//     of two bf16 values are exact in fp32, so this is the same arithmetic (up to summation
//     order) — correct everywhere, but slower than plain fp32 (the rounding pass is extra work).
// TETRAD_BF16=emulate in the environment forces the emulated path (to compare the two; so does
// TETRAD_MAX_CPU_ISA=avx512 or lower, core/cpu.hpp).
//
// train.precision = "auto" is the faster of fp32 and bf16 GEMMs on this machine, measured once
// per machine where bf16 GEMMs run natively (backend/cpu/precision_auto.hpp), fp32 where they
// would be emulated (the CPU backends' Backend::auto_precision, backend/precision.hpp);
// TETRAD_PRECISION_AUTO = bf16 | fp32 in the environment overrides that choice (so both of auto's
// branches run on any CPU: tests force each); TETRAD_PRECISION_AUTO = measure measures again
// and replaces the cached figures (`tetrad cpu --measure`).
//
// Not done: bf16 storage of activations between layers (they are rounded where they enter a
// GEMM, stored in fp32), bf16 collectives. (bf16 attention: attention_bf16.hpp.)
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "tetrad/backend/bf16.hpp"
#include "tetrad/backend/precision.hpp"

namespace tetrad::kernels {

using backend::Precision;  // the one precision type (backend/precision.hpp)

// What precision "auto" means on this CPU: auto_precision() and auto_precision_reason() in
// backend/cpu/precision_auto.hpp.

// Whether bf16 GEMMs run on bf16 hardware here (AMX-BF16 or AVX512-BF16, and oneDNN built a bf16
// matmul for it). Probed once, thread-safe.
bool native_bf16_matmul();
// Tests force the emulated path on a CPU that has the native one (both must be exercised on
// every machine). Not to be changed while another thread is inside a GEMM.
void set_bf16_emulation_forced(bool on);
// "native (oneDNN matmul on amx-bf16)" / "emulated (no AMX-BF16 or AVX512-BF16 on this CPU)" etc.
std::string bf16_matmul_path();

// C = alpha * op(A) · op(B) + beta * C with A and B rounded to bf16 and fp32 accumulation (the
// layout contract of kernels::gemm), native or emulated as above. The CPU backend's GEMM calls
// it for Precision::BF16; tests call it directly.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc);

// A GEMM operand for gemm_bf16: either fp32 (rounded to bf16 on the way in, on every call) or
// already stored in bf16 by the code that produced it (a weight copy the optimizer writes, an
// activation a norm or activation kernel writes in bf16): then no conversion pass runs. `ld` is
// the leading dimension of whichever pointer is set, in elements.
struct Bf16Operand {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  int64_t ld = 0;
  static Bf16Operand fp32(const float* p, int64_t ld) { return {p, nullptr, ld}; }
  static Bf16Operand bf16_stored(const uint16_t* p, int64_t ld) { return {nullptr, p, ld}; }
};

// How one call computes its product (see GemmLayoutPolicy below): kPolicy follows the policy in
// force; kPlain / kTransposed choose for this call (the model's per-site plan,
// parallel/gemm_layouts.hpp). The emulated path has one form (sgemm) and ignores it.
enum class GemmProductForm { kPolicy, kPlain, kTransposed };

// The same GEMM with each operand in either form. Transposes are strides of the stored operand
// (no copy when it is stored in bf16).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               Bf16Operand A, Bf16Operand B, float beta, float* C, int64_t ldc,
               GemmProductForm form = GemmProductForm::kPolicy);

// How gemm_bf16 computes a product whose layout runs slowly on the matrix units. oneDNN's matmul
// runs NT (second operand stored [N, K], tetrad's weights) fastest and TN (first operand stored
// transposed, every weight gradient) slowest (machine-notes.md). A product can instead be
// computed as its transpose, Cᵀ = op(B)ᵀ·op(A)ᵀ (for TN again a TN product, with the operands'
// roles swapped, which oneDNN blocks differently), into a scratch then added into C transposed
// (oneDNN's matmul has only its reference kernel for a transposed destination).
//   kRule: a fixed rule from measurements (gemm_layout_rule below): the same choice in every
//          process, so bf16 runs stay bit-reproducible (resume, grids against serial);
//   kTune: time both once per shape on random operands and keep the faster (AxoNN's way; the
//          choice may differ between processes, so results need not be bit-identical);
//   kPlain / kTransposed: force one (tests, benchmarks).
// TETRAD_GEMM_LAYOUT=rule|tune|plain|transposed sets the default (rule).
enum class GemmLayoutPolicy { kRule, kTune, kPlain, kTransposed };
void set_gemm_layout_policy(GemmLayoutPolicy p);
GemmLayoutPolicy gemm_layout_policy();
// Whether the fixed rule computes C[M, N] = op(A)·op(B) as its transpose.
bool gemm_layout_rule(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K);
// For benchmarks: the choice made for each shape seen so far, one line each (the first 1024,
// then how many more).
std::string gemm_layout_report();
// The native bf16 GEMM's primitives this thread holds (bounded: the least recently used go).
size_t gemm_bf16_cached_primitives();

// bf16 conversions: backend/bf16.hpp.
using backend::float_to_bf16;
using backend::bf16_to_float;
using backend::round_to_bf16;

// out[r * ldo + c] = round_to_bf16(in[r * ldi + c]) for r < rows, c < cols (OpenMP over rows).
void round_matrix_to_bf16(const float* in, int64_t ldi, float* out, int64_t ldo, int64_t rows,
                          int64_t cols);
// The same into bf16 storage.
void convert_matrix_to_bf16(const float* in, int64_t ldi, uint16_t* out, int64_t ldo,
                            int64_t rows, int64_t cols);
// n contiguous elements, vectorised (AVX-512 where the CPU has it); OpenMP over chunks when
// `parallel` (callers already inside a parallel region pass false).
void convert_to_bf16(const float* in, uint16_t* out, int64_t n, bool parallel = true);
void convert_from_bf16(const uint16_t* in, float* out, int64_t n, bool parallel = true);

}  // namespace tetrad::kernels
