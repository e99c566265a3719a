// The codebook i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
// IQ1_M) as integers, for gemm_kq.cu's integer kernel (kq_blocks_iquants.cuh)
// and, on the host, the GPU tests' reference of it. Every weight is
//   dfac(block) * iscale(block, run) * code,
// an int8 code times the odd integer scale (2s + 1) of its 16-column run
// times one float of the block:
//   IQ2_*: d (s + 1/2) / 4 * m  =  d/8 * (2s + 1) * m, m the signed magnitude;
//   IQ3_XXS: d (s + 1/2) / 2 * m  =  d/4 * (2s + 1) * m;
//   IQ3_S: d (2s + 1) * m;
//   IQ1_*: d (2s + 1) (q + shift), q in {-1, 0, 1}, shift +-1/8  =
//          d/8 * (2s + 1) * (8q +- 1).
// The codes come from the codebook decoders of quant_decode_iquants.cuh (the
// entries, signs and shifts the dequantizer uses); IqInt holds only the
// integer split of each type's scale.
#pragma once

#include <cstdint>

#include "kernels/cuda/quant_decode.cuh"

namespace moeserve::cuda::qdec {

// The integer split of a codebook i-quant's scale: iscale(blk, r) = 2s + 1
// of run r (0..15), dfac(blk) the block's float factor; L the type's layout
// (quant_decode_iquants.cuh).
template <DType T>
struct IqInt;

template <>
struct IqInt<DType::IQ2_XXS> {
  using L = Iq2xxsLayout<>;
  MOESERVE_QDEC static int iscale(const uint8_t* blk, int r) {
    return int(2 * (L::aux(blk, r >> 1) >> 28) + 1);
  }
  MOESERVE_QDEC static float dfac(const uint8_t* blk) { return half_bits_to_float(load_u16(blk)) * 0.125f; }
};
template <>
struct IqInt<DType::IQ2_XS> {
  using L = Iq2xsLayout<>;
  MOESERVE_QDEC static int iscale(const uint8_t* blk, int r) {
    return 2 * ((blk[66 + (r >> 1)] >> (4 * (r & 1))) & 15) + 1;
  }
  MOESERVE_QDEC static float dfac(const uint8_t* blk) { return IqInt<DType::IQ2_XXS>::dfac(blk); }
};
template <>
struct IqInt<DType::IQ2_S> {
  using L = Iq2sLayout<>;
  MOESERVE_QDEC static int iscale(const uint8_t* blk, int r) {
    return 2 * ((blk[74 + (r >> 1)] >> (4 * (r & 1))) & 15) + 1;
  }
  MOESERVE_QDEC static float dfac(const uint8_t* blk) { return IqInt<DType::IQ2_XXS>::dfac(blk); }
};
template <>
struct IqInt<DType::IQ3_XXS> {
  using L = Iq3xxsLayout<>;
  MOESERVE_QDEC static int iscale(const uint8_t* blk, int r) {
    return int(2 * (L::aux(blk, r >> 1) >> 28) + 1);
  }
  MOESERVE_QDEC static float dfac(const uint8_t* blk) { return half_bits_to_float(load_u16(blk)) * 0.25f; }
};
template <>
struct IqInt<DType::IQ3_S> {
  using L = Iq3sLayout<>;
  MOESERVE_QDEC static int iscale(const uint8_t* blk, int r) {
    const int ib = r >> 1;
    return 2 * ((blk[106 + (ib >> 1)] >> (4 * (ib & 1))) & 15) + 1;
  }
  MOESERVE_QDEC static float dfac(const uint8_t* blk) { return half_bits_to_float(load_u16(blk)); }
};
template <>
struct IqInt<DType::IQ1_S> {
  using L = Iq1sLayout<>;
  MOESERVE_QDEC static int iscale(const uint8_t* blk, int r) {
    return int(2 * ((L::qh(blk, r >> 1) >> 12) & 7u) + 1);
  }
  MOESERVE_QDEC static float dfac(const uint8_t* blk) { return half_bits_to_float(load_u16(blk)) * 0.125f; }
};
template <>
struct IqInt<DType::IQ1_M> {
  using L = Iq1mLayout<>;
  // As Iq1mLayout::scale: the 3-bit s of run r in the u16 scales[ib / 2],
  // d (f16) in the top nibbles of the four scale words.
  MOESERVE_QDEC static int iscale(const uint8_t* blk, int r) {
    const uint32_t w01 = load_u32(blk + 48), w23 = load_u32(blk + 52);
    const int ib = r >> 1;
    const uint32_t word = (ib < 4 ? w01 : w23) >> (16 * ((ib >> 1) & 1));
    return int(2 * ((word >> (6 * (ib & 1) + 3 * (r & 1))) & 7u) + 1);
  }
  MOESERVE_QDEC static float dfac(const uint8_t* blk) {
    const uint32_t w01 = load_u32(blk + 48), w23 = load_u32(blk + 52);
    const uint32_t d =
        ((w01 >> 12) & 0x000Fu) | ((w01 >> 24) & 0x00F0u) | ((w23 >> 4) & 0x0F00u) | ((w23 >> 16) & 0xF000u);
    return half_bits_to_float(d) * 0.125f;
  }
};

// The int8 codes of one 4-value half of a group: w the entry's half, the
// 4 sign bits (IQ2, IQ3: the signed magnitudes) or the shift's sign (IQ1:
// 8q +- 1).
template <bool kShifted>
MOESERVE_QDEC uint32_t iq_half_codes(uint32_t w, uint32_t sign_bits, bool shift_negative) {
  if constexpr (kShifted) {
    const uint32_t eight = (w << 3) & 0xF8F8F8F8u;  // int8 q (-1, 0, 1) times 8, byte by byte
#ifdef __CUDA_ARCH__
    return shift_negative ? __vsub4(eight, 0x01010101u) : __vadd4(eight, 0x01010101u);
#else
    uint32_t out = 0;  // no byte carries: |8q +- 1| <= 9
    for (int k = 0; k < 4; ++k) {
      const int v = int(int8_t(uint8_t(eight >> (8 * k)))) + (shift_negative ? -1 : 1);
      out |= uint32_t(uint8_t(int8_t(v))) << (8 * k);
    }
    return out;
#endif
  } else {
    // Sign bit k to all of byte k: 0xFF where negative.
    const uint32_t neg = ((sign_bits * 0x00204081u) & 0x01010101u) * 0xFFu;
#ifdef __CUDA_ARCH__
    return __vsub4(w ^ neg, neg);  // m or -m, byte by byte (m <= 62)
#else
    uint32_t out = 0;
    for (int k = 0; k < 4; ++k) {
      const int m = int((w >> (8 * k)) & 0xFFu);
      out |= uint32_t(uint8_t(int8_t((neg >> (8 * k)) & 1u ? -m : m))) << (8 * k);
    }
    return out;
#endif
  }
}

// The 8 int8 codes of group g (0..31: columns 8g..8g+7) of a block: columns
// 8g..8g+3 in lo, 8g+4.. in hi.
template <DType T>
MOESERVE_QDEC void iq_codes8(const uint8_t* blk, int g, uint32_t& lo, uint32_t& hi) {
  using L = typename IqInt<T>::L;
  const IqGroup grp = L::group(blk, g);
  const bool negative = grp.shift < 0.0f;
  lo = iq_half_codes<L::kShifted>(uint32_t(grp.entry), grp.signs & 15u, negative);
  hi = iq_half_codes<L::kShifted>(uint32_t(grp.entry >> 32), (grp.signs >> 4) & 15u, negative);
}

// Columns 8g + 4h..8g + 4h + 3 (h = 0, 1) of the codes of group g.
template <DType T>
MOESERVE_QDEC uint32_t iq_codes4(const uint8_t* blk, int g, int h) {
  uint32_t lo, hi;
  iq_codes8<T>(blk, g, lo, hi);
  return h == 0 ? lo : hi;
}

constexpr bool iq_codebook_type(DType t) {
  return t == DType::IQ2_XXS || t == DType::IQ2_XS || t == DType::IQ2_S || t == DType::IQ3_XXS ||
         t == DType::IQ3_S || t == DType::IQ1_S || t == DType::IQ1_M;
}

}  // namespace moeserve::cuda::qdec
