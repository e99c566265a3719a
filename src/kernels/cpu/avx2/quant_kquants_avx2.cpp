// AVX2 vec_dot of the K-quants (Q4_K, Q5_K, Q6_K) with Q8_K activations, and
// the Q4_K dequantizer.
//
// Per super-block of 256: the weight codes are unsigned (0..15, 0..31,
// 0..63), so _mm256_maddubs_epi16(codes, activations) needs no sign trick;
// its pair sums stay below 2*63*128 = 16128 (no int16 saturation). The int16
// pair sums are multiplied by the sub-block scale in _mm256_madd_epi16, so a
// whole super-block is summed in int32 (bounded by 256*63*127*127 < 2^31)
// and scaled once. The min term (Q4_K/Q5_K) and the -32 offset (Q6_K) come
// from the activations' bsums, as in the reference.
#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/simd_common_x86.h"
#include "kernels/cpu/register.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// Shuffle pattern broadcasting int16 element k of each 128-bit lane.
inline __m256i bcast16_pattern(int k) { return _mm256_set1_epi16(int16_t(0x0100 + 0x0202 * k)); }

// Σ m_j * (bsums[2j] + bsums[2j+1]) as 8 int32 lanes.
inline __m256i min_term(__m128i sc_mn, const int16_t* bsums) {
  const __m128i mn = _mm_unpackhi_epi64(sc_mn, sc_mn);                       // m0..m7 in the low 8 bytes
  const __m256i mn_pairs = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));  // m0,m0,m1,m1,...
  return _mm256_madd_epi16(load256(bsums), mn_pairs);
}

// Σ_j sc_j * Σ q*x of one Q4_K/Q5_K super-block (int32 lanes). With Q5 the
// fifth bit of element 32j+l is bit j of qh[l].
template <bool kHasHighBit>
inline __m256i affine_scaled_sum(const uint8_t* qs, const uint8_t* qh, const int8_t* xq, __m128i sc_mn) {
  const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc_mn));  // sc0..7 as int16, both lanes
  const __m256i low4 = _mm256_set1_epi8(15);
  __m256i hbits = kHasHighBit ? load256(qh) : _mm256_setzero_si256();
  __m256i acc = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    const __m256i q = load256(qs + 32 * c);
    __m256i q_lo = _mm256_and_si256(q, low4);                        // sub-block 2c
    __m256i q_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);  // sub-block 2c+1
    if (kHasHighBit) {
      // hbits holds qh >> 2c: bit 0 -> +16 for q_lo, bit 1 -> +16 for q_hi.
      const __m256i bit4 = _mm256_set1_epi8(16);
      q_lo = _mm256_or_si256(q_lo, _mm256_and_si256(_mm256_slli_epi16(hbits, 4), bit4));
      q_hi = _mm256_or_si256(q_hi, _mm256_and_si256(_mm256_slli_epi16(hbits, 3), bit4));
      hbits = _mm256_srli_epi16(hbits, 2);
    }
    const __m256i p_lo = _mm256_maddubs_epi16(q_lo, load256(xq + 64 * c));
    const __m256i p_hi = _mm256_maddubs_epi16(q_hi, load256(xq + 64 * c + 32));
    const __m256i s_lo = _mm256_shuffle_epi8(sc16, bcast16_pattern(2 * c));
    const __m256i s_hi = _mm256_shuffle_epi8(sc16, bcast16_pattern(2 * c + 1));
    acc =
        _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(p_lo, s_lo), _mm256_madd_epi16(p_hi, s_hi)));
  }
  return acc;
}

template <typename Block, bool kHasHighBit>
float affine_kquant_dot(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const Block*>(wv);
  const auto* x = static_cast<const BlockQ8_K*>(xv);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(Block));
    const __m128i sc_mn = unpack_scales_mins(w[b].scales);
    const uint8_t* qh = nullptr;
    if constexpr (kHasHighBit) qh = w[b].qh;
    const __m256i scaled = affine_scaled_sum<kHasHighBit>(w[b].qs, qh, x[b].qs, sc_mn);
    const __m256i mins = min_term(sc_mn, x[b].bsums);
    const float d = x[b].d * half_to_float(w[b].d);
    const float dmin = x[b].d * half_to_float(w[b].dmin);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(scaled), acc);
    acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mins), acc);
  }
  return hsum(acc);
}

