// bf16 attention on the matrix units: see attention_bf16.hpp for the contract and the method.
#include "tetrad/backend/cpu/attention_bf16.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::kernels {
namespace {

constexpr int64_t kBlock = 128;  // rows of a query or key block (products of 128 x 128 x hd)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// 2^x, x clamped to [-126, 126]: the degree-6 fit of attention.cpp (relative error 2e-8), written
// scalar so the row loops vectorise.
inline float exp2_fast(float x) {
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

// The stored operand type: bf16 bits (native) or fp32 holding bf16-rounded values (emulated).
// Branch-free (so the row loops vectorise), the same bits as float_to_bf16: round to nearest
// even, NaN kept quiet.
inline uint16_t bf16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
template <class S>
inline S to_stored(float x) {
  if constexpr (std::is_same_v<S, uint16_t>) return bf16_bits(x);
  else return std::bit_cast<float>(uint32_t(bf16_bits(x)) << 16);
}

using dnnl::memory;

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

struct MmKey {
  int64_t M, N, K;
  bool nt, accumulate, bf16;
  bool operator==(const MmKey&) const = default;
};
struct MmKeyHash {
  size_t operator()(const MmKey& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t v : {k.M, k.N, k.K, int64_t(k.nt) | int64_t(k.accumulate) << 1 | int64_t(k.bf16) << 2})
      h = (h ^ uint64_t(v)) * 1099511628211ull;
    return h;
  }
};
struct Mm {
  dnnl::matmul prim;
  memory::desc src, wei, dst;
};

std::string g_path = "not run yet";

// dst[M, N] (+)= src[M, K] · W, all compact; W stored [N, K] (nt: the product's second operand
// transposed, the weights' layout) or [K, N]. Called inside the kernel's parallel region: oneDNN
// then runs it on the calling thread alone. Primitives are cached per thread and shape.
template <class S>
void mm(int64_t M, int64_t N, int64_t K, const S* src, const S* w, bool nt, float* dst,
        bool accumulate) {
  constexpr bool kBf16 = std::is_same_v<S, uint16_t>;
  thread_local std::unordered_map<MmKey, Mm, MmKeyHash> cache;
  thread_local dnnl::stream strm(engine());
  const MmKey key{M, N, K, nt, accumulate, kBf16};
  auto it = cache.find(key);
  if (it == cache.end()) {
    using dt = memory::data_type;
    const dt st = kBf16 ? dt::bf16 : dt::f32;
    Mm b;
    b.src = memory::desc({M, K}, st, memory::format_tag::ab);
    b.wei = memory::desc({K, N}, st, nt ? memory::format_tag::ba : memory::format_tag::ab);
    b.dst = memory::desc({M, N}, dt::f32, memory::format_tag::ab);
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
#if DNNL_VERSION_MAJOR >= 3
    dnnl::matmul::primitive_desc pd(engine(), b.src, b.wei, b.dst, attr);
#else
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(b.src, b.wei, b.dst), attr, engine());
#endif
    if (M == kBlock && K != kBlock) {  // one representative shape names the path
#pragma omp critical(tetrad_attention_bf16_path)
      g_path = std::string(kBf16 ? "native (oneDNN bf16 matmul '" : "emulated (oneDNN f32 matmul '") +
               pd.impl_info_str() + "')";
    }
    b.prim = dnnl::matmul(pd);
    it = cache.emplace(key, std::move(b)).first;
  }
  const Mm& b = it->second;
  memory sm(b.src, engine(), const_cast<S*>(src)), wm(b.wei, engine(), const_cast<S*>(w)),
      dm(b.dst, engine(), dst);
  b.prim.execute(strm, {{DNNL_ARG_SRC, sm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, dm}});
  strm.wait();
}

// Shapes of one call. Sequences are padded to whole blocks (zero rows).
struct Shape {
  int64_t B, nh, nkv, g, hd, Tq, Tk, Bq, Bk, Tqp, Tkp, q_offset;
  Shape(const AttentionDims& d, int64_t qoff)
      : B(d.B), nh(d.n_head), nkv(d.n_kv_head), g(d.n_head / d.n_kv_head), hd(d.head_dim),
        Tq(d.Tq), Tk(d.Tk), Bq(std::min(kBlock, round_up(d.Tq, 16))),
        Bk(std::min(kBlock, round_up(d.Tk, 16))), Tqp(round_up(d.Tq, Bq)), Tkp(round_up(d.Tk, Bk)),
        q_offset(qoff) {}
  // Keys (a multiple of Bk) some query of the block starting at i0 sees.
  int64_t key_prefix(int64_t i0) const {
    const int64_t last = q_offset + std::min(Tq, i0 + Bq) - 1;
    return std::min(Tkp, (last / Bk + 1) * Bk);
  }
  // Keys of row i (query index) that it sees: causal, and within the Tk real keys.
  int64_t visible(int64_t i) const {
    return i < Tq ? std::clamp<int64_t>(q_offset + i + 1, 0, Tk) : 0;
  }
};

