// Helpers of the AVX2 quantized dot products (quant_avx2.cpp,
// quant_kquants_avx2.cpp, quant_lowbit_avx2.cpp): horizontal sums, f16
// scales, the signed byte dot. Include only from *_avx2.cpp files: the
// anonymous namespace gives each translation unit its own copy, so no AVX2
// instruction leaks into shared inline code.
#pragma once

#include <cstdint>

#include "kernels/cpu/x86_intrinsics.h"

namespace moeserve::cpu::detail {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// 8 int32 partial sums of Σ w*x for 32 signed weights and 32 activations
// (|w * x| pairs stay within int16: the sign moves onto x, |w| <= 127).
inline __m256i dot_i8_32(__m256i w, __m256i x) {
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

}  // namespace
}  // namespace moeserve::cpu::detail
