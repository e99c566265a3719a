// Device decoding of weight blocks for the matrix-product kernels (matvec,
// gemm, grouped expert products), byte-exact to tensor/quant_blocks.h.
//
// Every type is cut into "runs": 16 consecutive elements of one row. A type's
// Traits decode one run from a pointer to its block (shared or global
// memory) into 16 floats v and a scale a:
//   kScaled types (Q8_0, Q4_0, Q6_K; Q5_0, IQ4_NL, IQ4_XS, MXFP4, Q3_K):
//     element = a * v[i], v the integer code (minus its offset) or table
//     value as an exact float; a = d, d * sc or MXFP4's 2^(e - 128).
//   the others (F32, F16, BF16, Q4_K, Q5_K; Q4_1, Q5_1, Q2_K): v[i] is the
//     element itself (fma(q, d*sc, -dmin*m) or fma(q, d, m), the reference's
//     value up to the FMA).
// Issue 43's types (Q4_1 .. Q3_K above) are in quant_decode_lowbit.cuh, the
// i-quants with codebooks (IQ2_XXS .. IQ1_M, all kScaled: a = the sub-block
// scale, v the signed codebook value) in quant_decode_iquants.cuh.
// The scaled form lets the matrix x vector kernel sum code * x over a run and
// scale once per run instead of once per element.
//
// Codes become floats without the slow int->float converter: a byte b placed
// under the exponent of 2^23 (0x4B0000bb) is the float 2^23 + b exactly, and
// one subtraction (which can also remove the code offset) gives b - offset.
//
// A "unit" groups the runs one lane decodes together because they share the
// loaded bytes (the low and high nibbles of the same Q4_K bytes, say).
// kMvChunkBlocks: the blocks of one row the matrix x vector kernel stages in
// shared memory at a time (about 84-210 bytes, an even number of units; the
// newer types stay small enough for matvec.cu's two stages).
// kRowAlign: the alignment a row (so every block) of the type has: 16 for
// whole 16-byte blocks, else what the block length allows (weight_row_align).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "tensor/dtype.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cuda::qdec {

inline constexpr int kRunLen = 16;

// Host and device: the decoders are also run on the host by the tests that
// check them against the CPU reference without a GPU.
#define MOESERVE_QDEC __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define MOESERVE_QDEC_UNROLL _Pragma("unroll")
#else
#define MOESERVE_QDEC_UNROLL
#endif

MOESERVE_QDEC float bits_as_float(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
#endif
}

// __byte_perm(x, y, s): result byte i = byte (s >> 4i) & 7 of {y:x}.
MOESERVE_QDEC uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t xy = (uint64_t(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((xy >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
#endif
}

// Low word of (hi:lo) >> sh, sh in 0..31.
MOESERVE_QDEC uint32_t funnel_right(uint32_t lo, uint32_t hi, uint32_t sh) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(lo, hi, sh);
#else
  return uint32_t(((uint64_t(hi) << 32) | lo) >> sh);
#endif
}

MOESERVE_QDEC float half_bits_to_float(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFFu)));
}

// 2^23 + byte k of w, exactly.
template <int k>
MOESERVE_QDEC float magic_byte(uint32_t w) {
  return bits_as_float(byte_perm(w, 0x4B000000u, 0x7440u | k));
}

// The 4 bytes of w as floats, minus `offset` (2^23 + code offset).
MOESERVE_QDEC void bytes_to_floats(uint32_t w, float offset, float* out) {
  out[0] = magic_byte<0>(w) - offset;
  out[1] = magic_byte<1>(w) - offset;
  out[2] = magic_byte<2>(w) - offset;
  out[3] = magic_byte<3>(w) - offset;
}

// 16 bytes from a 16-byte aligned address.
MOESERVE_QDEC void load16_aligned(const uint8_t* p, uint32_t w[4]) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
}

// 16 bytes from any address (the 2-byte aligned blocks of Q8_0, Q4_0, Q6_K,
// and MXFP4's at any byte): aligned words, then funnel shifts by the byte
// offset. Never reads a word that holds none of the 16 bytes, so reading the
// last bytes of an allocation is safe.
MOESERVE_QDEC void load16_any(const uint8_t* p, uint32_t w[4]) {
  const uint32_t mis = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p)) & 3u;
  const uint32_t* base = reinterpret_cast<const uint32_t*>(p - mis);
  const uint32_t v0 = base[0], v1 = base[1], v2 = base[2], v3 = base[3];
  const uint32_t v4 = base[mis != 0 ? 4 : 3];
  const uint32_t sh = mis * 8;
  w[0] = funnel_right(v0, v1, sh);
  w[1] = funnel_right(v1, v2, sh);
  w[2] = funnel_right(v2, v3, sh);
  w[3] = funnel_right(v3, v4, sh);
}

MOESERVE_QDEC uint32_t load_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

template <DType T>
struct Traits;

// ---- float types: a virtual block of one run -------------------------------

