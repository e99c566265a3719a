// AVX2 dot products of the codebook i-quants (IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) against Q8_K activations, one weight row
// against 1..8 activation rows (a sub-block decoded once for every column).
//
// Every one of them stores a sub-block of 32 values as four groups of 8:
// each group a codebook entry of 8 unsigned magnitudes (IQ3: two entries of
// 4) and a byte of signs, and the sub-block (IQ2_XS/IQ2_S: each half) has
// an odd integer scale 2s + 1. Per sub-block: the magnitudes as 32 unsigned
// bytes from four (eight) table loads, the signs moved onto the activations
// (vpsignb by ±1 bytes), vpmaddubsw into 16 int16 pair sums, vpmaddwd by
// the scales into 8 int32 lanes. Bounds: magnitudes <= 62, |x| <= 127, so a
// pair sum <= 15,748; times a scale <= 31 and summed over a super-block's
// 8 sub-blocks, < 2^31. The float scale d * x.d and the type's constant
// (1/8 for IQ2, 1/4 for IQ3_XXS, 1 for IQ3_S) are applied once a block.
//
// IQ1_S / IQ1_M: a group's values are g + delta with g in {-1, 0, 1} (int8
// entries) and delta = ±1/8 per sub-block (IQ1_M: per group); 8 (g + delta)
// = 8g ± 1 is a signed byte in -9..9, so the weights go through the signed
// byte dot (the sign trick) and the constant is 1/8.
#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/avx2/quant_common_avx2.h"
#include "kernels/cpu/cols_dispatch.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/register.h"
#include "kernels/cpu/simd_common_x86.h"
#include "tensor/iquant_grids.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu::detail {
namespace {

// ±1 bytes from four sign bytes: bit j of byte l negates element 8l + j.
inline __m256i sign_bytes(uint32_t four) {
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(int(four)),
                                             _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                                                0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  const __m256i negate = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_or_si256(negate, _mm256_set1_epi8(1));
}


inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The scales of a sub-block's two halves as int16 lanes (pair sums 0..7: the
// first 16 values, 8..15: the last 16).
inline __m256i half_scales(int first, int second) {
  return _mm256_set_m128i(_mm_set1_epi16(int16_t(second)), _mm_set1_epi16(int16_t(first)));
}

// kIqSigns[i] as 8 bytes of ±1 (0xFF where bit j negates element j): a
// group's signs in one load. kIqSigns's rule (i with bit 7 set when i has
// an odd number of ones), checked against the table by the kernel tests.
struct SignMasks {
  uint64_t mask[128];
  constexpr SignMasks() : mask() {
    for (int i = 0; i < 128; ++i) {
      int ones = 0;
      for (int b = 0; b < 7; ++b) ones += (i >> b) & 1;
      const int signs = i | (ones & 1) << 7;
      uint64_t m = 0;
      for (int j = 0; j < 8; ++j) m |= uint64_t((signs >> j) & 1 ? 0xFF : 0x01) << (8 * j);
      mask[i] = m;
    }
  }
};
inline constexpr SignMasks kSignMasks;

// IQ2_XXS / IQ3_XXS keep a sub-block's four 7-bit sign indices and its
// 4-bit scale in one word.
inline __m256i xxs_signs(uint32_t aux) {
  const uint64_t* m = kSignMasks.mask;
  return _mm256_setr_epi64x(int64_t(m[aux & 127]), int64_t(m[(aux >> 7) & 127]), int64_t(m[(aux >> 14) & 127]),
                            int64_t(m[(aux >> 21) & 127]));
}
inline __m256i xxs_scale(uint32_t aux) { return _mm256_set1_epi16(int16_t(2 * (aux >> 28) + 1)); }

// IQ2_XS / IQ2_S: a sub-block's two 4-bit scales s in one byte, as 2s + 1.
inline __m256i iq2_scales(uint8_t both) { return half_scales(2 * (both & 15) + 1, 2 * (both >> 4) + 1); }

// A sub-block: its magnitudes, signs (±1 bytes) and int16 scales.
struct SubBlock {
  __m256i mags, signs, scales;
};

// One decoder per type: the block type, the constant factor, d, and sub-block ib.
struct Iq2Xxs {
  using Block = BlockIQ2_XXS;
  static constexpr float kFactor = 0.125f;
  static SubBlock decode(const Block& b, int ib) {
    const uint32_t idx = uint32_t(b.qs[4 * ib]) | uint32_t(b.qs[4 * ib + 1]) << 16;
    const uint32_t aux = uint32_t(b.qs[4 * ib + 2]) | uint32_t(b.qs[4 * ib + 3]) << 16;
    return {_mm256_setr_epi64x(int64_t(kIq2xxsGrid[idx & 255]), int64_t(kIq2xxsGrid[(idx >> 8) & 255]),
                               int64_t(kIq2xxsGrid[(idx >> 16) & 255]), int64_t(kIq2xxsGrid[idx >> 24])),
            xxs_signs(aux), xxs_scale(aux)};
  }
};

struct Iq2Xs {
  using Block = BlockIQ2_XS;
  static constexpr float kFactor = 0.125f;
  static SubBlock decode(const Block& b, int ib) {
    const uint16_t* q = b.qs + 4 * ib;
    return {_mm256_setr_epi64x(int64_t(kIq2xsGrid[q[0] & 511]), int64_t(kIq2xsGrid[q[1] & 511]),
                               int64_t(kIq2xsGrid[q[2] & 511]), int64_t(kIq2xsGrid[q[3] & 511])),
            _mm256_setr_epi64x(int64_t(kSignMasks.mask[q[0] >> 9]), int64_t(kSignMasks.mask[q[1] >> 9]),
                               int64_t(kSignMasks.mask[q[2] >> 9]), int64_t(kSignMasks.mask[q[3] >> 9])),
            iq2_scales(b.scales[ib])};
  }
};

struct Iq2S {
  using Block = BlockIQ2_S;
  static constexpr float kFactor = 0.125f;
  static SubBlock decode(const Block& b, int ib) {
    const uint8_t* q = b.qs + 4 * ib;
    const int h = b.qh[ib];
    return {_mm256_setr_epi64x(int64_t(kIq2sGrid[q[0] | ((h << 8) & 0x300)]),
                               int64_t(kIq2sGrid[q[1] | ((h << 6) & 0x300)]),
                               int64_t(kIq2sGrid[q[2] | ((h << 4) & 0x300)]),
                               int64_t(kIq2sGrid[q[3] | ((h << 2) & 0x300)])),
            sign_bytes(u32_at(b.qs + 32 + 4 * ib)),
            iq2_scales(b.scales[ib])};
  }
};

struct Iq3Xxs {
  using Block = BlockIQ3_XXS;
  static constexpr float kFactor = 0.25f;
  static SubBlock decode(const Block& b, int ib) {
    const uint8_t* q = b.qs + 8 * ib;
    const uint32_t aux = u32_at(b.qs + 64 + 4 * ib);
    const uint32_t* g = kIq3xxsGrid;
    return {_mm256_setr_epi32(int(g[q[0]]), int(g[q[1]]), int(g[q[2]]), int(g[q[3]]), int(g[q[4]]), int(g[q[5]]),
                              int(g[q[6]]), int(g[q[7]])),
            xxs_signs(aux), xxs_scale(aux)};
  }
};

struct Iq3S {
  using Block = BlockIQ3_S;
  static constexpr float kFactor = 1.0f;
  static SubBlock decode(const Block& b, int ib) {
    const uint8_t* q = b.qs + 8 * ib;
    const int h = b.qh[ib];
    const uint32_t* g = kIq3sGrid;
    auto at = [&](int k) { return int(g[q[k] | ((h << (8 - k)) & 256)]); };
    const int s = (b.scales[ib / 2] >> (4 * (ib % 2))) & 15;
    return {_mm256_setr_epi32(at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7)),
            sign_bytes(u32_at(b.signs + 4 * ib)), _mm256_set1_epi16(int16_t(2 * s + 1))};
  }
};