// dst[b][h][t][c] = x[b * bs + t * rs + h * hd + c] as stored values, zero for t in [T, Tp).
template <class S>
void pack(S* dst, const float* x, int64_t B, int64_t H, int64_t hd, int64_t T, int64_t Tp,
          int64_t rs, int64_t bs) {
#pragma omp for collapse(2) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t t = 0; t < Tp; ++t) {
      const int64_t b = bh / H, h = bh % H;
      S* o = dst + (bh * Tp + t) * hd;
      if (t >= T) {
        std::fill(o, o + hd, S(0));
        continue;
      }
      const float* row = x + b * bs + t * rs + h * hd;
#pragma omp simd
      for (int64_t c = 0; c < hd; ++c) o[c] = to_stored<S>(row[c]);
    }
}

template <class S>
struct Arena {
  std::vector<S> q, k, v, dO;
  std::vector<float> D, L;
};
template <class S>
Arena<S>& shared_arena() {
  thread_local Arena<S> a;  // the caller's: its parallel region's threads read it by reference
  return a;
}
template <class S>
struct Scratch {  // one per thread
  std::vector<float> s, dp, acc_k, acc_v;
  std::vector<S> p, ds;
  std::vector<int32_t> lim;
};
template <class S>
Scratch<S>& scratch() {
  thread_local Scratch<S> t;
  return t;
}

// Forward: one task per (sequence, head, query block); its row of scores against every key
// block it sees is one product, the softmax is exact over that row (no rescaling), then PV.
template <class S>
void forward_impl(float* out, float* lse, const float* q, const float* k, const float* v,
                  const AttentionDims& d, int64_t qoff) {
  const Shape z(d, qoff);
  Arena<S>& a = shared_arena<S>();
  a.q.resize(size_t(z.B * z.nh * z.Tqp * z.hd));
  a.k.resize(size_t(z.B * z.nkv * z.Tkp * z.hd));
  a.v.resize(a.k.size());
  const float scale2 = kLog2e / std::sqrt(float(z.hd));  // scores in base 2
  const int64_t nqb = z.Tqp / z.Bq;
#pragma omp parallel
  {
    pack(a.q.data(), q, z.B, z.nh, z.hd, z.Tq, z.Tqp, d.q_stride, d.q_batch_stride);
    pack(a.k.data(), k, z.B, z.nkv, z.hd, z.Tk, z.Tkp, d.kv_stride, d.kv_batch_stride);
    pack(a.v.data(), v, z.B, z.nkv, z.hd, z.Tk, z.Tkp, d.kv_stride, d.kv_batch_stride);
    Scratch<S>& t = scratch<S>();
    t.s.resize(size_t(z.Bq * z.Tkp));
    t.p.resize(t.s.size());
    t.acc_k.resize(size_t(z.Bq));      // row sums
    t.dp.resize(size_t(z.Bq * z.hd));  // PV
    // Later query blocks see more keys: the largest tasks first.
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t ib = nqb - 1; ib >= 0; --ib)
      for (int64_t bh = 0; bh < z.B * z.nh; ++bh) {
        const int64_t b = bh / z.nh, h = bh % z.nh, kvh = b * z.nkv + h / z.g, i0 = ib * z.Bq;
        const int64_t n = z.key_prefix(i0);
        mm<S>(z.Bq, n, z.hd, a.q.data() + (bh * z.Tqp + i0) * z.hd, a.k.data() + kvh * z.Tkp * z.hd,
              true, t.s.data(), false);
        float* lrow = t.acc_k.data();
        for (int64_t r = 0; r < z.Bq; ++r) {
          const int64_t nvis = z.visible(i0 + r);
          const float* srow = t.s.data() + r * n;
          S* prow = t.p.data() + r * n;
          float mx = -std::numeric_limits<float>::infinity(), sum = 0;
#pragma omp simd reduction(max : mx)
          for (int64_t c = 0; c < nvis; ++c) mx = std::max(mx, srow[c] * scale2);
#pragma omp simd reduction(+ : sum)
          for (int64_t c = 0; c < nvis; ++c) {
            const float p = exp2_fast(srow[c] * scale2 - mx);
            sum += p;
            prow[c] = to_stored<S>(p);
          }
          std::fill(prow + nvis, prow + n, S(0));
          lrow[r] = sum;
          if (nvis > 0 && lse) lse[bh * z.Tq + i0 + r] = (mx + std::log2(sum)) * kLn2;
        }
        const float* o = t.dp.data();
        mm<S>(z.Bq, z.hd, n, t.p.data(), a.v.data() + kvh * z.Tkp * z.hd, false, t.dp.data(), false);
        for (int64_t r = 0; r < z.Bq && i0 + r < z.Tq; ++r) {
          const float inv = 1.0f / lrow[r];
          float* dst = out + b * d.out_batch_stride + (i0 + r) * d.out_stride + h * z.hd;
#pragma omp simd
          for (int64_t c = 0; c < z.hd; ++c) dst[c] = o[r * z.hd + c] * inv;
        }
      }
  }
}

