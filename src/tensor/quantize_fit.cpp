// The shared (sub-)block fits of the low-bit quantizers (quantize_fit.h).
#include "tensor/quantize_fit.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/quantize_internal.h"

namespace moeserve::quant_detail {
namespace {

constexpr int kSearchSteps = 6;
constexpr float kSearchStep = 0.15f;
constexpr int kPolishIters = 3;
constexpr int kWeightedSteps = 10;  // fit_levels_weighted: candidates per end

// Weighted least squares for fixed codes.
bool refit_affine(const float* x, const float* w, const uint8_t* q, int n, bool nonpositive_offset,
                  Affine* out) {
  double sw = 0, sq = 0, sqq = 0, sx = 0, sxq = 0;
  for (int i = 0; i < n; ++i) {
    const double wi = w[i];
    sw += wi, sq += wi * q[i], sqq += wi * q[i] * q[i], sx += wi * x[i], sxq += wi * x[i] * q[i];
  }
  const double det = sw * sqq - sq * sq;
  if (!(det > 0)) return false;
  double scale = (sw * sxq - sq * sx) / det;
  double offset = (sqq * sx - sq * sxq) / det;
  if (nonpositive_offset && offset > 0) offset = 0, scale = sxq / sqq;
  if (!(scale > 0)) return false;
  *out = {float(scale), float(offset)};
  return true;
}

// The index of the level nearest v (levels ascending).
int nearest_level(float v, const float* levels, int n_levels) {
  int best = 0;
  float best_d = std::fabs(v - levels[0]);
  for (int i = 1; i < n_levels; ++i) {
    if (const float d = std::fabs(v - levels[i]); d < best_d) best_d = d, best = i;
  }
  return best;
}

}  // namespace

float affine_codes(const float* x, const float* w, int n, int nmax, const Affine& f, uint8_t* q) {
  const float inv = f.scale > 0.0f ? 1.0f / f.scale : 0.0f;
  float err = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int c = round_clamp((x[i] - f.offset) * inv, 0, nmax);
    if (q != nullptr) q[i] = uint8_t(c);
    const float e = x[i] - (f.scale * float(c) + f.offset);
    err += w[i] * e * e;
  }
  return err;
}

Affine fit_affine(const float* x, const float* w, int n, int nmax, bool nonpositive_offset) {
  float lo = x[0], hi = x[0];
  for (int i = 0; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  if (nonpositive_offset) lo = std::min(lo, 0.0f);
  if (!(hi > lo)) return {0.0f, lo};
  Affine best{(hi - lo) / float(nmax), lo};
  float best_err = affine_codes(x, w, n, nmax, best, nullptr);
  uint8_t q[kMaxFitElems];
  for (int k = -kSearchSteps; k <= kSearchSteps; ++k) {
    const float iscale = (float(nmax) + kSearchStep * float(k)) / (hi - lo);
    for (int i = 0; i < n; ++i) q[i] = uint8_t(round_clamp((x[i] - lo) * iscale, 0, nmax));
    Affine c;
    if (!refit_affine(x, w, q, n, nonpositive_offset, &c)) continue;
    if (const float e = affine_codes(x, w, n, nmax, c, nullptr); e < best_err) best_err = e, best = c;
  }
  for (int it = 0; it < kPolishIters; ++it) {
    affine_codes(x, w, n, nmax, best, q);
    Affine c;
    if (!refit_affine(x, w, q, n, nonpositive_offset, &c)) break;
    const float e = affine_codes(x, w, n, nmax, c, nullptr);
    if (!(e < best_err)) break;
    best_err = e, best = c;
  }
  return best;
}

Levels uniform_levels(int lo, int hi) {
  Levels l;
  for (int i = lo; i <= hi; ++i) l.v[l.n++] = float(i);
  l.uniform = true;
  return l;
}

Levels table_levels(const int8_t* values, int n) {
  Levels l;
  for (int i = 0; i < n; ++i) l.v[l.n++] = float(values[i]);
  std::sort(l.v, l.v + l.n);
  return l;
}

uint8_t table_code(const int8_t* values, int n, float level) {
  for (int i = 0; i < n; ++i) {
    if (float(values[i]) == level) return uint8_t(i);
  }
  return 0;
}

float level_codes(const float* x, const float* w, int n, const Levels& levels, float scale, uint8_t* q) {
  const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
  float err = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int c = nearest_level(x[i] * inv, levels.v, levels.n);
    if (q != nullptr) q[i] = uint8_t(c);
    const float e = x[i] - scale * levels.v[c];
    err += w[i] * e * e;
  }
  return err;
}

