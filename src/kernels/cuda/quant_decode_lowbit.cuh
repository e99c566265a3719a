// Device decoding (qdec::Traits, see quant_decode.cuh) of issue 43's types:
// the legacy Q4_1, Q5_0, Q5_1, the table types IQ4_NL, IQ4_XS and MXFP4, and
// the low-bit K-quants Q2_K and Q3_K, byte-exact to tensor/quant_blocks.h.
// quant_decode.cuh includes this at its end (its helpers and the primary
// Traits come first): include quant_decode.cuh.
//
// Alignment. These blocks are 17 to 136 bytes, so a row (and a block) starts
// only as aligned as its length allows: kRowAlign is the largest power of two
// that divides the block bytes (up to 8), which is also what
// weight_row_align() asks of row_bytes and matrix strides. No load below
// assumes more alignment than its field then has: MXFP4's 17-byte
// blocks start at any byte, so its scale is a byte load and its codes go
// through load16_any (aligned words around them, never a word without one of
// their bytes).
//
// Additive minimums (Q4_1, Q5_1, Q2_K) decode as Q4_K does: kScaled = false,
// v[i] = fma(code, scale, min) is the element, and decode returns 1.
// Lookup-table types (IQ4_NL, IQ4_XS, MXFP4) map each 4-bit code to an int8
// with two byte permutes of the table held in four words (no memory table:
// a per-lane index into constant or shared memory would serialise or need
// setup in every kernel), then to a float with the exponent trick.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cuda/quant_decode.cuh"  // the helpers (a cycle #pragma once resolves)
#include "tensor/quant_blocks.h"

