// Thin f32 vector wrappers, one per instruction set, so the ops kernels in
// ops_simd.h are written once and instantiated for AVX2 and AVX-512.
//
// Include only from *_avx2.cpp / *_avx512.cpp files. Everything here sits in
// an anonymous namespace: each SIMD translation unit gets its own private
// copy, so no AVX instruction can leak into code shared with a plain build
// through the linker's choice of one inline definition (ODR).
//
// Every wrapper provides (Reg = register type, Mask = lane predicate):
//   kWidth, zero, set1, load, store, load_partial(p, n, fill) (lanes >= n get
//   fill and are never read), store_partial(p, v, n), load_f16(_partial),
//   add, sub, mul, div, min, max, fmadd(a,b,c)=a*b+c, fnmadd(a,b,c)=c-a*b,
//   reduce_add, reduce_max, gt, ge, is_nan, select(m, if_true, if_false),
//   mask_bits, round_nearest, add_to_exponent (v * 2^n for integer-valued n).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/x86_intrinsics.h"

namespace {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
struct VecAvx2 {
  using Reg = __m256;
  using Mask = __m256;  // all-ones / all-zeros lanes
  static constexpr int kWidth = 8;

  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float v) { return _mm256_set1_ps(v); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static __m256i lanes_below(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Reg load_partial(const float* p, int64_t n, float fill = 0.0f) {
    const __m256i m = lanes_below(n);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static void store_partial(float* p, Reg v, int64_t n) { _mm256_maskstore_ps(p, lanes_below(n), v); }
  static Reg load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static Reg load_f16_partial(const uint16_t* p, int64_t n) {
    uint16_t tmp[8] = {};
    std::memcpy(tmp, p, size_t(n) * sizeof(uint16_t));
    return load_f16(tmp);
  }

  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  static Reg min(Reg a, Reg b) { return _mm256_min_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg fnmadd(Reg a, Reg b, Reg c) { return _mm256_fnmadd_ps(a, b, c); }

  static float reduce_add(Reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(Reg v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }

  static Mask gt(Reg a, Reg b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static Mask ge(Reg a, Reg b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static Mask lt(Reg a, Reg b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static Mask is_nan(Reg a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static Reg select(Mask m, Reg if_true, Reg if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
  static unsigned mask_bits(Mask m) { return unsigned(_mm256_movemask_ps(m)); }

  static Reg round_nearest(Reg v) {
    return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // v * 2^n by adding n to the exponent field; n integer-valued and the
  // result a normal float (the caller handles the ranges where it is not).
  static Reg add_to_exponent(Reg v, Reg n) {
    const __m256i shift = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(v), shift));
  }
};
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
struct VecAvx512 {
  using Reg = __m512;
  using Mask = __mmask16;
  static constexpr int kWidth = 16;

  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float v) { return _mm512_set1_ps(v); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static __mmask16 lanes_below(int64_t n) { return __mmask16((1u << n) - 1u); }
  static Reg load_partial(const float* p, int64_t n, float fill = 0.0f) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), lanes_below(n), p);
  }
  static void store_partial(float* p, Reg v, int64_t n) { _mm512_mask_storeu_ps(p, lanes_below(n), v); }
  static Reg load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static Reg load_f16_partial(const uint16_t* p, int64_t n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes_below(n), p));
  }

  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  static Reg min(Reg a, Reg b) { return _mm512_min_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg fnmadd(Reg a, Reg b, Reg c) { return _mm512_fnmadd_ps(a, b, c); }

  static float reduce_add(Reg v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(Reg v) {
    const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }

  static Mask gt(Reg a, Reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static Mask ge(Reg a, Reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static Mask lt(Reg a, Reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static Mask is_nan(Reg a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static Reg select(Mask m, Reg if_true, Reg if_false) { return _mm512_mask_blend_ps(m, if_false, if_true); }
  static unsigned mask_bits(Mask m) { return unsigned(m); }

  static Reg round_nearest(Reg v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static Reg add_to_exponent(Reg v, Reg n) {
    const __m512i shift = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(v), shift));
  }
};
#endif

}  // namespace
