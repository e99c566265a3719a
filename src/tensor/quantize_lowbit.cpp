// Reference quantizers and dequantizers of issue 43's types: the legacy
// 32-element types (Q4_1, Q5_0, Q5_1), the 2- and 3-bit K-quants (Q2_K,
// Q3_K), the non-linear 4-bit types (IQ4_NL, IQ4_XS) and MXFP4. Block
// layouts and value formulas: tensor/quant_blocks.h (ggml's definitions).
//
// The quantizers follow the scheme of the other K-quants
// (quantize_kquants.cpp): each (sub-)block's scale (and offset) is searched
// over candidate inverse scales, each candidate's codes rounded and its
// least-squares scale refit, the best kept; super-block scales are then
// quantized and every value re-coded against the scales a reader sees. The
// fits (quantize_fit.h) weight every element's error: the plain quantizers
// pass no weights (all 1), the *_weighted ones an imatrix's.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/quant_blocks.h"
#include "tensor/quantize_fit.h"
#include "tensor/quantize_internal.h"

namespace moeserve::quant_detail {
namespace {

// ---- Q4_1 / Q5_1: y = d * q + m ---------------------------------------------

template <typename Block, int kBits>
void quantize_affine32(const float* src, const float* w_row, void* dst, int64_t n) {
  constexpr int kMax = (1 << kBits) - 1;
  auto* out = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    const float* w = block_weights(w_row, b * 32);
    const Affine f = fit_affine(x, w, 32, kMax, false);
    const HalfScale d = half_scale(f.scale), m = half_scale(f.offset);
    Block& blk = out[b];
    std::memset(&blk, 0, sizeof blk);
    blk.d = d.bits, blk.m = m.bits;
    uint8_t q[32];
    affine_codes(x, w, 32, kMax, {d.value, m.value}, q);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      blk.qs[j] = uint8_t((q[j] & 15) | ((q[j + 16] & 15) << 4));
      if constexpr (kBits == 5) qh |= uint32_t(q[j] >> 4) << j | uint32_t(q[j + 16] >> 4) << (j + 16);
    }
    if constexpr (kBits == 5) std::memcpy(blk.qh, &qh, 4);
  }
}

uint32_t high_bits(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

template <typename Block, int kBits>
void dequantize_affine32(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float d = fp16_to_fp32(in[b].d), m = fp16_to_fp32(in[b].m);
    uint32_t qh = 0;
    if constexpr (kBits == 5) qh = high_bits(in[b].qh);
    float* y = dst + b * 32;
    for (int j = 0; j < 16; ++j) {
      const int lo = (in[b].qs[j] & 15) | int((qh >> j) & 1) << 4;
      const int hi = (in[b].qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
      y[j] = d * float(lo) + m;
      y[j + 16] = d * float(hi) + m;
    }
  }
}

// ---- Q5_0: y = d * (q - 16) -------------------------------------------------

void quantize_q5_0(const float* src, const float* w_row, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ5_0*>(dst);
  const Levels levels = uniform_levels(-16, 15);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    const float* w = block_weights(w_row, b * 32);
    const HalfScale d = half_scale(fit_levels(x, w, 32, levels));
    uint8_t q[32];  // indices into -16..15: the stored code
    level_codes(x, w, 32, levels, d.value, q);
    BlockQ5_0& blk = out[b];
    blk.d = d.bits;
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      blk.qs[j] = uint8_t((q[j] & 15) | ((q[j + 16] & 15) << 4));
      qh |= uint32_t(q[j] >> 4) << j | uint32_t(q[j + 16] >> 4) << (j + 16);
    }
    std::memcpy(blk.qh, &qh, 4);
  }
}

void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const BlockQ5_0*>(src);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float d = fp16_to_fp32(in[b].d);
    const uint32_t qh = high_bits(in[b].qh);
    float* y = dst + b * 32;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * float(((in[b].qs[j] & 15) | int((qh >> j) & 1) << 4) - 16);
      y[j + 16] = d * float(((in[b].qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4) - 16);
    }
  }
}

// ---- IQ4_NL and MXFP4: y = scale * values[q] ---------------------------------

