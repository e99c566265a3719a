// Dispatch of the reference conversions, plus the float types and the
// 32-element block types (Q8_0, Q4_0) and the Q8_K activation type.
#include "tensor/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "tensor/quant_blocks.h"
#include "tensor/quantize_internal.h"

namespace moeserve {
namespace {

using quant_detail::half_scale;
using quant_detail::HalfScale;
using quant_detail::round_clamp;

// ---- float types ----------------------------------------------------------

void dequantize_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}
void quantize_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}
void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
}
void quantize_bf16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
}

// The element of largest magnitude, with its sign. Ties between +a and -a go
// to +a so the choice does not depend on scan order (SIMD kernels reduce in a
// different order and must pick the same value).
float signed_absmax(const float* x, int64_t n) {
  float hi = 0.0f;
  float lo = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    hi = std::max(hi, x[i]);
    lo = std::min(lo, x[i]);
  }
  return -lo > hi ? lo : hi;
}

// ---- Q8_0: y = d*q, d = amax/127 ----------------------------------------------

void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const float* x = src + b * kQK8_0;
    float amax = 0.0f;
    for (int i = 0; i < kQK8_0; ++i) amax = std::max(amax, std::fabs(x[i]));
    // Codes are computed against the f16-rounded d the reader will use.
    const HalfScale d = half_scale(amax / 127.0f);
    const float id = d.value != 0.0f ? 1.0f / d.value : 0.0f;
    out[b].d = d.bits;
    for (int i = 0; i < kQK8_0; ++i) out[b].qs[i] = int8_t(round_clamp(x[i] * id, -127, 127));
  }
}

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const float d = fp16_to_fp32(in[b].d);
    for (int i = 0; i < kQK8_0; ++i) dst[b * kQK8_0 + i] = d * float(in[b].qs[i]);
  }
}

// ---- Q4_0: y = d*(q-8); the largest-magnitude value maps exactly to -8 -----

void quantize_q4_0(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ4_0*>(dst);
  constexpr int kHalf = kQK4_0 / 2;
  for (int64_t b = 0; b < n / kQK4_0; ++b) {
    const float* x = src + b * kQK4_0;
    const HalfScale d = half_scale(signed_absmax(x, kQK4_0) / -8.0f);
    const float id = d.value != 0.0f ? 1.0f / d.value : 0.0f;
    out[b].d = d.bits;
    for (int j = 0; j < kHalf; ++j) {
      const int lo = round_clamp(x[j] * id, -8, 7) + 8;
      const int hi = round_clamp(x[j + kHalf] * id, -8, 7) + 8;
      out[b].qs[j] = uint8_t(lo | (hi << 4));
    }
  }
}

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const BlockQ4_0*>(src);
  constexpr int kHalf = kQK4_0 / 2;
  for (int64_t b = 0; b < n / kQK4_0; ++b) {
    const float d = fp16_to_fp32(in[b].d);
    float* y = dst + b * kQK4_0;
    for (int j = 0; j < kHalf; ++j) {
      y[j] = d * float((in[b].qs[j] & 15) - 8);
      y[j + kHalf] = d * float((in[b].qs[j] >> 4) - 8);
    }
  }
}

// ---- Q8_K (activations): y = d*q, d = m/-127, bsums of 16 -------------------

void quantize_q8_k(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ8_K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* x = src + b * kQK_K;
    BlockQ8_K& blk = out[b];
    const float m = signed_absmax(x, kQK_K);
    if (m == 0.0f) {
      std::memset(&blk, 0, sizeof blk);
      continue;
    }
    // m maps to -127; d is kept in f32, so no rounding of the scale here.
    const float iscale = -127.0f / m;
    blk.d = 1.0f / iscale;
    for (int i = 0; i < kQK_K; ++i) blk.qs[i] = int8_t(round_clamp(iscale * x[i], -127, 127));
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += blk.qs[16 * g + i];
      blk.bsums[g] = int16_t(sum);
    }
  }
}

void dequantize_q8_k(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const BlockQ8_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    for (int i = 0; i < kQK_K; ++i) dst[b * kQK_K + i] = in[b].d * float(in[b].qs[i]);
  }
}

void dequantize_unknown(const void*, float* dst, int64_t n) { std::fill(dst, dst + n, 0.0f); }
void quantize_unknown(const float*, void*, int64_t) {}

}  // namespace

