// Quantizers of the codebook i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and
// IQ3_S (block layouts: quant_blocks.h; codebooks: iquant_grids.h). Each
// group of 8 values (IQ3: two entries of 4) is a codebook entry of
// magnitudes times its sub-block's scale, with a sign per value. IQ2_XXS,
// IQ2_XS and IQ3_XXS keep 7 sign bits (even parity), so a group with an odd
// number of negative values flips the sign of its cheapest element (least
// weighted square), which is then coded as a small value of the wrong sign;
// IQ2_S and IQ3_S store all 8.
//
// Search, per sub-block (32 values; IQ2_XS, IQ2_S: 16): for candidate scales s,
// each entry is chosen given s (the element-wise nearest magnitudes when
// they form a codebook entry: the exact optimum; else the best of the
// entries nearest to them, precomputed per point of the magnitude lattice);
// the candidate with the largest sum(wqx)^2 / sum(wq^2) wins and its least
// squares scale is refined twice. The super-block scale d is then searched
// over a few values near max(scale) / top, the 4-bit scales quantized
// against it and every entry chosen again at its quantized scale.
//
// Weights: w null means plain squared error (unit weights); with an
// imatrix, the importance of each column (quantize.h).
//
// QuantEffort::kQuick (make-model --quick-quant, synthetic files where only
// the types and shapes matter): each sub-block's scale is its largest
// magnitude over the codebook's top and d the largest of those over 15.5
// units, no search: one choice of entries a sub-block instead of ~20.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "tensor/iquant_codebook.h"
#include "tensor/iquant_grids.h"
#include "tensor/quant_blocks.h"
#include "tensor/quantize_internal.h"