// ---- Q6_K ---------------------------------------------------------------------

// Pattern selecting int16 element a in the low lane and b in the high lane.
inline __m256i lane_pair_pattern(int a, int b) {
  return _mm256_setr_m128i(_mm_set1_epi16(int16_t(0x0100 + 0x0202 * a)),
                           _mm_set1_epi16(int16_t(0x0100 + 0x0202 * b)));
}

// Σ sc_j * Σ q*x over one 128-element half (q unsigned 0..63, offset not
// removed). Element 32i+l of the half: low 4 bits in ql[l + 32*(i&1)]
// (nibble i/2), high 2 bits in bits 2i..2i+1 of qh[l].
inline __m256i q6_half_sum(const uint8_t* ql, const uint8_t* qh, const int8_t* xq, __m256i sc_half) {
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i top2 = _mm256_set1_epi8(0x30);
  const __m256i l0 = load256(ql), l1 = load256(ql + 32), h = load256(qh);
  __m256i q[4];
  q[0] = _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), top2));
  q[1] = _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), top2));
  q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(h, top2));
  q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                         _mm256_and_si256(_mm256_srli_epi16(h, 2), top2));
  __m256i acc = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    // 32 elements = sub-blocks 2i (low lane) and 2i+1 (high lane) of the half.
    const __m256i p = _mm256_maddubs_epi16(q[i], load256(xq + 32 * i));
    acc = _mm256_add_epi32(
        acc, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc_half, lane_pair_pattern(2 * i, 2 * i + 1))));
  }
  return acc;
}

float q6_k_dot(int64_t n, const void* wv, const void* xv) {
  const auto* w = static_cast<const BlockQ6_K*>(wv);
  const auto* x = static_cast<const BlockQ8_K*>(xv);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(BlockQ6_K));
    // sc0..7 (low lane), sc8..15 (high lane) as int16.
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales)));
    __m256i sum = q6_half_sum(w[b].ql, w[b].qh, x[b].qs, _mm256_permute2x128_si256(sc16, sc16, 0x00));
    sum = _mm256_add_epi32(sum, q6_half_sum(w[b].ql + 64, w[b].qh + 32, x[b].qs + 128,
                                            _mm256_permute2x128_si256(sc16, sc16, 0x11)));
    // Remove the +32 code offset: Σ sc_j * 32 * bsums[j].
    const __m256i offset = _mm256_madd_epi16(sc16, load256(x[b].bsums));
    sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(offset, 5));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(x[b].d * half_to_float(w[b].d)), _mm256_cvtepi32_ps(sum), acc);
  }
  return hsum(acc);
}

// ---- Q4_K dequantizer ---------------------------------------------------------

void dequantize_q4_k(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const BlockQ4_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint8_t sc_mn[16];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(sc_mn), unpack_scales_mins(in[b].scales));
    const float d = half_to_float(in[b].d), dmin = half_to_float(in[b].dmin);
    float* y = dst + b * kQK_K;
    for (int j = 0; j < 8; ++j) {
      const __m256 scale = _mm256_set1_ps(d * float(sc_mn[j]));
      const __m256 min = _mm256_set1_ps(dmin * float(sc_mn[8 + j]));
      const uint8_t* qs = in[b].qs + 32 * (j / 2);
      for (int l = 0; l < 32; l += 8) {
        __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + l));
        if (j % 2) q = _mm_srli_epi16(q, 4);
        q = _mm_and_si128(q, _mm_set1_epi8(15));
        const __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
        _mm256_storeu_ps(y + 32 * j + l, _mm256_sub_ps(_mm256_mul_ps(scale, qf), min));
      }
    }
  }
}

}  // namespace

void register_quant_kquants_avx2(CpuKernels& k) {
  k.vec_dot[dtype_slot(DType::Q4_K)] = affine_kquant_dot<BlockQ4_K, false>;
  k.vec_dot[dtype_slot(DType::Q5_K)] = affine_kquant_dot<BlockQ5_K, true>;
  k.vec_dot[dtype_slot(DType::Q6_K)] = q6_k_dot;
  k.dequantize_row[dtype_slot(DType::Q4_K)] = dequantize_q4_k;
}

}  // namespace moeserve::cpu::detail
