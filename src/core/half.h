// Scalar IEEE binary16 and bfloat16 conversions (the reference every SIMD
// conversion is tested against). Round-to-nearest-even both ways.
#pragma once

#include <cstdint>
#include <cstring>

namespace moeserve {

static inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
static inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

static inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: value = mant * 2^-24
    const float mag = float(mant) * (1.0f / 16777216.0f);
    return sign ? -mag : mag;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan (keep nan quiet)
    return uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: inf
  if (abs < 0x38800000u) {
    // result is subnormal or zero: scale so the mantissa lands in the low bits,
    // letting the FPU do round-to-nearest-even.
    const float mag = bits_float(abs) * 16777216.0f;  // * 2^24
    const uint32_t m = uint32_t(__builtin_nearbyintf(mag));
    return uint16_t(sign | m);
  }
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;  // carries into exp correctly
  return uint16_t(sign | h);
}

static inline float bf16_to_fp32(uint16_t b) { return bits_float(uint32_t(b) << 16); }

static inline uint16_t fp32_to_bf16(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

}  // namespace moeserve