template <>
struct Traits<DType::F32> {
  static constexpr DType kType = DType::F32;
  static constexpr int kBlockElems = 16, kBlockBytes = 64;
  static constexpr int kUnitsPerBlock = 1, kUnitRuns = 1, kMvChunkBlocks = 2;
  static constexpr bool kScaled = false;
  static constexpr int kRowAlign = 16;
  MOESERVE_QDEC static int unit_run(int, int) { return 0; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int, float v[16]) {
MOESERVE_QDEC_UNROLL
    for (int q = 0; q < 4; ++q) {
      const float4 f = reinterpret_cast<const float4*>(blk)[q];
      v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
    return 1.0f;
  }
};

template <>
struct Traits<DType::F16> {
  static constexpr DType kType = DType::F16;
  static constexpr int kBlockElems = 16, kBlockBytes = 32;
  static constexpr int kUnitsPerBlock = 1, kUnitRuns = 1, kMvChunkBlocks = 4;
  static constexpr bool kScaled = false;
  static constexpr int kRowAlign = 16;
  MOESERVE_QDEC static int unit_run(int, int) { return 0; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int, float v[16]) {
    uint32_t w[8];
    load16_aligned(blk, w);
    load16_aligned(blk + 16, w + 4);
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 8; ++i) {
      v[2 * i] = half_bits_to_float(w[i]);
      v[2 * i + 1] = half_bits_to_float(w[i] >> 16);
    }
    return 1.0f;
  }
};

template <>
struct Traits<DType::BF16> {
  static constexpr DType kType = DType::BF16;
  static constexpr int kBlockElems = 16, kBlockBytes = 32;
  static constexpr int kUnitsPerBlock = 1, kUnitRuns = 1, kMvChunkBlocks = 4;
  static constexpr bool kScaled = false;
  static constexpr int kRowAlign = 16;
  MOESERVE_QDEC static int unit_run(int, int) { return 0; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int, float v[16]) {
    uint32_t w[8];
    load16_aligned(blk, w);
    load16_aligned(blk + 16, w + 4);
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 8; ++i) {
      v[2 * i] = bits_as_float(w[i] << 16);
      v[2 * i + 1] = bits_as_float(w[i] & 0xFFFF0000u);
    }
    return 1.0f;
  }
};

// ---- Q8_0: d (f16), 32 int8 codes; run r = codes 16r..16r+15 ----------------

template <>
struct Traits<DType::Q8_0> {
  static constexpr DType kType = DType::Q8_0;
  static constexpr int kBlockElems = 32, kBlockBytes = 34;
  static constexpr int kUnitsPerBlock = 2, kUnitRuns = 1, kMvChunkBlocks = 4;
  static constexpr bool kScaled = true;
  static constexpr int kRowAlign = 2;
  MOESERVE_QDEC static int unit_run(int u, int) { return u; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    uint32_t w[4];
    load16_any(blk + 2 + 16 * r, w);
    // Flip the sign bits: the bytes become code + 128 in 0..255.
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i) bytes_to_floats(w[i] ^ 0x80808080u, 8388608.0f + 128.0f, v + 4 * i);
    return half_bits_to_float(load_u16(blk));
  }
};

// ---- Q4_0: d (f16), 16 bytes; low nibbles elements 0..15, high 16..31 -------

template <>
struct Traits<DType::Q4_0> {
  static constexpr DType kType = DType::Q4_0;
  static constexpr int kBlockElems = 32, kBlockBytes = 18;
  static constexpr int kUnitsPerBlock = 1, kUnitRuns = 2, kMvChunkBlocks = 8;
  static constexpr bool kScaled = true;
  static constexpr int kRowAlign = 2;
  MOESERVE_QDEC static int unit_run(int, int k) { return k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    uint32_t w[4];
    load16_any(blk + 2, w);
    const int shift = 4 * r;
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i) bytes_to_floats((w[i] >> shift) & 0x0F0F0F0Fu, 8388608.0f + 8.0f, v + 4 * i);
    return half_bits_to_float(load_u16(blk));
  }
};

// ---- Q4_K / Q5_K -------------------------------------------------------------
// Element e of the block: chunk c = e/64 uses qs[32c + e%32], low nibble for
// (e%64) < 32; sub-block j = e/32 (= 2c + side) has 6-bit (sc, m). Run r
// (elements 16r..16r+15): c = r/4, side = (r/2)%2, bytes 16*(r%2) of the chunk.
// A unit is the two runs that share bytes: (c, h) -> runs 4c+h and 4c+2+h.

// (d*sc_j, dmin*m_j) of sub-block j from the 16-byte header {d, dmin, scales}.
MOESERVE_QDEC void k_scale_min(const uint32_t hdr[4], int j, float* dsc, float* dm) {
  const int jj = j & 3, sh = 8 * jj;
  const uint32_t by = (hdr[1] >> sh) & 0xFFu;  // scales[jj]
  const uint32_t bz = (hdr[2] >> sh) & 0xFFu;  // scales[4 + jj]
  const uint32_t bw = (hdr[3] >> sh) & 0xFFu;  // scales[8 + jj]
  uint32_t sc, m;
  if (j < 4) {
    sc = by & 63u, m = bz & 63u;
  } else {
    sc = (bw & 0xFu) | ((by >> 6) << 4), m = (bw >> 4) | ((bz >> 6) << 4);
  }
  *dsc = half_bits_to_float(hdr[0]) * static_cast<float>(sc);
  *dm = half_bits_to_float(hdr[0] >> 16) * static_cast<float>(m);
}

