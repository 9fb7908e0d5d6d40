// Host-side logic of the GPU backend that needs no GPU, run in every build: the mapping of a
// row-major GEMM onto one column-major library call and the bf16 casts in front of it
// (backend/cuda/gemm_mapping.hpp), the attention kernels' shared-memory layouts and the refusal
// of a card too small for them (backend/cuda/attention_tiles.hpp), the device choice. The mapped
// call is executed by a column-major reference product that reads operands exactly as cuBLASLt
// does (stored rows x cols, leading dimension, then the transpose flag), on fresh random data
// with padded leading dimensions, and compared with the row-major product.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "tetrad/backend/cuda/attention_tiles.hpp"
#include "tetrad/backend/cuda/gemm_mapping.hpp"
#include "tetrad/backend/device_select.hpp"
#include "tetrad/core/error.hpp"

#include <cstdlib>

namespace {

using tetrad::gpu::ColMajorGemm;
using tetrad::gpu::map_row_major_gemm;

// Column-major D[m,n] = op(X)[m,k] op(Y)[k,n], X stored (xr, xc) with ldx, column-major.
void colmajor_gemm(const ColMajorGemm& g, const double* X, const double* Y, double* D) {
  auto x_at = [&](int64_t i, int64_t l) {  // op(X)(i, l)
    const int64_t r = g.trans_first ? l : i, c = g.trans_first ? i : l;
    EXPECT_LT(r, g.first_rows);
    EXPECT_LT(c, g.first_cols);
    return X[c * g.first_ld + r];
  };
  auto y_at = [&](int64_t l, int64_t j) {
    const int64_t r = g.trans_second ? j : l, c = g.trans_second ? l : j;
    EXPECT_LT(r, g.second_rows);
    EXPECT_LT(c, g.second_cols);
    return Y[c * g.second_ld + r];
  };
  for (int64_t j = 0; j < g.n; ++j)
    for (int64_t i = 0; i < g.m; ++i) {
      double s = 0;
      for (int64_t l = 0; l < g.k; ++l) s += x_at(i, l) * y_at(l, j);
      D[j * g.c_ld + i] = s;
    }
}

TEST(GpuHost, RowMajorGemmMapsToOneColumnMajorCall) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{3, 5, 7}, {8, 2, 1}, {1, 9, 4}}) {
        const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
        const int64_t arows = ta ? K : M, brows = tb ? N : K;
        std::vector<double> A(arows * lda), B(brows * ldb), C(M * ldc, -777), R(M * ldc, -777);
        for (auto& x : A) x = u(rng);
        for (auto& x : B) x = u(rng);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (int64_t l = 0; l < K; ++l)
              s += (ta ? A[l * lda + i] : A[i * lda + l]) * (tb ? B[j * ldb + l] : B[l * ldb + j]);
            R[i * ldc + j] = s;
          }
        const ColMajorGemm g = map_row_major_gemm(ta, tb, M, N, K, lda, ldb, ldc);
        EXPECT_EQ(g.m, N);
        EXPECT_EQ(g.n, M);
        EXPECT_EQ(g.k, K);
        // The library's first operand is the caller's B, the second A.
        colmajor_gemm(g, B.data(), A.data(), C.data());
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j)
            ASSERT_NEAR(C[i * ldc + j], R[i * ldc + j], 1e-12)
                << "ta=" << ta << " tb=" << tb << " M=" << M << " N=" << N << " K=" << K;
        // Padding columns of C were never written.
        for (int64_t i = 0; i < M; ++i) EXPECT_EQ(C[i * ldc + N], -777);
      }
}

TEST(GpuHost, LeadingDimensionCheck) {
  EXPECT_TRUE(tetrad::gpu::row_major_ld_ok(false, 4, 6, 6));
  EXPECT_FALSE(tetrad::gpu::row_major_ld_ok(false, 4, 6, 5));
  EXPECT_TRUE(tetrad::gpu::row_major_ld_ok(true, 4, 6, 4));
  EXPECT_FALSE(tetrad::gpu::row_major_ld_ok(true, 4, 6, 3));
}

