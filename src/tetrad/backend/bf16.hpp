// fp32 <-> bf16 on the host, for every layer (the CPU kernels use them as kernels::float_to_bf16
// etc.; the model fills bf16 operands with them).
#pragma once
#include <cstdint>
#include <cstring>

namespace tetrad::backend {

// bf16 conversions: round to nearest even; NaN stays NaN (quiet), ±inf stays ±inf, values past
// the largest bf16 round to ±inf as IEEE rounding does.
// Written as a select, not an early return, so loops that call it vectorise (a blend).
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t quiet_nan = (u >> 16) | 0x40u;                 // NaN: keep it quiet
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
inline float bf16_to_float(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace tetrad::backend
