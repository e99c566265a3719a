// AVX2 dot products of the K-quants (Q4_K, Q5_K, Q6_K) with Q8_K
// activations, one weight row against 1..8 activation rows at once (prefill
// and batched decode decode each row once for all its columns), and the Q4_K
// dequantizer.
//
// Per super-block of 256: the weight codes are unsigned (0..15, 0..31,
// 0..63), so _mm256_maddubs_epi16(codes, activations) needs no sign trick;
// its pair sums stay below 2*63*128 = 16128 (no int16 saturation). The int16
// pair sums are multiplied by the sub-block scales in _mm256_madd_epi16 (two
// sub-blocks per instruction, see pair_up), so a whole super-block is summed
// in int32 (bounded by 256*63*63*128 < 2^31) and scaled once. The min term
// (Q4_K/Q5_K) and the -32 offset (Q6_K) come from the activations' bsums, as
// in the reference.
#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/avx2/quant_common_avx2.h"
#include "kernels/cpu/cols_dispatch.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/simd_common_x86.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {
namespace {

// Shuffle pattern broadcasting dword k of each 128-bit lane.
inline __m256i bcast32_pattern(int k) { return _mm256_set1_epi32(0x03020100 + 0x04040404 * k); }

// Σ m_j * (bsums[2j] + bsums[2j+1]) as 8 int32 lanes.
inline __m256i min_term(__m128i sc_mn, const int16_t* bsums) {
  const __m128i mn = _mm_unpackhi_epi64(sc_mn, sc_mn);                       // m0..m7 in the low 8 bytes
  const __m256i mn_pairs = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));  // m0,m0,m1,m1,...
  return _mm256_madd_epi16(load256(bsums), mn_pairs);
}

// Two vectors of int16 pair sums a, b (one sub-block scale each within a
// 128-bit lane) as one whose dword i holds (a_i + a_i+4, b_i + b_i+4) in the
// lane: a single vpmaddwd then applies both scales. On CPUs with one vector
// multiply pipe this trades a multiply for two shuffles and an add. No
// overflow: |a_i|, |b_i| <= 2 * 63 * 128 = 16128, so a sum is <= 32256.
inline __m256i pair_up(__m256i a, __m256i b) {
  return _mm256_add_epi16(_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b));
}

// One Q4_K/Q5_K row against NC activation rows (1..kMaxDotColumns). Per
// super-block the codes and scales are unpacked once and reused by every
// column; each column's integer sums and float steps are the same whatever
// NC is, so vec_dot (NC = 1) and vec_dot_cols agree bit for bit.
//
// Chunk c (32 qs bytes) holds sub-blocks 2c (low nibbles) and 2c+1 (high
// nibbles). With Q5 the fifth bit of element 32j+l is bit j of qh[l].
template <typename Block, bool kHasHighBit, int NC>
void affine_kquant_cols(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out,
                        int64_t out_stride) {
  const auto* w = static_cast<const Block*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  const __m256i low4 = _mm256_set1_epi8(15);
  __m256 acc[NC];
  for (int j = 0; j < NC; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(Block));
    const __m128i sc_mn = unpack_scales_mins(w[b].scales);
    // sc0..7 as int16, in both lanes.
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc_mn));
    __m256i hbits = _mm256_setzero_si256();
    if constexpr (kHasHighBit) hbits = load256(w[b].qh);
    __m256i isum[NC];
    for (int j = 0; j < NC; ++j) isum[j] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load256(w[b].qs + 32 * c);
      __m256i q_lo = _mm256_and_si256(q, low4);                        // sub-block 2c
      __m256i q_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);  // sub-block 2c+1
      if constexpr (kHasHighBit) {
        // hbits holds qh >> 2c: bit 0 -> +16 for q_lo, bit 1 -> +16 for q_hi.
        const __m256i bit4 = _mm256_set1_epi8(16);
        q_lo = _mm256_or_si256(q_lo, _mm256_and_si256(_mm256_slli_epi16(hbits, 4), bit4));
        q_hi = _mm256_or_si256(q_hi, _mm256_and_si256(_mm256_slli_epi16(hbits, 3), bit4));
        hbits = _mm256_srli_epi16(hbits, 2);
      }
      // Dword c of sc16 is the pair (sc_2c, sc_2c+1).
      const __m256i s_pair = _mm256_shuffle_epi8(sc16, bcast32_pattern(c));
      for (int j = 0; j < NC; ++j) {
        const int8_t* xq = x[j][b].qs + 64 * c;
        const __m256i p_lo = _mm256_maddubs_epi16(q_lo, load256(xq));
        const __m256i p_hi = _mm256_maddubs_epi16(q_hi, load256(xq + 32));
        isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(pair_up(p_lo, p_hi), s_pair));
      }
    }
    const float wd = half_to_float(w[b].d), wdmin = half_to_float(w[b].dmin);
    for (int j = 0; j < NC; ++j) {
      const BlockQ8_K& xb = x[j][b];
      const __m256i mins = min_term(sc_mn, xb.bsums);
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(xb.d * wd), _mm256_cvtepi32_ps(isum[j]), acc[j]);
      acc[j] = _mm256_fnmadd_ps(_mm256_set1_ps(xb.d * wdmin), _mm256_cvtepi32_ps(mins), acc[j]);
    }
  }
  for (int j = 0; j < NC; ++j) out[j * out_stride] = hsum(acc[j]);
}

