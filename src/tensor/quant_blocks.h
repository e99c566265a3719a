// On-disk block layouts of the quantized types (GGUF / ggml compatible).
// Byte-exact: these structs are read straight out of the mmapped file.
// Values: see docs/FORMATS.md and shared/design/model-and-format-specs.md §4.
#pragma once

#include <cstdint>
#include <cstring>

namespace moeserve {

inline constexpr int kQK4_0 = 32;
inline constexpr int kQK8_0 = 32;
inline constexpr int kQK_K = 256;           // super-block of the K-quants
inline constexpr int kKScaleBytes = 12;     // 8 packed 6-bit (scale, min) pairs

// y[j] = d * ((qs[j] & 15) - 8), y[j+16] = d * ((qs[j] >> 4) - 8)
struct BlockQ4_0 {
  uint16_t d;  // f16
  uint8_t qs[kQK4_0 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// y = d * q
struct BlockQ8_0 {
  uint16_t d;  // f16
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

// 8 sub-blocks of 32: y = d*sc*q - dmin*m, q in 0..15
struct BlockQ4_K {
  uint16_t d;     // f16 super-scale of the scales
  uint16_t dmin;  // f16 super-scale of the mins
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// As Q4_K plus one high bit per element: q in 0..31
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// 16 sub-blocks of 16: y = d * scales[i] * (q - 32), q in 0..63
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      // low 4 bits
  uint8_t qh[kQK_K / 4];      // high 2 bits
  int8_t scales[kQK_K / 16];  // 8-bit sub-block scales
  uint16_t d;                 // f16, stored last
};
static_assert(sizeof(BlockQ6_K) == 210);

// The 6-bit codes of one Q6_K half (128 elements; ql and qh point at the
// half's 64 and 32 bytes): element 32t + l (t = 0..3, l = 0..31) keeps its
// low 4 bits in ql[l + 32 * (t & 1)] (low nibble for t < 2, high for t >= 2)
// and its high 2 bits in bits 2t..2t+1 of qh[l].
inline void q6_k_codes_at(const uint8_t* ql, const uint8_t* qh, int l, int codes[4]) {
  const int a = ql[l], b = ql[l + 32], hi = qh[l];
  codes[0] = (a & 15) | ((hi & 3) << 4);
  codes[1] = (b & 15) | (((hi >> 2) & 3) << 4);
  codes[2] = (a >> 4) | (((hi >> 4) & 3) << 4);
  codes[3] = (b >> 4) | (((hi >> 6) & 3) << 4);
}
inline void q6_k_store_codes_at(const int codes[4], uint8_t* ql, uint8_t* qh, int l) {
  ql[l] = uint8_t((codes[0] & 15) | ((codes[2] & 15) << 4));
  ql[l + 32] = uint8_t((codes[1] & 15) | ((codes[3] & 15) << 4));
  qh[l] = uint8_t((codes[0] >> 4) | ((codes[1] >> 4) << 2) | ((codes[2] >> 4) << 4) | ((codes[3] >> 4) << 6));
}

// ---- Types of issue 43, as ggml defines them (ggml-common.h) ---------------

inline constexpr int kQK4_1 = 32, kQK5_0 = 32, kQK5_1 = 32, kQK4_NL = 32, kQK_MXFP4 = 32;

// y = d * q + m, q in 0..15 (element j: low nibble of qs[j], j + 16: high)
struct BlockQ4_1 {
  uint16_t d;  // f16
  uint16_t m;  // f16
  uint8_t qs[kQK4_1 / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// y = d * (q - 16), q in 0..31: the nibble as Q4_0's, the fifth bit of
// element j (j + 16) is bit j (j + 16) of qh read as a little-endian uint32.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK5_0 / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// y = d * q + m, q in 0..31 (bits as Q5_0).
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK5_1 / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// 16 sub-blocks of 16: y = d * (sc & 15) * q - dmin * (sc >> 4), q in 0..3.
// In each half of 128 elements, element 32t + l (t = 0..3, l = 0..31) has
// its code in bits 2t..2t+1 of qs[32 * half + l]; sub-block 8 * half + 2t +
// l / 16 owns it.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// 16 sub-blocks of 16: y = d * (s - 32) * (q - 4 * !hbit), q in 0..3 laid
// out as Q2_K's, the high bit of element 32t + l of half h in bit 4h + t of
// hmask[l]; s are 16 6-bit scales packed in 12 bytes (q3_k_scales).
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// The 16 6-bit scales of a Q3_K block (0..63; the value is s - 32): the low
// 4 bits of s[j] in the nibbles of bytes 0..7 (j < 8: low nibble of byte j;
// else high nibble of byte j - 8), the high 2 bits in bytes 8..11 (scale j
// in bits 2 * (j / 4) of byte 8 + j % 4).
inline void q3_k_scales(const uint8_t* packed, int out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? packed[j] & 15 : packed[j - 8] >> 4;
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = low | (high << 4);
  }
}
inline void q3_k_pack_scales(const int s[16], uint8_t* packed) {
  for (int j = 0; j < 12; ++j) packed[j] = 0;
  for (int j = 0; j < 16; ++j) {
    if (j < 8) packed[j] |= uint8_t(s[j] & 15);
    else packed[j - 8] |= uint8_t((s[j] & 15) << 4);
    packed[8 + j % 4] |= uint8_t(((s[j] >> 4) & 3) << (2 * (j / 4)));
  }
}

// The non-linear 4-bit values of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// y = d * kIq4nlValues[q] (nibbles as Q4_0's).
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK4_NL / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// 8 sub-blocks of 32: y = d * (ls - 32) * kIq4nlValues[q], ls a 6-bit scale:
// low 4 bits in the nibble ib % 2 of scales_l[ib / 2], high 2 bits in bits
// 2 ib of scales_h; each sub-block's nibbles as an IQ4_NL block's.
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// OCP MXFP4: y = kMxfp4Values[q] * 2^(e - 128) (the values are twice the
// E2M1 ones, so this is E2M1 * 2^(e - 127)); nibbles as Q4_0's. ggml reads
// e = 0 and 1 as 2^-128 and 2^-127, and e = 255 as 2^127.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
inline float mxfp4_scale(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : uint32_t(e - 1) << 23;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}
struct BlockMXFP4 {
  uint8_t e;
  uint8_t qs[kQK_MXFP4 / 2];
};
static_assert(sizeof(BlockMXFP4) == 17);

// ---- The i-quants (codebooks: tensor/iquant_grids.h) --------------------------
// Each 256-element block has 8 sub-blocks of 32, each of 4 groups of 8.

// Per sub-block ib, qs[4ib], qs[4ib+1] hold the 4 groups' grid indices
// (bytes), qs[4ib+2..3] as a uint32: bits 7l..7l+6 group l's signs
// (kIqSigns), bits 28..31 the scale s: y = d (2s+1)/8 grid * sign.
struct BlockIQ2_XXS {
  uint16_t d;
  uint16_t qs[kQK_K / 8];
};
static_assert(sizeof(BlockIQ2_XXS) == 66);

// qs[4ib + l]: grid index (9 bits) | signs (7 bits) << 9; scales[ib]: the
// 4-bit scales of groups 0-1 (low nibble) and 2-3.
struct BlockIQ2_XS {
  uint16_t d;
  uint16_t qs[kQK_K / 8];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_XS) == 74);

// qs[4ib + l]: the grid index's low 8 bits, its bits 8-9 in bits 2l..2l+1
// of qh[ib]; qs[32 + 4ib + l]: the 8 signs; scales as IQ2_XS.
struct BlockIQ2_S {
  uint16_t d;
  uint8_t qs[kQK_K / 4];
  uint8_t qh[kQK_K / 32];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_S) == 82);

// qs[8ib + k]: grid indices of 4 values each; qs[64 + 4ib..] as a uint32:
// signs as IQ2_XXS, bits 28..31 the scale s: y = d (2s+1)/4 grid * sign.
struct BlockIQ3_XXS {
  uint16_t d;
  uint8_t qs[3 * kQK_K / 8];
};
static_assert(sizeof(BlockIQ3_XXS) == 98);

// qs[8ib + k]: grid index low 8 bits, bit 8 in bit k of qh[ib]; signs[4ib
// + l]: group l's 8 signs; scale nibble ib % 2 of scales[ib / 2] = s: y = d
// (2s+1) grid * sign.
struct BlockIQ3_S {
  uint16_t d;
  uint8_t qs[kQK_K / 4];
  uint8_t qh[kQK_K / 32];
  uint8_t signs[kQK_K / 8];
  uint8_t scales[kQK_K / 64];
};
static_assert(sizeof(BlockIQ3_S) == 110);

// qs[4ib + l]: grid index low 8 bits, bits 8-10 in bits 3l.. of qh[ib];
// qh[ib] bits 12-14 the scale s, bit 15 the sign of the shift: y = d (2s+1)
// (grid ± 1/8).
struct BlockIQ1_S {
  uint16_t d;
  uint8_t qs[kQK_K / 8];
  uint16_t qh[kQK_K / 32];
};
static_assert(sizeof(BlockIQ1_S) == 50);

// qs[4ib + l]: grid index low 8 bits; qh[2ib + l/2]: bits 8-10 of group
// 2(l/2) in its bits 0-2 and of the next group in bits 4-6, the shifts'
// signs in bits 3 and 7; scales (4 uint16): 3-bit sub-block scales (two a
// sub-block: groups 0-1 and 2-3), and in their top nibbles the f16 d.
struct BlockIQ1_M {
  uint8_t qs[kQK_K / 8];
  uint8_t qh[kQK_K / 16];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ1_M) == 56);

// IQ1_M's f16 scale (its bits), from the top nibbles of its four scale words.
inline uint16_t iq1_m_scale_bits(const BlockIQ1_M& b) {
  uint16_t sc[4];
  std::memcpy(sc, b.scales, 8);
  return uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
}

// Activations for K-quant dot products: y = d * q; bsums = sums of 16 q's.
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

// Unpack the 6-bit (scale, min) pair j (0..7) of a Q4_K/Q5_K block.
inline void k_scale_min(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = uint8_t((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

}  // namespace moeserve