namespace moeserve::cuda::qdec {

// 16 bytes from an address aligned to kAlign (a power of two) bytes, with the
// widest loads that alignment allows.
template <int kAlign>
MOESERVE_QDEC void load16(const uint8_t* p, uint32_t w[4]) {
#ifdef __CUDA_ARCH__
  if constexpr (kAlign >= 16) {
    load16_aligned(p, w);
  } else if constexpr (kAlign >= 8) {
    const uint2 a = reinterpret_cast<const uint2*>(p)[0], b = reinterpret_cast<const uint2*>(p)[1];
    w[0] = a.x, w[1] = a.y, w[2] = b.x, w[3] = b.y;
  } else if constexpr (kAlign >= 4) {
    const uint32_t* q = reinterpret_cast<const uint32_t*>(p);
    w[0] = q[0], w[1] = q[1], w[2] = q[2], w[3] = q[3];
  } else {
    load16_any(p, w);
  }
#else
  std::memcpy(w, p, 16);
#endif
}

// 4 bytes from a 4-byte aligned address.
MOESERVE_QDEC uint32_t load_u32(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}

// The 4-bit codes of run r (0: elements 0..15, 1: 16..31) of a 32-element
// block whose 16 bytes hold element j in the low nibble and j + 16 in the
// high one (Q4_0's layout, shared by all the 32-element types here).
MOESERVE_QDEC uint32_t nibbles(uint32_t w, int r) { return (w >> (4 * r)) & 0x0F0F0F0Fu; }

// Bit 4 of the codes of elements 4i..4i+3 of a run, from the run's 16 high
// bits h (bit k: element k of the run): bit k of the nibble moves to bit 0
// of byte k (shifts by 0, 7, 14, 21 that never overlap: no carries), then up
// to bit 4.
MOESERVE_QDEC uint32_t high_bits4(uint32_t h, int i) {
  const uint32_t b = (h >> (4 * i)) & 0xFu;
  return ((b * 0x00204081u) & 0x01010101u) << 4;
}

// A table of 16 int8 values as 4 little-endian words: value k in byte k % 4
// of word k / 4.
struct Table16 {
  uint32_t w0, w1, w2, w3;
};

// kIq4nlValues and kMxfp4Values (tensor/quant_blocks.h), packed.
MOESERVE_QDEC constexpr Table16 iq4nl_table() { return {0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u}; }
MOESERVE_QDEC constexpr Table16 mxfp4_table() { return {0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu}; }

constexpr bool table_holds(Table16 t, const int8_t (&values)[16]) {
  const uint32_t w[4] = {t.w0, t.w1, t.w2, t.w3};
  for (int k = 0; k < 16; ++k) {
    if (uint8_t(w[k / 4] >> (8 * (k % 4))) != uint8_t(values[k])) return false;
  }
  return true;
}
static_assert(table_holds(iq4nl_table(), kIq4nlValues), "iq4nl_table() is not kIq4nlValues");
static_assert(table_holds(mxfp4_table(), kMxfp4Values), "mxfp4_table() is not kMxfp4Values");

// The table values (int8 bytes) of the 4 codes (0..15, one a byte) of c:
// codes 0..7 from words 0-1, 8..15 from words 2-3, chosen by bit 3.
MOESERVE_QDEC uint32_t table_lookup4(uint32_t c, Table16 t) {
  const uint32_t x = c & 0x07070707u;
  // Selector nibble k = byte k of x (bit 3 clear: a plain byte select).
  const uint32_t sel = (x & 0x7u) | ((x >> 4) & 0x70u) | ((x >> 8) & 0x700u) | ((x >> 12) & 0x7000u);
  const uint32_t lo = byte_perm(t.w0, t.w1, sel), hi = byte_perm(t.w2, t.w3, sel);
  const uint32_t upper = ((c >> 3) & 0x01010101u) * 0xFFu;  // 0xFF in the bytes of codes 8..15
  return (lo & ~upper) | (hi & upper);
}

// One table value (element decoders).
MOESERVE_QDEC int table_value(int code, Table16 t) {
  const uint32_t w =
      code < 8 ? byte_perm(t.w0, t.w1, uint32_t(code & 7)) : byte_perm(t.w2, t.w3, uint32_t(code & 7));
  return static_cast<int8_t>(w & 0xFFu);
}

// 16 table values of the codes in words c[0..3] as floats: the int8 bytes
// with their sign bits flipped are value + 128 in 0..255.
MOESERVE_QDEC void table_floats(const uint32_t c[4], Table16 t, float v[16]) {
MOESERVE_QDEC_UNROLL
  for (int i = 0; i < 4; ++i)
    bytes_to_floats(table_lookup4(c[i], t) ^ 0x80808080u, 8388608.0f + 128.0f, v + 4 * i);
}

// MXFP4's block scale 2^(e - 128) (mxfp4_scale on the host): e = 0 and 1 are
// the subnormals 2^-128 and 2^-127.
MOESERVE_QDEC float mxfp4_block_scale(uint32_t e) {
  return bits_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// ---- Q4_1: {d, m, qs[16]}; y = d * q + m ------------------------------------

template <>
struct Traits<DType::Q4_1> {
  static constexpr DType kType = DType::Q4_1;
  static constexpr int kBlockElems = 32, kBlockBytes = 20;
  static constexpr int kUnitsPerBlock = 1, kUnitRuns = 2, kMvChunkBlocks = 6;
  static constexpr bool kScaled = false;
  static constexpr int kRowAlign = 4;
  MOESERVE_QDEC static int unit_run(int, int k) { return k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    const uint32_t dm = load_u32(blk);
    uint32_t q[4];
    load16<4>(blk + 4, q);
    const float d = half_bits_to_float(dm), m = half_bits_to_float(dm >> 16);
    float code[16];
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i) bytes_to_floats(nibbles(q[i], r), 8388608.0f, code + 4 * i);
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 16; ++i) v[i] = fmaf(code[i], d, m);
    return 1.0f;
  }
};

// ---- Q5_0: {d, qh (u32), qs[16]}; y = d * (q - 16), bit 4 of element j in
// bit j of qh ------------------------------------------------------------------

template <>
struct Traits<DType::Q5_0> {
  static constexpr DType kType = DType::Q5_0;
  static constexpr int kBlockElems = 32, kBlockBytes = 22;
  static constexpr int kUnitsPerBlock = 1, kUnitRuns = 2, kMvChunkBlocks = 6;
  static constexpr bool kScaled = true;
  static constexpr int kRowAlign = 2;
  MOESERVE_QDEC static int unit_run(int, int k) { return k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    const uint32_t h = (load_u16(blk + 2) | (load_u16(blk + 4) << 16)) >> (16 * r);
    uint32_t q[4];
    load16_any(blk + 6, q);
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i)
      bytes_to_floats(nibbles(q[i], r) | high_bits4(h, i), 8388608.0f + 16.0f, v + 4 * i);
    return half_bits_to_float(load_u16(blk));
  }
};

