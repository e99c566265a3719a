// AVX2 dot products of issue 43's weight types.
//
// 32-element types against Q8_0 activations (Q4_1, Q5_0, Q5_1, IQ4_NL,
// MXFP4): each block's codes become 32 signed bytes (Q5_0 centred, the
// non-linear types through a 16-entry byte table, vpshufb), one signed
// byte dot (the sign trick of quant_avx2.cpp) gives the block's integer
// sum, scaled once; Q4_1/Q5_1 add m * Σx from the same activations.
//
// Super-block types against Q8_K (Q2_K, Q3_K, IQ4_XS), one weight row
// against 1..8 activation rows (the codes decoded once for all columns, as
// quant_kquants_avx2.cpp does): per group of 32 codes a vpmaddubsw of the
// unsigned codes (Q2_K 0..3, Q3_K 0..7 = value + 4) or of |x| with the
// signed IQ4 values, then a vpmaddwd by the two sub-block scales of the
// group's lanes; Q2_K's minimum and Q3_K's -4 come from the bsums. Bounds:
// pair sums <= 2 * 127 * 127 (IQ4: values |v| <= 127), times a scale <= 63
// in int32, a super-block's sum < 2^31.
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

// The 32 nibbles of a block's 16 bytes: low nibbles (elements 0..15) in the
// low lane, high nibbles (16..31) in the high lane.
inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
}

// The fifth bits of a Q5 block (qh, bit j = element j) as 0x10 in byte j.
inline __m256i fifth_bits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  // Byte j of the broadcast word holds bits 8*(j/8)..: select bit j % 8 of byte j / 8.
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)),
                                             _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                                                0x0202020202020202, 0x0303030303030303));
  const __m256i mask = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

inline __m256i table16(const int8_t* values) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values)));
}

inline __m256i load_x(const BlockQ8_0& b) { return load256(b.qs); }

// ---- 32-element types x Q8_0 ---------------------------------------------------

// Q4_1 / Q5_1: unsigned codes (the fifth bit for Q5_1), d and the minimum m.
template <typename B, bool kFiveBits>
struct AffineCodes {
  using Block = B;
  static constexpr bool kMin = true;
  static __m256i codes(const Block& b) {
    if constexpr (kFiveBits) return _mm256_or_si256(nibbles32(b.qs), fifth_bits(b.qh));
    return nibbles32(b.qs);
  }
  static float scale(const Block& b) { return half_to_float(b.d); }
  static float min(const Block& b) { return half_to_float(b.m); }
};
using Q4_1Codes = AffineCodes<BlockQ4_1, false>;
using Q5_1Codes = AffineCodes<BlockQ5_1, true>;
struct Q5_0Codes {
  using Block = BlockQ5_0;
  static constexpr bool kMin = false;
  static __m256i codes(const Block& b) {
    return _mm256_sub_epi8(_mm256_or_si256(nibbles32(b.qs), fifth_bits(b.qh)), _mm256_set1_epi8(16));
  }
  static float scale(const Block& b) { return half_to_float(b.d); }
  static float min(const Block&) { return 0.0f; }
};
struct Iq4NlCodes {
  using Block = BlockIQ4_NL;
  static constexpr bool kMin = false;
  static __m256i codes(const Block& b) { return _mm256_shuffle_epi8(table16(kIq4nlValues), nibbles32(b.qs)); }
  static float scale(const Block& b) { return half_to_float(b.d); }
  static float min(const Block&) { return 0.0f; }
};
struct Mxfp4Codes {
  using Block = BlockMXFP4;
  static constexpr bool kMin = false;
  static __m256i codes(const Block& b) { return _mm256_shuffle_epi8(table16(kMxfp4Values), nibbles32(b.qs)); }
  static float scale(const Block& b) { return mxfp4_scale(b.e); }
  static float min(const Block&) { return 0.0f; }
};

