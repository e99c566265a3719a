// Reference quantizers and dequantizers of issue 43's types: the legacy
// 32-element types (Q4_1, Q5_0, Q5_1), the 2- and 3-bit K-quants (Q2_K,
// Q3_K), the non-linear 4-bit types (IQ4_NL, IQ4_XS) and MXFP4. Block
// layouts and value formulas: tensor/quant_blocks.h (ggml's definitions).
//
// The quantizers follow the scheme of the other K-quants
// (quantize_kquants.cpp): each (sub-)block's scale (and offset) is searched
// over candidate inverse scales, each candidate's codes rounded and its
// least-squares scale refit, the best kept; super-block scales are then
// quantized and every value re-coded against the scales a reader sees.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/quant_blocks.h"
#include "tensor/quantize_internal.h"

namespace moeserve::quant_detail {
namespace {

constexpr int kSearchSteps = 6;
constexpr float kSearchStep = 0.15f;
constexpr int kPolishIters = 3;
constexpr int kMaxSub = 32;

// ---- affine fits: x ≈ scale * q + offset, q in [0, nmax] --------------------

struct Affine {
  float scale = 0.0f, offset = 0.0f;
};

float affine_codes(const float* x, int n, int nmax, const Affine& f, uint8_t* q) {
  const float inv = f.scale > 0.0f ? 1.0f / f.scale : 0.0f;
  float err = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int c = round_clamp((x[i] - f.offset) * inv, 0, nmax);
    if (q != nullptr) q[i] = uint8_t(c);
    const float e = x[i] - (f.scale * float(c) + f.offset);
    err += e * e;
  }
  return err;
}

// Least squares for fixed codes; `nonpositive_offset`: the format stores a
// subtracted non-negative minimum (Q2_K), so a positive offset is clamped.
bool refit_affine(const float* x, const uint8_t* q, int n, bool nonpositive_offset, Affine* out) {
  double sq = 0, sqq = 0, sx = 0, sxq = 0;
  for (int i = 0; i < n; ++i) {
    sq += q[i], sqq += double(q[i]) * q[i], sx += x[i], sxq += double(x[i]) * q[i];
  }
  const double det = n * sqq - sq * sq;
  if (!(det > 0)) return false;
  double scale = (n * sxq - sq * sx) / det;
  double offset = (sqq * sx - sq * sxq) / det;
  if (nonpositive_offset && offset > 0) offset = 0, scale = sxq / sqq;
  if (!(scale > 0)) return false;
  *out = {float(scale), float(offset)};
  return true;
}

Affine fit_affine(const float* x, int n, int nmax, bool nonpositive_offset) {
  float lo = x[0], hi = x[0];
  for (int i = 0; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  if (nonpositive_offset) lo = std::min(lo, 0.0f);
  if (!(hi > lo)) return {0.0f, lo};
  Affine best{(hi - lo) / float(nmax), lo};
  float best_err = affine_codes(x, n, nmax, best, nullptr);
  uint8_t q[kMaxSub];
  for (int k = -kSearchSteps; k <= kSearchSteps; ++k) {
    const float iscale = (float(nmax) + kSearchStep * float(k)) / (hi - lo);
    for (int i = 0; i < n; ++i) q[i] = uint8_t(round_clamp((x[i] - lo) * iscale, 0, nmax));
    Affine c;
    if (!refit_affine(x, q, n, nonpositive_offset, &c)) continue;
    if (const float e = affine_codes(x, n, nmax, c, nullptr); e < best_err) best_err = e, best = c;
  }
  for (int it = 0; it < kPolishIters; ++it) {
    affine_codes(x, n, nmax, best, q);
    Affine c;
    if (!refit_affine(x, q, n, nonpositive_offset, &c)) break;
    const float e = affine_codes(x, n, nmax, c, nullptr);
    if (!(e < best_err)) break;
    best_err = e, best = c;
  }
  return best;
}

// ---- fits on a table of levels: x ≈ scale * values[q] ------------------------

// The index of the level nearest v (levels ascending).
int nearest_level(float v, const float* levels, int n_levels) {
  int best = 0;
  float best_d = std::fabs(v - levels[0]);
  for (int i = 1; i < n_levels; ++i) {
    if (const float d = std::fabs(v - levels[i]); d < best_d) best_d = d, best = i;
  }
  return best;
}

float level_codes(const float* x, int n, const float* levels, int n_levels, float scale, uint8_t* q) {
  const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
  float err = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int c = nearest_level(x[i] * inv, levels, n_levels);
    if (q != nullptr) q[i] = uint8_t(c);
    const float e = x[i] - scale * levels[c];
    err += e * e;
  }
  return err;
}

// The scale minimising the error over codes chosen by nearest level: the
// value of largest magnitude tried on levels near the end of the table on
// its side, each candidate's codes refit by least squares.
float fit_levels(const float* x, int n, const float* levels, int n_levels) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::fabs(x[i]) > std::fabs(m) ? x[i] : m;
  if (m == 0.0f) return 0.0f;
  const float end = m < 0.0f ? levels[0] : levels[n_levels - 1];  // same sign as m
  float best = m / end;
  float best_err = level_codes(x, n, levels, n_levels, best, nullptr);
  uint8_t q[kMaxSub];
  for (int k = -kSearchSteps; k <= kSearchSteps; ++k) {
    const float cand0 = m / (end * (1.0f + 0.04f * float(k)));
    level_codes(x, n, levels, n_levels, cand0, q);
    for (int it = 0; it < 2; ++it) {
      double sxq = 0, sqq = 0;
      for (int i = 0; i < n; ++i) sxq += double(x[i]) * levels[q[i]], sqq += double(levels[q[i]]) * levels[q[i]];
      if (!(sqq > 0)) break;
      const float cand = float(sxq / sqq);
      const float e = level_codes(x, n, levels, n_levels, cand, q);
      if (e < best_err) best_err = e, best = cand;
    }
  }
  return best;
}

