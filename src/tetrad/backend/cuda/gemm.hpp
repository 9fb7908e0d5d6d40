// GEMMs through cuBLASLt, behind the backend's own wrapper (a HIP port swaps this file's .cpp for
// hipBLASLt, whose API mirrors cuBLASLt's).
//
// Arithmetic (the op table's GemmArgs, backend/ops.hpp):
//   * fp32 operands, Precision::FP32: true fp32 (CUBLAS_COMPUTE_32F), the exact path; or, only
//     when asked for (GemmMath::TF32, `train.gpu_tf32`), TF32 tensor cores (32F_FAST_TF32);
//   * bf16-stored operands (the optimizer's bf16 weight copy, bf16 activations): bf16 tensor
//     cores, fp32 accumulation (CUBLAS_COMPUTE_32F), fp32 C. GemmMath::BF16 takes bf16-stored
//     operands only: Precision::BF16 on fp32-stored operands is the caller's cast (round to
//     nearest even, the CPU's bf16 semantics: cuda_backend.cpp's op_gemm) then this product.
//     cuBLASLt's CUBLAS_COMPUTE_32F_FAST_16BF is never used: it may down-convert to bf16 or to
//     TF32, so its rounding is not the CPU's.
// K = 0: C = beta C (+ bias), as the CPU computes it (no library call).
// Epilogue: an optional bias[N] added to every row of C inside the GEMM (CUBLASLT_EPILOGUE_BIAS:
// one pass over C fewer for every biased linear layer).
// Plans (descriptors, layouts, the heuristic's algorithm) are cached per shape and type, so a
// step after the first costs no host-side planning. Workspace: 32 MiB, allocated once.
#pragma once
#include <cstdint>
#include <memory>

#include "tetrad/backend/cuda/gpu_api.hpp"

namespace tetrad::gpu {

enum class GemmType : uint8_t { F32, BF16 };
enum class GemmMath : uint8_t { FP32, TF32, BF16 };

struct GemmCall {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* A = nullptr;
  int64_t lda = 0;
  GemmType a_type = GemmType::F32;
  const void* B = nullptr;
  int64_t ldb = 0;
  GemmType b_type = GemmType::F32;
  float* C = nullptr;  // always fp32
  int64_t ldc = 0;
  GemmMath math = GemmMath::FP32;
  const float* bias = nullptr;  // [N], added to each row (beta must be 0 or 1)
};

class Gemm {
 public:
  Gemm();  // creates the cuBLASLt handle and the workspace on the current device
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  // Enqueues C = alpha op(A) op(B) + beta C (+ bias) on s. Throws Error for bad arguments and
  // for cuBLASLt failures (naming the shape and the status).
  void run(const GemmCall& c, gpuStream_t s);
  static const char* math_name(GemmMath m);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tetrad::gpu
