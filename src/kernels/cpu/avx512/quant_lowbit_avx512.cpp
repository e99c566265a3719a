// AVX-512 (F/BW/VL/VNNI) dot products of issue 43's weight types, with the
// activation formats of their AVX2 versions (quant_lowbit_avx2.cpp).
//
// 32-element types against Q8_0 (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4): two blocks
// per 512-bit register, one per 256-bit half. Every code is made unsigned
// (Q5_0 keeps q = value + 16, the table types read value + 128 from a shifted
// table), so one vpdpbusd gives both blocks' code sums; a second vpdpbusd
// against a constant gives the offset times Σx, subtracted in int32 so each
// block's integer sum is exact before its single float scaling (Q4_1/Q5_1:
// the constant is 1 and Σx feeds the m term). Lanes stay below 4 * 241 * 127.
//
// Super-block types against Q8_K (Q2_K, Q3_K, IQ4_XS), one weight row against
// 1..8 activation rows with the codes decoded once (as
// quant_kquants_cols_avx512.cpp): 64 codes per register, vpmaddubsw of the
// unsigned codes (Q2_K 0..3, Q3_K value + 4 in 0..7, IQ4_XS |value| with its
// sign moved onto x) and one VNNI vpdpwssd that multiplies the int16 pairs by
// their sub-block scale and accumulates. Pair sums <= 2 * 127 * 127 (no
// saturation); Q2_K's minimum and Q3_K's -4 come from the bsums, as in the
// reference. A dpbusd would need int32 scale multiplies here: IQ4 values reach
// 127, so four products no longer pack into int16 as Q4_K's do.
#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx512/kquant_common_avx512.h"
#include "kernels/cpu/cols_dispatch.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/register.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {
namespace {

// 16-bit lanes of 128-bit lanes 1 and 3.
constexpr __mmask32 kOddLanes16 = 0xFF00FF00u;

inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// The nibbles of two 16-byte code runs a and b as 128-bit lanes [a low, a high,
// b low, b high]: for a 32-element block that is its elements in order. Built
// with broadcasts from memory (loads, not shuffle-port uops).
inline __m512i nibble_pair(const uint8_t* a, const uint8_t* b) {
  const __m512i aabb = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(load128(a)), 0xFF00, load128(b));
  return _mm512_and_si512(_mm512_mask_srli_epi16(aabb, kOddLanes16, aabb, 4), _mm512_set1_epi8(15));
}

// A 16-entry signed table broadcast to every 128-bit lane, as value + 128
// (unsigned, for vpdpbusd).
inline __m512i offset_table(const int8_t* values) {
  return _mm512_xor_si512(_mm512_broadcast_i32x4(load128(values)), _mm512_set1_epi8(char(0x80)));
}

// Q5's fifth bits (qh, bit j = element j) of two blocks as a byte mask of
// their codes register.
inline __mmask64 fifth_bit_mask(const uint8_t* qh0, const uint8_t* qh1) {
  uint32_t lo, hi;
  std::memcpy(&lo, qh0, 4);
  std::memcpy(&hi, qh1, 4);
  return _cvtu64_mask64(uint64_t(lo) | uint64_t(hi) << 32);
}

// Four f16 values (the low words first) as floats.
inline __m128 halves_to_float(uint64_t words) { return _mm_cvtph_ps(_mm_cvtsi64_si128(int64_t(words))); }

// ---- 32-element types x Q8_0 ---------------------------------------------------
// Each type gives the unsigned codes of a block pair, the constant whose Σx
// is subtracted (or, with kMin, scaled by m), and [d0, d1, m0, m1].

template <typename Block>
inline __m512i five_bit_codes(const Block& b0, const Block& b1) {
  const __m512i nib = nibble_pair(b0.qs, b1.qs);
  return _mm512_mask_add_epi8(nib, fifth_bit_mask(b0.qh, b1.qh), nib, _mm512_set1_epi8(16));
}

