// The attention kernels' code paths (attention.hpp, attention_bf16.hpp): their names, which this
// CPU supports and the default, kept apart from the kernels (attention.cpp, attention_bf16.cpp).
#include "tetrad/backend/cpu/attention.hpp"
#include "tetrad/backend/cpu/attention_bf16.hpp"
#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::kernels {

const char* attention_path_name(AttentionPath p) {
  switch (p) {
    case AttentionPath::kPortable: return "portable";
    case AttentionPath::kAvx2: return "avx2";
    case AttentionPath::kAvx512: return "avx512";
  }
  return "?";
}

bool attention_path_supported(AttentionPath p) {
  switch (p) {
    case AttentionPath::kPortable: return true;
    // cpu_features(), not the compiler's runtime: it honours TETRAD_MAX_CPU_ISA.
    case AttentionPath::kAvx2: return cpu_features().use_avx2_fma();
    case AttentionPath::kAvx512: {
      const CpuFeatures& f = cpu_features();
      return f.use_avx512() && f.avx512bw && f.avx512vl && f.use_avx2_fma();
    }
  }
  return false;
}

AttentionPath attention_default_path() {
  static const AttentionPath best = attention_path_supported(AttentionPath::kAvx512)
                                        ? AttentionPath::kAvx512
                                    : attention_path_supported(AttentionPath::kAvx2)
                                        ? AttentionPath::kAvx2
                                        : AttentionPath::kPortable;
  return best;
}

const char* attention_bf16_path_name(AttentionBf16Path p) {
  switch (p) {
    case AttentionBf16Path::kEmulated: return "emulated";
    case AttentionBf16Path::kEmulatedAvx2: return "emulated-avx2";
    case AttentionBf16Path::kAvx512Bf16: return "avx512_bf16";
    case AttentionBf16Path::kAmx: return "amx";
  }
  return "?";
}

bool attention_bf16_path_supported(AttentionBf16Path p) {
  const CpuFeatures& f = cpu_features();  // honours TETRAD_MAX_CPU_ISA
  const bool avx512bf16 = f.use_avx512_bf16() && f.avx512bw && f.avx512vl && f.use_avx2_fma();
  switch (p) {
    case AttentionBf16Path::kEmulated: return true;
    case AttentionBf16Path::kEmulatedAvx2: return f.use_avx2_fma();
    case AttentionBf16Path::kAvx512Bf16: return avx512bf16;
    case AttentionBf16Path::kAmx: return avx512bf16 && f.use_amx_bf16();
  }
  return false;
}

AttentionBf16Path attention_bf16_default_path() {
  using P = AttentionBf16Path;
  // Where bf16 GEMMs are emulated (no bf16 units, a cap, TETRAD_BF16=emulate), so is attention.
  if (native_bf16_matmul()) {
    if (attention_bf16_path_supported(P::kAmx)) return P::kAmx;
    if (attention_bf16_path_supported(P::kAvx512Bf16)) return P::kAvx512Bf16;
  }
  return attention_bf16_path_supported(P::kEmulatedAvx2) ? P::kEmulatedAvx2 : P::kEmulated;
}

const char* attention_bf16_path() {
  switch (attention_bf16_default_path()) {
    case AttentionBf16Path::kEmulated: return "emulated (bf16 operands multiplied in fp32, SSE2)";
    case AttentionBf16Path::kEmulatedAvx2:
      return "emulated-avx2 (bf16 operands multiplied in fp32, AVX2+FMA)";
    case AttentionBf16Path::kAvx512Bf16: return "avx512_bf16 (vdpbf16ps)";
    case AttentionBf16Path::kAmx: return "amx (AMX-BF16 tiles)";
  }
  return "?";
}

void attention_bf16_check(const AttentionDims& d, AttentionBf16Path p) {
  if (!(d.B >= 0 && d.Tq >= 0 && d.Tk >= 0 && d.head_dim > 0 && d.n_kv_head > 0 &&
        d.n_head % d.n_kv_head == 0))
    fail("attention (bf16): n_head ", d.n_head, " must be a multiple of n_kv_head ", d.n_kv_head,
         " and head_dim positive (", d.head_dim, ")");
  if (d.head_dim > kAttentionBf16MaxHeadDim)
    fail("attention (bf16): head_dim ", d.head_dim, " is above the kernel's limit of ",
         kAttentionBf16MaxHeadDim);
  if (d.q_stride < int64_t(d.n_head) * d.head_dim || d.out_stride < int64_t(d.n_head) * d.head_dim ||
      d.kv_stride < int64_t(d.n_kv_head) * d.head_dim)
    fail("attention (bf16): a row stride is shorter than its row (q ", d.q_stride, ", kv ",
         d.kv_stride, ", out ", d.out_stride, ")");
  if (!attention_bf16_path_supported(p))
    fail("attention (bf16): path ", attention_bf16_path_name(p), " is not supported on this CPU (",
         cpu_features().best_isa(), ")");
}

// The bf16 kernels on the default path (attention_bf16.cpp has the ones taking a path).
void attention_backward_bf16_saved(float* dq, float* dk, float* dv, const float* dout,
                                   const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const uint16_t* out, const float* lse, const AttentionDims& d,
                                   int64_t q_offset) {
  attention_backward_bf16_saved(dq, dk, dv, dout, q, k, v, out, lse, d, q_offset,
                                attention_bf16_default_path());
}

void attention_forward_bf16(float* out, float* lse, const float* q, const float* k,
                            const float* v, const AttentionDims& d, int64_t q_offset) {
  attention_forward_bf16(out, lse, q, k, v, d, q_offset, attention_bf16_default_path());
}

void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* q,
                             const float* k, const float* v, const float* out, const float* lse,
                             const AttentionDims& d, int64_t q_offset) {
  attention_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, d, q_offset,
                          attention_bf16_default_path());
}

}  // namespace tetrad::kernels