// ---- Q6_K ---------------------------------------------------------------------

// Pattern selecting the int16 pair (2i, 2i+2) into every dword of the low
// lane and (2i+1, 2i+3) into the high lane's.
inline __m256i quad_pair_pattern(int i) {
  const auto word = [](int e) { return int32_t(0x0100 + 0x0202 * e); };
  return _mm256_setr_m128i(_mm_set1_epi32(word(2 * i) | word(2 * i + 2) << 16),
                           _mm_set1_epi32(word(2 * i + 1) | word(2 * i + 3) << 16));
}

// One Q6_K row against NC activation rows, the codes decoded once per
// super-block (as affine_kquant_cols). Codes are unsigned 0..63 (offset not
// removed). In half h (128 elements), element 32i+l has its low 4 bits in
// ql[l + 32*(i&1)] (nibble i/2) and its high 2 bits in bits 2i..2i+1 of
// qh[l]; the 32 elements of quad i are sub-blocks 2i (low lane) and 2i+1
// (high lane) of the half.
template <int NC>
void q6_k_cols(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  const auto* w = static_cast<const BlockQ6_K*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i top2 = _mm256_set1_epi8(0x30);
  __m256 acc[NC];
  for (int j = 0; j < NC; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(BlockQ6_K));
    // sc0..7 (low lane), sc8..15 (high lane) as int16.
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales)));
    __m256i isum[NC];
    for (int j = 0; j < NC; ++j) isum[j] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i sc_half =
          h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00) : _mm256_permute2x128_si256(sc16, sc16, 0x11);
      const uint8_t* ql = w[b].ql + 64 * h;
      const __m256i l0 = load256(ql), l1 = load256(ql + 32), hb = load256(w[b].qh + 32 * h);
      for (int i = 0; i < 4; i += 2) {
        // Quads i and i + 1 differ only in their high 2 bits and the nibble.
        const __m256i nib_a =
            i == 0 ? _mm256_and_si256(l0, low4) : _mm256_and_si256(_mm256_srli_epi16(l0, 4), low4);
        const __m256i nib_b =
            i == 0 ? _mm256_and_si256(l1, low4) : _mm256_and_si256(_mm256_srli_epi16(l1, 4), low4);
        const __m256i top_a = i == 0 ? _mm256_slli_epi16(hb, 4) : hb;
        const __m256i top_b = i == 0 ? _mm256_slli_epi16(hb, 2) : _mm256_srli_epi16(hb, 2);
        const __m256i qa = _mm256_or_si256(nib_a, _mm256_and_si256(top_a, top2));
        const __m256i qb = _mm256_or_si256(nib_b, _mm256_and_si256(top_b, top2));
        // Word pairs (sc_2i, sc_2i+2) in the low lane, (sc_2i+1, sc_2i+3) in the high one.
        const __m256i s_pair = _mm256_shuffle_epi8(sc_half, quad_pair_pattern(i));
        for (int j = 0; j < NC; ++j) {
          const int8_t* xq = x[j][b].qs + 128 * h + 32 * i;
          const __m256i pa = _mm256_maddubs_epi16(qa, load256(xq));
          const __m256i pb = _mm256_maddubs_epi16(qb, load256(xq + 32));
          isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(pair_up(pa, pb), s_pair));
        }
      }
    }
    const float wd = half_to_float(w[b].d);
    for (int j = 0; j < NC; ++j) {
      const BlockQ8_K& xb = x[j][b];
      // Remove the +32 code offset: sum_j sc_j * 32 * bsums[j].
      const __m256i offset = _mm256_madd_epi16(sc16, load256(xb.bsums));
      const __m256i sum = _mm256_sub_epi32(isum[j], _mm256_slli_epi32(offset, 5));
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(xb.d * wd), _mm256_cvtepi32_ps(sum), acc[j]);
    }
  }
  for (int j = 0; j < NC; ++j) out[j * out_stride] = hsum(acc[j]);
}

template <int NC>
struct Q4Cols {
  static constexpr ColsKernel fn = affine_kquant_cols<BlockQ4_K, false, NC>;
};
template <int NC>
struct Q5Cols {
  static constexpr ColsKernel fn = affine_kquant_cols<BlockQ5_K, true, NC>;
};
template <int NC>
struct Q6Cols {
  static constexpr ColsKernel fn = q6_k_cols<NC>;
};

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
  k.vec_dot[dtype_slot(DType::Q4_K)] = one_column_dot<Q4Cols>;
  k.vec_dot[dtype_slot(DType::Q5_K)] = one_column_dot<Q5Cols>;
  k.vec_dot[dtype_slot(DType::Q6_K)] = one_column_dot<Q6Cols>;
  k.vec_dot_cols[dtype_slot(DType::Q4_K)] = dispatch_cols<Q4Cols>;
  k.vec_dot_cols[dtype_slot(DType::Q5_K)] = dispatch_cols<Q5Cols>;
  k.vec_dot_cols[dtype_slot(DType::Q6_K)] = dispatch_cols<Q6Cols>;
  k.dequantize_row[dtype_slot(DType::Q4_K)] = dequantize_q4_k;
}

}  // namespace moeserve::cpu::detail
