// Weight decoding for the tensor-core matrix x vector kernels (matvec_tc.cu):
// quantized codes as exact bf16 MMA operands, and activations as exact sums
// of three bf16 terms. Host and device (the host runs them in the tests,
// against the CPU dequantizer, without a GPU).
//
// Columns. A "chunk" is 256 columns of a row (one K-quant block; 8 blocks of
// Q8_0 or Q4_0). Step q (0..15) of a chunk is one m16n8k16 MMA K step over
// columns 16q..16q+15, and lane j (0..3) of a quad supplies the four K slots
// 2j, 2j+1, 2j+8, 2j+9, which hold columns 16q+4j+{0,1} and 16q+4j+{2,3}:
// every type uses this one order, so the activation operand does not depend
// on the weight type.
//
// Weights: the integer code of each element (code - offset: 0..15, 0..31,
// -32..31, -8..7, -128..127) is exact in bf16. Codes are placed under the
// exponent of 128 (bf16 0x43cc = 128 + cc for cc < 128) and one bf16x2 FMA
// subtracts 128 + offset exactly. The per-element scale (and the K-quants'
// min) is applied to the f32 MMA sums per scale group (32 columns, Q6_K 16):
//   element = scale * code - min,  scale, min per (row, group).
// Activations: x = t0 + t1 + t2, each term the top 16 bits (bf16) of what is
// left (3 x 8 significant bits hold f32's 24): exact for |x| >= 2^-100, and
// below that off by less than 2^-126 (the last term loses subnormal bits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/quant_decode.cuh"
#include "tensor/dtype.h"

namespace moeserve::cuda::tcdec {

inline constexpr int kChunkCols = 256;
inline constexpr int kSteps = kChunkCols / 16;  // MMA K steps of a chunk

MOESERVE_QDEC uint32_t ld32(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}

// 4 bytes at a 2-byte aligned address: the aligned words around them and a
// byte permute (reads at most 2 bytes past the 4).
MOESERVE_QDEC uint32_t ld32_2(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* base = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  return __byte_perm(base[0], base[1], (a & 2) ? 0x5432u : 0x3210u);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}

MOESERVE_QDEC float bf16_bits_to_float(uint32_t h) { return qdec::bits_as_float(h << 16); }

// bf16x2 a - b for b = -neg (both exact bf16 pairs; the result is exact).
MOESERVE_QDEC uint32_t bf16x2_add(uint32_t a, uint32_t neg) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0x3F803F80u), "r"(neg));
  return d;
#else
  uint32_t out = 0;
  for (int h = 0; h < 2; ++h) {
    const float v =
        bf16_bits_to_float((a >> (16 * h)) & 0xFFFFu) + bf16_bits_to_float((neg >> (16 * h)) & 0xFFFFu);
    uint32_t b;
    std::memcpy(&b, &v, 4);
    out |= (b >> 16) << (16 * h);  // exact: the values are small integers
  }
  return out;
#endif
}

// The pair of codes (bytes 2p, 2p + 1 of `codes`, each < 128) minus the
// offset whose bf16x2 negation (-(128 + offset) twice) is `neg`.
template <int p>
MOESERVE_QDEC uint32_t code_pair(uint32_t codes, uint32_t neg) {
  return bf16x2_add(qdec::byte_perm(codes, 0x43434343u, p == 0 ? 0x4140u : 0x4342u), neg);
}

// -(128 + offset) as a bf16x2 pair (offset < 128 and a small integer).
constexpr uint32_t neg_offset(int offset) {
  // bf16 of -(128 + offset): sign, exponent 2^7, mantissa offset (7 bits).
  return (0xC300u | uint32_t(offset)) * 0x10001u;
}

// Signed bytes (Q8_0) as a pair: (128 + (b & 127)) - (128 + (b & 128)).
template <int p>
MOESERVE_QDEC uint32_t signed_pair(uint32_t w) {
  constexpr uint32_t sel = p == 0 ? 0x4140u : 0x4342u;
  const uint32_t mag = qdec::byte_perm(w & 0x7F7F7F7Fu, 0x43434343u, sel);
  const uint32_t neg = qdec::byte_perm(w & 0x80808080u, 0xC3C3C3C3u, sel);  // -128 or -256
  return bf16x2_add(mag, neg);
}

