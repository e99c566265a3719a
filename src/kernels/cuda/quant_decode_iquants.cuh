// Device decoding (qdec::Traits, see quant_decode.cuh) of the i-quants with
// codebooks: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M, equal
// to the reference dequantizers (tensor/dequantize_iquants.cpp) on the block
// layouts of tensor/quant_blocks.h. quant_decode.cuh includes this at its
// end: include quant_decode.cuh.
//
// A block is 8 sub-blocks of 32 elements, each 4 groups of 8 values taken
// from a codebook entry (IQ3: two entries of 4). Run r (16 elements) is the
// groups 2h and 2h + 1 (h = r % 2) of sub-block r / 2, and the two always
// share one scale (IQ2_XS, IQ2_S and IQ1_M scale groups 0-1 and 2-3 apart,
// the others whole sub-blocks), so every type here is kScaled:
//   IQ2, IQ3: v = the entry's magnitude with its sign, a = the scale, and
//     a * v is the reference's scale * magnitude * sign (a sign is exact);
//   IQ1: v = the entry's value (-1, 0 or 1) plus the group's shift of
//     +-1/8 (exact), a = d (2s + 1), as the reference's scale * (q + shift).
// A unit is a sub-block: its two runs share the scale bytes.
//
// Codebooks. An entry's index is data, different in every lane, so the
// device reads them from global memory through the read-only cache
// (iquant_grids_device.cuh, copies of the host tables): __constant__ memory
// would serialise a warp's distinct addresses. The host decoders (the tests)
// read tensor/iquant_grids.h's tables, which define the formats. The sign
// bytes of IQ2_XXS, IQ2_XS and IQ3_XXS (kIqSigns: 7 stored bits and their
// parity as bit 7) are computed, not looked up.
//
// Alignment: the blocks are 50 to 110 bytes, only 2-byte aligned (IQ1_M:
// 56, so 8), so the fields are read as bytes and 16-bit words (IQ1_M's
// scales as 32-bit words).
#pragma once

#include <cstdint>

#include "kernels/cuda/iquant_grids_device.cuh"
#include "kernels/cuda/quant_decode.cuh"  // the helpers (a cycle #pragma once resolves)
#include "tensor/iquant_grids.h"