void quantize_iq4_nl(const float* src, const float* w_row, void* dst, int64_t n) {
  auto* out = static_cast<BlockIQ4_NL*>(dst);
  const Levels levels = table_levels(kIq4nlValues, 16);  // ascending already
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    const float* w = block_weights(w_row, b * 32);
    const HalfScale d = half_scale(fit_levels(x, w, 32, levels));
    uint8_t q[32];
    level_codes(x, w, 32, levels, d.value, q);
    out[b].d = d.bits;
    for (int j = 0; j < 16; ++j) out[b].qs[j] = uint8_t(q[j] | (q[j + 16] << 4));
  }
}

template <typename Block>
void dequantize_table32(const void* src, float* dst, int64_t n, const int8_t* values,
                        float (*scale)(const Block&)) {
  const auto* in = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float d = scale(in[b]);
    float* y = dst + b * 32;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * float(values[in[b].qs[j] & 15]);
      y[j + 16] = d * float(values[in[b].qs[j] >> 4]);
    }
  }
}

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
  dequantize_table32<BlockIQ4_NL>(src, dst, n, kIq4nlValues,
                                  [](const BlockIQ4_NL& b) { return fp16_to_fp32(b.d); });
}

void quantize_mxfp4(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockMXFP4*>(dst);
  const Levels levels = table_levels(kMxfp4Values, 16);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    if (!(amax > 0.0f)) {  // zero (or NaN): an all-zero block
      std::memset(&out[b], 0, sizeof out[b]);
      continue;
    }
    // The exponent that puts amax near the top value (12), and the next one
    // up: whichever codes the block with less error. (From e = 2: the
    // inverse of a smaller scale is not a finite float.)
    const int e0 = std::clamp(int(std::floor(std::log2(amax))) - 2 + 127, 2, 254);
    uint8_t best_e = uint8_t(e0);
    float best_err = INFINITY;
    for (int e = e0; e <= std::min(e0 + 1, 255); ++e) {
      const float err = level_codes(x, kUnitWeights, 32, levels, mxfp4_scale(uint8_t(e)), nullptr);
      if (err < best_err) best_err = err, best_e = uint8_t(e);
    }
    uint8_t idx[32];
    level_codes(x, kUnitWeights, 32, levels, mxfp4_scale(best_e), idx);
    out[b].e = best_e;
    for (int j = 0; j < 16; ++j) {
      // Sorted-level index -> stored nibble (0 is code 0, not -0's code 8).
      const uint8_t lo = table_code(kMxfp4Values, 16, levels.v[idx[j]]);
      const uint8_t hi = table_code(kMxfp4Values, 16, levels.v[idx[j + 16]]);
      out[b].qs[j] = uint8_t(lo | (hi << 4));
    }
  }
}

void dequantize_mxfp4(const void* src, float* dst, int64_t n) {
  dequantize_table32<BlockMXFP4>(src, dst, n, kMxfp4Values,
                                 [](const BlockMXFP4& b) { return mxfp4_scale(b.e); });
}

}  // namespace

void quantize_q4_1(const float* src, void* dst, int64_t n) {
  quantize_affine32<BlockQ4_1, 4>(src, nullptr, dst, n);
}
void quantize_q5_1(const float* src, void* dst, int64_t n) {
  quantize_affine32<BlockQ5_1, 5>(src, nullptr, dst, n);
}
void quantize_q4_1_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_affine32<BlockQ4_1, 4>(src, w, dst, n);
}
void quantize_q5_1_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_affine32<BlockQ5_1, 5>(src, w, dst, n);
}
void dequantize_q4_1(const void* src, float* dst, int64_t n) {
  dequantize_affine32<BlockQ4_1, 4>(src, dst, n);
}
void dequantize_q5_1(const void* src, float* dst, int64_t n) {
  dequantize_affine32<BlockQ5_1, 5>(src, dst, n);
}
void quantize_q5_0_row(const float* src, void* dst, int64_t n) { quantize_q5_0(src, nullptr, dst, n); }
void quantize_q5_0_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_q5_0(src, w, dst, n);
}
void dequantize_q5_0_row(const void* src, float* dst, int64_t n) { dequantize_q5_0(src, dst, n); }
void quantize_iq4_nl_row(const float* src, void* dst, int64_t n) { quantize_iq4_nl(src, nullptr, dst, n); }
void quantize_iq4_nl_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_iq4_nl(src, w, dst, n);
}
void dequantize_iq4_nl_row(const void* src, float* dst, int64_t n) { dequantize_iq4_nl(src, dst, n); }
void quantize_mxfp4_row(const float* src, void* dst, int64_t n) { quantize_mxfp4(src, dst, n); }
void dequantize_mxfp4_row(const void* src, float* dst, int64_t n) { dequantize_mxfp4(src, dst, n); }