// IQ1: 32 signed weights 8g + s (s = ±1 per group, as the `deltas` bytes say).
inline __m256i iq1_weights(uint64_t e0, uint64_t e1, uint64_t e2, uint64_t e3, __m256i deltas) {
  const __m256i g = _mm256_setr_epi64x(int64_t(e0), int64_t(e1), int64_t(e2), int64_t(e3));
  const __m256i g2 = _mm256_add_epi8(g, g), g4 = _mm256_add_epi8(g2, g2);  // byte-wise: no carry between bytes
  return _mm256_add_epi8(_mm256_add_epi8(g4, g4), deltas);
}

// ±1 per group from four flags (bit l set: group l's delta is negative).
inline __m256i iq1_deltas(int negative) {
  return _mm256_setr_epi64x(negative & 1 ? -1 : 0x0101010101010101, negative & 2 ? -1 : 0x0101010101010101,
                            negative & 4 ? -1 : 0x0101010101010101, negative & 8 ? -1 : 0x0101010101010101);
}

struct Iq1S {
  using Block = BlockIQ1_S;
  static constexpr float kFactor = 0.125f;
  static constexpr bool kSignedWeights = true;
  static SubBlock decode(const Block& b, int ib) {
    const int h = b.qh[ib];
    const uint8_t* q = b.qs + 4 * ib;
    const __m256i w = iq1_weights(kIq1sGrid[q[0] | ((h << 8) & 0x700)], kIq1sGrid[q[1] | ((h << 5) & 0x700)],
                                  kIq1sGrid[q[2] | ((h << 2) & 0x700)], kIq1sGrid[q[3] | ((h >> 1) & 0x700)],
                                  iq1_deltas(h & 0x8000 ? 15 : 0));
    return {w, w, _mm256_set1_epi16(int16_t(2 * ((h >> 12) & 7) + 1))};
  }
};