namespace moeserve::quant_detail {
namespace {

// Candidate scales a sub-block tries: 0.55 .. 1.3 x max / top in this many
// steps. On the tiny trained model 20, 8 and 4 steps gave IQ2_XXS
// perplexities 11.73, 11.80, 11.87 and IQ3_S 2.62, 2.61, 2.62; each step is
// a full choice of entries, most of the quantizer's time.
constexpr int kScaleSteps = 10;

const Codebook& iq2xxs_book() {
  static const Codebook book(kIq2xxsGrid, 256, 8);
  return book;
}
const Codebook& iq2xs_book() {
  static const Codebook book(kIq2xsGrid, 512, 8);
  return book;
}
const Codebook& iq2s_book() {
  static const Codebook book(kIq2sGrid, 1024, 8);
  return book;
}
const Codebook& iq3xxs_book() {
  static const Codebook book(kIq3xxsGrid, 256, 4);
  return book;
}
const Codebook& iq3s_book() {
  static const Codebook book(kIq3sGrid, 512, 4);
  return book;
}

// One sub-block of n values (a multiple of 8): signs (parity-fixed), the
// targets (magnitudes; negative where a sign was flipped) and weights.
struct SubBlock {
  int n = 0;
  float t[32], w[32];
  uint8_t signs[4];  // per 8 values: bit j negates value j
};

void prepare(const float* x, const float* w, int n, bool parity, SubBlock& sb) {
  sb.n = n;
  for (int g = 0; g < n / 8; ++g) {
    uint8_t s = 0;
    for (int j = 0; j < 8; ++j) {
      const int i = 8 * g + j;
      sb.t[i] = std::fabs(x[i]);
      sb.w[i] = w != nullptr ? w[i] : 1.0f;
      if (x[i] < 0.0f) s |= uint8_t(1u << j);
    }
    if (parity && std::popcount(unsigned(s)) % 2 != 0) {  // the cheapest element takes the wrong sign
      int k = 0;
      for (int j = 1; j < 8; ++j) {
        if (sb.w[8 * g + j] * sb.t[8 * g + j] * sb.t[8 * g + j] <
            sb.w[8 * g + k] * sb.t[8 * g + k] * sb.t[8 * g + k])
          k = j;
      }
      s ^= uint8_t(1u << k);
      sb.t[8 * g + k] = -sb.t[8 * g + k];
    }
    sb.signs[g] = s;
  }
}

// Entries of every unit at scale s into e; returns sum(wqx), sum(wq^2).
std::pair<double, double> choose(const Codebook& cb, const SubBlock& sb, float s, int* e) {
  double qx = 0.0, q2 = 0.0;
  for (int u = 0; u < sb.n / cb.G; ++u) {
    const float* t = sb.t + cb.G * u;
    const float* w = sb.w + cb.G * u;
    e[u] = cb.best(t, w, s);
    for (int j = 0; j < cb.G; ++j) {
      const float q = cb.entries[size_t(e[u])][size_t(j)];
      qx += double(w[j]) * q * t[j], q2 += double(w[j]) * q * q;
    }
  }
  return {qx, q2};
}

double error_at(const Codebook& cb, const SubBlock& sb, float s, int* e) {
  const auto [qx, q2] = choose(cb, sb, s, e);
  double tt = 0.0;
  for (int i = 0; i < sb.n; ++i) tt += double(sb.w[i]) * sb.t[i] * sb.t[i];
  return tt - 2.0 * double(s) * qx + double(s) * s * q2;
}

// The sub-block's best scale (0: all zero).
float largest_magnitude(const SubBlock& sb) {
  float amax = 0.0f;
  for (int i = 0; i < sb.n; ++i) amax = std::max(amax, std::fabs(sb.t[i]));
  return amax;
}

float fit_scale(const Codebook& cb, const SubBlock& sb) {
  const float amax = largest_magnitude(sb);
  if (amax == 0.0f) return 0.0f;
  int e[32];
  float best_s = amax / cb.top;
  double best_score = -1.0;
  for (int k = 0; k <= kScaleSteps; ++k) {
    const float s = amax / cb.top * (0.55f + 0.75f / float(kScaleSteps) * float(k));
    const auto [qx, q2] = choose(cb, sb, s, e);
    if (qx > 0.0 && q2 > 0.0 && qx * qx / q2 > best_score) best_score = qx * qx / q2, best_s = float(qx / q2);
  }
  for (int it = 0; it < 2; ++it) {
    const auto [qx, q2] = choose(cb, sb, best_s, e);
    if (!(qx > 0.0 && q2 > 0.0)) break;
    best_s = float(qx / q2);
  }
  return best_s;
}

// The super-block scale d for sub-block scales s[] stored as 4-bit ls with
// scale d * (0.5 + ls) * unit (IQ2: 0.25, IQ3_XXS: 0.5, IQ3_S: 2): a few d near max(s) / (15.5 unit), each
// judged by the total error with entries chosen at the quantized scales.
struct Scales {
  float d = 0.0f;
  int ls[16] = {};
};
Scales fit_block_scales(const Codebook& cb, const SubBlock* sbs, const float* s, int n_sub, float unit,
                        bool quick) {
  float smax = 0.0f;
  for (int i = 0; i < n_sub; ++i) smax = std::max(smax, s[i]);
  Scales best;
  if (smax == 0.0f) return best;
  double best_err = INFINITY;
  int e[32];
  for (int k = quick ? 0 : -4; k <= (quick ? 0 : 2); ++k) {
    Scales c;
    c.d = fp16_to_fp32(fp32_to_fp16(smax / (15.5f * unit) * (1.0f + 0.025f * float(k))));
    if (c.d <= 0.0f) continue;
    double err = 0.0;
    for (int i = 0; i < n_sub; ++i) {
      c.ls[i] = std::clamp(int(std::lround(s[i] / (c.d * unit) - 0.5f)), 0, 15);
      if (!quick) err += error_at(cb, sbs[i], c.d * (0.5f + float(c.ls[i])) * unit, e);
    }
    if (err < best_err) best_err = err, best = c;
  }
  return best;
}

constexpr int kBlock = 256;

struct IqLayout {
  const Codebook* book = nullptr;
  int sub = 32;        // values a scale covers
  float unit = 0.25f;  // sub-block scale d * (0.5 + ls) * unit
  bool parity = true;  // 7 stored sign bits a group
  bool quick = false;  // QuantEffort::kQuick
};

float quick_scale(const Codebook& cb, const SubBlock& sb) { return largest_magnitude(sb) / cb.top; }

template <class Block, class Encode>
void quantize_iq(const float* src, const float* w, void* dst, int64_t n, const IqLayout& lay, Encode encode) {
  const Codebook& cb = *lay.book;
  const int sub = lay.sub;
  const float unit = lay.unit;
  auto* out = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / kBlock; ++b) {
    const float* x = src + b * kBlock;
    const float* wb = w != nullptr ? w + b * kBlock : nullptr;
    const int n_sub = kBlock / sub;
    SubBlock sbs[16];
    float s[16];
    for (int i = 0; i < n_sub; ++i) {
      prepare(x + i * sub, wb != nullptr ? wb + i * sub : nullptr, sub, lay.parity, sbs[i]);
      s[i] = lay.quick ? quick_scale(cb, sbs[i]) : fit_scale(cb, sbs[i]);
    }
    const Scales sc = fit_block_scales(cb, sbs, s, n_sub, unit, lay.quick);
    Block& blk = out[b];
    std::memset(&blk, 0, sizeof(blk));
    blk.d = fp32_to_fp16(sc.d);
    for (int i = 0; i < n_sub; ++i) {
      int e[32] = {};
      if (sc.d > 0.0f) choose(cb, sbs[i], sc.d * (0.5f + float(sc.ls[i])) * unit, e);
      encode(blk, i, sc.ls[i], e, sbs[i].signs);
    }
  }
}

void quantize_iq2_xxs_effort(const float* src, const float* w, void* dst, int64_t n, bool quick) {
  quantize_iq<BlockIQ2_XXS>(src, w, dst, n, {&iq2xxs_book(), 32, 0.25f, true, quick},
                            [](BlockIQ2_XXS& b, int ib, int ls, const int* e, const uint8_t* signs) {
                              uint32_t idx = 0, aux = uint32_t(ls) << 28;
                              for (int l = 0; l < 4; ++l) {
                                idx |= uint32_t(e[l]) << (8 * l);
                                aux |= uint32_t(signs[l] & 127) << (7 * l);
                              }
                              b.qs[4 * ib] = uint16_t(idx), b.qs[4 * ib + 1] = uint16_t(idx >> 16);
                              b.qs[4 * ib + 2] = uint16_t(aux), b.qs[4 * ib + 3] = uint16_t(aux >> 16);
                            });
}

void quantize_iq2_xs_effort(const float* src, const float* w, void* dst, int64_t n, bool quick) {
  // Sub-blocks of 16 (two groups), two 4-bit scales a byte.
  quantize_iq<BlockIQ2_XS>(src, w, dst, n, {&iq2xs_book(), 16, 0.25f, true, quick},
                           [](BlockIQ2_XS& b, int i, int ls, const int* e, const uint8_t* signs) {
                             const int ib = i / 2, half = i % 2;
                             b.scales[ib] |= uint8_t(ls << (4 * half));
                             for (int l = 0; l < 2; ++l)
                               b.qs[4 * ib + 2 * half + l] = uint16_t(e[l] | (signs[l] & 127) << 9);
                           });
}

void quantize_iq3_xxs_effort(const float* src, const float* w, void* dst, int64_t n, bool quick) {
  quantize_iq<BlockIQ3_XXS>(src, w, dst, n, {&iq3xxs_book(), 32, 0.5f, true, quick},
                            [](BlockIQ3_XXS& b, int ib, int ls, const int* e, const uint8_t* signs) {
                              for (int k = 0; k < 8; ++k) b.qs[8 * ib + k] = uint8_t(e[k]);
                              uint32_t aux = uint32_t(ls) << 28;
                              for (int l = 0; l < 4; ++l) aux |= uint32_t(signs[l] & 127) << (7 * l);
                              std::memcpy(b.qs + 64 + 4 * ib, &aux, 4);
                            });
}

void quantize_iq2_s_effort(const float* src, const float* w, void* dst, int64_t n, bool quick) {
  // As IQ2_XS, with 10-bit indices (bits 8-9 in qh) and 8 stored signs.
  quantize_iq<BlockIQ2_S>(src, w, dst, n, {&iq2s_book(), 16, 0.25f, false, quick},
                          [](BlockIQ2_S& b, int i, int ls, const int* e, const uint8_t* signs) {
                            const int ib = i / 2, half = i % 2;
                            b.scales[ib] |= uint8_t(ls << (4 * half));
                            for (int k = 0; k < 2; ++k) {
                              const int l = 2 * half + k;
                              b.qs[4 * ib + l] = uint8_t(e[k]);
                              b.qh[ib] |= uint8_t((e[k] >> 8) << (2 * l));
                              b.qs[32 + 4 * ib + l] = signs[k];
                            }
                          });
}

void quantize_iq3_s_effort(const float* src, const float* w, void* dst, int64_t n, bool quick) {
  // Scale d (1 + 2 ls) = d * 2 * (0.5 + ls); 9-bit indices (bit 8 in qh), 8 stored signs.
  quantize_iq<BlockIQ3_S>(src, w, dst, n, {&iq3s_book(), 32, 2.0f, false, quick},
                          [](BlockIQ3_S& b, int ib, int ls, const int* e, const uint8_t* signs) {
                            b.scales[ib / 2] |= uint8_t(ls << (4 * (ib % 2)));
                            for (int k = 0; k < 8; ++k) {
                              b.qs[8 * ib + k] = uint8_t(e[k]);
                              b.qh[ib] |= uint8_t((e[k] >> 8) << k);
                            }
                            for (int l = 0; l < 4; ++l) b.signs[4 * ib + l] = signs[l];
                          });
}

}  // namespace