template <typename C>
float block32_dot(int64_t n, const void* wv, const void* xv) {
  using Block = typename C::Block;
  const auto* w = static_cast<const Block*>(wv);
  const auto* x = static_cast<const BlockQ8_0*>(xv);
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b) {
    prefetch_ahead(w + b, sizeof(Block));
    const __m256i xq = load_x(x[b]);
    const float dx = half_to_float(x[b].d);
    const __m256i p = dot_i8_32(C::codes(w[b]), xq);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(C::scale(w[b]) * dx), _mm256_cvtepi32_ps(p), acc);
    if constexpr (C::kMin) {
      const __m256i sx = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), xq), _mm256_set1_epi16(1));
      acc_min = _mm256_fmadd_ps(_mm256_set1_ps(C::min(w[b]) * dx), _mm256_cvtepi32_ps(sx), acc_min);
    }
  }
  return hsum(_mm256_add_ps(acc, acc_min));
}

// ---- super-block types x Q8_K --------------------------------------------------

// Shuffle pattern of group t (0..3) of a half: word 2t of a lane's eight
// int16 scales into every word of the low lane, word 2t + 1 into the high
// lane's (the group's two sub-blocks).
inline __m256i group_scale_pattern(int t) {
  const auto pair = [](int word) { return int16_t(((2 * word + 1) << 8) | (2 * word)); };
  return _mm256_setr_m128i(_mm_set1_epi16(pair(2 * t)), _mm_set1_epi16(pair(2 * t + 1)));
}
// The eight int16 scales of half h (words 8h..8h+7 of `all`) in both lanes.
inline __m256i half_scales(__m256i all, int h) {
  return h == 0 ? _mm256_permute2x128_si256(all, all, 0x00) : _mm256_permute2x128_si256(all, all, 0x11);
}

// Q2_K: in half h, group t holds element 32t + l in bits 2t of qs[32h + l];
// its 16-lane halves are sub-blocks 8h + 2t and 8h + 2t + 1.
template <int NC>
void q2_k_cols(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  const auto* w = static_cast<const BlockQ2_K*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  const __m256i three = _mm256_set1_epi8(3);
  __m256 acc[NC];
  for (int j = 0; j < NC; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(BlockQ2_K));
    const __m128i sc_bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales));
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc_bytes, 4), _mm_set1_epi8(15)));
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc_bytes, _mm_set1_epi8(15)));
    __m256i isum[NC];
    for (int j = 0; j < NC; ++j) isum[j] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i q = load256(w[b].qs + 32 * h);
      const __m256i sc_half = half_scales(sc16, h);
      for (int t = 0; t < 4; ++t) {
        const __m256i codes = _mm256_and_si256(_mm256_srli_epi16(q, 2 * t), three);
        const __m256i scales = _mm256_shuffle_epi8(sc_half, group_scale_pattern(t));
        for (int j = 0; j < NC; ++j) {
          const __m256i p = _mm256_maddubs_epi16(codes, load256(x[j][b].qs + 128 * h + 32 * t));
          isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(p, scales));
        }
      }
    }
    const float wd = half_to_float(w[b].d), wdmin = half_to_float(w[b].dmin);
    for (int j = 0; j < NC; ++j) {
      const __m256i mins = _mm256_madd_epi16(mins16, load256(x[j][b].bsums));
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(x[j][b].d * wd), _mm256_cvtepi32_ps(isum[j]), acc[j]);
      acc[j] = _mm256_fnmadd_ps(_mm256_set1_ps(x[j][b].d * wdmin), _mm256_cvtepi32_ps(mins), acc[j]);
    }
  }
  for (int j = 0; j < NC; ++j) out[j * out_stride] = hsum(acc[j]);
}

// The 16 6-bit scales of a Q3_K block (quant_blocks.h's q3_k_scales) as
// bytes: with the packed words u0, u1, u2, scales 0..3 = (u0 & 0x0f..) |
// ((u2 & 0x03..) << 4), 4..7 from u1 and u2 >> 2, 8..11 from u0 >> 4 and u2
// >> 4, 12..15 from u1 >> 4 and u2 >> 6.
inline __m128i q3_k_scales16(const uint8_t* packed) {
  // 8 + 4 bytes (the block ends 2 bytes after them), straight into
  // registers: a copy through the stack stalled every block on store forwarding.
  int32_t last;
  std::memcpy(&last, packed + 8, 4);
  const __m128i u = _mm_insert_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed)), last, 2);
  const __m128i lo = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(1, 0, 1, 0)), _mm_setr_epi32(0, 0, 4, 4)),
                                   _mm_set1_epi8(15));
  const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(2, 2, 2, 2)), _mm_setr_epi32(0, 2, 4, 6)),
                                   _mm_set1_epi8(3));
  return _mm_or_si128(lo, _mm_slli_epi32(hi, 4));
}