// level_codes for the weighted search: the nearest level by rounding
// (uniform levels) or by bisection (a table), not by a scan of every level.
// (Ties may go the other way than nearest_level's; only candidates are
// ranked with it, and the quantizers code the chosen scale with level_codes.)
static float level_codes_fast(const float* x, const float* w, int n, const Levels& levels, float scale,
                              uint8_t* q) {
  const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
  const int last = levels.n - 1;
  float err = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float v = x[i] * inv;
    int c;
    if (levels.uniform) {
      c = round_clamp(v - levels.v[0], 0, last);
    } else {
      int lo = 0, hi = last;  // the answer is in [lo, hi]
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        (v < levels.v[mid] ? hi : lo) = mid;
      }
      c = v - levels.v[lo] <= levels.v[hi] - v ? lo : hi;
    }
    q[i] = uint8_t(c);
    const float e = x[i] - scale * levels.v[c];
    err += w[i] * e * e;
  }
  return err;
}

// The weighted least-squares scale of x for the given codes; NaN when the
// codes carry no weight (no refit then).
static float refit_scale(const float* x, const float* w, int n, const Levels& levels, const uint8_t* q) {
  double sxq = 0, sqq = 0;
  for (int i = 0; i < n; ++i) {
    const double wl = double(w[i]) * levels.v[q[i]];
    sxq += wl * x[i], sqq += wl * levels.v[q[i]];
  }
  return sqq > 0 ? float(sxq / sqq) : std::numeric_limits<float>::quiet_NaN();
}

// Candidates put the value of largest magnitude on levels near the end of
// the table on its side; each candidate's codes are refit by least squares.
// (The plain quantizers' fit: its results are fixed by their tests.)
template <bool kFast>
float fit_levels_plain(const float* x, const float* w, int n, const Levels& levels) {
  uint8_t qq[kMaxFitElems];
  const auto codes = [&](float scale, uint8_t* q) {
    return kFast ? level_codes_fast(x, w, n, levels, scale, q != nullptr ? q : qq)
                 : level_codes(x, w, n, levels, scale, q);
  };
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::fabs(x[i]) > std::fabs(m) ? x[i] : m;
  if (m == 0.0f) return 0.0f;
  const float end = m < 0.0f ? levels.v[0] : levels.v[levels.n - 1];  // same sign as m
  float best = m / end;
  float best_err = codes(best, nullptr);
  uint8_t q[kMaxFitElems];
  for (int k = -kSearchSteps; k <= kSearchSteps; ++k) {
    const float cand0 = m / (end * (1.0f + 0.04f * float(k)));
    codes(cand0, q);
    for (int it = 0; it < 2; ++it) {
      const float cand = refit_scale(x, w, n, levels, q);
      if (std::isnan(cand)) break;
      const float e = codes(cand, q);
      if (e < best_err) best_err = e, best = cand;
    }
  }
  return best;
}

// The importance-weighted fit: the plain fit's scale, plus candidates that
// put the value of largest magnitude on either end of the table (the longer
// side, reached with a scale of the opposite sign, codes a block more finely:
// ggml's make_qx_quants / IQ4_NL search), 21 steps of a tenth of the mean
// level spacing around it, each refit once by weighted least squares. The
// least weighted error wins, so it is never worse than the plain fit's.
static float fit_levels_weighted(const float* x, const float* w, int n, const Levels& levels) {
  float best = fit_levels_plain<true>(x, w, n, levels);
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::fabs(x[i]) > std::fabs(m) ? x[i] : m;
  if (m == 0.0f) return best;
  uint8_t q[kMaxFitElems];
  float best_err = level_codes_fast(x, w, n, levels, best, q);
  const float step = 0.1f * (levels.v[levels.n - 1] - levels.v[0]) / float(levels.n - 1);
  for (const float end : {levels.v[0], levels.v[levels.n - 1]}) {
    if (end == 0.0f) continue;
    const float dir = end < 0.0f ? -1.0f : 1.0f;
    for (int k = -kWeightedSteps; k <= kWeightedSteps; ++k) {
      const float cand0 = m / (end + dir * step * float(k));
      float e = level_codes_fast(x, w, n, levels, cand0, q);
      if (e < best_err) best_err = e, best = cand0;
      const float cand = refit_scale(x, w, n, levels, q);
      if (std::isnan(cand)) continue;
      e = level_codes_fast(x, w, n, levels, cand, q);
      if (e < best_err) best_err = e, best = cand;
    }
  }
  return best;
}

float fit_levels(const float* x, const float* w, int n, const Levels& levels) {
  return is_unit_weights(w) ? fit_levels_plain<false>(x, w, n, levels) : fit_levels_weighted(x, w, n, levels);
}

}  // namespace moeserve::quant_detail