template <typename B, bool kFiveBits>
struct AffineCodes {  // Q4_1 / Q5_1: q, plus m Σx
  using Block = B;
  static constexpr bool kMin = true;
  static constexpr int kOffset = 1;
  static __m512i codes(const Block& b0, const Block& b1) {
    if constexpr (kFiveBits) return five_bit_codes(b0, b1);
    return nibble_pair(b0.qs, b1.qs);
  }
  static __m128 scales(const Block& b0, const Block& b1) {
    return halves_to_float(uint64_t(b0.d) | uint64_t(b1.d) << 16 | uint64_t(b0.m) << 32 |
                           uint64_t(b1.m) << 48);
  }
};
using Q4_1Codes = AffineCodes<BlockQ4_1, false>;
using Q5_1Codes = AffineCodes<BlockQ5_1, true>;

struct Q5_0Codes {  // q = value + 16
  using Block = BlockQ5_0;
  static constexpr bool kMin = false;
  static constexpr int kOffset = 16;
  static __m512i codes(const Block& b0, const Block& b1) { return five_bit_codes(b0, b1); }
  static __m128 scales(const Block& b0, const Block& b1) {
    return halves_to_float(uint64_t(b0.d) | uint64_t(b1.d) << 16);
  }
};

struct Iq4NlCodes {
  using Block = BlockIQ4_NL;
  static constexpr bool kMin = false;
  static constexpr int kOffset = 128;
  static __m512i codes(const Block& b0, const Block& b1) {
    return _mm512_shuffle_epi8(offset_table(kIq4nlValues), nibble_pair(b0.qs, b1.qs));
  }
  static __m128 scales(const Block& b0, const Block& b1) {
    return halves_to_float(uint64_t(b0.d) | uint64_t(b1.d) << 16);
  }
};

// mxfp4_scale()'s bits, so that two scales go to a register in one move.
inline uint32_t mxfp4_scale_bits(uint8_t e) { return e < 2 ? (0x00200000u << e) : uint32_t(e - 1) << 23; }

struct Mxfp4Codes {
  using Block = BlockMXFP4;
  static constexpr bool kMin = false;
  static constexpr int kOffset = 128;
  static __m512i codes(const Block& b0, const Block& b1) {
    return _mm512_shuffle_epi8(offset_table(kMxfp4Values), nibble_pair(b0.qs, b1.qs));
  }
  static __m128 scales(const Block& b0, const Block& b1) {
    const uint64_t bits = uint64_t(mxfp4_scale_bits(b0.e)) | uint64_t(mxfp4_scale_bits(b1.e)) << 32;
    return _mm_castsi128_ps(_mm_cvtsi64_si128(int64_t(bits)));
  }
};

// The Q8_0 scales of two blocks as [dx0, dx1, dx0, dx1].
inline __m128 x_scales(const BlockQ8_0& x0, const BlockQ8_0& x1) {
  const uint64_t pair = uint64_t(x0.d) | uint64_t(x1.d) << 16;
  return halves_to_float(pair | pair << 32);
}

// Float lanes 0-7 from lane `lo` of s, lanes 8-15 from lane lo + 1.
inline __m512 spread_pair(__m128 s, int lo) {
  const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(lo),
                                       _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(1), 1));
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s));
}

template <typename C>
struct PairAccumulator {
  __m512 acc = _mm512_setzero_ps(), acc_min = _mm512_setzero_ps();

  void add(const typename C::Block& w0, const typename C::Block& w1, const BlockQ8_0& x0,
           const BlockQ8_0& x1) {
    const __m512i xq = _mm512_inserti64x4(_mm512_castsi256_si512(load256(x0.qs)), load256(x1.qs), 1);
    const __m512i codes = _mm512_dpbusd_epi32(_mm512_setzero_si512(), C::codes(w0, w1), xq);
    const __m512i offset =
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(char(C::kOffset)), xq);
    const __m128 s = _mm_mul_ps(C::scales(w0, w1), x_scales(x0, x1));  // [d0 dx0, d1 dx1, m0 dx0, m1 dx1]
    if constexpr (C::kMin) {
      acc = _mm512_fmadd_ps(spread_pair(s, 0), _mm512_cvtepi32_ps(codes), acc);
      acc_min = _mm512_fmadd_ps(spread_pair(s, 2), _mm512_cvtepi32_ps(offset), acc_min);
    } else {
      acc = _mm512_fmadd_ps(spread_pair(s, 0), _mm512_cvtepi32_ps(_mm512_sub_epi32(codes, offset)), acc);
    }
  }
};

