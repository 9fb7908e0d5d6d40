// bf16 attention on the matrix units: see attention_bf16.hpp for the contract and the method.
//
// Packed layouts (bf16 bits, uint16_t), per head slice, T rows padded to Tp (a multiple of 32),
// head_dim padded to hdp (a multiple of 32), zeros in the padding:
//   rows    [Tp][hdp]                 the first operand A of a product (row-major)
//   npanels [Tp/16][hdp/2][16][2]     X as the second operand of A·Xᵀ: panels of 16 rows of X,
//                                     pairs of head columns interleaved (AMX's / vdpbf16ps's
//                                     "VNNI" B layout, K = head columns)
//   dpanels [hdp/16][Tp/2][16][2]     X as the second operand of A·X: panels of 16 head columns,
//                                     pairs of rows interleaved (K = rows)
//   trows   [hdp][ldt]                Xᵀ as a first operand (K = rows of X)
// A product C[M][N] (+)= A[M][K]·B reads B as panels of 16 columns (panel stride `pstride`
// elements, row pair p of a panel at p * 32); M, N are multiples of 32 and K of 32 everywhere.
#include "tetrad/backend/cpu/attention_bf16.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"

// The vector helpers pass vectors by value; they are always inlined, so the ABI note is moot.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tetrad::kernels {
namespace {

#define TETRAD_INLINE inline __attribute__((always_inline))
#define TETRAD_T_AVX2 __attribute__((target("avx2,fma")))
#define TETRAD_T_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#define TETRAD_T_AMX \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,amx-tile,amx-bf16")))

constexpr int kB = 32;            // rows of a query or key block; head_dim is padded to it
constexpr int kMaxHdp = kAttentionBf16MaxHeadDim;  // the packers' row buffers
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

typedef uint32_t u32_alias __attribute__((may_alias));
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// 2^x, x clamped to [-126, 126]: the degree-6 fit of attention.cpp (relative error 2e-8), written
// scalar so the row loops vectorise.
TETRAD_INLINE float exp2_fast(float x) {
  x = x < -126.0f ? -126.0f : x;
  x = x > 126.0f ? 126.0f : x;
  constexpr float magic = 1.5f * 8388608.0f;
  const float kf = x + magic;
  const float r = x - (kf - magic);
  float p = r * 1.546973217e-04f + 1.340043265e-03f;
  p = p * r + 9.618025273e-03f;
  p = p * r + 5.550327152e-02f;
  p = p * r + 2.402265072e-01f;
  p = p * r + 6.931471825e-01f;
  p = p * r + 1.0f;
  const int32_t e = (std::bit_cast<int32_t>(kf) - std::bit_cast<int32_t>(magic) + 127) << 23;
  return p * std::bit_cast<float>(e);
}

// Round to bf16, nearest even, NaN kept quiet: the bits of float_to_bf16, branch-free so the row
// loops vectorise.
TETRAD_INLINE uint16_t bf16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// max of x[0..n), n >= 1, in 16 independent lanes (a plain max loop is one dependency chain: the
// compiler does not reassociate it).
TETRAD_INLINE float row_max(const float* x, int64_t n) {
  float m[16];
  for (int l = 0; l < 16; ++l) m[l] = x[0];
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
#pragma omp simd
    for (int l = 0; l < 16; ++l) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  for (; j < n; ++j) m[0] = x[j] > m[0] ? x[j] : m[0];
  float r = m[0];
  for (int l = 1; l < 16; ++l) r = m[l] > r ? m[l] : r;
  return r;
}

// ---- the block product, one per path ---------------------------------------------------------
// gemm<acc>(M, N, K, A, lda, B, pstride, C, ldc): C[M][N] (+)= A[M][K] · B[K][N], A row-major
// bf16, B in panels of 16 columns (see the file comment), C row-major fp32. M, N, K multiples of
// 32. begin() / end() bracket a thread's use (AMX: the tile configuration).

// Rounding to bf16 (to_bf16: n values; to_bf16_pairs: y[2l], y[2l+1] = x0[l], x1[l] for n, a
// multiple of 16, values of each): vcvtne2ps2bf16 on the bf16 paths (round to nearest even;
// like the bf16 units themselves it flushes denormals), the bit arithmetic of bf16_bits on the
// emulated ones.
// kFlush: to_bf16 flushes denormals to zero (sign kept), which bf16_copy follows for values
// already in bf16.
struct Avx512Cvt {
  static constexpr bool kFlush = true;
  static TETRAD_T_AVX512BF16 inline void to_bf16(const float* x, uint16_t* y, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
      _mm512_storeu_si512(y + i, (__m512i)v);
    }
    for (; i < n; i += 16) {
      const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
      const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
      _mm256_mask_storeu_epi16(y + i, m, (__m256i)v);
    }
  }
  static TETRAD_T_AVX512BF16 inline void to_bf16_pairs(const float* x0, const float* x1,
                                                       uint16_t* y, int64_t n) {
    alignas(64) static const uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19,
                                                         4,  20, 5,  21, 6,  22, 7,  23,
                                                         8,  24, 9,  25, 10, 26, 11, 27,
                                                         12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i idx = _mm512_load_si512(kInterleave);
    for (int64_t i = 0; i < n; i += 16) {
      const __m512i v =
          (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x1 + i), _mm512_loadu_ps(x0 + i));
      _mm512_storeu_si512(y + 2 * i, _mm512_permutexvar_epi16(idx, v));
    }
  }
};
struct ScalarCvt {
  static constexpr bool kFlush = false;
  static inline void to_bf16(const float* x, uint16_t* y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_bits(x[i]);
  }
  static inline void to_bf16_pairs(const float* x0, const float* x1, uint16_t* y, int64_t n) {
    u32_alias* o = reinterpret_cast<u32_alias*>(y);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = uint32_t(bf16_bits(x0[i])) | uint32_t(bf16_bits(x1[i])) << 16;
  }
};