// P = 2^(S·scale2 - L) and dS = P (dP - D) · scale of one tile (rows x cols, stored compact),
// zero where masked; visible(row, col) says which.
// Vis: a callable nvis(row) (rows are queries), or a struct whose `limits` array holds nvis of
// each column (transposed: rows are keys).
template <class S, class Vis>
inline void probabilities(S* p, S* ds, const float* s, const float* dp, int64_t rows,
                          int64_t cols, float scale2, float scale, const float* L_of_row,
                          const float* D_of_row, const float* L_of_col, const float* D_of_col,
                          const Vis& nvis_of_row, bool transposed) {
  constexpr bool kRows = std::is_invocable_v<const Vis&, int64_t>;
  (void)transposed;
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = s + r * cols;
    const float* dprow = dp + r * cols;
    S* prow = p + r * cols;
    S* dsrow = ds + r * cols;
    if constexpr (kRows) {  // rows are queries, columns keys
      const int64_t nvis = nvis_of_row(r);
      const float Li = L_of_row[r], Di = D_of_row[r];
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) {
        const float pv = c < nvis ? exp2_fast(srow[c] * scale2 - Li) : 0.0f;
        prow[c] = to_stored<S>(pv);
        dsrow[c] = to_stored<S>(pv * (dprow[c] - Di) * scale);
      }
    } else {  // rows are keys (row r = key r), columns queries: visible when key < nvis(query)
      const int32_t* lim = nvis_of_row.limits;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) {
        const bool vis = r < lim[c];
        const float pv = vis ? exp2_fast(srow[c] * scale2 - L_of_col[c]) : 0.0f;
        prow[c] = to_stored<S>(pv);
        dsrow[c] = to_stored<S>(pv * (dprow[c] - D_of_col[c]) * scale);
      }
    }
  }
}

