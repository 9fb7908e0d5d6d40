// cuBLASLt behind Gemm (gemm.hpp). Row-major calls become column-major ones by
// map_row_major_gemm (gemm_mapping.hpp, unit-tested on the CPU).
#include "tetrad/backend/cuda/gemm.hpp"

#include <cublasLt.h>

#include <map>
#include <tuple>

#include "tetrad/backend/cuda/gemm_mapping.hpp"
#include "tetrad/backend/cuda/kernels.hpp"

namespace tetrad::gpu {
namespace {

const char* lt_status(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "unknown status";
  }
}

#define LT_CHECK(call, what)                                                               \
  do {                                                                                     \
    const cublasStatus_t lt_s_ = (call);                                                   \
    if (lt_s_ != CUBLAS_STATUS_SUCCESS)                                                    \
      fail("cuBLASLt: ", #call, " failed (", lt_status(lt_s_), ", status ", int(lt_s_),    \
           ") for ", what);                                                                \
  } while (0)

int alignment_of(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (u % uintptr_t(a)) != 0) a /= 2;
  return a;
}

cudaDataType_t lt_type(GemmType t) { return t == GemmType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                       int, bool, int, int, int, int>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

std::string shape_text(const GemmCall& c) {
  return detail::concat("GEMM ", c.trans_a ? "T" : "N", c.trans_b ? "T" : "N", " M=", c.M,
                        " N=", c.N, " K=", c.K, " lda=", c.lda, " ldb=", c.ldb, " ldc=", c.ldc,
                        " math=", Gemm::math_name(c.math), c.bias ? " +bias" : "");
}

}  // namespace

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct Gemm::Impl {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans;
};

Gemm::Gemm() : impl_(std::make_unique<Impl>()) {
  LT_CHECK(cublasLtCreate(&impl_->lt), "handle creation");
  GPU_CHECK(gpuMalloc(&impl_->workspace, kWorkspaceBytes));
}

Gemm::~Gemm() {
  impl_->plans.clear();
  if (impl_->workspace) gpuFree(impl_->workspace);
  if (impl_->lt) cublasLtDestroy(impl_->lt);
}

const char* Gemm::math_name(GemmMath m) {
  switch (m) {
    case GemmMath::FP32: return "fp32";
    case GemmMath::TF32: return "tf32";
    case GemmMath::BF16: return "bf16";
  }
  return "?";
}

void Gemm::run(const GemmCall& c, gpuStream_t s) {
  if (c.M < 0 || c.N < 0 || c.K < 0) fail("GEMM: negative size in ", shape_text(c));
  if (c.M == 0 || c.N == 0) return;
  if (!row_major_ld_ok(c.trans_a, c.M, c.K, c.lda) || !row_major_ld_ok(c.trans_b, c.K, c.N, c.ldb) ||
      !row_major_ld_ok(false, c.M, c.N, c.ldc))
    fail("GEMM: a leading dimension is smaller than its row in ", shape_text(c));
  if (c.K == 0) {
    // No products (cuBLASLt rejects k = 0): C = beta C (+ bias), as the CPU's GEMM computes it;
    // beta 0 overwrites C (NaN in C does not propagate).
    gemm_empty_product(c.C, c.ldc, c.M, c.N, c.beta, c.bias, s);
    return;
  }
  if (c.a_type != c.b_type)
    fail("GEMM: A and B must be stored in the same type (cuBLASLt has no mixed fp32 x bf16 "
         "product); got ", c.a_type == GemmType::BF16 ? "bf16" : "fp32", " x ",
         c.b_type == GemmType::BF16 ? "bf16" : "fp32", " in ", shape_text(c));
  if (c.a_type == GemmType::BF16 && c.math != GemmMath::BF16)
    fail("GEMM: bf16-stored operands need bf16 math, got ", math_name(c.math));
  if (c.a_type == GemmType::F32 && c.math == GemmMath::BF16)
    fail("GEMM: bf16 math on fp32-stored operands: round them to bf16 first (cast_f32_to_bf16, "
         "round to nearest even, as the CPU does); cuBLASLt's 32F_FAST_16BF may round otherwise "
         "or use TF32, in ", shape_text(c));
  if (c.bias && c.beta != 0.0f && c.beta != 1.0f)
    fail("GEMM: a bias epilogue needs beta 0 or 1, got ", c.beta);

  const ColMajorGemm g = map_row_major_gemm(c.trans_a, c.trans_b, c.M, c.N, c.K, c.lda, c.ldb,
                                            c.ldc);
  const Key key{c.trans_a, c.trans_b, c.M, c.N, c.K, c.lda, c.ldb, c.ldc, int(c.a_type),
                int(c.b_type), int(c.math), c.bias != nullptr, alignment_of(c.A),
                alignment_of(c.B), alignment_of(c.C), c.bias ? alignment_of(c.bias) : 256};
  auto it = impl_->plans.find(key);
  if (it == impl_->plans.end()) {
    auto p = std::make_unique<Plan>();
    const std::string what = shape_text(c);
    // bf16 math runs on bf16-stored operands only (refused above otherwise): bf16 x bf16 with
    // fp32 accumulation is plain CUBLAS_COMPUTE_32F; TF32 only when asked for.
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    if (c.math == GemmMath::TF32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    LT_CHECK(cublasLtMatmulDescCreate(&p->op, compute, CUDA_R_32F), what);
    const cublasOperation_t ta = g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), what);
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), what);
    if (c.bias) {
      const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
      LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)), what);
      // Before the heuristic, which reads the bias pointer's alignment (a null pointer counts as
      // perfectly aligned); the plan key holds that alignment, so a plan made for a 16-byte
      // aligned bias is never reused for a 4-byte aligned one inside a packed parameter buffer.
      LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias,
                                              sizeof(c.bias)), what);
    }
    // First operand: the caller's B; second: the caller's A.
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->a, lt_type(c.b_type), uint64_t(g.first_rows),
                                        uint64_t(g.first_cols), g.first_ld), what);
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->b, lt_type(c.a_type), uint64_t(g.second_rows),
                                        uint64_t(g.second_cols), g.second_ld), what);
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, uint64_t(g.c_rows), uint64_t(g.c_cols),
                                        g.c_ld), what);
    cublasLtMatmulPreference_t pref = nullptr;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), what);
    const uint64_t ws = kWorkspaceBytes;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof(ws)), what);
    const uint32_t al_first = uint32_t(alignment_of(c.B)), al_second = uint32_t(alignment_of(c.A)),
                   al_c = uint32_t(alignment_of(c.C));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_first, sizeof(al_first));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_second, sizeof(al_second));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(impl_->lt, p->op, p->a, p->b, p->c,
                                                             p->c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
      fail("cuBLASLt found no algorithm (", lt_status(hs), ") for ", what);
    p->algo = res.algo;
    it = impl_->plans.emplace(key, std::move(p)).first;
  }
  Plan& p = *it->second;
  if (c.bias)
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias,
                                            sizeof(c.bias)), shape_text(c));
  LT_CHECK(cublasLtMatmul(impl_->lt, p.op, &c.alpha, c.B, p.a, c.A, p.b, &c.beta, c.C, p.c, c.C,
                          p.c, &p.algo, impl_->workspace, kWorkspaceBytes, s),
           shape_text(c));
}

}  // namespace tetrad::gpu