// AMX: all eight tiles 16 rows x 64 bytes; a 32 x 32 block of C is four accumulator tiles (0-3),
// held across the whole K loop, fed by two A tiles (4, 5) and two B tiles (6, 7) per 32 of K.
struct AmxMm : Avx512Cvt {
  struct alignas(64) TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  };
  static TETRAD_T_AMX inline void begin() {
    TileConfig cfg{};
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
  }
  static TETRAD_T_AMX inline void end() { _tile_release(); }
  template <bool kAcc>
  static TETRAD_T_AMX inline void gemm(int64_t M, int64_t N, int64_t K, const uint16_t* A,
                                              int64_t lda, const uint16_t* B, int64_t pstride,
                                              float* C, int64_t ldc) {
    const int64_t as = lda * 2, cs = ldc * 4;
    for (int64_t m0 = 0; m0 < M; m0 += 32)
      for (int64_t n0 = 0; n0 < N; n0 += 32) {
        float* c0 = C + m0 * ldc + n0;
        float* c1 = c0 + 16 * ldc;
        if constexpr (kAcc) {
          _tile_loadd(0, c0, cs);
          _tile_loadd(1, c0 + 16, cs);
          _tile_loadd(2, c1, cs);
          _tile_loadd(3, c1 + 16, cs);
        } else {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
        }
        const uint16_t* a0 = A + m0 * lda;
        const uint16_t* a1 = a0 + 16 * lda;
        const uint16_t* b0 = B + (n0 / 16) * pstride;
        const uint16_t* b1 = b0 + pstride;
        for (int64_t k0 = 0; k0 < K; k0 += 32) {
          _tile_loadd(4, a0 + k0, as);
          _tile_loadd(6, b0 + k0 * 16, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_loadd(7, b1 + k0 * 16, 64);
          _tile_dpbf16ps(1, 4, 7);
          _tile_loadd(5, a1 + k0, as);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, c0, cs);
        _tile_stored(1, c0 + 16, cs);
        _tile_stored(2, c1, cs);
        _tile_stored(3, c1 + 16, cs);
      }
  }
  // C[32][N] = A[32][K] · B for K <= 64: A's (up to) four tiles stay loaded (2-5) while the
  // B panels stream through tiles 6-7 into the accumulators 0-1, one 16-column panel at a time:
  // half the tile loads of gemm() for the score blocks, whose K is only head_dim.
  static TETRAD_T_AMX inline void gemm_a32(int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                                           const uint16_t* B, int64_t pstride, float* C,
                                           int64_t ldc) {
    if (K > 64) return gemm<false>(32, N, K, A, lda, B, pstride, C, ldc);
    const int64_t as = lda * 2, cs = ldc * 4;
    const bool two = K > 32;
    _tile_loadd(2, A, as);
    _tile_loadd(3, A + 16 * lda, as);
    if (two) {
      _tile_loadd(4, A + 32, as);
      _tile_loadd(5, A + 16 * lda + 32, as);
    }
    for (int64_t n0 = 0; n0 < N; n0 += 16) {
      const uint16_t* b = B + (n0 / 16) * pstride;
      _tile_zero(0);
      _tile_zero(1);
      _tile_loadd(6, b, 64);
      _tile_dpbf16ps(0, 2, 6);
      _tile_dpbf16ps(1, 3, 6);
      if (two) {
        _tile_loadd(7, b + 512, 64);
        _tile_dpbf16ps(0, 4, 7);
        _tile_dpbf16ps(1, 5, 7);
      }
      _tile_stored(0, C + n0, cs);
      _tile_stored(1, C + 16 * ldc + n0, cs);
    }
  }
};

// AVX512-BF16: 8 rows x 32 columns of C in 16 zmm accumulators; per pair of K, two B vectors
// (one per panel) and a broadcast pair of A per row.
struct Avx512Bf16Mm : Avx512Cvt {
  static inline void begin() {}
  static inline void end() {}
  static TETRAD_T_AVX512BF16 inline void gemm_a32(int64_t N, int64_t K, const uint16_t* A,
                                                  int64_t lda, const uint16_t* B, int64_t pstride,
                                                  float* C, int64_t ldc) {
    gemm<false>(32, N, K, A, lda, B, pstride, C, ldc);
  }
  template <bool kAcc>
  static TETRAD_T_AVX512BF16 inline void gemm(int64_t M, int64_t N, int64_t K,
                                                     const uint16_t* A, int64_t lda,
                                                     const uint16_t* B, int64_t pstride, float* C,
                                                     int64_t ldc) {
    constexpr int R = 8;
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      const uint16_t* b0 = B + (n0 / 16) * pstride;
      const uint16_t* b1 = b0 + pstride;
      for (int64_t m0 = 0; m0 < M; m0 += R) {
        __m512 acc[R][2];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          acc[r][0] = kAcc ? _mm512_loadu_ps(C + (m0 + r) * ldc + n0) : _mm512_setzero_ps();
          acc[r][1] = kAcc ? _mm512_loadu_ps(C + (m0 + r) * ldc + n0 + 16) : _mm512_setzero_ps();
        }
        const uint16_t* a = A + m0 * lda;
        for (int64_t kp = 0; kp < K / 2; ++kp) {
          const __m512bh w0 = (__m512bh)_mm512_loadu_si512(b0 + kp * 32);
          const __m512bh w1 = (__m512bh)_mm512_loadu_si512(b1 + kp * 32);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            uint32_t x;
            std::memcpy(&x, a + r * lda + 2 * kp, 4);
            const __m512bh ar = (__m512bh)_mm512_set1_epi32(int(x));
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ar, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ar, w1);
          }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          _mm512_storeu_ps(C + (m0 + r) * ldc + n0, acc[r][0]);
          _mm512_storeu_ps(C + (m0 + r) * ldc + n0 + 16, acc[r][1]);
        }
      }
    }
  }
};