struct Iq1M {
  using Block = BlockIQ1_M;
  static constexpr float kFactor = 0.125f;
  static constexpr bool kSignedWeights = true;
  static SubBlock decode(const Block& b, int ib) {
    uint16_t sc[4];
    std::memcpy(sc, b.scales, 8);
    const int shift = 6 * (ib % 2);
    const uint8_t* q = b.qs + 4 * ib;
    const int h0 = b.qh[2 * ib], h1 = b.qh[2 * ib + 1];
    const int negative = (h0 & 0x08 ? 1 : 0) | (h0 & 0x80 ? 2 : 0) | (h1 & 0x08 ? 4 : 0) | (h1 & 0x80 ? 8 : 0);
    const __m256i w = iq1_weights(kIq1sGrid[q[0] | ((h0 << 8) & 0x700)], kIq1sGrid[q[1] | ((h0 << 4) & 0x700)],
                                  kIq1sGrid[q[2] | ((h1 << 8) & 0x700)], kIq1sGrid[q[3] | ((h1 << 4) & 0x700)],
                                  iq1_deltas(negative));
    return {w, w,
            half_scales(2 * ((sc[ib / 2] >> shift) & 7) + 1, 2 * ((sc[ib / 2] >> (shift + 3)) & 7) + 1)};
  }
  static float scale(const Block& b) { return half_to_float(iq1_m_scale_bits(b)); }
};

// The block's f16 scale: its d, or what the decoder says (IQ1_M keeps it in its scales).
template <typename D>
float block_scale(const typename D::Block& b) {
  if constexpr (requires { D::scale(b); }) {
    return D::scale(b);
  } else {
    return half_to_float(b.d);
  }
}

// The 16 int16 pair sums of a sub-block against 32 activations: unsigned
// magnitudes with the signs moved onto x, or (IQ1) signed weights through
// the sign trick (mags and signs are then both the weights).
template <typename D>
inline __m256i pair_sums(const SubBlock& s, __m256i xq) {
  if constexpr (requires { D::kSignedWeights; }) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(s.mags, s.mags), _mm256_sign_epi8(xq, s.signs));
  } else {
    return _mm256_maddubs_epi16(s.mags, _mm256_sign_epi8(xq, s.signs));
  }
}

template <typename D, int NC>
void iquant_cols(int64_t n, const void* wv, const void* xv, size_t x_stride, float* out, int64_t out_stride) {
  const auto* w = static_cast<const typename D::Block*>(wv);
  const BlockQ8_K* x[NC];
  activation_rows(xv, x_stride, x);
  __m256 acc[NC];
  for (int j = 0; j < NC; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    prefetch_ahead(w + b, sizeof(typename D::Block));
    __m256i isum[NC];
    for (int j = 0; j < NC; ++j) isum[j] = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const SubBlock s = D::decode(w[b], ib);
      for (int j = 0; j < NC; ++j) {
        const __m256i p = pair_sums<D>(s, load256(x[j][b].qs + 32 * ib));
        isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(p, s.scales));
      }
    }
    const float wd = block_scale<D>(w[b]) * D::kFactor;
    for (int j = 0; j < NC; ++j) {
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(x[j][b].d * wd), _mm256_cvtepi32_ps(isum[j]), acc[j]);
    }
  }
  for (int j = 0; j < NC; ++j) out[j * out_stride] = hsum(acc[j]);
}

template <typename D>
struct Cols {
  template <int NC>
  struct Table {
    static constexpr ColsKernel fn = iquant_cols<D, NC>;
  };
};

template <typename D>
void register_type(CpuKernels& k, DType t) {
  k.vec_dot[dtype_slot(t)] = one_column_dot<Cols<D>::template Table>;
  k.vec_dot_cols[dtype_slot(t)] = dispatch_cols<Cols<D>::template Table>;
}

}  // namespace

void register_quant_iquants_avx2(CpuKernels& k) {
  register_type<Iq2Xxs>(k, DType::IQ2_XXS);
  register_type<Iq2Xs>(k, DType::IQ2_XS);
  register_type<Iq2S>(k, DType::IQ2_S);
  register_type<Iq3Xxs>(k, DType::IQ3_XXS);
  register_type<Iq3S>(k, DType::IQ3_S);
  register_type<Iq1S>(k, DType::IQ1_S);
  register_type<Iq1M>(k, DType::IQ1_M);
}

}  // namespace moeserve::cpu::detail