DequantizeRowFn dequantize_row_fn(DType t) {
  switch (t) {
    case DType::F32:
      return dequantize_f32;
    case DType::F16:
      return dequantize_f16;
    case DType::BF16:
      return dequantize_bf16;
    case DType::Q8_0:
      return dequantize_q8_0;
    case DType::Q4_0:
      return dequantize_q4_0;
    case DType::Q4_K:
      return quant_detail::dequantize_q4_k;
    case DType::Q5_K:
      return quant_detail::dequantize_q5_k;
    case DType::Q6_K:
      return quant_detail::dequantize_q6_k;
    case DType::Q8_K:
      return dequantize_q8_k;
    case DType::Q4_1:
      return quant_detail::dequantize_q4_1;
    case DType::Q5_0:
      return quant_detail::dequantize_q5_0_row;
    case DType::Q5_1:
      return quant_detail::dequantize_q5_1;
    case DType::Q2_K:
      return quant_detail::dequantize_q2_k;
    case DType::Q3_K:
      return quant_detail::dequantize_q3_k;
    case DType::IQ4_NL:
      return quant_detail::dequantize_iq4_nl_row;
    case DType::IQ4_XS:
      return quant_detail::dequantize_iq4_xs;
    case DType::MXFP4:
      return quant_detail::dequantize_mxfp4_row;
    case DType::IQ2_XXS:
      return quant_detail::dequantize_iq2_xxs;
    case DType::IQ2_XS:
      return quant_detail::dequantize_iq2_xs;
    case DType::IQ2_S:
      return quant_detail::dequantize_iq2_s;
    case DType::IQ3_XXS:
      return quant_detail::dequantize_iq3_xxs;
    case DType::IQ3_S:
      return quant_detail::dequantize_iq3_s;
    case DType::IQ1_S:
      return quant_detail::dequantize_iq1_s;
    case DType::IQ1_M:
      return quant_detail::dequantize_iq1_m;
  }
  return dequantize_unknown;
}

QuantizeRowRefFn quantize_row_fn(DType t) {
  switch (t) {
    case DType::F32:
      return quantize_f32;
    case DType::F16:
      return quantize_f16;
    case DType::BF16:
      return quantize_bf16;
    case DType::Q8_0:
      return quantize_q8_0;
    case DType::Q4_0:
      return quantize_q4_0;
    case DType::Q4_K:
      return quant_detail::quantize_q4_k;
    case DType::Q5_K:
      return quant_detail::quantize_q5_k;
    case DType::Q6_K:
      return quant_detail::quantize_q6_k;
    case DType::Q8_K:
      return quantize_q8_k;
    case DType::Q4_1:
      return quant_detail::quantize_q4_1;
    case DType::Q5_0:
      return quant_detail::quantize_q5_0_row;
    case DType::Q5_1:
      return quant_detail::quantize_q5_1;
    case DType::Q2_K:
      return quant_detail::quantize_q2_k;
    case DType::Q3_K:
      return quant_detail::quantize_q3_k;
    case DType::IQ4_NL:
      return quant_detail::quantize_iq4_nl_row;
    case DType::IQ4_XS:
      return quant_detail::quantize_iq4_xs;
    case DType::MXFP4:
      return quant_detail::quantize_mxfp4_row;
    case DType::IQ2_XXS:
      return quant_detail::quantize_iq2_xxs;
    case DType::IQ2_XS:
      return quant_detail::quantize_iq2_xs;
    case DType::IQ3_XXS:
      return quant_detail::quantize_iq3_xxs;
    case DType::IQ2_S:
      return quant_detail::quantize_iq2_s;
    case DType::IQ3_S:
      return quant_detail::quantize_iq3_s;
    case DType::IQ1_S:
      return quant_detail::quantize_iq1_s;
    case DType::IQ1_M:
      return quant_detail::quantize_iq1_m;
  }
  return quantize_unknown;
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) { dequantize_row_fn(t)(src, dst, n); }

bool dtype_has_quantizer(DType t) { return quantize_row_fn(t) != quantize_unknown; }

void quantize_row(DType t, const float* src, void* dst, int64_t n) { quantize_row_fn(t)(src, dst, n); }

size_t quantize_rows(DType t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row) {
  return quantize_rows(t, src, dst, n_rows, n_per_row, QuantEffort::kBest);
}

size_t quantize_rows(DType t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                     QuantEffort effort) {
  const size_t row_bytes = dtype_row_bytes(t, n_per_row);
  QuantizeRowRefFn fn = quantize_row_fn(t);
  if (effort == QuantEffort::kQuick) {
    if (t == DType::Q4_K) fn = quant_detail::quantize_q4_k_quick;
    if (t == DType::Q5_K) fn = quant_detail::quantize_q5_k_quick;
    if (t == DType::Q6_K) fn = quant_detail::quantize_q6_k_quick;
    if (t == DType::Q2_K) fn = quant_detail::quantize_q2_k_quick;
    if (t == DType::Q3_K) fn = quant_detail::quantize_q3_k_quick;
    if (t == DType::IQ4_XS) fn = quant_detail::quantize_iq4_xs_quick;
    if (t == DType::IQ2_XXS) fn = quant_detail::quantize_iq2_xxs_quick;
    if (t == DType::IQ2_XS) fn = quant_detail::quantize_iq2_xs_quick;
    if (t == DType::IQ2_S) fn = quant_detail::quantize_iq2_s_quick;
    if (t == DType::IQ3_XXS) fn = quant_detail::quantize_iq3_xxs_quick;
    if (t == DType::IQ3_S) fn = quant_detail::quantize_iq3_s_quick;
  }
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t r = 0; r < n_rows; ++r) fn(src + r * n_per_row, out + size_t(r) * row_bytes, n_per_row);
  return size_t(n_rows) * row_bytes;
}

}  // namespace moeserve