// Emulated: the bf16 operands widened to fp32 (exact: a bf16 is the top half of a float) and
// multiplied in fp32, 4 rows x 32 columns per register tile; compiled for AVX2+FMA or SSE2 by the
// entry it is inlined into.
struct EmulatedMm : ScalarCvt {
  static inline void begin() {}
  static inline void end() {}
  static inline void gemm_a32(int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                              const uint16_t* B, int64_t pstride, float* C, int64_t ldc) {
    gemm<false>(32, N, K, A, lda, B, pstride, C, ldc);
  }
  template <bool kAcc>
  static inline void gemm(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                                 const uint16_t* B, int64_t pstride, float* C, int64_t ldc) {
    constexpr int R = 4;
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      const uint16_t* b0 = B + (n0 / 16) * pstride;
      const uint16_t* b1 = b0 + pstride;
      for (int64_t m0 = 0; m0 < M; m0 += R) {
        f32x16 acc[R][2];
        for (int r = 0; r < R; ++r) {
          if (kAcc) {
            std::memcpy(&acc[r][0], C + (m0 + r) * ldc + n0, 64);
            std::memcpy(&acc[r][1], C + (m0 + r) * ldc + n0 + 16, 64);
          } else {
            acc[r][0] = f32x16{};
            acc[r][1] = f32x16{};
          }
        }
        const uint16_t* a = A + m0 * lda;
        for (int64_t kp = 0; kp < K / 2; ++kp) {
          u32x16 w0, w1;
          std::memcpy(&w0, b0 + kp * 32, 64);
          std::memcpy(&w1, b1 + kp * 32, 64);
          const f32x16 lo0 = (f32x16)(w0 << 16), hi0 = (f32x16)(w0 & 0xffff0000u);
          const f32x16 lo1 = (f32x16)(w1 << 16), hi1 = (f32x16)(w1 & 0xffff0000u);
          for (int r = 0; r < R; ++r) {
            uint32_t x;
            std::memcpy(&x, a + r * lda + 2 * kp, 4);
            const float alo = std::bit_cast<float>(x << 16);
            const float ahi = std::bit_cast<float>(x & 0xffff0000u);
            acc[r][0] += alo * lo0 + ahi * hi0;
            acc[r][1] += alo * lo1 + ahi * hi1;
          }
        }
        for (int r = 0; r < R; ++r) {
          std::memcpy(C + (m0 + r) * ldc + n0, &acc[r][0], 64);
          std::memcpy(C + (m0 + r) * ldc + n0 + 16, &acc[r][1], 64);
        }
      }
    }
  }
};

// ---- packing -----------------------------------------------------------------------------------

struct PackTo {
  uint16_t* rows = nullptr;  // [Tp][hdp]
  uint16_t* np = nullptr;    // [Tp/16][hdp/2][16][2]
  uint16_t* dp = nullptr;    // [hdp/16][Tp/2][16][2]
  uint16_t* tr = nullptr;    // [hdp][ldt]
};

// Rows t0..t0+31 (t0 a multiple of 32) of one head slice: src points at row t0 (row stride rs),
// rows at or after T are padding (zeros). Rounded once into a row buffer in L1, then written to
// each requested layout in whole cache lines (a row at a time would scatter 4-byte stores over
// dozens of lines per row).
// A bf16 src (the caller's bf16 copy) is taken as its fp32 widening would be rounded.
template <class Mm, class S>
inline void pack_block(const S* src, int64_t rs, int64_t T, int hd, int hdp, int64_t Tp,
                       int64_t ldt, int64_t t0, const PackTo& o) {
  alignas(64) uint16_t x[kB * kMaxHdp];
  for (int r = 0; r < kB; ++r) {
    uint16_t* xr = x + r * hdp;
    if (t0 + r < T) {
      if constexpr (std::is_same_v<S, uint16_t>)
        for (int c = 0; c < hd; ++c) {
          const uint16_t v = src[r * rs + c];
          xr[c] = Mm::kFlush && !(v & 0x7f80u) ? uint16_t(v & 0x8000u) : v;
        }
      else Mm::to_bf16(src + r * rs, xr, hd);
      for (int c = hd; c < hdp; ++c) xr[c] = 0;
    } else {
      std::memset(xr, 0, sizeof(uint16_t) * hdp);
    }
  }
  if (o.rows) std::memcpy(o.rows + t0 * hdp, x, sizeof(uint16_t) * kB * hdp);
  const u32_alias* x32 = reinterpret_cast<const u32_alias*>(x);
  if (o.np) {  // two panels of 16 rows: [hdp/2][16] words, word (cp, l) = row l's column pair cp
    for (int q = 0; q < 2; ++q) {
      u32_alias* dst = reinterpret_cast<u32_alias*>(o.np + (t0 / 16 + q) * hdp * 16);
      for (int cp = 0; cp < hdp / 2; ++cp)
#pragma omp simd
        for (int l = 0; l < 16; ++l) dst[cp * 16 + l] = x32[(q * 16 + l) * (hdp / 2) + cp];
    }
  }
  if (o.dp) {  // per panel of 16 columns: 16 row pairs x 16 columns, the pair in one word
    for (int p = 0; p < hdp / 16; ++p) {
      u32_alias* dst = reinterpret_cast<u32_alias*>(o.dp + p * Tp * 16 + (t0 / 2) * 32);
      for (int rp = 0; rp < kB / 2; ++rp)
#pragma omp simd
        for (int l = 0; l < 16; ++l)
          dst[rp * 16 + l] = uint32_t(x[2 * rp * hdp + p * 16 + l]) |
                             uint32_t(x[(2 * rp + 1) * hdp + p * 16 + l]) << 16;
    }
  }
  if (o.tr) {
    for (int c = 0; c < hdp; ++c)
#pragma omp simd
      for (int r = 0; r < kB; ++r) o.tr[c * ldt + t0 + r] = x[r * hdp + c];
  }
}

// ---- shapes ------------------------------------------------------------------------------------

struct Shape {
  int64_t B, nh, nkv, group, hd, hdp, Tq, Tk, Tqp, Tkp, ldt, ldq, qoff;
  // ldt: row stride of Kᵀ; ldq: of dqᵀ (one cache line past the row, so that a tile's 16 rows do
  // not fall on the same L1 sets, as 4 KiB strides would)
  Shape(const AttentionDims& d, int64_t q_offset)
      : B(d.B), nh(d.n_head), nkv(d.n_kv_head), group(d.n_head / d.n_kv_head), hd(d.head_dim),
        hdp(round_up(d.head_dim, kB)), Tq(d.Tq), Tk(d.Tk), Tqp(round_up(d.Tq, kB)),
        Tkp(round_up(d.Tk, kB)), ldt(round_up(d.Tk, kB) + kB), ldq(round_up(d.Tq, kB) + 16),
        qoff(q_offset) {}
  // Keys query i sees (causal and within the Tk real keys); none for padding rows.
  int64_t visible(int64_t i) const {
    return i < Tq ? std::clamp<int64_t>(qoff + i + 1, 0, Tk) : 0;
  }
};