// ---- K-quants of 2 and 3 bits, IQ4_XS ---------------------------------------

namespace {

// The super-block scale d of the signed 6-bit sub-block scales (code l in
// -32..31, sub-block scale d * l) of Q3_K and IQ4_XS: m / -32, m the
// sub-block scale of largest magnitude. With an imatrix (real weights) d is
// also fitted to the sub-block scales, each weighted by its sub-block's
// total weight (as ggml does), and the candidate that codes the whole block
// with the least weighted error is kept.
template <int kSubs, int kLen>
float signed_super_scale(const float* x, const float* w, const float* scales, const Levels& levels) {
  float m = 0.0f;
  for (int s = 0; s < kSubs; ++s) m = std::fabs(scales[s]) > std::fabs(m) ? scales[s] : m;
  const float plain = half_scale(m / -32.0f).value;
  if (is_unit_weights(w)) return m / -32.0f;
  float sw[kSubs];
  for (int s = 0; s < kSubs; ++s) {
    sw[s] = 0.0f;
    for (int i = 0; i < kLen; ++i) sw[s] += w[kLen * s + i];
  }
  static const Levels kScaleLevels = uniform_levels(-32, 31);
  const float cands[2] = {plain, half_scale(fit_levels(scales, sw, kSubs, kScaleLevels)).value};
  float best = m / -32.0f, best_err = INFINITY;
  for (int c = 0; c < 2; ++c) {
    const float d = cands[c];
    float err = 0.0f;
    for (int s = 0; s < kSubs; ++s) {
      const int l = d != 0.0f ? round_clamp(scales[s] / d, -32, 31) : 0;
      err += level_codes(x + kLen * s, w + kLen * s, kLen, levels, d * float(l), nullptr);
    }
    if (err < best_err) best_err = err, best = c == 0 ? m / -32.0f : cands[1];
  }
  return best;
}

// QuantEffort::kQuick (make-model --quick-quant: synthetic files, where only
// the types and shapes matter): plain range fits, no search. An affine fit
// from [min(x, 0), max(x)]; a level fit mapping the value of largest
// magnitude to the lowest level.
Affine quick_affine(const float* x, int n, int nmax) {
  float lo = 0.0f, hi = 0.0f;
  for (int i = 0; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  return {(hi - lo) / float(nmax), lo};
}
float quick_levels(const float* x, int n, const Levels& levels) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::fabs(x[i]) > std::fabs(m) ? x[i] : m;
  return m / levels.v[0];
}

// Q2_K: per sub-block of 16 an affine fit (q in 0..3, min >= 0); the 4-bit
// scale and min codes against d = max scale / 15, dmin = max min / 15.
template <bool kQuick>
void quantize_q2_k_block(const float* x, const float* w, BlockQ2_K& blk) {
  Affine fits[16];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 16; ++s) {
    fits[s] = kQuick ? quick_affine(x + 16 * s, 16, 3) : fit_affine(x + 16 * s, w + 16 * s, 16, 3, true);
    max_scale = std::max(max_scale, fits[s].scale);
    max_min = std::max(max_min, -fits[s].offset);
  }
  const HalfScale d = half_scale(max_scale / 15.0f), dmin = half_scale(max_min / 15.0f);
  blk.d = d.bits, blk.dmin = dmin.bits;
  uint8_t q[kQK_K];
  for (int s = 0; s < 16; ++s) {
    const int sc = d.value > 0.0f ? round_clamp(fits[s].scale / d.value, 0, 15) : 0;
    const int mn = dmin.value > 0.0f ? round_clamp(-fits[s].offset / dmin.value, 0, 15) : 0;
    blk.scales[s] = uint8_t(sc | (mn << 4));
    affine_codes(x + 16 * s, w + 16 * s, 16, 3, {d.value * float(sc), -dmin.value * float(mn)}, q + 16 * s);
  }
  std::memset(blk.qs, 0, sizeof blk.qs);
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 4; ++t) {
      for (int l = 0; l < 32; ++l) blk.qs[32 * h + l] |= uint8_t(q[128 * h + 32 * t + l] << (2 * t));
    }
  }
}