// Q3_K: the codes as value + 4 (0..7: the two low bits as Q2_K's, the high
// bit of element 32t + l of half h in bit 4h + t of hmask[l]); the +4 is
// taken back as 4 * Σ (s - 32) bsums.
template <int NC>
void q3_k_cols(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  const auto* w = static_cast<const BlockQ3_K*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
  __m256 acc[NC];
  for (int j = 0; j < NC; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(BlockQ3_K));
    const __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(q3_k_scales16(w[b].scales)), _mm256_set1_epi16(32));
    const __m256i hm = load256(w[b].hmask);
    __m256i isum[NC];
    for (int j = 0; j < NC; ++j) isum[j] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i q = load256(w[b].qs + 32 * h);
      const __m256i sc_half = half_scales(sc16, h);
      for (int t = 0; t < 4; ++t) {
        const int bit = 4 * h + t;
        // Bit `bit` of each hmask byte moved to bit 2 (value 4).
        const __m256i high = bit >= 2 ? _mm256_srli_epi16(hm, bit - 2) : _mm256_slli_epi16(hm, 2 - bit);
        const __m256i codes =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * t), three), _mm256_and_si256(high, four));
        const __m256i scales = _mm256_shuffle_epi8(sc_half, group_scale_pattern(t));
        for (int j = 0; j < NC; ++j) {
          const __m256i p = _mm256_maddubs_epi16(codes, load256(x[j][b].qs + 128 * h + 32 * t));
          isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(p, scales));
        }
      }
    }
    const float wd = half_to_float(w[b].d);
    for (int j = 0; j < NC; ++j) {
      const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load256(x[j][b].bsums)), 2);
      const __m256i sum = _mm256_sub_epi32(isum[j], offset);
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(x[j][b].d * wd), _mm256_cvtepi32_ps(sum), acc[j]);
    }
  }
  for (int j = 0; j < NC; ++j) out[j * out_stride] = hsum(acc[j]);
}

// IQ4_XS: per sub-block of 32 the table's values (signed) against x by the
// sign trick, then the sub-block's scale (ls - 32) in the vpmaddwd.
template <int NC>
void iq4_xs_cols(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  const auto* w = static_cast<const BlockIQ4_XS*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  const __m256i table = table16(kIq4nlValues);
  __m256 acc[NC];
  for (int j = 0; j < NC; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(BlockIQ4_XS));
    __m256i isum[NC];
    for (int j = 0; j < NC; ++j) isum[j] = _mm256_setzero_si256();
    for (int s = 0; s < 8; ++s) {
      const int ls = ((w[b].scales_l[s / 2] >> (4 * (s % 2))) & 15) | (((w[b].scales_h >> (2 * s)) & 3) << 4);
      const __m256i scale = _mm256_set1_epi16(int16_t(ls - 32));
      const __m256i v = _mm256_shuffle_epi8(table, nibbles32(w[b].qs + 16 * s));
      const __m256i v_abs = _mm256_sign_epi8(v, v);
      for (int j = 0; j < NC; ++j) {
        const __m256i xq = load256(x[j][b].qs + 32 * s);
        const __m256i p = _mm256_maddubs_epi16(v_abs, _mm256_sign_epi8(xq, v));
        isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(p, scale));
      }
    }
    const float wd = half_to_float(w[b].d);
    for (int j = 0; j < NC; ++j) {
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(x[j][b].d * wd), _mm256_cvtepi32_ps(isum[j]), acc[j]);
    }
  }
  for (int j = 0; j < NC; ++j) out[j * out_stride] = hsum(acc[j]);
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

void register_quant_lowbit_avx2(CpuKernels& k) {
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