// The document mask's first key query i of sequence b sees (0 without a mask), clamped to
// [0, Tk]: the query sees keys [doc_first(b, i), visible(i)).
inline int64_t doc_first(const AttentionDims& d, int64_t b, int64_t i) {
  if (!d.doc_start || i >= d.Tq) return 0;
  return std::clamp<int64_t>(int64_t(d.doc_start[b * d.doc_batch_stride + i]) - d.doc_shift, 0,
                             d.Tk);
}

// ---- forward -----------------------------------------------------------------------------------

struct FwdCtx {
  const AttentionDims* d;
  Shape z;
  const float *q, *k, *v;
  float *out, *lse;
  uint16_t *qa, *kn, *vd;  // Q rows [BH][Tqp][hdp]; K npanels, V dpanels [B*nkv][Tkp*hdp]
};

struct FwdScratch {
  std::vector<float> s, o, l;
  std::vector<uint16_t> p;
};
__attribute__((noinline)) FwdScratch& fwd_scratch(const Shape& z, int64_t lds, int64_t ldp) {
  thread_local FwdScratch t;
  if (t.s.size() < size_t(kB * lds)) t.s.resize(size_t(kB * lds));
  if (t.p.size() < size_t(kB * ldp)) t.p.resize(size_t(kB * ldp));
  if (t.o.size() < size_t(kB * z.hdp)) t.o.resize(size_t(kB * z.hdp));
  if (t.l.size() < size_t(kB)) t.l.resize(kB);
  return t;
}

template <class Mm>
inline void forward_worker(const FwdCtx& c) {
  const Shape& z = c.z;
  const AttentionDims& d = *c.d;
  const int64_t BH = z.B * z.nh;
  const int hd = int(z.hd), hdp = int(z.hdp);
  // Token-major (a block of 32 tokens, every head): the source rows are read in order, not one
  // head's slice at a row stride (which defeats the prefetchers).
#pragma omp for schedule(static) nowait  // (the k/v loop's barrier waits for both)
  for (int64_t r = 0; r < z.B * z.Tqp / kB; ++r) {
    const int64_t b = r / (z.Tqp / kB), t0 = r % (z.Tqp / kB) * kB;
    for (int64_t h = 0; h < z.nh; ++h) {
      PackTo o;
      o.rows = c.qa + (b * z.nh + h) * z.Tqp * hdp;
      pack_block<Mm>(c.q + b * d.q_batch_stride + t0 * d.q_stride + h * hd, d.q_stride, z.Tq, hd,
                     hdp, z.Tqp, 0, t0, o);
    }
  }
#pragma omp for schedule(static)
  for (int64_t r = 0; r < z.B * z.Tkp / kB; ++r) {
    const int64_t b = r / (z.Tkp / kB), t0 = r % (z.Tkp / kB) * kB;
    for (int64_t g = 0; g < z.nkv; ++g) {
      const int64_t kvh = b * z.nkv + g, off = b * d.kv_batch_stride + t0 * d.kv_stride + g * hd;
      PackTo ok, ov;
      ok.np = c.kn + kvh * z.Tkp * hdp;
      ov.dp = c.vd + kvh * z.Tkp * hdp;
      pack_block<Mm>(c.k + off, d.kv_stride, z.Tk, hd, hdp, z.Tkp, 0, t0, ok);
      pack_block<Mm>(c.v + off, d.kv_stride, z.Tk, hd, hdp, z.Tkp, 0, t0, ov);
    }
  }
  // Row strides of the score and probability blocks one cache line past the block's width, so a
  // tile's 16 rows do not share L1 sets.
  const int64_t lds = z.Tkp + 16, ldp = z.Tkp + 32;
  FwdScratch& s = fwd_scratch(z, lds, ldp);
  const float scale2 = kLog2e / std::sqrt(float(hd));  // scores in base 2
  const int64_t nqb = z.Tqp / kB;
  Mm::begin();
  // The last query blocks see the most keys: largest tasks first.
#pragma omp for schedule(dynamic, 1)
  for (int64_t task = 0; task < nqb * BH; ++task) {
    const int64_t ib = nqb - 1 - task / BH, bh = task % BH;
    const int64_t b = bh / z.nh, h = bh % z.nh, kvh = b * z.nkv + h / z.group, i0 = ib * kB;
    const int64_t last = std::min(z.Tq, i0 + kB) - 1;
    const int64_t n =
        std::clamp(round_up(std::min(z.Tk, z.qoff + last + 1), kB), int64_t(0), z.Tkp);
    Mm::gemm_a32(n, hdp, c.qa + (bh * z.Tqp + i0) * hdp, hdp, c.kn + kvh * z.Tkp * hdp,
                 int64_t(hdp) * 16, s.s.data(), lds);
    float* lrow = s.l.data();
    for (int64_t r = 0; r < kB; ++r) {
      const int64_t nvis = z.visible(i0 + r), lo = std::min(nvis, doc_first(d, b, i0 + r));
      const bool seen = nvis > lo;  // keys [lo, nvis) are visible
      const float* srow = s.s.data() + r * lds;
      uint16_t* prow = s.p.data() + r * ldp;
      const float mx = seen ? row_max(srow + lo, nvis - lo) * scale2 : 0.0f;
      // (max(s)·scale2 = max(s·scale2): scale2 > 0 and rounding is monotone.) P in fp32 in
      // 32-key pieces that stay in L1, rounded into prow from there (the masked keys, scores of
      // real or zero padding keys, are finite and give 0); the sum in 16 lanes of a register.
      f32x16 acc{};
      for (int64_t j0 = 0; j0 < n; j0 += 32) {
        alignas(64) float pf[32];
        const int lim = int(std::clamp<int64_t>(nvis - j0, 0, 32));  // (32-bit lane compares)
        const int first = int(std::clamp<int64_t>(lo - j0, 0, 32));
#pragma omp simd
        for (int l = 0; l < 32; ++l) {
          const float p = exp2_fast(srow[j0 + l] * scale2 - mx);
          pf[l] = l < lim && l >= first ? p : 0.0f;
        }
        f32x16 a0, a1;
        std::memcpy(&a0, pf, 64);
        std::memcpy(&a1, pf + 16, 64);
        acc += a0 + a1;
        Mm::to_bf16(pf, prow + j0, 32);
      }
      float sum = 0;
      for (int l = 0; l < 16; ++l) sum += acc[l];
      lrow[r] = seen ? sum : 1.0f;
      if (c.lse && i0 + r < z.Tq)  // a query that sees no key: out 0, lse -inf
        c.lse[bh * z.Tq + i0 + r] = seen ? (mx + std::log2(sum)) * kLn2 : -INFINITY;
    }
    Mm::template gemm<false>(kB, hdp, n, s.p.data(), ldp, c.vd + kvh * z.Tkp * hdp,
                             z.Tkp * 16, s.o.data(), hdp);
    for (int64_t r = 0; r < kB && i0 + r < z.Tq; ++r) {
      const float inv = 1.0f / lrow[r];
      const float* o = s.o.data() + r * hdp;
      float* dst = c.out + b * d.out_batch_stride + (i0 + r) * d.out_stride + h * hd;
#pragma omp simd
      for (int e = 0; e < hd; ++e) dst[e] = o[e] * inv;
    }
  }
  Mm::end();
}

