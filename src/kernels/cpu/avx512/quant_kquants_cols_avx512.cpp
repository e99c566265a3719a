// AVX-512 VNNI dot products of one Q4_K / Q6_K weight row with 1..8
// activation rows (Q8_K) at once: the row is decoded once and reused for
// every column, which is what prefill (and a batch of decode rows) needs.
// vec_dot of these types is the 1-column instance, so a token's result is
// bit-identical whether it was computed alone or next to others.
//
// Per 64 codes and column the integer work is ONE vpdpbusd (u8 codes x s8
// activations, 4 products per int32 lane). A lane holds at most 4*63*128 =
// 32256 (Q6_K) or 4*15*128 = 7680 (Q4_K), so vpackssdw turns two such
// registers into int16 without saturating, and one vpmaddwd applies the
// sub-block scales to both: 4 dpbusd + 2 packs + 2 madd per 256 weights,
// instead of the maddubs + madd pairs of a one-column kernel.
#include <cstdint>

#include "kernels/cpu/avx512/kquant_common_avx512.h"
#include "kernels/cpu/cols_dispatch.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/register.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {
namespace {

// Word-permutation index: in 128-bit lane L (0..3), words 0-3 take source
// word lo[L] and words 4-7 take hi[L].
inline __m512i lane_pair_index(const int lo[4], const int hi[4]) {
  alignas(64) int16_t idx[32];
  for (int L = 0; L < 4; ++L) {
    for (int i = 0; i < 4; ++i) {
      idx[8 * L + i] = int16_t(lo[L]);
      idx[8 * L + 4 + i] = int16_t(hi[L]);
    }
  }
  return _mm512_load_si512(idx);
}

// Two chunk sums (int32, <= 32767 in magnitude) times their sub-block scales
// (the int16 words of `scales` matching vpackssdw's lane layout).
inline __m512i scale_pair(__m512i a, __m512i b, __m512i scales) {
  return _mm512_madd_epi16(_mm512_packs_epi32(a, b), scales);
}

// ---- Q4_K ---------------------------------------------------------------------
// Chunk c (32 qs bytes) as 64 codes [low nibbles | high nibbles] = sub-blocks
// 2c (lanes 0-1) and 2c+1 (lanes 2-3), against activations 64c..64c+63.
template <int NC>
void q4_k_cols(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  const auto* w = static_cast<const BlockQ4_K*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  static const int lo01[4] = {0, 0, 1, 1}, hi01[4] = {2, 2, 3, 3}, lo23[4] = {4, 4, 5, 5},
                   hi23[4] = {6, 6, 7, 7};
  const __m512i idx01 = lane_pair_index(lo01, hi01), idx23 = lane_pair_index(lo23, hi23);
  // Mins as word pairs (2j, 2j+1) = m_j, against bsums pairs (2j, 2j+1).
  const __m256i idx_min = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  const __m512i low4 = _mm512_set1_epi8(15);
  __m512 acc[NC];
  __m256 acc_min[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps(), acc_min[c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(BlockQ4_K));
    const __m256i sm16 = _mm256_cvtepu8_epi16(unpack_scales_mins(w[b].scales));
    const __m512i s01 = _mm512_permutexvar_epi16(idx01, _mm512_castsi256_si512(sm16));
    const __m512i s23 = _mm512_permutexvar_epi16(idx23, _mm512_castsi256_si512(sm16));
    const __m256i mins = _mm256_permutexvar_epi16(idx_min, sm16);
    __m512i codes[4];
    for (int k = 0; k < 4; ++k) {
      const __m512i qq = _mm512_broadcast_i64x4(load256(w[b].qs + 32 * k));
      codes[k] = _mm512_and_si512(_mm512_mask_srli_epi16(qq, kHighHalf16, qq, 4), low4);
    }
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(w[b].d));
    const __m256 dmin = _mm256_set1_ps(_cvtsh_ss(w[b].dmin));
    for (int c = 0; c < NC; ++c) {
      const BlockQ8_K& xb = x[c][b];
      __m512i a[4];
      for (int k = 0; k < 4; ++k)
        a[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes[k], load512(xb.qs + 64 * k));
      const __m512i s = _mm512_add_epi32(scale_pair(a[0], a[1], s01), scale_pair(a[2], a[3], s23));
      const __m256i m = _mm256_madd_epi16(mins, load256(xb.bsums));
      const __m512 xd = _mm512_set1_ps(xb.d);
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(xd, d), acc[c]);
      acc_min[c] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(_mm512_castps512_ps256(xd), dmin), acc_min[c]);
    }
  }
  for (int c = 0; c < NC; ++c) {
    const __m256 mn = acc_min[c];
    const __m128 m4 = _mm_add_ps(_mm256_castps256_ps128(mn), _mm256_extractf128_ps(mn, 1));
    __m128 m2 = _mm_add_ps(m4, _mm_movehl_ps(m4, m4));
    m2 = _mm_add_ss(m2, _mm_movehdup_ps(m2));
    out[c * out_stride] = _mm512_reduce_add_ps(acc[c]) - _mm_cvtss_f32(m2);
  }
}