// The casts in front of a bf16 product: each fp32-stored operand's stored matrix (rows x cols as
// the transpose flag stores it) gets a compact bf16 copy at a 256-byte aligned offset of one
// scratch; bf16-stored operands are read in place; the scratch holds both copies, no overlap.
TEST(GpuHost, Bf16GemmCastsPlanCompactAlignedCopies) {
  using tetrad::gpu::GemmCasts;
  using tetrad::gpu::plan_gemm_casts;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int form = 0; form < 4; ++form) {  // bit 0: A fp32-stored, bit 1: B fp32-stored
        const int64_t M = 37, N = 13, K = 29, lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5;
        const bool a32 = form & 1, b32 = form & 2;
        const GemmCasts g = plan_gemm_casts(ta, tb, M, N, K, lda, ldb, a32, b32);
        const std::string what = "ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                                 " form=" + std::to_string(form);
        EXPECT_EQ(g.a.cast, a32) << what;
        EXPECT_EQ(g.b.cast, b32) << what;
        EXPECT_TRUE(g.a.is_a && !g.b.is_a) << what;
        EXPECT_EQ(g.a.rows, ta ? K : M) << what;
        EXPECT_EQ(g.a.cols, ta ? M : K) << what;
        EXPECT_EQ(g.a.ld, lda) << what;
        EXPECT_EQ(g.b.rows, tb ? N : K) << what;
        EXPECT_EQ(g.b.cols, tb ? K : N) << what;
        EXPECT_EQ(g.b.ld, ldb) << what;
        const size_t a_bytes = size_t(M * K) * 2, b_bytes = size_t(K * N) * 2;
        size_t need = 0;
        if (a32) {
          EXPECT_EQ(g.a.offset % 256, 0u) << what;
          need = g.a.offset + a_bytes;
        }
        if (b32) {
          EXPECT_EQ(g.b.offset % 256, 0u) << what;
          if (a32) {
            EXPECT_GE(g.b.offset, g.a.offset + a_bytes) << what << ": the copies overlap";
          }
          need = std::max(need, g.b.offset + b_bytes);
        }
        EXPECT_GE(g.bytes, need) << what;
        if (!a32 && !b32) {
          EXPECT_EQ(g.bytes, 0u) << what;
        }
      }
}

// The attention kernels' shared memory (backend/cuda/attention_tiles.hpp): every layout's pieces
// in order, 128-byte aligned and not overlapping; WMMA's leading-dimension rules on the bf16 path;
// every head-dim bucket within sm_80's and sm_90's per-block opt-in (163 KB, 227 KB); and a card
// with sm_86 / sm_89's 99 KB refused by name at head_dim 128, with the largest head_dim it holds.
template <typename L>
void check_layout(const std::vector<size_t>& starts, const char* what) {
  for (size_t i = 0; i < starts.size(); ++i) {
    EXPECT_EQ(starts[i] % 128, 0u) << what << " piece " << i;
    if (i) {
      EXPECT_LT(starts[i - 1], starts[i]) << what << " piece " << i;
    }
  }
  EXPECT_GE(L::bytes, starts.back()) << what;
  EXPECT_EQ(L::ldo % 4, 0) << what;  // fp32 WMMA accumulators: ld a multiple of 4
  EXPECT_EQ(L::lds % 4, 0) << what;
}
template <int E, int PAD, int T, int H>
void check_layouts(const char* what) {
  using namespace tetrad::gpu::attn;
  using F = FwdLayout<E, PAD, T, T, H>;
  using Q = DqLayout<E, PAD, T, T, H>;
  using K = DkvLayout<E, PAD, T, T, H>;
  check_layout<F>({F::q, F::k, F::v, F::s, F::p, F::o, F::st}, what);
  check_layout<Q>({Q::q, Q::dout, Q::k, Q::v, Q::s, Q::dp, Q::ds, Q::dq, Q::st}, what);
  check_layout<K>({K::k, K::v, K::q, K::dout, K::s, K::p, K::dk, K::dv, K::st}, what);
  // The pieces hold what they say: each start plus its size at most the next start.
  EXPECT_LE(F::s + F::scores, F::p) << what;
  EXPECT_LE(K::dk + K::k_acc, K::dv) << what;
  EXPECT_LE(K::dv + K::k_acc, K::st) << what;
  if (E == 2) {  // bf16 WMMA operands: ld a multiple of 8 elements
    EXPECT_EQ(F::ldt % 8, 0) << what;
    EXPECT_EQ(F::ldp % 8, 0) << what;
  }
}

