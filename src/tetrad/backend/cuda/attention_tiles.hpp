// The attention kernels' tiles and shared-memory layouts (attention.cu), as plain constexpr
// arithmetic with no CUDA in it: the kernels carve their dynamic shared memory with these
// offsets, the launcher checks a device's per-block opt-in limit against `bytes` before it asks
// for them (a card with too little gets an Error naming it, not cudaFuncSetAttribute's "invalid
// argument"), and tests/test_gpu_host.cpp checks the figures in every build.
//
// Every layout: tiles of BQ query rows and BK key rows, HDP head-dim columns (hd padded to 16,
// 32, 64 or 128), element rows padded by PAD elements (E bytes each), fp32 score / accumulator
// rows by kAccPad floats; each piece starts 128-byte aligned.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace tetrad::gpu::attn {

constexpr int kThreads = 128;  // 4 warps per block
constexpr int kAccPad = 4;     // fp32 accumulators
// The two paths (AttnPath): bf16 on WMMA tensor cores, 64 x 64 tiles, rows padded by 8 elements
// (WMMA's ld a multiple of 8, fragments 32-byte aligned); fp32 FMA, 32 x 32, padded by 4 (16-byte
// rows, staggered banks).
constexpr int kBf16Tile = 64, kBf16Pad = 8, kF32Tile = 32, kF32Pad = 4;

constexpr size_t align128(size_t x) { return (x + 127) / 128 * 128; }

// Row widths and piece sizes every kernel's layout is made of.
template <int E, int PAD, int BQ, int BK, int HDP>
struct Pieces {
  static constexpr int ldt = HDP + PAD, lds = BK + kAccPad, ldp = BK + PAD, ldo = HDP + kAccPad;
  static constexpr size_t q_rows = size_t(E) * BQ * ldt;   // a BQ x HDP element tile
  static constexpr size_t k_rows = size_t(E) * BK * ldt;   // a BK x HDP element tile
  static constexpr size_t scores = sizeof(float) * BQ * lds;
  static constexpr size_t probs = size_t(E) * BQ * ldp;
  static constexpr size_t q_acc = sizeof(float) * BQ * ldo;
  static constexpr size_t k_acc = sizeof(float) * BK * ldo;
  static constexpr size_t row_stats(int n) { return sizeof(float) * n * BQ; }
};

// Forward: Q, K, V tiles, scores S, probabilities P, output accumulator O, row max and sum.
template <int E, int PAD, int BQ, int BK, int HDP>
struct FwdLayout : Pieces<E, PAD, BQ, BK, HDP> {
  using W = Pieces<E, PAD, BQ, BK, HDP>;
  static constexpr size_t q = 0, k = align128(q + W::q_rows), v = align128(k + W::k_rows),
                          s = align128(v + W::k_rows), p = align128(s + W::scores),
                          o = align128(p + W::probs), st = align128(o + W::q_acc),
                          bytes = align128(st + W::row_stats(3));
};
// Backward dQ (per query tile over key tiles): Q, dO, K, V, S, dP, dS, the dQ accumulator,
// lse and D = rowsum(dO * O).
template <int E, int PAD, int BQ, int BK, int HDP>
struct DqLayout : Pieces<E, PAD, BQ, BK, HDP> {
  using W = Pieces<E, PAD, BQ, BK, HDP>;
  static constexpr size_t q = 0, dout = align128(q + W::q_rows), k = align128(dout + W::q_rows),
                          v = align128(k + W::k_rows), s = align128(v + W::k_rows),
                          dp = align128(s + W::scores), ds = align128(dp + W::scores),
                          dq = align128(ds + W::probs), st = align128(dq + W::q_acc),
                          bytes = align128(st + W::row_stats(2));
};
// Backward dK, dV (per key tile over the group's query heads and tiles): K, V, Q, dO, S (then
// dP), P (then dS), the dK and dV accumulators, lse and D.
template <int E, int PAD, int BQ, int BK, int HDP>
struct DkvLayout : Pieces<E, PAD, BQ, BK, HDP> {
  using W = Pieces<E, PAD, BQ, BK, HDP>;
  static constexpr size_t k = 0, v = align128(k + W::k_rows), q = align128(v + W::k_rows),
                          dout = align128(q + W::q_rows), s = align128(dout + W::q_rows),
                          p = align128(s + W::scores), dk = align128(p + W::probs),
                          dv = align128(dk + W::k_acc), st = align128(dv + W::k_acc),
                          bytes = align128(st + W::row_stats(2));
};

// hd padded to the kernels' head-dim bucket (16, 32, 64, 128); 0 when hd is out of range.
inline int padded_head_dim(int hd) {
  if (hd <= 0) return 0;
  for (int b : {16, 32, 64, 128})
    if (hd <= b) return b;
  return 0;
}

// Shared memory per block of the largest kernel of a pass at head dim hd: the forward, or the
// backward's larger kernel (dK/dV). 0 for an unsupported hd.
template <int E, int PAD, int T>
size_t smem_bytes_of(bool backward, int hdp) {
  auto of = [&](auto tag) -> size_t {
    constexpr int H = decltype(tag)::value;
    if (!backward) return FwdLayout<E, PAD, T, T, H>::bytes;
    const size_t dq = DqLayout<E, PAD, T, T, H>::bytes, dkv = DkvLayout<E, PAD, T, T, H>::bytes;
    return dq > dkv ? dq : dkv;
  };
  switch (hdp) {
    case 16: return of(std::integral_constant<int, 16>{});
    case 32: return of(std::integral_constant<int, 32>{});
    case 64: return of(std::integral_constant<int, 64>{});
    case 128: return of(std::integral_constant<int, 128>{});
    default: return 0;
  }
}
inline size_t smem_bytes(bool bf16, bool backward, int hd) {
  const int hdp = padded_head_dim(hd);
  return bf16 ? smem_bytes_of<2, kBf16Pad, kBf16Tile>(backward, hdp)
              : smem_bytes_of<4, kF32Pad, kF32Tile>(backward, hdp);
}

// Why a device whose blocks may opt in to `optin` bytes of shared memory cannot run attention at
// head dim hd on the path (bf16 or fp32), forward and backward; "" when it can. `device` names it
// ("NVIDIA GeForce RTX 4090 (compute capability 8.9)").
inline std::string smem_refusal(size_t optin, int hd, bool bf16, const std::string& device) {
  const size_t need_f = smem_bytes(bf16, false, hd), need_b = smem_bytes(bf16, true, hd);
  const size_t need = need_f > need_b ? need_f : need_b;
  if (need <= optin) return "";
  int fits = 0;  // the largest head-dim bucket that would fit on this device
  for (int b : {16, 32, 64, 128}) {
    const size_t f = smem_bytes(bf16, false, b), bw = smem_bytes(bf16, true, b);
    if ((f > bw ? f : bw) <= optin) fits = b;
  }
  std::string s = "CUDA attention: head_dim " + std::to_string(hd) + " on the " +
                  (bf16 ? "bf16" : "fp32") + " path needs " + std::to_string(need) +
                  " bytes of shared memory per block (" + (need_b >= need_f ? "backward dK/dV" : "forward") +
                  " kernel), but " + device + " allows " + std::to_string(optin) +
                  " per block: use a GPU whose blocks may opt in to at least " +
                  std::to_string(need) + " bytes (A100, H100, H200: compute capability 8.0 or 9.0)";
  s += fits ? ", or a model with head_dim at most " + std::to_string(fits)
            : " (no head_dim fits on this device)";
  return s;
}

}  // namespace tetrad::gpu::attn