// Uniform signed levels lo..hi as a table (Q3_K's -4..3).
struct Levels {
  float v[64];
  int n = 0;
};
Levels uniform_levels(int lo, int hi) {
  Levels l;
  for (int i = lo; i <= hi; ++i) l.v[l.n++] = float(i);
  return l;
}
Levels table_levels(const int8_t* values, int n) {
  Levels l;
  for (int i = 0; i < n; ++i) l.v[l.n++] = float(values[i]);
  std::sort(l.v, l.v + l.n);
  return l;
}
// The code of table entry `level` in `values` (the stored nibble).
uint8_t table_code(const int8_t* values, int n, float level) {
  for (int i = 0; i < n; ++i) {
    if (float(values[i]) == level) return uint8_t(i);
  }
  return 0;
}

// ---- Q4_1 / Q5_1: y = d * q + m ---------------------------------------------

template <typename Block, int kBits>
void quantize_affine32(const float* src, void* dst, int64_t n) {
  constexpr int kMax = (1 << kBits) - 1;
  auto* out = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    const Affine f = fit_affine(x, 32, kMax, false);
    const HalfScale d = half_scale(f.scale), m = half_scale(f.offset);
    Block& blk = out[b];
    std::memset(&blk, 0, sizeof blk);
    blk.d = d.bits, blk.m = m.bits;
    uint8_t q[32];
    affine_codes(x, 32, kMax, {d.value, m.value}, q);
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

void quantize_q5_0(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockQ5_0*>(dst);
  const Levels levels = uniform_levels(-16, 15);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    const HalfScale d = half_scale(fit_levels(x, 32, levels.v, levels.n));
    uint8_t q[32];  // indices into -16..15: the stored code
    level_codes(x, 32, levels.v, levels.n, d.value, q);
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

void quantize_iq4_nl(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<BlockIQ4_NL*>(dst);
  const Levels levels = table_levels(kIq4nlValues, 16);  // ascending already
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    const HalfScale d = half_scale(fit_levels(x, 32, levels.v, levels.n));
    uint8_t q[32];
    level_codes(x, 32, levels.v, levels.n, d.value, q);
    out[b].d = d.bits;
    for (int j = 0; j < 16; ++j) out[b].qs[j] = uint8_t(q[j] | (q[j + 16] << 4));
  }
}

template <typename Block>
void dequantize_table32(const void* src, float* dst, int64_t n, const int8_t* values, float (*scale)(const Block&)) {
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
      const float err = level_codes(x, 32, levels.v, levels.n, mxfp4_scale(uint8_t(e)), nullptr);
      if (err < best_err) best_err = err, best_e = uint8_t(e);
    }
    uint8_t idx[32];
    level_codes(x, 32, levels.v, levels.n, mxfp4_scale(best_e), idx);
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
  dequantize_table32<BlockMXFP4>(src, dst, n, kMxfp4Values, [](const BlockMXFP4& b) { return mxfp4_scale(b.e); });
}

}  // namespace

