// Quantizers of IQ1_S and IQ1_M (block layouts: quant_blocks.h; codebook:
// kIq1sGrid, 2048 entries of 8 values in {-1, 0, 1}). A group of 8 values
// is y = dl (g + delta), delta = +-1/8: per sub-block of 32 in IQ1_S, per
// group in IQ1_M; dl = d (2 ls + 1) with a 3-bit ls per 32 values (IQ1_S)
// or per 16 (IQ1_M).
//
// Search (as quantize_iquants.cpp): for candidate scales s of a sub-block,
// each group takes its best entry (iquant_codebook.h) for each shift and
// the better shift (IQ1_M: per group; IQ1_S: one for the sub-block); the
// candidate with the largest sum(wqx)^2 / sum(wq^2) (q = g + delta) wins,
// refined twice by least squares. Then d is searched over a few values near
// max(scale) / 15, with every entry and shift chosen again at the quantized
// scales. Weights: w null means unit weights; else an imatrix's.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "tensor/iquant_codebook.h"
#include "tensor/iquant_grids.h"
#include "tensor/quant_blocks.h"
#include "tensor/quantize_internal.h"

namespace moeserve::quant_detail {
namespace {

constexpr int kBlock = 256, kGroup = 8, kScaleSteps = 10;

const Codebook& iq1_book() {
  static const Codebook book(kIq1sGrid, 2048, kGroup, true);
  return book;
}

struct GroupChoice {
  int entry = 0;
  bool negative = false;  // the shift is -1/8
  double err = 0.0;
};

// The best entry for 8 targets at scale s with a shift: the targets less
// s * delta against s * g.
GroupChoice choose_group(const Codebook& cb, const float* x, const float* w, float s, bool negative) {
  const float delta = negative ? -kIq1Delta : kIq1Delta;
  float t[kGroup];
  for (int j = 0; j < kGroup; ++j) t[j] = x[j] - s * delta;
  GroupChoice c;
  c.entry = cb.best(t, w, s);
  c.negative = negative;
  for (int j = 0; j < kGroup; ++j) {
    const double d = double(t[j]) - double(s) * cb.entries[size_t(c.entry)][size_t(j)];
    c.err += double(w[j]) * d * d;
  }
  return c;
}

struct SubFit {
  GroupChoice groups[4];
  double qx = 0.0, q2 = 0.0, err = 0.0;
};

// Every group of a sub-block of n values at scale s: shifts per group, or
// one for the sub-block (the better total).
SubFit choose_sub(const Codebook& cb, const float* x, const float* w, int n, float s, bool shift_per_group) {
  SubFit best;
  best.err = INFINITY;
  const int n_groups = n / kGroup;
  for (int option = 0; option < (shift_per_group ? 1 : 2); ++option) {
    SubFit f;
    for (int g = 0; g < n_groups; ++g) {
      const float* xg = x + kGroup * g;
      const float* wg = w + kGroup * g;
      if (shift_per_group) {
        const GroupChoice pos = choose_group(cb, xg, wg, s, false), neg = choose_group(cb, xg, wg, s, true);
        f.groups[g] = neg.err < pos.err ? neg : pos;
      } else {
        f.groups[g] = choose_group(cb, xg, wg, s, option == 1);
      }
      f.err += f.groups[g].err;
      const float delta = f.groups[g].negative ? -kIq1Delta : kIq1Delta;
      for (int j = 0; j < kGroup; ++j) {
        const double q = double(cb.entries[size_t(f.groups[g].entry)][size_t(j)]) + delta;
        f.qx += double(wg[j]) * q * xg[j], f.q2 += double(wg[j]) * q * q;
      }
    }
    if (f.err < best.err) best = f;
  }
  return best;
}

// A sub-block's best scale (0: all zero).
float fit_scale(const Codebook& cb, const float* x, const float* w, int n, bool shift_per_group) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.0f) return 0.0f;
  const float base = amax / (1.0f + kIq1Delta);
  float best_s = base;
  double best_score = -1.0;
  for (int k = 0; k <= kScaleSteps; ++k) {
    const float s = base * (0.5f + 0.8f / float(kScaleSteps) * float(k));
    const SubFit f = choose_sub(cb, x, w, n, s, shift_per_group);
    if (f.qx > 0.0 && f.q2 > 0.0 && f.qx * f.qx / f.q2 > best_score) {
      best_score = f.qx * f.qx / f.q2, best_s = float(f.qx / f.q2);
    }
  }
  for (int it = 0; it < 2; ++it) {
    const SubFit f = choose_sub(cb, x, w, n, best_s, shift_per_group);
    if (!(f.qx > 0.0 && f.q2 > 0.0)) break;
    best_s = float(f.qx / f.q2);
  }
  return best_s;
}

