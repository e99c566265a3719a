// On-disk block layouts of the quantized types (GGUF / ggml compatible).
// Byte-exact: these structs are read straight out of the mmapped file.
// Values: see docs/FORMATS.md and shared/design/model-and-format-specs.md §4.
#pragma once

#include <cstdint>

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