void quantize_iq2_xxs_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_iq2_xxs_effort(src, w, dst, n, false);
}
void quantize_iq2_xxs_quick(const float* src, void* dst, int64_t n) {
  quantize_iq2_xxs_effort(src, nullptr, dst, n, true);
}
void quantize_iq2_xs_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_iq2_xs_effort(src, w, dst, n, false);
}
void quantize_iq2_xs_quick(const float* src, void* dst, int64_t n) {
  quantize_iq2_xs_effort(src, nullptr, dst, n, true);
}
void quantize_iq3_xxs_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_iq3_xxs_effort(src, w, dst, n, false);
}
void quantize_iq3_xxs_quick(const float* src, void* dst, int64_t n) {
  quantize_iq3_xxs_effort(src, nullptr, dst, n, true);
}
void quantize_iq2_s_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_iq2_s_effort(src, w, dst, n, false);
}
void quantize_iq2_s_quick(const float* src, void* dst, int64_t n) {
  quantize_iq2_s_effort(src, nullptr, dst, n, true);
}
void quantize_iq3_s_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_iq3_s_effort(src, w, dst, n, false);
}
void quantize_iq3_s_quick(const float* src, void* dst, int64_t n) {
  quantize_iq3_s_effort(src, nullptr, dst, n, true);
}
void quantize_iq2_s(const float* src, void* dst, int64_t n) { quantize_iq2_s_weighted(src, nullptr, dst, n); }
void quantize_iq3_s(const float* src, void* dst, int64_t n) { quantize_iq3_s_weighted(src, nullptr, dst, n); }
void quantize_iq2_xxs(const float* src, void* dst, int64_t n) {
  quantize_iq2_xxs_weighted(src, nullptr, dst, n);
}
void quantize_iq2_xs(const float* src, void* dst, int64_t n) {
  quantize_iq2_xs_weighted(src, nullptr, dst, n);
}
void quantize_iq3_xxs(const float* src, void* dst, int64_t n) {
  quantize_iq3_xxs_weighted(src, nullptr, dst, n);
}

}  // namespace moeserve::quant_detail