// ---- backward ----------------------------------------------------------------------------------

struct BwdCtx {
  const AttentionDims* d;
  Shape z;
  const float *q, *k, *v, *dout, *out, *lse;
  float *dq, *dk, *dv;
  // Q and dO as npanels (Sᵀ, dPᵀ) and dpanels (dK, dV) [BH][Tqp*hdp]; K, V rows (Sᵀ, dPᵀ)
  // [B*nkv][Tkp*hdp]; Kᵀ trows (dQᵀ) [B*nkv][hdp*ldt].
  uint16_t *qn, *qd, *don, *dod, *ka, *va, *kt;
  float *L, *D;   // [BH][Tqp]: lse·log2(e) and rowsum(dO ∘ O); 0 for padding rows
  int32_t* vis;   // [Tqp]: keys each query sees
  int32_t* lo;    // [B][Tqp]: the first key each query sees; nullptr without a document mask
  // The forward's q, k, v and out read from bf16 copies instead (q, k, v, out unused then).
  const uint16_t *q16 = nullptr, *k16 = nullptr, *v16 = nullptr, *out16 = nullptr;
};

// Keys per chunk of the backward: dSᵀ of a chunk's keys against every query is kept (bf16, in
// the B layout of dQᵀ = Kᵀ·dSᵀ), and dQᵀ then runs as one product per 32-query block over all
// the chunk's keys that block sees, its accumulators held in the tiles from the first key to the
// last (a product per key block would load and store dQᵀ's accumulators for every 32 keys: three
// tile transfers per tile product instead of one). 512 keys: 1 MiB of dSᵀ per thread at 1024
// queries, linear in the sequence length.
constexpr int64_t kKeyChunk = 512;

// Per thread: one key block against every query that sees it, keys as rows. st / dpt: Sᵀ and
// dPᵀ (fp32) [32][ldn]; pt / dst: Pᵀ and dSᵀ in bf16 [32][ldb]; dsv: the chunk's dSᵀ as the
// second operand of Kᵀ·dSᵀ (panels of 16 queries, pairs of keys interleaved)
// [Tqp/16][kc/2][16][2] (panel stride kc·16, kc = the chunk's width); acc_k / acc_v: dK, dV of
// the chunk's keys [kc][hdp]; dqt: dQᵀ of the task's heads [group][hdp][ldq].
struct BwdScratch {
  int64_t ldn = 0, ldb = 0;
  std::vector<float> st, dpt, acc_k, acc_v, dqt;
  std::vector<uint16_t> pt, dst, dsv;
};
__attribute__((noinline)) BwdScratch& bwd_scratch(const Shape& z, int64_t kc) {
  thread_local BwdScratch t;
  t.ldn = z.Tqp + 16, t.ldb = z.Tqp + 32;  // one cache line past the row (see Shape::ldq)
  auto grow_to = [](auto& v, int64_t n) {
    if (v.size() < size_t(n)) v.resize(size_t(n));
  };
  grow_to(t.st, kB * t.ldn), grow_to(t.dpt, kB * t.ldn);
  grow_to(t.pt, kB * t.ldb), grow_to(t.dst, kB * t.ldb), grow_to(t.dsv, z.Tqp * kc);
  grow_to(t.acc_k, kc * z.hdp), grow_to(t.acc_v, kc * z.hdp);
  grow_to(t.dqt, z.group * z.hdp * z.ldq);
  return t;
}