// Backward in two passes, each task owning what it writes (no reduction across threads):
//   keys: per (sequence, kv head, key block): for each query head of the group, Sᵀ = K_j·Qᵀ and
//         dPᵀ = V_j·dOᵀ over every query that sees the block, Pᵀ and dSᵀ, dV_j += Pᵀ·dO,
//         dK_j += dSᵀ·Q;
//   queries: per (sequence, head, query block): S, dP, dS again over its key prefix, dQ = dS·K.
template <class S>
void backward_impl(float* dq, float* dk, float* dv, const float* dout, const float* q,
                   const float* k, const float* v, const float* out, const float* lse,
                   const AttentionDims& d, int64_t qoff) {
  const Shape z(d, qoff);
  Arena<S>& a = shared_arena<S>();
  const int64_t BH = z.B * z.nh;
  a.q.resize(size_t(BH * z.Tqp * z.hd));
  a.dO.resize(a.q.size());
  a.k.resize(size_t(z.B * z.nkv * z.Tkp * z.hd));
  a.v.resize(a.k.size());
  a.D.resize(size_t(BH * z.Tqp));
  a.L.resize(a.D.size());
  const float scale = 1.0f / std::sqrt(float(z.hd)), scale2 = scale * kLog2e;
  const int64_t nqb = z.Tqp / z.Bq, nkb = z.Tkp / z.Bk;
#pragma omp parallel
  {
    pack(a.q.data(), q, z.B, z.nh, z.hd, z.Tq, z.Tqp, d.q_stride, d.q_batch_stride);
    pack(a.dO.data(), dout, z.B, z.nh, z.hd, z.Tq, z.Tqp, d.out_stride, d.out_batch_stride);
    pack(a.k.data(), k, z.B, z.nkv, z.hd, z.Tk, z.Tkp, d.kv_stride, d.kv_batch_stride);
    pack(a.v.data(), v, z.B, z.nkv, z.hd, z.Tk, z.Tkp, d.kv_stride, d.kv_batch_stride);
    // D_i = dO_i · O_i (fp32 out) and the log-sum-exp in base 2; zero for padded rows.
#pragma omp for collapse(2) schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh)
      for (int64_t i = 0; i < z.Tqp; ++i) {
        float s = 0, l = 0;
        if (i < z.Tq) {
          const int64_t b = bh / z.nh, h = bh % z.nh;
          const float* o = out + b * d.out_batch_stride + i * d.out_stride + h * z.hd;
          const float* g = dout + b * d.out_batch_stride + i * d.out_stride + h * z.hd;
#pragma omp simd reduction(+ : s)
          for (int64_t c = 0; c < z.hd; ++c) s += o[c] * g[c];
          l = lse[bh * z.Tq + i] * kLog2e;
        }
        a.D[size_t(bh * z.Tqp + i)] = s;
        a.L[size_t(bh * z.Tqp + i)] = l;
      }
    Scratch<S>& t = scratch<S>();
    const size_t tile = size_t(std::max(z.Bq * z.Tkp, z.Bk * z.Tqp));
    t.s.resize(tile);
    t.dp.resize(tile);
    t.p.resize(tile);
    t.ds.resize(tile);
    t.acc_k.resize(size_t(std::max(z.Bk, z.Bq) * z.hd));
    t.acc_v.resize(t.acc_k.size());
    t.lim.resize(size_t(z.Tqp));
    // Pass 1: dK, dV per key block (the first blocks see the most queries: largest first).
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t jb = 0; jb < nkb; ++jb)
      for (int64_t bk = 0; bk < z.B * z.nkv; ++bk) {
        const int64_t b = bk / z.nkv, kv = bk % z.nkv, j0 = jb * z.Bk;
        // First query that sees key j0, rounded down to a query block.
        const int64_t i_first = std::max<int64_t>(0, j0 - z.q_offset);
        std::fill(t.acc_k.begin(), t.acc_k.end(), 0.0f);
        std::fill(t.acc_v.begin(), t.acc_v.end(), 0.0f);
        if (i_first < z.Tq) {
          const int64_t i0 = i_first / z.Bq * z.Bq, n = z.Tqp - i0;
          for (int64_t gi = 0; gi < z.g; ++gi) {
            const int64_t bh = b * z.nh + kv * z.g + gi;
            const S* Kj = a.k.data() + (bk * z.Tkp + j0) * z.hd;
            const S* Vj = a.v.data() + (bk * z.Tkp + j0) * z.hd;
            const S* Qi = a.q.data() + (bh * z.Tqp + i0) * z.hd;
            const S* dOi = a.dO.data() + (bh * z.Tqp + i0) * z.hd;
            mm<S>(z.Bk, n, z.hd, Kj, Qi, true, t.s.data(), false);
            mm<S>(z.Bk, n, z.hd, Vj, dOi, true, t.dp.data(), false);
            const float* L = a.L.data() + bh * z.Tqp + i0;
            const float* D = a.D.data() + bh * z.Tqp + i0;
            // Key row r (key j0 + r) is visible to query column c when j0 + r < nvis(i0 + c).
            for (int64_t c = 0; c < n; ++c) t.lim[size_t(c)] = int32_t(z.visible(i0 + c) - j0);
            struct {
              const int32_t* limits;
            } cols{t.lim.data()};
            probabilities(t.p.data(), t.ds.data(), t.s.data(), t.dp.data(), z.Bk, n, scale2, scale,
                          nullptr, nullptr, L, D, cols, true);
            mm<S>(z.Bk, z.hd, n, t.p.data(), dOi, false, t.acc_v.data(), true);
            mm<S>(z.Bk, z.hd, n, t.ds.data(), Qi, false, t.acc_k.data(), true);
          }
        }
        for (int64_t r = 0; r < z.Bk && j0 + r < z.Tk; ++r) {
          float* ok = dk + b * d.kv_batch_stride + (j0 + r) * d.kv_stride + kv * z.hd;
          float* ov = dv + b * d.kv_batch_stride + (j0 + r) * d.kv_stride + kv * z.hd;
          std::copy(t.acc_k.data() + r * z.hd, t.acc_k.data() + (r + 1) * z.hd, ok);
          std::copy(t.acc_v.data() + r * z.hd, t.acc_v.data() + (r + 1) * z.hd, ov);
        }
      }
    // Pass 2: dQ per query block (the last blocks see the most keys: largest first).
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t ib = nqb - 1; ib >= 0; --ib)
      for (int64_t bh = 0; bh < BH; ++bh) {
        const int64_t b = bh / z.nh, h = bh % z.nh, kvh = b * z.nkv + h / z.g, i0 = ib * z.Bq;
        const int64_t n = z.key_prefix(i0);
        const S* Qi = a.q.data() + (bh * z.Tqp + i0) * z.hd;
        const S* dOi = a.dO.data() + (bh * z.Tqp + i0) * z.hd;
        const S* K = a.k.data() + kvh * z.Tkp * z.hd;
        mm<S>(z.Bq, n, z.hd, Qi, K, true, t.s.data(), false);
        mm<S>(z.Bq, n, z.hd, dOi, a.v.data() + kvh * z.Tkp * z.hd, true, t.dp.data(), false);
        struct {
          const Shape& z;
          int64_t i0;
          int64_t operator()(int64_t r) const { return z.visible(i0 + r); }
        } rows{z, i0};
        probabilities(t.p.data(), t.ds.data(), t.s.data(), t.dp.data(), z.Bq, n, scale2, scale,
                      a.L.data() + bh * z.Tqp + i0, a.D.data() + bh * z.Tqp + i0, nullptr,
                      nullptr, rows, false);
        mm<S>(z.Bq, z.hd, n, t.ds.data(), K, false, t.acc_k.data(), false);
        for (int64_t r = 0; r < z.Bq && i0 + r < z.Tq; ++r)
          std::copy(t.acc_k.data() + r * z.hd, t.acc_k.data() + (r + 1) * z.hd,
                    dq + b * d.q_batch_stride + (i0 + r) * d.q_stride + h * z.hd);
      }
  }
}