// ---- Q5_1: {d, m, qh (u32), qs[16]}; y = d * q + m, bits as Q5_0's ----------

template <>
struct Traits<DType::Q5_1> {
  static constexpr DType kType = DType::Q5_1;
  static constexpr int kBlockElems = 32, kBlockBytes = 24;
  static constexpr int kUnitsPerBlock = 1, kUnitRuns = 2, kMvChunkBlocks = 6;
  static constexpr bool kScaled = false;
  static constexpr int kRowAlign = 8;
  MOESERVE_QDEC static int unit_run(int, int k) { return k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    const uint32_t dm = load_u32(blk), h = load_u32(blk + 4) >> (16 * r);
    uint32_t q[4];
    load16<8>(blk + 8, q);
    const float d = half_bits_to_float(dm), m = half_bits_to_float(dm >> 16);
    float code[16];
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i)
      bytes_to_floats(nibbles(q[i], r) | high_bits4(h, i), 8388608.0f, code + 4 * i);
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 16; ++i) v[i] = fmaf(code[i], d, m);
    return 1.0f;
  }
};

// ---- IQ4_NL: {d, qs[16]}; y = d * kIq4nlValues[q] ----------------------------

template <>
struct Traits<DType::IQ4_NL> {
  static constexpr DType kType = DType::IQ4_NL;
  static constexpr int kBlockElems = 32, kBlockBytes = 18;
  static constexpr int kUnitsPerBlock = 1, kUnitRuns = 2, kMvChunkBlocks = 8;
  static constexpr bool kScaled = true;
  static constexpr int kRowAlign = 2;
  MOESERVE_QDEC static int unit_run(int, int k) { return k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    uint32_t q[4];
    load16_any(blk + 2, q);
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i) q[i] = nibbles(q[i], r);
    table_floats(q, iq4nl_table(), v);
    return half_bits_to_float(load_u16(blk));
  }
};

// ---- MXFP4: {e, qs[16]}; y = kMxfp4Values[q] * 2^(e - 128) -------------------
// 17-byte blocks: any byte alignment (see the header).

template <>
struct Traits<DType::MXFP4> {
  static constexpr DType kType = DType::MXFP4;
  static constexpr int kBlockElems = 32, kBlockBytes = 17;
  static constexpr int kUnitsPerBlock = 1, kUnitRuns = 2, kMvChunkBlocks = 8;
  static constexpr bool kScaled = true;
  static constexpr int kRowAlign = 1;
  MOESERVE_QDEC static int unit_run(int, int k) { return k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    uint32_t q[4];
    load16_any(blk + 1, q);
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i) q[i] = nibbles(q[i], r);
    table_floats(q, mxfp4_table(), v);
    return mxfp4_block_scale(blk[0]);
  }
};

// ---- IQ4_XS: {d, scales_h (u16), scales_l[4], qs[128]} ----------------------
// Sub-block s (32 elements) has qs[16s..16s+15] in IQ4_NL's nibble order and
// the 6-bit scale ls: low 4 bits at bit 4s of scales_l (as a u32), high 2 at
// bit 2s of scales_h; y = d * (ls - 32) * kIq4nlValues[q]. Run r: s = r/2,
// nibble r%2; a unit is the two runs of one sub-block.

template <>
struct Traits<DType::IQ4_XS> {
  static constexpr DType kType = DType::IQ4_XS;
  static constexpr int kBlockElems = 256, kBlockBytes = 136;
  static constexpr int kUnitsPerBlock = 8, kUnitRuns = 2, kMvChunkBlocks = 1;
  static constexpr bool kScaled = true;
  static constexpr int kRowAlign = 8;
  MOESERVE_QDEC static int unit_run(int u, int k) { return 2 * u + k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    const int s = r >> 1;
    const uint32_t hdr = load_u32(blk), low = load_u32(blk + 4);
    const int ls = int(((low >> (4 * s)) & 15u) | (((hdr >> (16 + 2 * s)) & 3u) << 4));
    uint32_t q[4];
    load16<8>(blk + 8 + 16 * s, q);
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i) q[i] = nibbles(q[i], r & 1);
    table_floats(q, iq4nl_table(), v);
    return half_bits_to_float(hdr) * static_cast<float>(ls - 32);
  }
};