// P and dS of key block j0 against queries i0.. (nq of them, a multiple of 32; L, D, vis, lo
// start at i0), from Sᵀ and dPᵀ, rounded straight into pt, dst and the key block's rows of dsv
// (dsv points at query i0's panel and the block's first key pair; panels dstride apart), two keys
// at a time in 32-query pieces that stay in L1. kDocs: a document mask (lo, each query's first
// key); without one the loop is the plain causal one. The lane test is branch-free (`&`, both
// loads unconditional): a short-circuit `&&` on lo's load made GCC leave the loop scalar (the
// backward ran 1.8x slower).
template <class Mm, bool kDocs>
inline void block_probabilities(BwdScratch& s, int64_t nq, const float* L, const float* D,
                                const int32_t* vis, const int32_t* lo, int64_t j0, float scale2,
                                float scale, uint16_t* dsv, int64_t dstride) {
  for (int rp = 0; rp < kB / 2; ++rp)
    for (int64_t c0 = 0; c0 < nq; c0 += 32) {
      alignas(64) float p[2][32], ds[2][32];
      for (int h = 0; h < 2; ++h) {
        const int r = 2 * rp + h;
        const int32_t j = int32_t(j0 + r);
        const float* srow = s.st.data() + r * s.ldn + c0;
        const float* dprow = s.dpt.data() + r * s.ldn + c0;
#pragma omp simd
        for (int l = 0; l < 32; ++l) {
          bool on = j < vis[c0 + l];
          if constexpr (kDocs) on = on & (j >= lo[c0 + l]);
          const float pv = exp2_fast(srow[l] * scale2 - L[c0 + l]);
          const float dv = pv * (dprow[l] - D[c0 + l]) * scale;
          p[h][l] = on ? pv : 0.0f;
          ds[h][l] = on ? dv : 0.0f;
        }
        Mm::to_bf16(p[h], s.pt.data() + r * s.ldb + c0, 32);
        Mm::to_bf16(ds[h], s.dst.data() + r * s.ldb + c0, 32);
      }
      uint16_t* o = dsv + (c0 / 16) * dstride + rp * 32;
      Mm::to_bf16_pairs(ds[0], ds[1], o, 16);
      Mm::to_bf16_pairs(ds[0] + 16, ds[1] + 16, o + dstride, 16);
    }
}

