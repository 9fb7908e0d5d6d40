// How a row-major GEMM (the op table's layout contract) becomes one column-major call of
// cuBLASLt (or hipBLASLt, rocBLAS: the same convention). Pure host arithmetic, no CUDA: it is
// compiled and unit-tested in every build (tests/test_gpu_host.cpp runs the mapped call through a
// column-major reference product and compares it with the row-major one).
//
// A row-major matrix X (rows r, cols c, leading dimension ld) is, read column-major, Xᵀ (rows c,
// cols r, same ld). So C = op(A)·op(B) with C row-major [M, N] is, column-major,
// Cᵀ [N, M] = op(B)ᵀ·op(A)ᵀ: the library's first operand is B, its second A, m' = N, n' = M, and
// each operand keeps its own transpose flag (a row-major B [K, N] read column-major is already
// N x K = op'(B) untransposed).
#pragma once
#include <cstddef>
#include <cstdint>

namespace tetrad::gpu {

struct ColMajorGemm {
  bool trans_first = false, trans_second = false;  // cuBLAS transa / transb
  int64_t m = 0, n = 0, k = 0;
  int first_is_a = 0;  // 0: first operand is the caller's B (always, documented for the test)
  // Stored shapes (rows, cols) of the two operands and C as the library's layouts describe them
  // (column-major, before the transpose flag is applied), with their leading dimensions.
  int64_t first_rows = 0, first_cols = 0, first_ld = 0;
  int64_t second_rows = 0, second_cols = 0, second_ld = 0;
  int64_t c_rows = 0, c_cols = 0, c_ld = 0;
};

// Row-major C[M,N] = op(A)·op(B): A [M,K] (trans_a: stored [K,M]) with lda, B [K,N] (trans_b:
// stored [N,K]) with ldb, C with ldc.
inline ColMajorGemm map_row_major_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N,
                                       int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
  ColMajorGemm g;
  g.m = N;
  g.n = M;
  g.k = K;
  g.trans_first = trans_b;
  g.trans_second = trans_a;
  // First operand = B read column-major: untransposed it is N x K (m' x k'), stored as such;
  // transposed, the stored matrix is K x N (k' x m').
  g.first_rows = trans_b ? K : N;
  g.first_cols = trans_b ? N : K;
  g.first_ld = ldb;
  // Second operand = A read column-major: untransposed K x M (k' x n'); transposed M x K.
  g.second_rows = trans_a ? M : K;
  g.second_cols = trans_a ? K : M;
  g.second_ld = lda;
  g.c_rows = N;
  g.c_cols = M;
  g.c_ld = ldc;
  return g;
}

// The leading dimensions a row-major operand needs at least (for argument checks): A [M,K] needs
// lda >= K (trans: >= M), and so on.
inline bool row_major_ld_ok(bool trans, int64_t rows, int64_t cols, int64_t ld) {
  return ld >= (trans ? rows : cols) && ld >= 1;
}

// The bf16 casts in front of a bf16 product (cuda_backend.cpp's op_gemm): every fp32-stored
// operand is rounded to bf16 into one scratch buffer, compact (ld = cols of the stored matrix),
// each at a 256-byte aligned offset (cuBLASLt's fastest kernels want 16-byte operands; the plan
// cache keys on alignment). An operand stored in bf16 already is read in place.
struct GemmCasts {
  struct Operand {
    bool cast = false, is_a = false;
    int64_t rows = 0, cols = 0, ld = 0;  // the stored fp32 matrix: rows x cols, leading dim ld
    size_t offset = 0;                   // of its bf16 copy in the scratch, bytes
  };
  Operand a, b;
  size_t bytes = 0;  // scratch needed for both (0: nothing to cast)
};
inline GemmCasts plan_gemm_casts(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                 int64_t lda, int64_t ldb, bool a_fp32, bool b_fp32) {
  GemmCasts g;
  auto place = [&](GemmCasts::Operand& o, bool cast, bool is_a, int64_t rows, int64_t cols,
                   int64_t ld) {
    o.is_a = is_a;
    o.rows = rows;
    o.cols = cols;
    o.ld = ld;
    o.cast = cast;
    if (!cast) return;
    o.offset = g.bytes;
    g.bytes += (size_t(rows) * size_t(cols) * 2 + 255) / 256 * 256;
  };
  place(g.a, a_fp32, true, trans_a ? K : M, trans_a ? M : K, lda);
  place(g.b, b_fp32, false, trans_b ? N : K, trans_b ? K : N, ldb);
  return g;
}

}  // namespace tetrad::gpu