template <typename C>
float block32_dot(int64_t n, const void* wv, const void* xv) {
  using Block = typename C::Block;
  const auto* w = static_cast<const Block*>(wv);
  const auto* x = static_cast<const BlockQ8_0*>(xv);
  const int64_t nb = n / 32;
  PairAccumulator<C> sum;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    prefetch_ahead(w + b, 2 * sizeof(Block));
    sum.add(w[b], w[b + 1], x[b], x[b + 1]);
  }
  if (b < nb) {
    // An odd last block pairs with zeros: zero activations add nothing
    // whatever the weight codes, and a zero scale keeps it finite.
    const Block zero_w{};
    const BlockQ8_0 zero_x{};
    sum.add(w[b], zero_w, x[b], zero_x);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(sum.acc, sum.acc_min));
}

// ---- super-block types x Q8_K --------------------------------------------------

// vpermw index: word i takes source word first + i / per.
inline __m512i word_index(int first, int per) {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 32; ++i) idx[i] = int16_t(first + i / per);
  return _mm512_load_si512(idx);
}

// Σ scale * codes * x of one super-block for 4 registers of 64 codes: two
// dpwssd chains, so that one column's chain is half as long.
inline __m512i scaled_block_sum(const __m512i codes[4], const __m512i scales[4], const int8_t* xq) {
  __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
  even = _mm512_dpwssd_epi32(even, _mm512_maddubs_epi16(codes[0], load512(xq)), scales[0]);
  odd = _mm512_dpwssd_epi32(odd, _mm512_maddubs_epi16(codes[1], load512(xq + 64)), scales[1]);
  even = _mm512_dpwssd_epi32(even, _mm512_maddubs_epi16(codes[2], load512(xq + 128)), scales[2]);
  odd = _mm512_dpwssd_epi32(odd, _mm512_maddubs_epi16(codes[3], load512(xq + 192)), scales[3]);
  return _mm512_add_epi32(even, odd);
}

// The 2-bit fields of Q2_K/Q3_K codes for register k (elements 64k..64k+63):
// half h = k / 2 of qs holds group t of its 128 elements in bits 2t, so the
// register's low 256 bits are group 2(k % 2) and its high 256 bits the next.
inline __m512i two_bit_codes(const uint8_t* qs, int k) {
  const __m512i qq = _mm512_broadcast_i64x4(load256(qs + 32 * (k / 2)));
  const __m512i q = _mm512_srli_epi16(_mm512_mask_srli_epi16(qq, kHighHalf16, qq, 2), 4 * (k % 2));
  return _mm512_and_si512(q, _mm512_set1_epi8(3));
}

// Scales per 16-element sub-block (Q2_K, Q3_K): 128-bit lane L of register k
// is sub-block 4k + L.
struct SubBlock16Scales {
  __m512i idx[4];
  SubBlock16Scales() {
    for (int k = 0; k < 4; ++k) idx[k] = word_index(4 * k, 8);
  }
  void spread(__m256i sc16, __m512i out[4]) const {
    for (int k = 0; k < 4; ++k) out[k] = _mm512_permutexvar_epi16(idx[k], _mm512_castsi256_si512(sc16));
  }
};

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Q2_K: x.d (d Σ sc Σ q x - dmin Σ m bsums).
template <int NC>
void q2_k_cols(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  const auto* w = static_cast<const BlockQ2_K*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  const SubBlock16Scales layout;
  __m512 acc[NC];
  __m256 acc_min[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps(), acc_min[c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(BlockQ2_K));
    const __m128i sc_bytes = load128(w[b].scales);
    const __m256i mins16 =
        _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc_bytes, 4), _mm_set1_epi8(15)));
    __m512i codes[4], scales[4];
    layout.spread(_mm256_cvtepu8_epi16(_mm_and_si128(sc_bytes, _mm_set1_epi8(15))), scales);
    for (int k = 0; k < 4; ++k) codes[k] = two_bit_codes(w[b].qs, k);
    const float wd = _cvtsh_ss(w[b].d), wdmin = _cvtsh_ss(w[b].dmin);
    for (int c = 0; c < NC; ++c) {
      const BlockQ8_K& xb = x[c][b];
      const __m512i isum = scaled_block_sum(codes, scales, xb.qs);
      const __m256i mins = _mm256_madd_epi16(mins16, load256(xb.bsums));
      acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(xb.d * wd), _mm512_cvtepi32_ps(isum), acc[c]);
      acc_min[c] = _mm256_fmadd_ps(_mm256_set1_ps(xb.d * wdmin), _mm256_cvtepi32_ps(mins), acc_min[c]);
    }
  }
  for (int c = 0; c < NC; ++c) out[c * out_stride] = _mm512_reduce_add_ps(acc[c]) - hsum256(acc_min[c]);
}