template <class Mm>
inline void backward_worker(const BwdCtx& c) {
  const Shape& z = c.z;
  const AttentionDims& d = *c.d;
  const int64_t KV = z.B * z.nkv;
  const int hd = int(z.hd), hdp = int(z.hdp);
#pragma omp for schedule(static) nowait  // (the k/v loop's barrier waits for both)
  for (int64_t r = 0; r < z.B * z.Tqp / kB; ++r) {
    const int64_t b = r / (z.Tqp / kB), t0 = r % (z.Tqp / kB) * kB;
    for (int64_t h = 0; h < z.nh; ++h) {
      const int64_t bh = b * z.nh + h;
      const int64_t oo = b * d.out_batch_stride + t0 * d.out_stride + h * hd;
      PackTo oq, og;
      oq.np = c.qn + bh * z.Tqp * hdp, oq.dp = c.qd + bh * z.Tqp * hdp;
      og.np = c.don + bh * z.Tqp * hdp, og.dp = c.dod + bh * z.Tqp * hdp;
      const int64_t qo = b * d.q_batch_stride + t0 * d.q_stride + h * hd;
      if (c.q16) pack_block<Mm>(c.q16 + qo, d.q_stride, z.Tq, hd, hdp, z.Tqp, 0, t0, oq);
      else pack_block<Mm>(c.q + qo, d.q_stride, z.Tq, hd, hdp, z.Tqp, 0, t0, oq);
      pack_block<Mm>(c.dout + oo, d.out_stride, z.Tq, hd, hdp, z.Tqp, 0, t0, og);
      for (int64_t i = t0; i < t0 + kB; ++i) {
        float dd = 0, l = 0;
        if (i < z.Tq) {
          const float* g = c.dout + oo + (i - t0) * d.out_stride;
          // A bf16 out widened into a row first: the one sum below (its order the
          // vectorisation's) runs on the same values either way.
          alignas(64) float orow[kMaxHdp];
          const float* o = c.out16 ? orow : c.out + oo + (i - t0) * d.out_stride;
          for (int e = 0; c.out16 && e < hd; ++e)
            orow[e] = backend::bf16_to_float(c.out16[oo + (i - t0) * d.out_stride + e]);
#pragma omp simd reduction(+ : dd)
          for (int e = 0; e < hd; ++e) dd += o[e] * g[e];
          l = c.lse[bh * z.Tq + i] * kLog2e;
        }
        c.D[bh * z.Tqp + i] = dd;
        c.L[bh * z.Tqp + i] = l;
      }
    }
  }
#pragma omp for schedule(static)
  for (int64_t r = 0; r < z.B * z.Tkp / kB; ++r) {
    const int64_t b = r / (z.Tkp / kB), t0 = r % (z.Tkp / kB) * kB;
    for (int64_t g = 0; g < z.nkv; ++g) {
      const int64_t kvh = b * z.nkv + g, off = b * d.kv_batch_stride + t0 * d.kv_stride + g * hd;
      PackTo ok, ov;
      ok.rows = c.ka + kvh * z.Tkp * hdp, ok.tr = c.kt + kvh * hdp * z.ldt;
      ov.rows = c.va + kvh * z.Tkp * hdp;
      if (c.k16) {
        pack_block<Mm>(c.k16 + off, d.kv_stride, z.Tk, hd, hdp, z.Tkp, z.ldt, t0, ok);
        pack_block<Mm>(c.v16 + off, d.kv_stride, z.Tk, hd, hdp, z.Tkp, z.ldt, t0, ov);
      } else {
        pack_block<Mm>(c.k + off, d.kv_stride, z.Tk, hd, hdp, z.Tkp, z.ldt, t0, ok);
        pack_block<Mm>(c.v + off, d.kv_stride, z.Tk, hd, hdp, z.Tkp, z.ldt, t0, ov);
      }
    }
  }
  const float scale = 1.0f / std::sqrt(float(hd)), scale2 = scale * kLog2e;
  const int64_t kc_max = std::min<int64_t>(kKeyChunk, z.Tkp);
  BwdScratch& s = bwd_scratch(z, kc_max);
  const int64_t dq_head = int64_t(hdp) * z.ldq;
  Mm::begin();
  // Task (sequence b, kv head g): it owns the dk/dv rows of g and the dq columns of the group's
  // heads. Only the (sequence, kv head) pairs are spread over threads, never a head's key blocks:
  // a head's arithmetic then depends on nothing but its own shapes, so a grid that splits the
  // heads or the batch computes bit for bit what one rank does (bf16 rounding of P and dS would
  // turn a different summation order of dQ into visibly different losses).
#pragma omp for schedule(dynamic, 1)
  for (int64_t kvh = 0; kvh < KV; ++kvh) {
    const int64_t b = kvh / z.nkv, g = kvh % z.nkv;
    for (int64_t c0 = 0; c0 < z.Tkp; c0 += kc_max) {
      const int64_t kc = std::min(kc_max, z.Tkp - c0);  // a multiple of 32
      const bool last_chunk = c0 + kc >= z.Tkp;
      std::fill(s.acc_k.begin(), s.acc_k.begin() + kc * hdp, 0.0f);
      std::fill(s.acc_v.begin(), s.acc_v.begin() + kc * hdp, 0.0f);
      for (int64_t gi = 0; gi < z.group; ++gi) {
        const int64_t bh = b * z.nh + g * z.group + gi;
        const int64_t qo = bh * z.Tqp * hdp;
        float* dqt = s.dqt.data() + gi * dq_head;
        for (int64_t j0 = c0; j0 < c0 + kc; j0 += kB) {
          const int64_t i_first = std::max<int64_t>(0, j0 - z.qoff);  // first query that sees j0
          if (i_first >= z.Tq) break;  // nor any later key
          // Every query that sees the block at once (from its first 32-query block on): the
          // score products keep K_j / V_j in the tiles, and dK_j, dV_j accumulate over all of
          // them in one product each.
          const int64_t i0 = i_first / kB * kB, nq = z.Tqp - i0;
          const uint16_t* Kj = c.ka + (kvh * z.Tkp + j0) * hdp;
          const uint16_t* Vj = c.va + (kvh * z.Tkp + j0) * hdp;
          Mm::gemm_a32(nq, hdp, Kj, hdp, c.qn + qo + i0 * hdp, int64_t(hdp) * 16, s.st.data(),
                       s.ldn);
          Mm::gemm_a32(nq, hdp, Vj, hdp, c.don + qo + i0 * hdp, int64_t(hdp) * 16, s.dpt.data(),
                       s.ldn);
          uint16_t* dsv = s.dsv.data() + (i0 / 16) * kc * 16 + (j0 - c0) * 16;
          if (c.lo)
            block_probabilities<Mm, true>(s, nq, c.L + bh * z.Tqp + i0, c.D + bh * z.Tqp + i0,
                                          c.vis + i0, c.lo + b * z.Tqp + i0, j0, scale2, scale,
                                          dsv, kc * 16);
          else
            block_probabilities<Mm, false>(s, nq, c.L + bh * z.Tqp + i0, c.D + bh * z.Tqp + i0,
                                           c.vis + i0, nullptr, j0, scale2, scale, dsv, kc * 16);
          Mm::template gemm<true>(kB, hdp, nq, s.pt.data(), s.ldb, c.dod + qo + i0 * 16,
                                  z.Tqp * 16, s.acc_v.data() + (j0 - c0) * hdp, hdp);
          Mm::template gemm<true>(kB, hdp, nq, s.dst.data(), s.ldb, c.qd + qo + i0 * 16,
                                  z.Tqp * 16, s.acc_k.data() + (j0 - c0) * hdp, hdp);
        }
        // dQᵀ (+)= Kᵀ·dSᵀ per 32-query block over the chunk's keys it sees (those dsv holds for
        // it: a key block's rows start at its first query block). The first chunk writes every
        // block (each sees key 0).
        const uint16_t* KT = c.kt + kvh * hdp * z.ldt + c0;
        for (int64_t i0 = 0; i0 < z.Tqp; i0 += kB) {
          const int64_t last = std::min(z.Tq, i0 + kB) - 1;
          const int64_t kend = std::min(z.Tkp, round_up(std::min(z.Tk, z.qoff + last + 1), kB));
          const int64_t kk = std::min(kend, c0 + kc) - c0;
          if (kk <= 0 && c0 == 0)  // queries before every key (q_offset < 0): their dq is 0
            for (int64_t e = 0; e < hdp; ++e) std::fill_n(dqt + e * z.ldq + i0, kB, 0.0f);
          if (kk <= 0) continue;
          const uint16_t* B = s.dsv.data() + (i0 / 16) * kc * 16;
          if (c0 == 0)
            Mm::template gemm<false>(hdp, kB, kk, KT, z.ldt, B, kc * 16, dqt + i0, z.ldq);
          else
            Mm::template gemm<true>(hdp, kB, kk, KT, z.ldt, B, kc * 16, dqt + i0, z.ldq);
        }
        if (last_chunk) {  // the head's dq rows from its dqᵀ (still in this core's cache)
          for (int64_t i0 = 0; i0 < z.Tq; i0 += 16) {
            const int64_t n = std::min<int64_t>(16, z.Tq - i0);
            alignas(64) float rows[16 * kMaxHdp];
            for (int64_t e = 0; e < hd; ++e) {
              const float* src = dqt + e * z.ldq + i0;
              for (int ii = 0; ii < 16; ++ii) rows[ii * hd + e] = src[ii];
            }
            for (int64_t ii = 0; ii < n; ++ii)
              std::memcpy(c.dq + b * d.q_batch_stride + (i0 + ii) * d.q_stride + (bh % z.nh) * hd,
                          rows + ii * hd, sizeof(float) * hd);
          }
        }
      }
      for (int64_t r = 0; r < kc && c0 + r < z.Tk; ++r) {
        const int64_t o = b * d.kv_batch_stride + (c0 + r) * d.kv_stride + g * hd;
        std::memcpy(c.dk + o, s.acc_k.data() + r * hdp, sizeof(float) * hd);
        std::memcpy(c.dv + o, s.acc_v.data() + r * hdp, sizeof(float) * hd);
      }
    }
  }
  Mm::end();
}

// ---- entries, one per path: the worker inlined into a function compiled for the path's ISA ----