// ---- Q6_K ---------------------------------------------------------------------
// Half h (128 elements): 64 ql bytes give codes of elements 0..63 (low
// nibbles) and 64..127 (high nibbles), with their 2 high bits from 32 qh
// bytes; each 128-bit lane of a code register is one 16-element sub-block.
template <int NC>
void q6_k_cols(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  const auto* w = static_cast<const BlockQ6_K*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  static const int lo0[4] = {0, 1, 2, 3}, hi0[4] = {4, 5, 6, 7}, lo1[4] = {8, 9, 10, 11},
                   hi1[4] = {12, 13, 14, 15};
  const __m512i idx_h0 = lane_pair_index(lo0, hi0), idx_h1 = lane_pair_index(lo1, hi1);
  const __m512i low4 = _mm512_set1_epi8(15), top2 = _mm512_set1_epi8(0x30);
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(BlockQ6_K));
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales)));
    const __m512i sc_h[2] = {_mm512_permutexvar_epi16(idx_h0, _mm512_castsi256_si512(sc16)),
                             _mm512_permutexvar_epi16(idx_h1, _mm512_castsi256_si512(sc16))};
    __m512i codes[4];  // half 0: elements 0..63, 64..127; half 1: the same + 128
    for (int h = 0; h < 2; ++h) {
      const __m512i l = load512(w[b].ql + 64 * h);
      const __m512i hh = _mm512_broadcast_i64x4(load256(w[b].qh + 32 * h));
      const __m512i hz = _mm512_mask_srli_epi16(hh, kHighHalf16, hh, 2);
      codes[2 * h] =
          _mm512_or_si512(_mm512_and_si512(l, low4), _mm512_and_si512(_mm512_slli_epi16(hz, 4), top2));
      codes[2 * h + 1] =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4), _mm512_and_si512(hz, top2));
    }
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(w[b].d));
    for (int c = 0; c < NC; ++c) {
      const BlockQ8_K& xb = x[c][b];
      __m512i a[4];
      for (int k = 0; k < 4; ++k)
        a[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes[k], load512(xb.qs + 64 * k));
      __m512i s = _mm512_add_epi32(scale_pair(a[0], a[1], sc_h[0]), scale_pair(a[2], a[3], sc_h[1]));
      // Remove the +32 code offset: sum_j sc_j * 32 * bsums_j.
      const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(xb.bsums)), 5);
      s = _mm512_sub_epi32(s, _mm512_zextsi256_si512(offset));
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(xb.d), d), acc[c]);
    }
  }
  for (int c = 0; c < NC; ++c) out[c * out_stride] = _mm512_reduce_add_ps(acc[c]);
}

template <int NC>
struct Q4Cols {
  static constexpr ColsKernel fn = q4_k_cols<NC>;
};
template <int NC>
struct Q6Cols {
  static constexpr ColsKernel fn = q6_k_cols<NC>;
};

}  // namespace

void register_quant_kquants_cols_avx512(CpuKernels& k) {
  k.vec_dot[dtype_slot(DType::Q4_K)] = one_column_dot<Q4Cols>;
  k.vec_dot[dtype_slot(DType::Q6_K)] = one_column_dot<Q6Cols>;
  k.vec_dot_cols[dtype_slot(DType::Q4_K)] = dispatch_cols<Q4Cols>;
  k.vec_dot_cols[dtype_slot(DType::Q6_K)] = dispatch_cols<Q6Cols>;
}

}  // namespace moeserve::cpu::detail