void dequantize_q2_k_block(const BlockQ2_K& blk, float* y) {
  const float d = fp16_to_fp32(blk.d), dmin = fp16_to_fp32(blk.dmin);
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 4; ++t) {
      for (int l = 0; l < 32; ++l) {
        const int sub = 8 * h + 2 * t + l / 16;
        const int q = (blk.qs[32 * h + l] >> (2 * t)) & 3;
        y[128 * h + 32 * t + l] =
            d * float(blk.scales[sub] & 15) * float(q) - dmin * float(blk.scales[sub] >> 4);
      }
    }
  }
}

// Q3_K: per sub-block of 16 a signed fit on -4..3; the 6-bit scales (s -
// 32) against d = the largest-magnitude scale / -32.
template <bool kQuick>
void quantize_q3_k_block(const float* x, const float* w, BlockQ3_K& blk) {
  const Levels levels = uniform_levels(-4, 3);
  float scales[16];
  for (int s = 0; s < 16; ++s) {
    scales[s] =
        kQuick ? quick_levels(x + 16 * s, 16, levels) : fit_levels(x + 16 * s, w + 16 * s, 16, levels);
  }
  const HalfScale d = half_scale(signed_super_scale<16, 16>(x, w, scales, levels));
  blk.d = d.bits;
  int codes[16];
  uint8_t q[kQK_K];
  for (int s = 0; s < 16; ++s) {
    const int l = d.value != 0.0f ? round_clamp(scales[s] / d.value, -32, 31) : 0;
    codes[s] = l + 32;
    level_codes(x + 16 * s, w + 16 * s, 16, levels, d.value * float(l), q + 16 * s);  // 0..7 = value + 4
  }
  q3_k_pack_scales(codes, blk.scales);
  std::memset(blk.qs, 0, sizeof blk.qs);
  std::memset(blk.hmask, 0, sizeof blk.hmask);
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 4; ++t) {
      for (int l = 0; l < 32; ++l) {
        const int c = q[128 * h + 32 * t + l];  // value + 4: the high bit set means no -4
        blk.qs[32 * h + l] |= uint8_t((c & 3) << (2 * t));
        if (c >= 4) blk.hmask[l] |= uint8_t(1 << (4 * h + t));
      }
    }
  }
}

void dequantize_q3_k_block(const BlockQ3_K& blk, float* y) {
  const float d = fp16_to_fp32(blk.d);
  int sc[16];
  q3_k_scales(blk.scales, sc);
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 4; ++t) {
      for (int l = 0; l < 32; ++l) {
        const int sub = 8 * h + 2 * t + l / 16;
        const int low = (blk.qs[32 * h + l] >> (2 * t)) & 3;
        const int q = low - ((blk.hmask[l] >> (4 * h + t)) & 1 ? 0 : 4);
        y[128 * h + 32 * t + l] = d * float(sc[sub] - 32) * float(q);
      }
    }
  }
}

// IQ4_XS: per sub-block of 32 an IQ4_NL fit; the 6-bit scales (ls - 32)
// against d = the largest-magnitude scale / -32.
template <bool kQuick>
void quantize_iq4_xs_block(const float* x, const float* w, BlockIQ4_XS& blk) {
  static const Levels levels = table_levels(kIq4nlValues, 16);
  float scales[8];
  for (int s = 0; s < 8; ++s) {
    scales[s] =
        kQuick ? quick_levels(x + 32 * s, 32, levels) : fit_levels(x + 32 * s, w + 32 * s, 32, levels);
  }
  const HalfScale d = half_scale(signed_super_scale<8, 32>(x, w, scales, levels));
  blk.d = d.bits;
  blk.scales_h = 0;
  std::memset(blk.scales_l, 0, sizeof blk.scales_l);
  for (int s = 0; s < 8; ++s) {
    const int l = d.value != 0.0f ? round_clamp(scales[s] / d.value, -32, 31) : 0;
    const int ls = l + 32;
    blk.scales_l[s / 2] |= uint8_t((ls & 15) << (4 * (s % 2)));
    blk.scales_h |= uint16_t((ls >> 4) << (2 * s));
    uint8_t q[32];
    level_codes(x + 32 * s, w + 32 * s, 32, levels, d.value * float(l), q);
    for (int j = 0; j < 16; ++j) blk.qs[16 * s + j] = uint8_t(q[j] | (q[j + 16] << 4));
  }
}

