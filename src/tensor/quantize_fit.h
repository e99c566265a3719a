// Internal to the tensor layer: the (sub-)block fits the low-bit quantizers
// share (quantize_lowbit.cpp: Q4_0 with weights, Q4_1, Q5_0, Q5_1, IQ4_NL,
// MXFP4, Q2_K, Q3_K, IQ4_XS). Each fit searches candidate inverse scales,
// rounds the codes for each, refits the scale (and offset) by least squares
// for those codes and keeps the best, then alternates rounding and refitting.
// Every error and sum is weighted by w (one weight per element, never null:
// quantize_internal.h's kUnitWeights for the plain squared error).
#pragma once

#include <cstdint>

namespace moeserve::quant_detail {

inline constexpr int kMaxFitElems = 32;  // the largest (sub-)block a fit takes

// x ≈ scale * q + offset, q in [0, nmax].
struct Affine {
  float scale = 0.0f, offset = 0.0f;
};

// The weighted squared error of coding x with f; the codes into q when set.
float affine_codes(const float* x, const float* w, int n, int nmax, const Affine& f, uint8_t* q);
// `nonpositive_offset`: the format stores a subtracted non-negative minimum
// (Q2_K), so a positive offset is clamped to 0.
Affine fit_affine(const float* x, const float* w, int n, int nmax, bool nonpositive_offset);

// x ≈ scale * levels[q] over a table of levels (ascending), q the nearest.
struct Levels {
  float v[64];
  int n = 0;
  bool uniform = false;  // v[i] = v[0] + i (uniform_levels)
};
Levels uniform_levels(int lo, int hi);                         // lo..hi (Q3_K's -4..3)
Levels table_levels(const int8_t* values, int n);              // a codebook, sorted
uint8_t table_code(const int8_t* values, int n, float level);  // level's index in values

float level_codes(const float* x, const float* w, int n, const Levels& levels, float scale, uint8_t* q);
// The scale of least weighted error, starting from the value of largest
// magnitude on the end level of its sign. With real weights (w is not
// kUnitWeights) the search is wider: both ends of the table, finer steps
// (quantize_fit.cpp fit_levels_weighted); with kUnitWeights it is the plain
// quantizers' fit, unchanged.
float fit_levels(const float* x, const float* w, int n, const Levels& levels);

}  // namespace moeserve::quant_detail