struct Iq1Block {
  float d = 0.0f;
  int ls[16] = {};
  SubFit subs[16];
};

// d and the 3-bit scales (dl = d (2 ls + 1)) of a block of n_sub
// sub-blocks of n values, with every group chosen at the quantized scales.
Iq1Block fit_block(const float* x, const float* w, int n, bool shift_per_group) {
  const Codebook& cb = iq1_book();
  const int n_sub = kBlock / n;
  float s[16];
  float smax = 0.0f;
  for (int i = 0; i < n_sub; ++i) {
    s[i] = fit_scale(cb, x + n * i, w + n * i, n, shift_per_group);
    smax = std::max(smax, s[i]);
  }
  Iq1Block best;
  if (smax == 0.0f) {
    for (int i = 0; i < n_sub; ++i)
      best.subs[i] = choose_sub(cb, x + n * i, w + n * i, n, 1.0f, shift_per_group);
    return best;
  }
  double best_err = INFINITY;
  for (int k = -4; k <= 2; ++k) {
    Iq1Block c;
    c.d = fp16_to_fp32(fp32_to_fp16(smax / 15.0f * (1.0f + 0.025f * float(k))));
    if (c.d <= 0.0f) continue;
    double err = 0.0;
    for (int i = 0; i < n_sub; ++i) {
      c.ls[i] = std::clamp(int(std::lround((s[i] / c.d - 1.0f) * 0.5f)), 0, 7);
      c.subs[i] = choose_sub(cb, x + n * i, w + n * i, n, c.d * float(2 * c.ls[i] + 1), shift_per_group);
      err += c.subs[i].err;
    }
    if (err < best_err) best_err = err, best = c;
  }
  return best;
}

// Each block of n values fitted (sub-blocks of `sub` values) and written by
// encode(block, fit).
template <class Block, class Encode>
void quantize_iq1(const float* src, const float* w, void* dst, int64_t n, int sub, bool shift_per_group,
                  Encode encode) {
  auto* out = static_cast<Block*>(dst);
  float unit[kBlock];
  std::fill(unit, unit + kBlock, 1.0f);
  for (int64_t b = 0; b < n / kBlock; ++b) {
    const Iq1Block f =
        fit_block(src + b * kBlock, w != nullptr ? w + b * kBlock : unit, sub, shift_per_group);
    Block& blk = out[b];
    std::memset(&blk, 0, sizeof(blk));
    encode(blk, f);
  }
}

}  // namespace

void quantize_iq1_s_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_iq1<BlockIQ1_S>(src, w, dst, n, 32, false, [](BlockIQ1_S& blk, const Iq1Block& f) {
    blk.d = fp32_to_fp16(f.d);
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t h = uint32_t(f.ls[ib]) << 12 | (f.subs[ib].groups[0].negative ? 0x8000u : 0u);
      for (int l = 0; l < 4; ++l) {
        const int e = f.subs[ib].groups[l].entry;
        blk.qs[4 * ib + l] = uint8_t(e);
        h |= uint32_t((e >> 8) & 7) << (3 * l);
      }
      blk.qh[ib] = uint16_t(h);
    }
  });
}

void quantize_iq1_m_weighted(const float* src, const float* w, void* dst, int64_t n) {
  quantize_iq1<BlockIQ1_M>(src, w, dst, n, 16, true, [](BlockIQ1_M& blk, const Iq1Block& f) {
    uint16_t sc[4] = {};
    for (int i = 0; i < 16; ++i) {  // sub-block i: groups 2 (i % 2) and + 1 of 32-value block ib
      const int ib = i / 2, half = i % 2;
      sc[ib / 2] |= uint16_t(f.ls[i] << (6 * (ib % 2) + 3 * half));
      uint8_t hb = 0;
      for (int k = 0; k < 2; ++k) {
        const GroupChoice& g = f.subs[i].groups[k];
        blk.qs[4 * ib + 2 * half + k] = uint8_t(g.entry);
        hb |= uint8_t(((g.entry >> 8) & 7) << (4 * k));
        if (g.negative) hb |= uint8_t(0x08 << (4 * k));
      }
      blk.qh[2 * ib + half] = hb;
    }
    const uint16_t d = fp32_to_fp16(f.d);
    for (int k = 0; k < 4; ++k) sc[k] |= uint16_t(((d >> (4 * k)) & 0xF) << 12);
    std::memcpy(blk.scales, sc, sizeof(sc));
  });
}

void quantize_iq1_s(const float* src, void* dst, int64_t n) { quantize_iq1_s_weighted(src, nullptr, dst, n); }
void quantize_iq1_m(const float* src, void* dst, int64_t n) { quantize_iq1_m_weighted(src, nullptr, dst, n); }

}  // namespace moeserve::quant_detail
