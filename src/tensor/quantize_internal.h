// Internal to the tensor layer: per-type conversion functions shared by
// quantize.cpp (dispatch, float and 32-element types) and
// quantize_kquants.cpp (256-element K-quants).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/half.h"

namespace moeserve::quant_detail {

// Largest finite f16: scales are clamped to it so a huge input row saturates
// instead of storing inf.
inline constexpr float kMaxHalf = 65504.0f;

// round-to-nearest-even of v, clamped to [lo, hi] (|lo|, |hi| < 2^22). NaN
// maps to lo (never UB). Quantizers call this for every candidate code, and
// nearbyint is a libm call on baseline x86-64, so the rounding is done by
// adding 1.5*2^23: the sum has an ulp of 1, so the FPU rounds it to an
// integer (nearest, ties to even) that sits in the low mantissa bits.
inline int round_clamp(float v, int lo, int hi) {
  // Branch-free (min/max), so the quantizers' inner loops vectorize.
  v = v > float(lo) ? v : float(lo);
  v = v < float(hi) ? v : float(hi);
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return int(float_bits(v + kMagic) & 0x7fffffu) - 0x400000;
}

// A scale as stored (f16) and as used afterwards (the rounded value), so
// codes are always computed against the scale a reader will see.
struct HalfScale {
  uint16_t bits;
  float value;
};
inline HalfScale half_scale(float s) {
  if (s > kMaxHalf) s = kMaxHalf;
  if (s < -kMaxHalf) s = -kMaxHalf;
  const uint16_t b = fp32_to_fp16(s);
  return {b, fp16_to_fp32(b)};
}

// ---- importance-weighted quantizers (quantize_weighted.cpp) -------------------
//
// The weighted quantizers minimise sum_i w[i] * (x[i] - y[i])^2 instead of the
// plain squared error; w holds one non-negative weight per element of the
// row (null: every weight 1). The plain quantizers are these with null w:
// a weight of exactly 1 changes no product or sum, so their output is bit
// for bit what it was before weights existed.
inline constexpr int kUnitWeightCount = 256;  // the largest block a fit sees
extern const float* const kUnitWeights;       // kUnitWeightCount ones
// The weights of the block at `offset` of the row: w + offset, or ones.
inline const float* block_weights(const float* w, int64_t offset) {
  return w != nullptr ? w + offset : kUnitWeights;
}
// Whether w points into kUnitWeights (a plain quantizer's sub-block): the
// fits keep the plain quantizers' own search for those, so their output
// stays what it was; real weights get the wider weighted search.
inline bool is_unit_weights(const float* w) {
  const auto p = reinterpret_cast<uintptr_t>(w), lo = reinterpret_cast<uintptr_t>(kUnitWeights);
  return p >= lo && p < lo + kUnitWeightCount * sizeof(float);
}
using QuantizeRowWeightedFn = void (*)(const float* src, const float* w, void* dst, int64_t n);
void quantize_q4_k_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_q5_k_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_q6_k_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_q2_k_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_q3_k_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_iq4_xs_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_iq2_xxs_weighted(const float* src, const float* w, void* dst,
                               int64_t n);  // quantize_iquants.cpp
void quantize_iq2_xs_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_iq3_xxs_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_iq2_s_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_iq3_s_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_iq1_s_weighted(const float* src, const float* w, void* dst, int64_t n);  // quantize_iq1.cpp
void quantize_iq1_m_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_iq4_nl_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_q4_0_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_q4_1_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_q5_0_weighted(const float* src, const float* w, void* dst, int64_t n);
void quantize_q5_1_weighted(const float* src, const float* w, void* dst, int64_t n);

void quantize_q4_k(const float* src, void* dst, int64_t n);
// QuantEffort::kQuick (quantize.h): plain range scales, no search.
void quantize_q4_k_quick(const float* src, void* dst, int64_t n);
void quantize_q5_k_quick(const float* src, void* dst, int64_t n);
void quantize_q6_k_quick(const float* src, void* dst, int64_t n);
void quantize_q2_k_quick(const float* src, void* dst, int64_t n);  // quantize_lowbit.cpp
void quantize_q3_k_quick(const float* src, void* dst, int64_t n);
void quantize_iq4_xs_quick(const float* src, void* dst, int64_t n);
void quantize_iq2_xxs_quick(const float* src, void* dst, int64_t n);  // quantize_iquants.cpp
void quantize_iq2_xs_quick(const float* src, void* dst, int64_t n);
void quantize_iq2_s_quick(const float* src, void* dst, int64_t n);
void quantize_iq3_xxs_quick(const float* src, void* dst, int64_t n);
void quantize_iq3_s_quick(const float* src, void* dst, int64_t n);
void quantize_q5_k(const float* src, void* dst, int64_t n);
void quantize_q6_k(const float* src, void* dst, int64_t n);
// Issue 43's types (quantize_lowbit.cpp).
void quantize_q4_1(const float* src, void* dst, int64_t n);
void quantize_q5_1(const float* src, void* dst, int64_t n);
void quantize_q5_0_row(const float* src, void* dst, int64_t n);
void quantize_iq4_nl_row(const float* src, void* dst, int64_t n);
void quantize_mxfp4_row(const float* src, void* dst, int64_t n);
void quantize_q2_k(const float* src, void* dst, int64_t n);
void quantize_q3_k(const float* src, void* dst, int64_t n);
void quantize_iq4_xs(const float* src, void* dst, int64_t n);
void quantize_iq2_xxs(const float* src, void* dst, int64_t n);
void quantize_iq2_xs(const float* src, void* dst, int64_t n);
void quantize_iq3_xxs(const float* src, void* dst, int64_t n);
void quantize_iq2_s(const float* src, void* dst, int64_t n);
void quantize_iq3_s(const float* src, void* dst, int64_t n);
void quantize_iq1_s(const float* src, void* dst, int64_t n);
void quantize_iq1_m(const float* src, void* dst, int64_t n);
void dequantize_q4_1(const void* src, float* dst, int64_t n);
void dequantize_q5_1(const void* src, float* dst, int64_t n);
void dequantize_q5_0_row(const void* src, float* dst, int64_t n);
void dequantize_iq4_nl_row(const void* src, float* dst, int64_t n);
void dequantize_mxfp4_row(const void* src, float* dst, int64_t n);
void dequantize_q2_k(const void* src, float* dst, int64_t n);
void dequantize_q3_k(const void* src, float* dst, int64_t n);
void dequantize_iq4_xs(const void* src, float* dst, int64_t n);
// The i-quants with codebooks (dequantize_iquants.cpp; quantizers of IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S: quantize_iquants.cpp; IQ1_S, IQ1_M:
// quantize_iq1.cpp).
void dequantize_iq2_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq2_xs(const void* src, float* dst, int64_t n);
void dequantize_iq2_s(const void* src, float* dst, int64_t n);
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq3_s(const void* src, float* dst, int64_t n);
void dequantize_iq1_s(const void* src, float* dst, int64_t n);
void dequantize_iq1_m(const void* src, float* dst, int64_t n);
void dequantize_q4_k(const void* src, float* dst, int64_t n);
void dequantize_q5_k(const void* src, float* dst, int64_t n);
void dequantize_q6_k(const void* src, float* dst, int64_t n);

}  // namespace moeserve::quant_detail