// The 16 6-bit Q3_K scales (q3_k_scales) as bytes: the low nibbles of the
// first 8 bytes are scales 0..7 and their high nibbles 8..15; scale j's two
// high bits sit in bits 2 (j / 4) of byte 8 + j % 4, i.e. dword lane j / 4
// of the last 4 bytes shifted right by 2 (j / 4).
inline __m128i q3_k_scale_bytes(const uint8_t* packed) {
  int64_t low;
  int32_t high;
  std::memcpy(&low, packed, 8);
  std::memcpy(&high, packed + 8, 4);
  const __m128i lo =
      _mm_and_si128(_mm_srlv_epi64(_mm_set1_epi64x(low), _mm_set_epi64x(4, 0)), _mm_set1_epi8(15));
  const __m128i hi =
      _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(high), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
  return _mm_or_si128(lo, _mm_slli_epi32(hi, 4));
}

// Q3_K: the codes as value + 4 (the high bit of element 32t + l of half h,
// bit 4h + t of hmask[l], adds 4); the +4 comes back as 4 Σ (s - 32) bsums.
template <int NC>
void q3_k_cols(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  const auto* w = static_cast<const BlockQ3_K*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  const SubBlock16Scales layout;
  // Register k's hmask bits: 4h + 2(k % 2) in the low half, the next in the high half.
  __m512i high_bit[4];
  for (int k = 0; k < 4; ++k) {
    const int bit = 4 * (k / 2) + 2 * (k % 2);
    high_bit[k] =
        _mm512_inserti64x4(_mm512_set1_epi8(char(1 << bit)), _mm256_set1_epi8(char(1 << (bit + 1))), 1);
  }
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(BlockQ3_K));
    const __m256i sc16 =
        _mm256_sub_epi16(_mm256_cvtepu8_epi16(q3_k_scale_bytes(w[b].scales)), _mm256_set1_epi16(32));
    const __m512i hm = _mm512_broadcast_i64x4(load256(w[b].hmask));
    __m512i codes[4], scales[4];
    layout.spread(sc16, scales);
    for (int k = 0; k < 4; ++k) {
      const __m512i low = two_bit_codes(w[b].qs, k);
      codes[k] = _mm512_mask_add_epi8(low, _mm512_test_epi8_mask(hm, high_bit[k]), low, _mm512_set1_epi8(4));
    }
    const float wd = _cvtsh_ss(w[b].d);
    for (int c = 0; c < NC; ++c) {
      const BlockQ8_K& xb = x[c][b];
      const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(xb.bsums)), 2);
      const __m512i isum =
          _mm512_sub_epi32(scaled_block_sum(codes, scales, xb.qs), _mm512_zextsi256_si512(offset));
      acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(xb.d * wd), _mm512_cvtepi32_ps(isum), acc[c]);
    }
  }
  for (int c = 0; c < NC; ++c) out[c * out_stride] = _mm512_reduce_add_ps(acc[c]);
}