// x as three bf16 terms, t[0] + t[1] + t[2] == x (exactly for |x| >= 2^-100;
// t[0] the largest; each in the top 16 bits of its word).
MOESERVE_QDEC void split3(float x, uint32_t t[3]) {
  uint32_t b0;
#ifdef __CUDA_ARCH__
  b0 = __float_as_uint(x) & 0xFFFF0000u;
  const float r1 = x - __uint_as_float(b0);
  const uint32_t b1 = __float_as_uint(r1) & 0xFFFF0000u;
  const float r2 = r1 - __uint_as_float(b1);
  t[0] = b0, t[1] = b1, t[2] = __float_as_uint(r2);
#else
  std::memcpy(&b0, &x, 4);
  b0 &= 0xFFFF0000u;
  const float r1 = x - qdec::bits_as_float(b0);
  uint32_t b1;
  std::memcpy(&b1, &r1, 4);
  b1 &= 0xFFFF0000u;
  const float r2 = r1 - qdec::bits_as_float(b1);
  uint32_t b2;
  std::memcpy(&b2, &r2, 4);
  t[0] = b0, t[1] = b1, t[2] = b2;
#endif
}

// Two activations (columns c, c + 1) as the bf16x2 pairs of the three terms.
MOESERVE_QDEC void split_pair(float lo, float hi, uint32_t out[3]) {
  uint32_t a[3], b[3];
  split3(lo, a);
  split3(hi, b);
  for (int k = 0; k < 3; ++k) out[k] = qdec::byte_perm(a[k], b[k], 0x7632u);
}

// ---- per type: bytes of a chunk row, the two code pairs of a step, and the
// scale table (kEntries floats a row: what a scale group's flush reads).

template <DType T>
struct Tc;

// Q4_K: {d, dmin, scales[12], qs[128]}; sub-block G (columns 32G..): low
// (G even) or high nibbles of qs[32(G/2) + l]. Step q: G = q/2, l = 16(q%2) + 4j + e.
template <>
struct Tc<DType::Q4_K> {
  static constexpr int kChunkBytes = 144, kBlockElems = 256, kBlockBytes = 144;
  static constexpr bool kAligned = true, kMin = true, kStepScale = false;
  MOESERVE_QDEC static void step(const uint8_t* row, int q, int j, uint32_t out[2]) {
    const int g = q >> 1, s = q & 1;
    const uint32_t w = ld32(row + 16 + 32 * (g >> 1) + 16 * s + 4 * j);
    const uint32_t codes = (w >> (4 * (g & 1))) & 0x0F0F0F0Fu;
    out[0] = code_pair<0>(codes, neg_offset(0));
    out[1] = code_pair<1>(codes, neg_offset(0));
  }
  // Entries 2G, 2G + 1: d * sc_G, dmin * m_G.
  MOESERVE_QDEC static void scales(const uint8_t* row, int half, float* e) {
    uint32_t hdr[4];
    for (int i = 0; i < 4; ++i) hdr[i] = ld32(row + 4 * i);
    for (int g = 4 * half; g < 4 * half + 4; ++g) qdec::k_scale_min(hdr, g, &e[2 * g], &e[2 * g + 1]);
  }
};

// Q5_K: {d, dmin, scales[12], qh[32], qs[128]}: as Q4_K, plus bit G of qh[l]
// as the code's bit 4.
template <>
struct Tc<DType::Q5_K> {
  static constexpr int kChunkBytes = 176, kBlockElems = 256, kBlockBytes = 176;
  static constexpr bool kAligned = true, kMin = true, kStepScale = false;
  MOESERVE_QDEC static void step(const uint8_t* row, int q, int j, uint32_t out[2]) {
    const int g = q >> 1, s = q & 1;
    const uint32_t w = ld32(row + 48 + 32 * (g >> 1) + 16 * s + 4 * j);
    const uint32_t h = ld32(row + 16 + 16 * s + 4 * j);
    const uint32_t codes = ((w >> (4 * (g & 1))) & 0x0F0F0F0Fu) | (((h >> g) & 0x01010101u) << 4);
    out[0] = code_pair<0>(codes, neg_offset(0));
    out[1] = code_pair<1>(codes, neg_offset(0));
  }
  MOESERVE_QDEC static void scales(const uint8_t* row, int half, float* e) {
    Tc<DType::Q4_K>::scales(row, half, e);
  }
};

// Q6_K: {ql[128], qh[64], scales[16] (int8), d}: element 128hf + 32t + l has
// its low 4 bits in ql[64hf + 32(t&1) + l] (nibble t/2), its high 2 bits at
// bit 2t of qh[32hf + l], scale scales[8hf + 2t + l/16]. Step q = 8hf + 2t + s
// covers l = 16s..16s+15 (columns 16q..), so entry q is its scale d * sc.
template <>
struct Tc<DType::Q6_K> {
  static constexpr int kChunkBytes = 210, kBlockElems = 256, kBlockBytes = 210;
  static constexpr bool kAligned = false, kMin = false, kStepScale = true;
  MOESERVE_QDEC static void step(const uint8_t* row, int q, int j, uint32_t out[2]) {
    const int hf = q >> 3, t = (q >> 1) & 3, s = q & 1;
    const uint32_t ql = ld32_2(row + 64 * hf + 32 * (t & 1) + 16 * s + 4 * j);
    const uint32_t qh = ld32_2(row + 128 + 32 * hf + 16 * s + 4 * j);
    const uint32_t codes = ((ql >> (4 * (t >> 1))) & 0x0F0F0F0Fu) | (((qh >> (2 * t)) & 0x03030303u) << 4);
    out[0] = code_pair<0>(codes, neg_offset(32));
    out[1] = code_pair<1>(codes, neg_offset(32));
  }
  MOESERVE_QDEC static void scales(const uint8_t* row, int half, float* e) {
    const float d = qdec::half_bits_to_float(qdec::load_u16(row + 208));
    for (int i = 8 * half; i < 8 * half + 8; ++i)
      e[i] = d * static_cast<float>(static_cast<int8_t>(row[192 + i]));
  }
};

