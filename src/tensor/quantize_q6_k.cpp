// Q6_K reference quantizer and dequantizer.
//
// y = d*sc_j*(q-32) on 16 sub-blocks of 16; q-32 in -32..31, sc_j int8, d f16.
// The quantizer mirrors the affine K-quants (quantize_kquants.cpp) with a
// symmetric, scale-only fit:
//   1. per sub-block, candidate inverse scales map the largest-magnitude value
//      near level -32 (the longer side of the signed range); for each the codes
//      are rounded and the least-squares scale for those codes computed; the
//      best is kept, then rounding and refitting alternate;
//   2. the 16 scales are quantized to int8 against d = max|scale|/127 (f16);
//   3. each sub-block tries its neighbouring scale codes, and d is refit by
//      least squares for the chosen integer codes, kept only when better.
// Errors and sums carry per-element weights (quantize_internal.h).
#include <cmath>

#include "tensor/quant_blocks.h"
#include "tensor/quantize_internal.h"

namespace moeserve::quant_detail {
namespace {

constexpr int kSub = 16;
constexpr int kNumSub = kQK_K / kSub;
constexpr int kLevelLo = -32;
constexpr int kLevelHi = 31;
constexpr int kMaxScaleCode = 127;
// Candidates: the largest-magnitude value lands on level -(32 + kStep*k).
constexpr int kSearchSteps = 8;
constexpr float kSearchStep = 0.25f;
constexpr int kPolishIters = 4;
constexpr int kSuperIters = 3;

// Weighted squared error of x ≈ scale*q; stores the signed codes when q is
// non-null. (float sums: they only rank candidates of one sub-block.)
float symmetric_error(const float* x, const float* w, int n, float scale, int8_t* q) {
  const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
  float err = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int c = round_clamp(x[i] * inv, kLevelLo, kLevelHi);
    if (q != nullptr) q[i] = int8_t(c);
    const float e = x[i] - scale * float(c);
    err += w[i] * e * e;
  }
  return err;
}

// Weighted least-squares scale for fixed codes; false when all codes are 0.
bool fit_scale_to_codes(const float* x, const float* w, const int8_t* q, int n, float* scale) {
  double sxq = 0, sqq = 0;
  for (int i = 0; i < n; ++i) {
    const double wi = w[i];
    sxq += wi * x[i] * q[i];
    sqq += wi * q[i] * q[i];
  }
  if (!(sqq > 0)) return false;
  *scale = float(sxq / sqq);
  return true;
}

float fit_symmetric_sub_block(const float* x, const float* w, int n) {
  float hi = 0.0f, lo = 0.0f;
  for (int i = 0; i < n; ++i) {
    hi = x[i] > hi ? x[i] : hi;
    lo = x[i] < lo ? x[i] : lo;
  }
  const float m = -lo > hi ? lo : hi;  // signed value of largest magnitude
  if (m == 0.0f) return 0.0f;
  float best = m / float(kLevelLo);
  float best_err = symmetric_error(x, w, n, best, nullptr);
  int8_t q[kSub];
  for (int k = -kSearchSteps; k <= kSearchSteps; ++k) {
    const float iscale = (float(kLevelLo) - kSearchStep * float(k)) / m;
    for (int i = 0; i < n; ++i) q[i] = int8_t(round_clamp(x[i] * iscale, kLevelLo, kLevelHi));
    float cand = 0.0f;
    if (!fit_scale_to_codes(x, w, q, n, &cand)) continue;
    const float err = symmetric_error(x, w, n, cand, nullptr);
    if (err < best_err) {
      best_err = err;
      best = cand;
    }
  }
  for (int it = 0; it < kPolishIters; ++it) {
    symmetric_error(x, w, n, best, q);
    float cand = 0.0f;
    if (!fit_scale_to_codes(x, w, q, n, &cand)) break;
    const float err = symmetric_error(x, w, n, cand, nullptr);
    if (!(err < best_err)) break;
    best_err = err;
    best = cand;
  }
  return best;
}

struct SymmetricSuperBlock {
  HalfScale d{};
  int8_t sc[kNumSub] = {};
  int8_t q[kQK_K] = {};  // signed levels
};

void polish_scale_codes(const float* x, const float* w, SymmetricSuperBlock* s) {
  for (int j = 0; j < kNumSub; ++j) {
    int best_sc = s->sc[j];
    float best_err = symmetric_error(x + j * kSub, w + j * kSub, kSub, s->d.value * float(best_sc), nullptr);
    for (int sc = s->sc[j] - 1; sc <= s->sc[j] + 1; sc += 2) {
      if (sc < -kMaxScaleCode || sc > kMaxScaleCode) continue;
      const float err = symmetric_error(x + j * kSub, w + j * kSub, kSub, s->d.value * float(sc), nullptr);
      if (err < best_err) {
        best_err = err;
        best_sc = sc;
      }
    }
    s->sc[j] = int8_t(best_sc);
  }
}

double code_values(const float* x, const float* w, SymmetricSuperBlock* s) {
  double err = 0.0;
  for (int j = 0; j < kNumSub; ++j) {
    err += symmetric_error(x + j * kSub, w + j * kSub, kSub, s->d.value * float(s->sc[j]), s->q + j * kSub);
  }
  return err;
}

// Least-squares d for fixed integer codes: x ≈ d*(sc_j*q).
bool refit_super_scale(const float* x, const float* w, const SymmetricSuperBlock& s, float* d) {
  double xu = 0, uu = 0;
  for (int i = 0; i < kQK_K; ++i) {
    const double u = double(s.sc[i / kSub]) * s.q[i];
    const double wi = w[i];
    xu += wi * x[i] * u;
    uu += wi * u * u;
  }
  if (!(uu > 0)) return false;
  *d = float(xu / uu);
  return *d > 0;
}

// Quick effort: the value of largest magnitude on level -32.
float range_symmetric_sub_block(const float* x, int n) {
  float hi = 0.0f, lo = 0.0f;
  for (int i = 0; i < n; ++i) {
    hi = x[i] > hi ? x[i] : hi;
    lo = x[i] < lo ? x[i] : lo;
  }
  return (-lo > hi ? lo : hi) / float(kLevelLo);
}

void encode_symmetric_super_block(const float* x, const float* w, bool quick, SymmetricSuperBlock* s) {
  float scales[kNumSub];
  float max_abs = 0.0f;
  for (int j = 0; j < kNumSub; ++j) {
    scales[j] = quick ? range_symmetric_sub_block(x + j * kSub, kSub)
                      : fit_symmetric_sub_block(x + j * kSub, w + j * kSub, kSub);
    max_abs = std::fabs(scales[j]) > max_abs ? std::fabs(scales[j]) : max_abs;
  }
  s->d = half_scale(max_abs / kMaxScaleCode);
  for (int j = 0; j < kNumSub; ++j) {
    s->sc[j] = s->d.value > 0.0f ? int8_t(round_clamp(scales[j] / s->d.value, -kMaxScaleCode, kMaxScaleCode))
                                 : int8_t(0);
  }
  if (quick) {
    code_values(x, w, s);
    return;
  }
  polish_scale_codes(x, w, s);
  double err = code_values(x, w, s);
  for (int it = 0; it < kSuperIters; ++it) {
    float d = 0.0f;
    if (!refit_super_scale(x, w, *s, &d)) break;
    SymmetricSuperBlock cand = *s;
    cand.d = half_scale(d);
    polish_scale_codes(x, w, &cand);
    const double cand_err = code_values(x, w, &cand);
    if (!(cand_err < err)) break;
    *s = cand;
    err = cand_err;
  }
}

// The bit layout of each half: q6_k_store_codes_at (quant_blocks.h).
void pack_q6_k(const SymmetricSuperBlock& s, BlockQ6_K* out) {
  for (int h = 0; h < 2; ++h) {
    const int8_t* q = s.q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      const int codes[4] = {q[l] + 32, q[l + 32] + 32, q[l + 64] + 32, q[l + 96] + 32};
      q6_k_store_codes_at(codes, out->ql + 64 * h, out->qh + 32 * h, l);
    }
  }
  for (int j = 0; j < kNumSub; ++j) out->scales[j] = s.sc[j];
  out->d = s.d.bits;
}