void dequantize_iq4_xs_block(const BlockIQ4_XS& blk, float* y) {
  const float d = fp16_to_fp32(blk.d);
  for (int s = 0; s < 8; ++s) {
    const int ls = ((blk.scales_l[s / 2] >> (4 * (s % 2))) & 15) | (((blk.scales_h >> (2 * s)) & 3) << 4);
    const float dl = d * float(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[32 * s + j] = dl * float(kIq4nlValues[blk.qs[16 * s + j] & 15]);
      y[32 * s + j + 16] = dl * float(kIq4nlValues[blk.qs[16 * s + j] >> 4]);
    }
  }
}

template <typename Block, void (*kEncode)(const float*, const float*, Block&)>
void quantize_super(const float* src, const float* w, void* dst, int64_t n) {
  auto* out = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b) kEncode(src + b * kQK_K, block_weights(w, b * kQK_K), out[b]);
}
template <typename Block, void (*kDecode)(const Block&, float*)>
void dequantize_super(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) kDecode(in[b], dst + b * kQK_K);
}

}  // namespace

void quantize_q2_k(const float* src, void* dst, int64_t n) { quantize_q2_k_weighted(src, nullptr, dst, n); }
void quantize_q3_k(const float* src, void* dst, int64_t n) { quantize_q3_k_weighted(src, nullptr, dst, n); }
void quantize_iq4_xs(const float* src, void* dst, int64_t n) {
  quantize_iq4_xs_weighted(src, nullptr, dst, n);
}
void quantize_q2_k_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_super<BlockQ2_K, quantize_q2_k_block<false>>(src, w, dst, n);
}
void quantize_q3_k_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_super<BlockQ3_K, quantize_q3_k_block<false>>(src, w, dst, n);
}
void quantize_iq4_xs_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_super<BlockIQ4_XS, quantize_iq4_xs_block<false>>(src, w, dst, n);
}
void quantize_q2_k_quick(const float* src, void* dst, int64_t n) {
  quantize_super<BlockQ2_K, quantize_q2_k_block<true>>(src, nullptr, dst, n);
}
void quantize_q3_k_quick(const float* src, void* dst, int64_t n) {
  quantize_super<BlockQ3_K, quantize_q3_k_block<true>>(src, nullptr, dst, n);
}
void quantize_iq4_xs_quick(const float* src, void* dst, int64_t n) {
  quantize_super<BlockIQ4_XS, quantize_iq4_xs_block<true>>(src, nullptr, dst, n);
}

// Q4_0 with weights: the plain quantizer (quantize.cpp) maps the value of
// largest magnitude to -8 as ggml's reference does; with an imatrix the
// scale is fitted instead, on the levels -8..7 (stored code = level + 8).
void quantize_q4_0_weighted(const float* src, const float* w_row, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ4_0*>(dst);
  const Levels levels = uniform_levels(-8, 7);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    const float* w = block_weights(w_row, b * 32);
    const HalfScale d = half_scale(fit_levels(x, w, 32, levels));
    uint8_t q[32];
    level_codes(x, w, 32, levels, d.value, q);
    for (int j = 0; j < 16; ++j) out[b].qs[j] = uint8_t(q[j] | (q[j + 16] << 4));
    out[b].d = d.bits;
  }
}
void dequantize_q2_k(const void* src, float* dst, int64_t n) {
  dequantize_super<BlockQ2_K, dequantize_q2_k_block>(src, dst, n);
}
void dequantize_q3_k(const void* src, float* dst, int64_t n) {
  dequantize_super<BlockQ3_K, dequantize_q3_k_block>(src, dst, n);
}
void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
  dequantize_super<BlockIQ4_XS, dequantize_iq4_xs_block>(src, dst, n);
}

}  // namespace moeserve::quant_detail
