// CUDA kernels beside their launchers (kernels.hpp): the token and position embeddings, forward
// and backward (the table's rows in buckets walked in token order; no atomics), and the scatter-add
// of a vocabulary shard's gradient.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tetrad/backend/cuda/kernel_common.cuh"
#include "tetrad/backend/cuda/kernels.hpp"

namespace tetrad::gpu {
namespace {

// ---- embedding ----
__global__ void k_embed_fwd(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                            int64_t ntok, int64_t T, int64_t C, int64_t v0, int64_t Vl, int64_t V,
                            int* bad) {
  const int64_t n = ntok * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i - t * C;
    const int64_t tok = tokens[t];
    if (bad && (tok < 0 || tok >= V) && c == 0) *bad = 1;
    const int64_t local = tok - v0;
    float e = (local >= 0 && local < Vl) ? wte[local * C + c] : 0.0f;
    if (wpe) e += wpe[(t % T) * C + c];
    out[i] = e;
  }
}
// Vocabulary rows are dealt out to kBuckets buckets by (local row % kBuckets); thread (c, b)
// owns column c of every row of bucket b and walks the tokens in order.
constexpr int kEmbedBuckets = 64;
// Only elements e = local * C + c of the flattened (Vl, C) block with s0 <= e < s1 are written,
// to dshard[e - s0] (a Z shard of the table's gradient; dense: s0 = 0, s1 = Vl * C).
__global__ void k_embed_bwd_wte(float* dshard, int64_t s0, int64_t s1, const float* dout,
                                const int32_t* tokens, int64_t ntok, int64_t C, int64_t v0,
                                int64_t Vl) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t bucket = blockIdx.y;
  if (c >= C) return;
  for (int64_t t = 0; t < ntok; ++t) {
    const int64_t local = int64_t(tokens[t]) - v0;
    if (local < 0 || local >= Vl || local % kEmbedBuckets != bucket) continue;
    const int64_t e = local * C + c;
    if (e < s0 || e >= s1) continue;
    dshard[e - s0] += dout[t * C + c];
  }
}
// dwpe[p] += Σ over sequences of dout[b * T + p]: thread per (p, c), fixed order over b.
__global__ void k_embed_bwd_wpe(float* dwpe, const float* dout, int64_t ntok, int64_t T,
                                int64_t C) {
  const int64_t n = T * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i / C, c = i - p * C;
    float acc = 0.0f;
    for (int64_t t = p; t < ntok; t += T) acc += dout[t * C + c];
    dwpe[i] += acc;
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t ntok, int64_t T, int64_t C, int64_t v0, int64_t Vl, int64_t V,
                       int* bad, gpuStream_t s) {
  if (ntok * C <= 0) return;
  k_embed_fwd<<<grid_for(ntok * C), kThreads, 0, s>>>(out, tokens, wte, wpe, ntok, T, C, v0, Vl,
                                                       V, bad);
  TETRAD_LAUNCH_CHECK("embedding_forward");
}
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t ntok, int64_t T, int64_t C, int64_t v0, int64_t Vl,
                        gpuStream_t s) {
  if (ntok * C <= 0) return;
  if (dwte) {
    dim3 grid(unsigned((C + 127) / 128), kEmbedBuckets);
    k_embed_bwd_wte<<<grid, 128, 0, s>>>(dwte, 0, Vl * C, dout, tokens, ntok, C, v0, Vl);
    TETRAD_LAUNCH_CHECK("embedding_backward(wte)");
  }
  if (dwpe) {
    k_embed_bwd_wpe<<<grid_for(T * C), kThreads, 0, s>>>(dwpe, dout, ntok, T, C);
    TETRAD_LAUNCH_CHECK("embedding_backward(wpe)");
  }
}
void position_grad(float* dpos, const float* dout, int64_t N, int64_t T, int64_t C, gpuStream_t s) {
  if (N * C <= 0) return;
  k_embed_bwd_wpe<<<grid_for(T * C), kThreads, 0, s>>>(dpos, dout, N, T, C);
  TETRAD_LAUNCH_CHECK("position_grad");
}
void embedding_scatter_add(float* dshard, int64_t s0, int64_t s1, const float* dout,
                           const int32_t* tokens, int64_t v0, int64_t Vs, int64_t N, int64_t C,
                           gpuStream_t s) {
  if (N * C <= 0 || s1 <= s0) return;
  dim3 grid(unsigned((C + 127) / 128), kEmbedBuckets);
  k_embed_bwd_wte<<<grid, 128, 0, s>>>(dshard, s0, s1, dout, tokens, N, C, v0, Vs);
  TETRAD_LAUNCH_CHECK("embedding_scatter_add");
}

}  // namespace tetrad::gpu