// ---- Q2_K / Q3_K: 16 sub-blocks of 16, so run r is sub-block r ---------------
// Element 128hf + 32t + l has its 2-bit code at bit 2t of qs[32hf + l]: run r
// reads qs bytes 32hf + 16(r%2).. with hf = r/8, t = (r/2)%4. A unit is the
// runs t and t + 2 that share those bytes (Q6_K's pairing).

// Q2_K: {scales[16], qs[64], d, dmin}; y = d * (sc & 15) * q - dmin * (sc >> 4).
template <>
struct Traits<DType::Q2_K> {
  static constexpr DType kType = DType::Q2_K;
  static constexpr int kBlockElems = 256, kBlockBytes = 84;
  static constexpr int kUnitsPerBlock = 8, kUnitRuns = 2, kMvChunkBlocks = 1;
  static constexpr bool kScaled = false;
  static constexpr int kRowAlign = 4;
  MOESERVE_QDEC static int unit_run(int u, int k) { return 2 * (u & ~3) + (u & 3) + 4 * k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    const int hf = r >> 3, t = (r >> 1) & 3;
    uint32_t q[4];
    load16<4>(blk + 16 + 32 * hf + 16 * (r & 1), q);
    const uint32_t dd = load_u32(blk + 80), sc = blk[r];
    const float dsc = half_bits_to_float(dd) * static_cast<float>(sc & 15u);
    const float dm = half_bits_to_float(dd >> 16) * static_cast<float>(sc >> 4);
    float code[16];
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i) bytes_to_floats((q[i] >> (2 * t)) & 0x03030303u, 8388608.0f, code + 4 * i);
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 16; ++i) v[i] = fmaf(code[i], dsc, -dm);
    return 1.0f;
  }
};

// Q3_K: {hmask[32], qs[64], scales[12], d}; y = d * (s - 32) * (q - 4 * !hbit),
// the high bit of element 128hf + 32t + l at bit 4hf + t of hmask[l]; the
// 6-bit scale s of sub-block j: low 4 bits in nibble j/8 of scales[j%8],
// high 2 bits at bit 2(j/4) of scales[8 + j%4] (q3_k_scales).
template <>
struct Traits<DType::Q3_K> {
  static constexpr DType kType = DType::Q3_K;
  static constexpr int kBlockElems = 256, kBlockBytes = 110;
  static constexpr int kUnitsPerBlock = 8, kUnitRuns = 2, kMvChunkBlocks = 1;
  static constexpr bool kScaled = true;
  static constexpr int kRowAlign = 2;
  MOESERVE_QDEC static int unit_run(int u, int k) { return 2 * (u & ~3) + (u & 3) + 4 * k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    const int hf = r >> 3, t = (r >> 1) & 3, side = r & 1;
    uint32_t hm[4], q[4];
    load16_any(blk + 16 * side, hm);
    load16_any(blk + 32 + 32 * hf + 16 * side, q);
    const int hbit = 4 * hf + t;
    // q + 4 = the 2 low bits plus 4 where the high bit is set.
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint32_t bits = ((q[i] >> (2 * t)) & 0x03030303u) | (((hm[i] >> hbit) & 0x01010101u) << 2);
      bytes_to_floats(bits, 8388608.0f + 4.0f, v + 4 * i);
    }
    const uint32_t low = (uint32_t(blk[96 + (r & 7)]) >> (4 * (r >> 3))) & 15u;
    const uint32_t high = (uint32_t(blk[104 + (r & 3)]) >> (2 * (r >> 2))) & 3u;
    return half_bits_to_float(load_u16(blk + 108)) * static_cast<float>(int(low | (high << 4)) - 32);
  }
};

}  // namespace moeserve::cuda::qdec