// Q8_0: 8 blocks {d, qs[32] (int8)} of 34 bytes; step q: block q/2, codes
// 16(q%2) + 4j + e. Entry G: d of block G.
template <>
struct Tc<DType::Q8_0> {
  static constexpr int kChunkBytes = 272, kBlockElems = 32, kBlockBytes = 34;
  static constexpr bool kAligned = false, kMin = false, kStepScale = false;
  MOESERVE_QDEC static void step(const uint8_t* row, int q, int j, uint32_t out[2]) {
    const uint32_t w = ld32_2(row + 34 * (q >> 1) + 2 + 16 * (q & 1) + 4 * j);
    out[0] = signed_pair<0>(w);
    out[1] = signed_pair<1>(w);
  }
  MOESERVE_QDEC static void scales(const uint8_t* row, int half, float* e) {
    for (int g = 4 * half; g < 4 * half + 4; ++g)
      e[2 * g] = qdec::half_bits_to_float(qdec::load_u16(row + 34 * g));
  }
};

// Q4_0: 8 blocks {d, qs[16]} of 18 bytes: element l low nibble of qs[l],
// 16 + l high nibble; step q: block q/2, nibble q%2 of qs[4j..4j+3]. Entry 2G:
// d of block G.
template <>
struct Tc<DType::Q4_0> {
  static constexpr int kChunkBytes = 144, kBlockElems = 32, kBlockBytes = 18;
  static constexpr bool kAligned = false, kMin = false, kStepScale = false;
  MOESERVE_QDEC static void step(const uint8_t* row, int q, int j, uint32_t out[2]) {
    const uint32_t w = ld32_2(row + 18 * (q >> 1) + 2 + 4 * j);
    const uint32_t codes = (w >> (4 * (q & 1))) & 0x0F0F0F0Fu;
    out[0] = code_pair<0>(codes, neg_offset(8));
    out[1] = code_pair<1>(codes, neg_offset(8));
  }
  MOESERVE_QDEC static void scales(const uint8_t* row, int half, float* e) {
    for (int g = 4 * half; g < 4 * half + 4; ++g)
      e[2 * g] = qdec::half_bits_to_float(qdec::load_u16(row + 18 * g));
  }
};

// Staging geometry only, for gemm_kq.cu's integer kernel (kq_blocks.cuh
// decodes these; no bf16 decoder here, so tc_type() leaves them out): one
// 256-column block a chunk.
template <int kBytes>
struct StageOnly {
  static constexpr int kChunkBytes = kBytes, kBlockElems = 256, kBlockBytes = kBytes;
  static constexpr bool kAligned = kBytes % 16 == 0;
};
template <>
struct Tc<DType::Q2_K> : StageOnly<84> {};
template <>
struct Tc<DType::Q3_K> : StageOnly<110> {};
template <>
struct Tc<DType::IQ4_XS> : StageOnly<136> {};
template <>
struct Tc<DType::IQ2_XXS> : StageOnly<66> {};
template <>
struct Tc<DType::IQ2_XS> : StageOnly<74> {};
template <>
struct Tc<DType::IQ2_S> : StageOnly<82> {};
template <>
struct Tc<DType::IQ3_XXS> : StageOnly<98> {};
template <>
struct Tc<DType::IQ3_S> : StageOnly<110> {};
template <>
struct Tc<DType::IQ1_S> : StageOnly<50> {};
template <>
struct Tc<DType::IQ1_M> : StageOnly<56> {};

// Whether the tensor-core path decodes this type.
constexpr bool tc_type(DType t) {
  return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q8_0 || t == DType::Q4_0;
}

// The scale and min that step q's codes take, from a row's entry table.
template <DType T>
MOESERVE_QDEC void step_scale(const float* e, int q, float* scale, float* min) {
  if constexpr (Tc<T>::kStepScale) {
    *scale = e[q], *min = 0.0f;
  } else {
    *scale = e[2 * (q >> 1)];
    *min = Tc<T>::kMin ? e[2 * (q >> 1) + 1] : 0.0f;
  }
}

}  // namespace moeserve::cuda::tcdec