void check(const AttentionDims& d, int64_t qoff) {
  TETRAD_CHECK(d.B >= 0 && d.Tq >= 0 && d.Tk >= 0 && d.head_dim > 0 && d.n_kv_head > 0 &&
                   d.n_head % d.n_kv_head == 0,
               "attention (bf16): n_head ", d.n_head, " must be a multiple of n_kv_head ",
               d.n_kv_head, " and head_dim positive (", d.head_dim, ")");
  TETRAD_CHECK(qoff >= 0, "attention (bf16): q_offset ", qoff, " must be >= 0");
}

}  // namespace

void attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                            const float* v, const AttentionDims& d, int64_t q_offset) {
  check(d, q_offset);
  if (d.B == 0 || d.Tq == 0 || d.n_head == 0) return;
  TETRAD_CHECK(d.Tk > 0, "attention (bf16): queries but no keys");
  if (native_bf16_matmul()) forward_impl<uint16_t>(out, lse, q, k, v, d, q_offset);
  else forward_impl<float>(out, lse, q, k, v, d, q_offset);
}

void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* q,
                             const float* k, const float* v, const float* out, const float* lse,
                             const AttentionDims& d, int64_t q_offset) {
  check(d, q_offset);
  if (d.B == 0 || d.n_head == 0) return;
  TETRAD_CHECK(lse != nullptr || d.Tq == 0, "attention_backward (bf16) needs the forward's lse");
  if (d.Tq == 0) {  // no queries: no gradient reaches k, v
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t j = 0; j < d.Tk; ++j)
        for (int64_t c = 0; c < int64_t(d.n_kv_head) * d.head_dim; ++c)
          dk[b * d.kv_batch_stride + j * d.kv_stride + c] =
              dv[b * d.kv_batch_stride + j * d.kv_stride + c] = 0.0f;
    return;
  }
  if (native_bf16_matmul()) backward_impl<uint16_t>(dq, dk, dv, dout, q, k, v, out, lse, d, q_offset);
  else backward_impl<float>(dq, dk, dv, dout, q, k, v, out, lse, d, q_offset);
}

const char* attention_bf16_path() { return g_path.c_str(); }

}  // namespace tetrad::kernels