TEST(GpuHost, AttentionSharedMemoryFitsTheTargetsAndRefusesSmallCardsByName) {
  using namespace tetrad::gpu::attn;
  check_layouts<2, kBf16Pad, kBf16Tile, 16>("bf16 hd16");
  check_layouts<2, kBf16Pad, kBf16Tile, 128>("bf16 hd128");
  check_layouts<4, kF32Pad, kF32Tile, 16>("fp32 hd16");
  check_layouts<4, kF32Pad, kF32Tile, 128>("fp32 hd128");
  EXPECT_EQ(padded_head_dim(48), 64);
  EXPECT_EQ(padded_head_dim(128), 128);
  EXPECT_EQ(padded_head_dim(129), 0);
  EXPECT_EQ(smem_bytes(true, false, 200), 0u);
  const size_t sm80 = 163 * 1024, sm90 = 227 * 1024, sm89 = 99 * 1024;
  for (bool bf16 : {false, true})
    for (int hd : {8, 16, 24, 32, 48, 64, 80, 96, 128}) {
      const size_t need = std::max(smem_bytes(bf16, false, hd), smem_bytes(bf16, true, hd));
      EXPECT_GT(need, 0u);
      EXPECT_LE(need, sm80) << (bf16 ? "bf16" : "fp32") << " hd " << hd;
      EXPECT_EQ(smem_refusal(sm80, hd, bf16, "A100"), "");
      EXPECT_EQ(smem_refusal(sm90, hd, bf16, "H200"), "");
    }
  // The largest kernel: bf16 dK/dV at head_dim 128 (docs/gpu.md quotes it).
  EXPECT_EQ(smem_bytes(true, true, 128), 164352u);
  const std::string card = "NVIDIA GeForce RTX 4090 (compute capability 8.9, device 0)";
  for (bool bf16 : {false, true}) {
    const std::string why = smem_refusal(sm89, 128, bf16, card);
    EXPECT_NE(why.find(card), std::string::npos) << why;
    EXPECT_NE(why.find("head_dim 128"), std::string::npos) << why;
    EXPECT_NE(why.find(std::to_string(sm89)), std::string::npos) << why;
    EXPECT_NE(why.find(std::to_string(std::max(smem_bytes(bf16, false, 128), smem_bytes(bf16, true, 128)))),
              std::string::npos) << why;
    EXPECT_NE(why.find("head_dim at most 64"), std::string::npos) << why;
    EXPECT_EQ(smem_refusal(sm89, 64, bf16, card), "");
  }
}

// One rank per GPU: the node-local rank from whichever launcher set it picks the device.
TEST(GpuHost, LocalRankChoosesTheDevice) {
  using namespace tetrad::backend;
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"})
    unsetenv(v);
  std::string src;
  EXPECT_EQ(local_rank_from_environment(&src), 0);
  EXPECT_EQ(src, "none");
  setenv("SLURM_LOCALID", "3", 1);
  EXPECT_EQ(local_rank_from_environment(&src), 3);
  EXPECT_EQ(src, "SLURM_LOCALID");
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "5", 1);  // Open MPI's wins
  EXPECT_EQ(local_rank_from_environment(&src), 5);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x1", 1);
  try {
    local_rank_from_environment();
    ADD_FAILURE() << "a malformed local rank was accepted";
  } catch (const tetrad::Error& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_LOCAL_RANK='x1'"), std::string::npos) << e.what();
  }
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("SLURM_LOCALID");
  EXPECT_EQ(device_for_local_rank(0, 8), 0);
  EXPECT_EQ(device_for_local_rank(9, 8), 1);
  EXPECT_THROW(device_for_local_rank(0, 0), tetrad::Error);
  EXPECT_EQ(parse_device_index("cuda", "cuda"), -1);
  EXPECT_EQ(parse_device_index("cuda:3", "cuda"), 3);
  EXPECT_THROW(parse_device_index("cuda:", "cuda"), tetrad::Error);
  EXPECT_THROW(parse_device_index("cuda:-1", "cuda"), tetrad::Error);
  EXPECT_THROW(parse_device_index("gpu", "cuda"), tetrad::Error);
}

}  // namespace