void quantize_q6_k_effort(const float* src, const float* w, void* dst, int64_t n, bool quick) {
  auto* out = static_cast<BlockQ6_K*>(dst);
  SymmetricSuperBlock s;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    encode_symmetric_super_block(src + b * kQK_K, block_weights(w, b * kQK_K), quick, &s);
    pack_q6_k(s, &out[b]);
  }
}

}  // namespace

void quantize_q6_k(const float* src, void* dst, int64_t n) {
  quantize_q6_k_effort(src, nullptr, dst, n, false);
}
void quantize_q6_k_quick(const float* src, void* dst, int64_t n) {
  quantize_q6_k_effort(src, nullptr, dst, n, true);
}
void quantize_q6_k_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_q6_k_effort(src, w, dst, n, false);
}

void dequantize_q6_k(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const BlockQ6_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = fp16_to_fp32(in[b].d);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = in[b].ql + 64 * h;
      const uint8_t* qh = in[b].qh + 32 * h;
      const int8_t* sc = in[b].scales + 8 * h;
      float* y = dst + b * kQK_K + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        int q[4];
        q6_k_codes_at(ql, qh, l, q);
        for (int t = 0; t < 4; ++t) y[l + 32 * t] = d * float(sc[is + 2 * t]) * float(q[t] - 32);
      }
    }
  }
}

}  // namespace moeserve::quant_detail
