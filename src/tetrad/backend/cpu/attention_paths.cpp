// The attention kernels' code paths (attention.hpp, attention_bf16.hpp): their names, which this
// CPU supports and the default, kept apart from the kernels (attention.cpp, attention_bf16.cpp).
#include "tetrad/backend/cpu/attention.hpp"
#include "tetrad/backend/cpu/attention_bf16.hpp"
#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/core/cpu.hpp"

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

}  // namespace tetrad::kernels