TETRAD_T_AMX __attribute__((flatten)) void forward_amx(const FwdCtx& c) { forward_worker<AmxMm>(c); }
TETRAD_T_AVX512BF16 __attribute__((flatten)) void forward_avx512bf16(const FwdCtx& c) { forward_worker<Avx512Bf16Mm>(c); }
TETRAD_T_AVX2 __attribute__((flatten)) void forward_emulated_avx2(const FwdCtx& c) { forward_worker<EmulatedMm>(c); }
__attribute__((flatten)) void forward_emulated(const FwdCtx& c) { forward_worker<EmulatedMm>(c); }
TETRAD_T_AMX __attribute__((flatten)) void backward_amx(const BwdCtx& c) { backward_worker<AmxMm>(c); }
TETRAD_T_AVX512BF16 __attribute__((flatten)) void backward_avx512bf16(const BwdCtx& c) { backward_worker<Avx512Bf16Mm>(c); }
TETRAD_T_AVX2 __attribute__((flatten)) void backward_emulated_avx2(const BwdCtx& c) { backward_worker<EmulatedMm>(c); }
__attribute__((flatten)) void backward_emulated(const BwdCtx& c) { backward_worker<EmulatedMm>(c); }

// Per-call packed operands: the caller's thread_local arena (its parallel region's threads read
// it by reference); grows to the largest call.
// A 64-byte aligned buffer that grows to the largest request (contents not kept).
template <class T>
struct Buf {
  std::unique_ptr<T[], void (*)(void*)> p{nullptr, std::free};
  int64_t n = 0;
};
struct CallArena {
  Buf<uint16_t> a, b, c, d, e, f, g;
  Buf<float> L, D;
  Buf<int32_t> vis, lo;
};
CallArena& call_arena() {
  thread_local CallArena a;
  return a;
}
template <class T>
T* grow(Buf<T>& b, int64_t n) {
  if (b.n < n) {
    b.p.reset();
    const size_t bytes = (sizeof(T) * size_t(n) + 63) / 64 * 64;
    b.p.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!b.p) fail("attention (bf16): out of memory for ", bytes, " bytes of packed operands");
    b.n = n;
  }
  return b.p.get();
}

}  // namespace

void attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                            const float* v, const AttentionDims& d, int64_t q_offset,
                            AttentionBf16Path path) {
  attention_bf16_check(d, path);
  if (d.B == 0 || d.Tq == 0 || d.n_head == 0) return;
  if (d.Tk <= 0) fail("attention (bf16): queries but no keys");
  const Shape z(d, q_offset);
  CallArena& a = call_arena();
  const int64_t nq = z.B * z.nh * z.Tqp * z.hdp, nkv = z.B * z.nkv * z.Tkp * z.hdp;
  FwdCtx c{&d, z, q, k, v, out, lse, grow(a.a, nq), grow(a.b, nkv), grow(a.c, nkv)};
  void (*fn)(const FwdCtx&) = nullptr;
  switch (path) {
    case AttentionBf16Path::kAmx: fn = forward_amx; break;
    case AttentionBf16Path::kAvx512Bf16: fn = forward_avx512bf16; break;
    case AttentionBf16Path::kEmulatedAvx2: fn = forward_emulated_avx2; break;
    case AttentionBf16Path::kEmulated: fn = forward_emulated; break;
  }
#pragma omp parallel
  fn(c);
}

namespace {
struct Saved16 { const uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr; };
void backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* q,
                   const float* k, const float* v, const float* out, const float* lse,
                   const AttentionDims& d, int64_t q_offset, AttentionBf16Path path,
                   const Saved16& s16) {
  attention_bf16_check(d, path);
  if (d.B == 0 || d.n_head == 0) return;
  if (lse == nullptr && d.Tq > 0) fail("attention_backward (bf16) needs the forward's lse");
  if (d.Tq == 0) {  // no queries: no gradient reaches k, v
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t j = 0; j < d.Tk; ++j)
        for (int64_t c = 0; c < int64_t(d.n_kv_head) * d.head_dim; ++c)
          dk[b * d.kv_batch_stride + j * d.kv_stride + c] =
              dv[b * d.kv_batch_stride + j * d.kv_stride + c] = 0.0f;
    return;
  }
  if (d.Tk <= 0) fail("attention_backward (bf16): queries but no keys");
  const Shape z(d, q_offset);
  CallArena& a = call_arena();
  const int64_t BH = z.B * z.nh, KV = z.B * z.nkv;
  const int64_t nq = BH * z.Tqp * z.hdp, nkv = KV * z.Tkp * z.hdp;
  BwdCtx c{&d, z, q, k, v, dout, out, lse, dq, dk, dv,
           grow(a.a, nq), grow(a.b, nq), grow(a.c, nq), grow(a.d, nq), grow(a.e, nkv),
           grow(a.f, nkv), grow(a.g, KV * z.hdp * z.ldt), grow(a.L, BH * z.Tqp),
           grow(a.D, BH * z.Tqp), grow(a.vis, z.Tqp),
           d.doc_start ? grow(a.lo, z.B * z.Tqp) : nullptr};
  c.q16 = s16.q, c.k16 = s16.k, c.v16 = s16.v, c.out16 = s16.out;
  for (int64_t i = 0; i < z.Tqp; ++i) c.vis[i] = int32_t(z.visible(i));
  if (c.lo)
    for (int64_t b = 0; b < z.B; ++b)
      for (int64_t i = 0; i < z.Tqp; ++i) c.lo[b * z.Tqp + i] = int32_t(doc_first(d, b, i));
  void (*fn)(const BwdCtx&) = nullptr;
  switch (path) {
    case AttentionBf16Path::kAmx: fn = backward_amx; break;
    case AttentionBf16Path::kAvx512Bf16: fn = backward_avx512bf16; break;
    case AttentionBf16Path::kEmulatedAvx2: fn = backward_emulated_avx2; break;
    case AttentionBf16Path::kEmulated: fn = backward_emulated; break;
  }
#pragma omp parallel
  fn(c);
}
}  // namespace
void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* q,
                             const float* k, const float* v, const float* out, const float* lse,
                             const AttentionDims& d, int64_t q_offset, AttentionBf16Path path) {
  backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, d, q_offset, path, {});
}

void attention_backward_bf16_saved(float* dq, float* dk, float* dv, const float* dout,
                                   const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const uint16_t* out, const float* lse, const AttentionDims& d,
                                   int64_t q_offset, AttentionBf16Path path) {
  backward_bf16(dq, dk, dv, dout, nullptr, nullptr, nullptr, nullptr, lse, d, q_offset, path,
                {q, k, v, out});
}
}  // namespace tetrad::kernels