namespace moeserve::cuda::qdec {

// Entry i of codebook `name` (kIq2xxs .. kIq1s): the device copy in device
// code, the reference table (name##Grid) on the host.
#ifdef __CUDA_ARCH__
#define MOESERVE_IQ_ENTRY(name, i) __ldg(&grids::name<>[i])
#else
#define MOESERVE_IQ_ENTRY(name, i) ::moeserve::name##Grid[i]
#endif

// kIqSigns[s7]: s7 with bit 7 set when it has an odd number of ones.
MOESERVE_QDEC uint32_t iq_signs(uint32_t s7) {
#ifdef __CUDA_ARCH__
  return s7 | ((uint32_t(__popc(s7)) & 1u) << 7);
#else
  return s7 | ((uint32_t(__builtin_popcount(s7)) & 1u) << 7);
#endif
}

// One group of 8 values: the entry's bytes (IQ2, IQ3: magnitudes; IQ1:
// int8 values) and, by type, the signs (bit j negates value j) or the shift.
struct IqGroup {
  uint64_t entry;
  uint32_t signs;
  float shift;
};

// The group's 8 values as exact floats (the int8 bytes of IQ1, their sign
// bits flipped, are value + 128).
template <bool kShifted>
MOESERVE_QDEC void iq_group_values(const IqGroup& g, float v[8]) {
  const uint32_t lo = uint32_t(g.entry), hi = uint32_t(g.entry >> 32);
  if constexpr (kShifted) {
    bytes_to_floats(lo ^ 0x80808080u, 8388608.0f + 128.0f, v);
    bytes_to_floats(hi ^ 0x80808080u, 8388608.0f + 128.0f, v + 4);
MOESERVE_QDEC_UNROLL
    for (int j = 0; j < 8; ++j) v[j] += g.shift;
  } else {
    bytes_to_floats(lo, 8388608.0f, v);
    bytes_to_floats(hi, 8388608.0f, v + 4);
MOESERVE_QDEC_UNROLL
    for (int j = 0; j < 8; ++j) v[j] = (g.signs >> j) & 1u ? -v[j] : v[j];
  }
}

// Value j (0..7) of the group, as iq_group_values gives it.
template <bool kShifted>
MOESERVE_QDEC float iq_group_value(const IqGroup& g, int j) {
  const uint32_t byte = uint32_t(g.entry >> (8 * j)) & 0xFFu;
  if constexpr (kShifted) return static_cast<float>(static_cast<int8_t>(byte)) + g.shift;
  const float m = static_cast<float>(byte);
  return (g.signs >> j) & 1u ? -m : m;
}

// The Traits of an i-quant from its layout L: L::scale(blk, r) the scale of
// run r, L::group(blk, g) group g (0..31: sub-block g / 4, position g % 4).
// The layouts are templates (of an unused parameter) so that their code, and
// with it a codebook (iquant_grids_device.cuh), is instantiated only in the
// translation units that decode the type.
template <DType T, class L>
struct IqTraits {
  static constexpr DType kType = T;
  static constexpr int kBlockElems = 256, kBlockBytes = L::kBytes;
  static constexpr int kUnitsPerBlock = 8, kUnitRuns = 2, kMvChunkBlocks = L::kChunkBlocks;
  static constexpr bool kScaled = true;
  static constexpr int kRowAlign = L::kAlign;
  MOESERVE_QDEC static int unit_run(int u, int k) { return 2 * u + k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    iq_group_values<L::kShifted>(L::group(blk, 2 * r), v);
    iq_group_values<L::kShifted>(L::group(blk, 2 * r + 1), v + 8);
    return L::scale(blk, r);
  }
  // Element j (0..255) of the block (dequant_element.cuh).
  MOESERVE_QDEC static float element(const uint8_t* blk, int j) {
    return L::scale(blk, j >> 4) * iq_group_value<L::kShifted>(L::group(blk, j >> 3), j & 7);
  }
};

// 32 bits from a 2-byte aligned address.
MOESERVE_QDEC uint32_t load_u32_a2(const uint8_t* p) { return load_u16(p) | (load_u16(p + 2) << 16); }

// d (s + 1/2) / 4 of IQ2_XXS, IQ2_XS and IQ2_S, in the reference's order.
MOESERVE_QDEC float iq2_scale(const uint8_t* blk, uint32_t s) {
  return half_bits_to_float(load_u16(blk)) * (0.5f + static_cast<float>(s)) * 0.25f;
}

// ---- IQ2_XXS: {d, qs[64] bytes}; sub-block ib: bytes 8ib..8ib+3 the four
// grid indices, 8ib+4.. a u32 aux: bits 7l.. group l's signs, bits 28..31 s.
template <int = 0>
struct Iq2xxsLayout {
  static constexpr int kBytes = 66, kAlign = 2, kChunkBlocks = 2;
  static constexpr bool kShifted = false;
  MOESERVE_QDEC static uint32_t aux(const uint8_t* blk, int ib) { return load_u32_a2(blk + 2 + 8 * ib + 4); }
  MOESERVE_QDEC static float scale(const uint8_t* blk, int r) {
    return iq2_scale(blk, aux(blk, r >> 1) >> 28);
  }
  MOESERVE_QDEC static IqGroup group(const uint8_t* blk, int g) {
    const int ib = g >> 2, l = g & 3;
    const uint32_t idx = blk[2 + 8 * ib + l];
    return {MOESERVE_IQ_ENTRY(kIq2xxs, idx), iq_signs((aux(blk, ib) >> (7 * l)) & 127u), 0.0f};
  }
};

// ---- IQ2_XS: {d, qs[32] (u16: index 9 bits | signs 7 bits << 9),
// scales[8]}; scales[ib]: groups 0-1 in the low nibble, 2-3 in the high.
template <int = 0>
struct Iq2xsLayout {
  static constexpr int kBytes = 74, kAlign = 2, kChunkBlocks = 1;
  static constexpr bool kShifted = false;
  MOESERVE_QDEC static float scale(const uint8_t* blk, int r) {
    return iq2_scale(blk, (uint32_t(blk[66 + (r >> 1)]) >> (4 * (r & 1))) & 15u);
  }
  MOESERVE_QDEC static IqGroup group(const uint8_t* blk, int g) {
    const uint32_t q = load_u16(blk + 2 + 2 * g);
    return {MOESERVE_IQ_ENTRY(kIq2xs, q & 511u), iq_signs(q >> 9), 0.0f};
  }
};

// ---- IQ2_S: {d, qs[32] index low bytes, signs[32], qh[8], scales[8]};
// bits 8-9 of group l's index at bit 2l of qh[ib]; scales as IQ2_XS.
template <int = 0>
struct Iq2sLayout {
  static constexpr int kBytes = 82, kAlign = 2, kChunkBlocks = 1;
  static constexpr bool kShifted = false;
  MOESERVE_QDEC static float scale(const uint8_t* blk, int r) {
    return iq2_scale(blk, (uint32_t(blk[74 + (r >> 1)]) >> (4 * (r & 1))) & 15u);
  }
  MOESERVE_QDEC static IqGroup group(const uint8_t* blk, int g) {
    const int ib = g >> 2, l = g & 3;
    const uint32_t idx = blk[2 + g] | (((uint32_t(blk[66 + ib]) >> (2 * l)) & 3u) << 8);
    return {MOESERVE_IQ_ENTRY(kIq2s, idx), blk[34 + g], 0.0f};
  }
};

// An IQ3 group: the entries of 4 (32-bit) i1 (values 0..3) and i2 (4..7).
#define MOESERVE_IQ3_PAIR(name, i1, i2) \
  (uint64_t(MOESERVE_IQ_ENTRY(name, i1)) | uint64_t(MOESERVE_IQ_ENTRY(name, i2)) << 32)

// ---- IQ3_XXS: {d, qs[64] indices (8 a sub-block), aux[8] (u32 as
// IQ2_XXS's, at 66 + 4ib)}; scale d (s + 1/2) / 2.
template <int = 0>
struct Iq3xxsLayout {
  static constexpr int kBytes = 98, kAlign = 2, kChunkBlocks = 1;
  static constexpr bool kShifted = false;
  MOESERVE_QDEC static uint32_t aux(const uint8_t* blk, int ib) { return load_u32_a2(blk + 66 + 4 * ib); }
  MOESERVE_QDEC static float scale(const uint8_t* blk, int r) {
    return half_bits_to_float(load_u16(blk)) * (0.5f + static_cast<float>(aux(blk, r >> 1) >> 28)) * 0.5f;
  }
  MOESERVE_QDEC static IqGroup group(const uint8_t* blk, int g) {
    const int ib = g >> 2, l = g & 3;
    const uint8_t* q = blk + 2 + 2 * g;
    return {MOESERVE_IQ3_PAIR(kIq3xxs, q[0], q[1]), iq_signs((aux(blk, ib) >> (7 * l)) & 127u), 0.0f};
  }
};

// ---- IQ3_S: {d, qs[64] index low bytes, qh[8], signs[32], scales[4]};
// bit 8 of index k (0..7) of sub-block ib at bit k of qh[ib]; nibble ib % 2
// of scales[ib / 2] is s: scale d (2s + 1).
template <int = 0>
struct Iq3sLayout {
  static constexpr int kBytes = 110, kAlign = 2, kChunkBlocks = 1;
  static constexpr bool kShifted = false;
  MOESERVE_QDEC static float scale(const uint8_t* blk, int r) {
    const int ib = r >> 1;
    const uint32_t s = (uint32_t(blk[106 + (ib >> 1)]) >> (4 * (ib & 1))) & 15u;
    return half_bits_to_float(load_u16(blk)) * static_cast<float>(1u + 2u * s);
  }
  MOESERVE_QDEC static IqGroup group(const uint8_t* blk, int g) {
    const int ib = g >> 2, l = g & 3;
    const uint32_t qh = uint32_t(blk[66 + ib]) >> (2 * l);
    const uint32_t i1 = blk[2 + 2 * g] | ((qh & 1u) << 8), i2 = blk[3 + 2 * g] | ((qh & 2u) << 7);
    return {MOESERVE_IQ3_PAIR(kIq3s, i1, i2), blk[74 + g], 0.0f};
  }
};

// IQ1's shift: -1/8 when the sign bit is set.
MOESERVE_QDEC float iq1_shift(uint32_t negative) { return negative != 0 ? -kIq1Delta : kIq1Delta; }

// ---- IQ1_S: {d, qs[32] index low bytes, qh[8] (u16)}; qh[ib]: bits 3l..
// bits 8-10 of group l's index, bits 12-14 s, bit 15 the shift's sign;
// scale d (2s + 1).
template <int = 0>
struct Iq1sLayout {
  static constexpr int kBytes = 50, kAlign = 2, kChunkBlocks = 2;
  static constexpr bool kShifted = true;
  MOESERVE_QDEC static uint32_t qh(const uint8_t* blk, int ib) { return load_u16(blk + 34 + 2 * ib); }
  MOESERVE_QDEC static float scale(const uint8_t* blk, int r) {
    const uint32_t s = (qh(blk, r >> 1) >> 12) & 7u;
    return half_bits_to_float(load_u16(blk)) * static_cast<float>(2u * s + 1u);
  }
  MOESERVE_QDEC static IqGroup group(const uint8_t* blk, int g) {
    const uint32_t h = qh(blk, g >> 2), idx = blk[2 + g] | (((h >> (3 * (g & 3))) & 7u) << 8);
    return {MOESERVE_IQ_ENTRY(kIq1s, idx), 0u, iq1_shift(h & 0x8000u)};
  }
};

// ---- IQ1_M: {qs[32] index low bytes, qh[16], scales[8] (4 u16)}; qh[2ib +
// l/2]: bits 8-10 of group l's index in bits 0-2 (l even) or 4-6, the
// shift's sign in bit 3 or 7; u16 scales[ib / 2] bits 6(ib % 2) + 3(l / 2)..
// s (scale d (2s + 1)); d (f16) in the top nibbles of the four scale words.
template <int = 0>
struct Iq1mLayout {
  static constexpr int kBytes = 56, kAlign = 8, kChunkBlocks = 2;
  static constexpr bool kShifted = true;
  MOESERVE_QDEC static float scale(const uint8_t* blk, int r) {
    const uint32_t w01 = load_u32(blk + 48), w23 = load_u32(blk + 52);
    // iq1_m_scale_bits: the top nibble of scale word k is bits 4k..4k+3 of d.
    const uint32_t d =
        ((w01 >> 12) & 0x000Fu) | ((w01 >> 24) & 0x00F0u) | ((w23 >> 4) & 0x0F00u) | ((w23 >> 16) & 0xF000u);
    const int ib = r >> 1;
    const uint32_t word = (ib < 4 ? w01 : w23) >> (16 * ((ib >> 1) & 1));  // scales[ib / 2]
    const uint32_t s = (word >> (6 * (ib & 1) + 3 * (r & 1))) & 7u;
    return half_bits_to_float(d) * static_cast<float>(2u * s + 1u);
  }
  MOESERVE_QDEC static IqGroup group(const uint8_t* blk, int g) {
    const uint32_t hb = uint32_t(blk[32 + (g >> 1)]) >> (4 * (g & 1));
    return {MOESERVE_IQ_ENTRY(kIq1s, blk[g] | ((hb & 7u) << 8)), 0u, iq1_shift(hb & 8u)};
  }
};

#undef MOESERVE_IQ3_PAIR
#undef MOESERVE_IQ_ENTRY

template <>
struct Traits<DType::IQ2_XXS> : IqTraits<DType::IQ2_XXS, Iq2xxsLayout<>> {};
template <>
struct Traits<DType::IQ2_XS> : IqTraits<DType::IQ2_XS, Iq2xsLayout<>> {};
template <>
struct Traits<DType::IQ2_S> : IqTraits<DType::IQ2_S, Iq2sLayout<>> {};
template <>
struct Traits<DType::IQ3_XXS> : IqTraits<DType::IQ3_XXS, Iq3xxsLayout<>> {};
template <>
struct Traits<DType::IQ3_S> : IqTraits<DType::IQ3_S, Iq3sLayout<>> {};
template <>
struct Traits<DType::IQ1_S> : IqTraits<DType::IQ1_S, Iq1sLayout<>> {};
template <>
struct Traits<DType::IQ1_M> : IqTraits<DType::IQ1_M, Iq1mLayout<>> {};

}  // namespace moeserve::cuda::qdec