// IQ4_XS: sub-blocks 2k and 2k + 1 are the two halves of register k (their
// 16 code bytes each through nibble_pair); the 8 scales ls - 32 come from
// scales_l's nibbles and scales_h's bit pairs, deposited into bytes.
template <int NC>
void iq4_xs_cols(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  const auto* w = static_cast<const BlockIQ4_XS*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  const __m512i table = _mm512_broadcast_i32x4(load128(kIq4nlValues));
  __m512i scale_idx[4];
  for (int k = 0; k < 4; ++k) scale_idx[k] = word_index(2 * k, 16);
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(BlockIQ4_XS));
    uint32_t scales_l;
    std::memcpy(&scales_l, w[b].scales_l, 4);
    const uint64_t ls =
        _pdep_u64(scales_l, 0x0F0F0F0F0F0F0F0Full) | _pdep_u64(w[b].scales_h, 0x3030303030303030ull);
    const __m512i ls16 = _mm512_castsi128_si512(
        _mm_sub_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(ls))), _mm_set1_epi16(32)));
    __m512i abs_values[4], scales[4];
    __mmask64 negative[4];
    for (int k = 0; k < 4; ++k) {
      const __m512i v = _mm512_shuffle_epi8(table, nibble_pair(w[b].qs + 32 * k, w[b].qs + 32 * k + 16));
      abs_values[k] = _mm512_abs_epi8(v);
      negative[k] = _mm512_movepi8_mask(v);
      scales[k] = _mm512_permutexvar_epi16(scale_idx[k], ls16);
    }
    const float wd = _cvtsh_ss(w[b].d);
    for (int c = 0; c < NC; ++c) {
      const BlockQ8_K& xb = x[c][b];
      __m512i signed_x[4];
      for (int k = 0; k < 4; ++k) {
        const __m512i xq = load512(xb.qs + 64 * k);
        signed_x[k] = _mm512_mask_sub_epi8(xq, negative[k], _mm512_setzero_si512(), xq);  // never -128
      }
      __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
      for (int k = 0; k < 4; k += 2) {
        even = _mm512_dpwssd_epi32(even, _mm512_maddubs_epi16(abs_values[k], signed_x[k]), scales[k]);
        odd =
            _mm512_dpwssd_epi32(odd, _mm512_maddubs_epi16(abs_values[k + 1], signed_x[k + 1]), scales[k + 1]);
      }
      const __m512i isum = _mm512_add_epi32(even, odd);
      acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(xb.d * wd), _mm512_cvtepi32_ps(isum), acc[c]);
    }
  }
  for (int c = 0; c < NC; ++c) out[c * out_stride] = _mm512_reduce_add_ps(acc[c]);
}

template <int NC>
struct Q2Cols {
  static constexpr ColsKernel fn = q2_k_cols<NC>;
};
template <int NC>
struct Q3Cols {
  static constexpr ColsKernel fn = q3_k_cols<NC>;
};
template <int NC>
struct Iq4XsCols {
  static constexpr ColsKernel fn = iq4_xs_cols<NC>;
};

}  // namespace

void register_quant_lowbit_avx512(CpuKernels& k) {
  k.vec_dot[dtype_slot(DType::Q4_1)] = block32_dot<Q4_1Codes>;
  k.vec_dot[dtype_slot(DType::Q5_0)] = block32_dot<Q5_0Codes>;
  k.vec_dot[dtype_slot(DType::Q5_1)] = block32_dot<Q5_1Codes>;
  k.vec_dot[dtype_slot(DType::IQ4_NL)] = block32_dot<Iq4NlCodes>;
  k.vec_dot[dtype_slot(DType::MXFP4)] = block32_dot<Mxfp4Codes>;
  k.vec_dot[dtype_slot(DType::Q2_K)] = one_column_dot<Q2Cols>;
  k.vec_dot[dtype_slot(DType::Q3_K)] = one_column_dot<Q3Cols>;
  k.vec_dot[dtype_slot(DType::IQ4_XS)] = one_column_dot<Iq4XsCols>;
  k.vec_dot_cols[dtype_slot(DType::Q2_K)] = dispatch_cols<Q2Cols>;
  k.vec_dot_cols[dtype_slot(DType::Q3_K)] = dispatch_cols<Q3Cols>;
  k.vec_dot_cols[dtype_slot(DType::IQ4_XS)] = dispatch_cols<Iq4XsCols>;
}

}  // namespace moeserve::cpu::detail