template <>
struct Traits<DType::Q4_K> {
  static constexpr DType kType = DType::Q4_K;
  static constexpr int kBlockElems = 256, kBlockBytes = 144;
  static constexpr int kUnitsPerBlock = 8, kUnitRuns = 2, kMvChunkBlocks = 1;
  static constexpr bool kScaled = false;
  static constexpr int kRowAlign = 16;
  MOESERVE_QDEC static int unit_run(int u, int k) { return 4 * (u >> 1) + (u & 1) + 2 * k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    const int c = r >> 2, side = (r >> 1) & 1;
    uint32_t hdr[4], q[4];
    load16_aligned(blk, hdr);
    load16_aligned(blk + 16 + 32 * c + 16 * (r & 1), q);
    float dsc, dm;
    k_scale_min(hdr, 2 * c + side, &dsc, &dm);
    float code[16];
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i) bytes_to_floats((q[i] >> (4 * side)) & 0x0F0F0F0Fu, 8388608.0f, code + 4 * i);
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 16; ++i) v[i] = fmaf(code[i], dsc, -dm);
    return 1.0f;
  }
};

// As Q4_K, plus bit j of qh[l] (l = e%32) as bit 4 of the code; layout
// {d, dmin, scales[12], qh[32], qs[128]}.
template <>
struct Traits<DType::Q5_K> {
  static constexpr DType kType = DType::Q5_K;
  static constexpr int kBlockElems = 256, kBlockBytes = 176;
  static constexpr int kUnitsPerBlock = 8, kUnitRuns = 2, kMvChunkBlocks = 1;
  static constexpr bool kScaled = false;
  static constexpr int kRowAlign = 16;
  MOESERVE_QDEC static int unit_run(int u, int k) { return 4 * (u >> 1) + (u & 1) + 2 * k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    const int c = r >> 2, side = (r >> 1) & 1, j = 2 * c + side;
    uint32_t hdr[4], q[4], h[4];
    load16_aligned(blk, hdr);
    load16_aligned(blk + 16 + 16 * (r & 1), h);
    load16_aligned(blk + 48 + 32 * c + 16 * (r & 1), q);
    float dsc, dm;
    k_scale_min(hdr, j, &dsc, &dm);
    float code[16];
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint32_t bits = ((q[i] >> (4 * side)) & 0x0F0F0F0Fu) | (((h[i] >> j) & 0x01010101u) << 4);
      bytes_to_floats(bits, 8388608.0f, code + 4 * i);
    }
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 16; ++i) v[i] = fmaf(code[i], dsc, -dm);
    return 1.0f;
  }
};

// ---- Q6_K: {ql[128], qh[64], scales[16] (int8), d}; element 128*hf + 32*t + l
// has its low 4 bits in ql[64hf + l + 32(t&1)] (nibble t/2), its high 2 bits
// in bits 2t of qh[32hf + l], and scale scales[8hf + l/16 + 2t]. Run r:
// hf = r/8, t = (r/2)%4, l = 16*(r%2)..+15. A unit is the two runs t, t+2
// that share their ql and qh bytes.
template <>
struct Traits<DType::Q6_K> {
  static constexpr DType kType = DType::Q6_K;
  static constexpr int kBlockElems = 256, kBlockBytes = 210;
  static constexpr int kUnitsPerBlock = 8, kUnitRuns = 2, kMvChunkBlocks = 1;
  static constexpr bool kScaled = true;
  static constexpr int kRowAlign = 2;
  MOESERVE_QDEC static int unit_run(int u, int k) { return 2 * (u & ~3) + (u & 3) + 4 * k; }
  MOESERVE_QDEC static float decode(const uint8_t* blk, int r, float v[16]) {
    const int hf = r >> 3, t = (r >> 1) & 3, h = r & 1;
    uint32_t ql[4], qh[4];
    load16_any(blk + 64 * hf + 32 * (t & 1) + 16 * h, ql);
    load16_any(blk + 128 + 32 * hf + 16 * h, qh);
    const int lo_shift = 4 * (t >> 1), hi_shift = 2 * t;
MOESERVE_QDEC_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint32_t bits = ((ql[i] >> lo_shift) & 0x0F0F0F0Fu) | (((qh[i] >> hi_shift) & 0x03030303u) << 4);
      bytes_to_floats(bits, 8388608.0f + 32.0f, v + 4 * i);
    }
    const int8_t sc = static_cast<int8_t>(blk[192 + 8 * hf + h + 2 * t]);
    return half_bits_to_float(load_u16(blk + 208)) * static_cast<float>(sc);
  }
};

}  // namespace moeserve::cuda::qdec

#include "kernels/cuda/quant_decode_lowbit.cuh"    // IWYU pragma: export
#include "kernels/cuda/quant_decode_iquants.cuh"  // IWYU pragma: export