void quantize_q4_1(const float* src, void* dst, int64_t n) { quantize_affine32<BlockQ4_1, 4>(src, dst, n); }
void quantize_q5_1(const float* src, void* dst, int64_t n) { quantize_affine32<BlockQ5_1, 5>(src, dst, n); }
void dequantize_q4_1(const void* src, float* dst, int64_t n) { dequantize_affine32<BlockQ4_1, 4>(src, dst, n); }
void dequantize_q5_1(const void* src, float* dst, int64_t n) { dequantize_affine32<BlockQ5_1, 5>(src, dst, n); }
void quantize_q5_0_row(const float* src, void* dst, int64_t n) { quantize_q5_0(src, dst, n); }
void dequantize_q5_0_row(const void* src, float* dst, int64_t n) { dequantize_q5_0(src, dst, n); }
void quantize_iq4_nl_row(const float* src, void* dst, int64_t n) { quantize_iq4_nl(src, dst, n); }
void dequantize_iq4_nl_row(const void* src, float* dst, int64_t n) { dequantize_iq4_nl(src, dst, n); }
void quantize_mxfp4_row(const float* src, void* dst, int64_t n) { quantize_mxfp4(src, dst, n); }
void dequantize_mxfp4_row(const void* src, float* dst, int64_t n) { dequantize_mxfp4(src, dst, n); }

// ---- K-quants of 2 and 3 bits, IQ4_XS ---------------------------------------

namespace {

// Q2_K: per sub-block of 16 an affine fit (q in 0..3, min >= 0); the 4-bit
// scale and min codes against d = max scale / 15, dmin = max min / 15.
void quantize_q2_k_block(const float* x, BlockQ2_K& blk) {
  Affine fits[16];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 16; ++s) {
    fits[s] = fit_affine(x + 16 * s, 16, 3, true);
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
    affine_codes(x + 16 * s, 16, 3, {d.value * float(sc), -dmin.value * float(mn)}, q + 16 * s);
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
        y[128 * h + 32 * t + l] = d * float(blk.scales[sub] & 15) * float(q) - dmin * float(blk.scales[sub] >> 4);
      }
    }
  }
}

// Q3_K: per sub-block of 16 a signed fit on -4..3; the 6-bit scales (s -
// 32) against d = the largest-magnitude scale / -32.
void quantize_q3_k_block(const float* x, BlockQ3_K& blk) {
  const Levels levels = uniform_levels(-4, 3);
  float scales[16], m = 0.0f;
  for (int s = 0; s < 16; ++s) {
    scales[s] = fit_levels(x + 16 * s, 16, levels.v, levels.n);
    m = std::fabs(scales[s]) > std::fabs(m) ? scales[s] : m;
  }
  const HalfScale d = half_scale(m / -32.0f);
  blk.d = d.bits;
  int codes[16];
  uint8_t q[kQK_K];
  for (int s = 0; s < 16; ++s) {
    const int l = d.value != 0.0f ? round_clamp(scales[s] / d.value, -32, 31) : 0;
    codes[s] = l + 32;
    level_codes(x + 16 * s, 16, levels.v, levels.n, d.value * float(l), q + 16 * s);  // 0..7 = value + 4
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
void quantize_iq4_xs_block(const float* x, BlockIQ4_XS& blk) {
  const Levels levels = table_levels(kIq4nlValues, 16);
  float scales[8], m = 0.0f;
  for (int s = 0; s < 8; ++s) {
    scales[s] = fit_levels(x + 32 * s, 32, levels.v, levels.n);
    m = std::fabs(scales[s]) > std::fabs(m) ? scales[s] : m;
  }
  const HalfScale d = half_scale(m / -32.0f);
  blk.d = d.bits;
  blk.scales_h = 0;
  std::memset(blk.scales_l, 0, sizeof blk.scales_l);
  for (int s = 0; s < 8; ++s) {
    const int l = d.value != 0.0f ? round_clamp(scales[s] / d.value, -32, 31) : 0;
    const int ls = l + 32;
    blk.scales_l[s / 2] |= uint8_t((ls & 15) << (4 * (s % 2)));
    blk.scales_h |= uint16_t((ls >> 4) << (2 * s));
    uint8_t q[32];
    level_codes(x + 32 * s, 32, levels.v, levels.n, d.value * float(l), q);
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

template <typename Block, void (*kEncode)(const float*, Block&)>
void quantize_super(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b) kEncode(src + b * kQK_K, out[b]);
}
template <typename Block, void (*kDecode)(const Block&, float*)>
void dequantize_super(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) kDecode(in[b], dst + b * kQK_K);
}

}  // namespace

void quantize_q2_k(const float* src, void* dst, int64_t n) {
  quantize_super<BlockQ2_K, quantize_q2_k_block>(src, dst, n);
}
void quantize_q3_k(const float* src, void* dst, int64_t n) {
  quantize_super<BlockQ3_K, quantize_q3_k_block>(src, dst, n);
}
void quantize_iq4_xs(const float* src, void* dst, int64_t n) {
  quantize_super<BlockIQ4_XS, quantize_iq4_xs_block>(src, dst, n);
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
