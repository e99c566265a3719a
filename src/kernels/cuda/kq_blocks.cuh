// The block math of gemm_kq.cu's integer kernel, one type at a time: how a
// warp turns two staged weight rows (g and g + 8 of its 16-row MMA tile) of
// one 256-column block and the staged Q8_K activation rows of its tokens
// into the block's float results, with the reference CPU kernel's own
// operations in its own order (kernels/cpu/ref/quant_ref.cpp and
// quant_ref_lowbit.cpp), so that a row's result is bit for bit the CPU's:
//  - the code products of each scale group are summed exactly in int32 by an
//    s8 MMA (m16n8k32 for 32-column groups, m16n8k16 for 16-column ones);
//  - the groups' sums are scaled by the integer scales in int32 (exact, as
//    the CPU's integer sums are);
//  - the block's float is formed once, as the CPU forms it, and added to the
//    running f32 total (no contraction: __fmul_rn / __fadd_rn).
// Types: Q4_K, Q5_K, Q6_K, and (issue 43) Q2_K, Q3_K, IQ4_XS.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/tc_decode.cuh"
#include "tensor/dtype.h"

namespace moeserve::cuda::detail::kq {

// ---- integer MMAs -----------------------------------------------------------
// A fragments (PTX .s8): a0 row g, a1 row g + 8, columns 4j..4j+3 of the
// group (j = lane % 4); m16n8k32 adds a2, a3: columns 16 + 4j... The B
// fragment: token g's codes of the same columns. Result c0, c1: row g,
// tokens 2j and 2j + 1; c2, c3: row g + 8.
__device__ __forceinline__ void mma_k32(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
__device__ __forceinline__ void mma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

// c += the product (the int32 sums accumulate in the MMA).
__device__ __forceinline__ void mma_k16_acc(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ uint32_t lds32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ __forceinline__ float f16_at(const uint8_t* p) {
  return qdec::half_bits_to_float(*reinterpret_cast<const uint16_t*>(p));
}

// ---- Q8_K activation rows ---------------------------------------------------
// Row r's 256-column block: 256 codes; the 8 sums of 32 codes (the K-quant
// mins) as sum = 64 hi + lo, hi (-64..63) and lo (0..63) bytes, so that the
// mins' products are one more integer MMA; d (f32); padding. The staged
// stride (76 words) puts the B fragment loads of 8 rows in distinct banks.
constexpr int kQ8Bytes = 304;
constexpr int kQ8SumHi = 256, kQ8SumLo = 264, kQ8D = 272;
constexpr int kQ8Pieces = kQ8Bytes / 16;

// Q8_K row of token t of the tile: a callable returning its staged bytes.
template <class XRow>
__device__ __forceinline__ float x_scale(XRow xr, int t) {
  return *reinterpret_cast<const float*>(xr(t) + kQ8D);
}

// Per-type results of one block: acc[nt][e] += the block's float for row g
// (e = 0, 1: tokens 8nt + 2j, + 1) and row g + 8 (e = 2, 3).
template <int kNt>
using Acc = float[kNt][4];

// acc += (x.d * d) * total, as the CPU (Q6_K, Q3_K, IQ4_XS: left to right).
template <int kNt, class XRow>
__device__ __forceinline__ void add_scaled(Acc<kNt>& acc, const int (&total)[kNt][4], float d0, float d8,
                                           XRow xr, int j) {
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    const float xd0 = x_scale(xr, 8 * nt + 2 * j), xd1 = x_scale(xr, 8 * nt + 2 * j + 1);
    acc[nt][0] = __fadd_rn(acc[nt][0], __fmul_rn(__fmul_rn(xd0, d0), float(total[nt][0])));
    acc[nt][1] = __fadd_rn(acc[nt][1], __fmul_rn(__fmul_rn(xd1, d0), float(total[nt][1])));
    acc[nt][2] = __fadd_rn(acc[nt][2], __fmul_rn(__fmul_rn(xd0, d8), float(total[nt][2])));
    acc[nt][3] = __fadd_rn(acc[nt][3], __fmul_rn(__fmul_rn(xd1, d8), float(total[nt][3])));
  }
}

// acc += x.d * (d * scaled - dmin * mins), as the CPU (Q4_K, Q5_K, Q2_K).
template <int kNt, class XRow>
__device__ __forceinline__ void add_affine(Acc<kNt>& acc, const int (&scaled)[kNt][4],
                                           const int (&mins)[kNt][4], const float (&d)[2],
                                           const float (&dmin)[2], XRow xr, int j) {
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    const float xd[2] = {x_scale(xr, 8 * nt + 2 * j), x_scale(xr, 8 * nt + 2 * j + 1)};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float blk = __fmul_rn(xd[e & 1], __fsub_rn(__fmul_rn(d[e >> 1], float(scaled[nt][e])),
                                                       __fmul_rn(dmin[e >> 1], float(mins[nt][e]))));
      acc[nt][e] = __fadd_rn(acc[nt][e], blk);
    }
  }
}

// total[nt][0..1] += c * s0 (row g), [2..3] += c * s8 (row g + 8).
template <int kNt>
__device__ __forceinline__ void add_group(int (&total)[kNt][4], int nt, const int (&c)[4], int s0, int s8) {
  total[nt][0] += c[0] * s0, total[nt][1] += c[1] * s0;
  total[nt][2] += c[2] * s8, total[nt][3] += c[3] * s8;
}

template <int kNt>
__device__ __forceinline__ void zero(int (&v)[kNt][4]) {
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) v[nt][0] = v[nt][1] = v[nt][2] = v[nt][3] = 0;
}

template <DType T>
struct Block;

// ---- Q4_K / Q5_K: {d, dmin, scales[12], (qh[32],) qs[128]} ------------------
// Group G's code l is nibble G%2 of qs[32(G/2) + l] (plus bit G of qh[l] as
// bit 4 for Q5_K); 6-bit scales and mins (the CPU's k_scale_min).
template <bool kHigh>
__device__ __forceinline__ uint32_t affine_codes(const uint8_t* blk, int G, int l0) {
  constexpr int kQs = kHigh ? 48 : 16;
  uint32_t c = (lds32(blk + kQs + 32 * (G >> 1) + l0) >> (4 * (G & 1))) & 0x0F0F0F0Fu;
  if constexpr (kHigh) c |= ((lds32(blk + 16 + l0) >> G) & 0x01010101u) << 4;
  return c;
}

// The scales and mins of a block's 8 groups, a byte each: word 0 groups
// 0..3, word 1 groups 4..7.
struct GroupScales {
  uint32_t sc[2], m[2];
};
__device__ __forceinline__ GroupScales group_scales(const uint8_t* blk) {
  const uint32_t w0 = lds32(blk + 4), w1 = lds32(blk + 8), w2 = lds32(blk + 12);
  GroupScales g;
  g.sc[0] = w0 & 0x3F3F3F3Fu;
  g.m[0] = w1 & 0x3F3F3F3Fu;
  g.sc[1] = (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);
  g.m[1] = ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
  return g;
}
__device__ __forceinline__ int group_byte(const uint32_t (&w)[2], int G) {
  return int((w[G >> 2] >> (8 * (G & 3))) & 0xFFu);
}

template <bool kHigh>
struct AffineK {
  template <int kNt, class XRow>
  __device__ __forceinline__ static void dot(const uint8_t* rg, const uint8_t* rg8, XRow xr, int g, int j,
                                             Acc<kNt>& acc) {
    int scaled[kNt][4];
    zero(scaled);
    const GroupScales gs0 = group_scales(rg), gs8 = group_scales(rg8);
#pragma unroll
    for (int G = 0; G < 8; ++G) {
      const uint32_t a[4] = {affine_codes<kHigh>(rg, G, 4 * j), affine_codes<kHigh>(rg8, G, 4 * j),
                             affine_codes<kHigh>(rg, G, 16 + 4 * j), affine_codes<kHigh>(rg8, G, 16 + 4 * j)};
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        const uint8_t* xq = xr(8 * nt + g) + 32 * G + 4 * j;
        int c[4];
        mma_k32(c, a, lds32(xq), lds32(xq + 16));
        add_group(scaled, nt, c, group_byte(gs0.sc, G), group_byte(gs8.sc, G));
      }
    }
    // mins = sum over G of m_G * xsum_G: K = 8 (lanes j = 2, 3 hold zero A
    // columns), xsum = 64 hi + lo, as two MMAs.
    const uint32_t am0 = j == 0 ? gs0.m[0] : j == 1 ? gs0.m[1] : 0u;
    const uint32_t am8 = j == 0 ? gs8.m[0] : j == 1 ? gs8.m[1] : 0u;
    int mins[kNt][4];
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      const uint8_t* xg = xr(8 * nt + g);
      int hi[4], lo[4];
      mma_k16(hi, am0, am8, lds32(xg + kQ8SumHi + 4 * j));
      mma_k16(lo, am0, am8, lds32(xg + kQ8SumLo + 4 * j));
#pragma unroll
      for (int e = 0; e < 4; ++e) mins[nt][e] = 64 * hi[e] + lo[e];
    }
    const float d[2] = {f16_at(rg), f16_at(rg8)}, dmin[2] = {f16_at(rg + 2), f16_at(rg8 + 2)};
    add_affine(acc, scaled, mins, d, dmin, xr, j);
  }
};
template <>
struct Block<DType::Q4_K> : AffineK<false> {};
template <>
struct Block<DType::Q5_K> : AffineK<true> {};

// ---- Q6_K: {ql[128], qh[64], scales[16] (int8), d} ---------------------------
// 16 groups of 16 columns: group q = 8hf + 2t + s, codes l = 16s + .. of
// quarter t of half hf (tc_decode.cuh's Tc<Q6_K>), minus 32. Rows are 2-byte
// aligned.
template <>
struct Block<DType::Q6_K> {
  template <int kNt, class XRow>
  __device__ __forceinline__ static void dot(const uint8_t* rg, const uint8_t* rg8, XRow xr, int g, int j,
                                             Acc<kNt>& acc) {
    int total[kNt][4];
    zero(total);
#pragma unroll
    for (int q = 0; q < 16; ++q) {
      const int hf = q >> 3, t = (q >> 1) & 3, s = q & 1;
      uint32_t codes[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint8_t* row = r == 0 ? rg : rg8;
        const uint32_t ql = tcdec::ld32_2(row + 64 * hf + 32 * (t & 1) + 16 * s + 4 * j);
        const uint32_t qh = tcdec::ld32_2(row + 128 + 32 * hf + 16 * s + 4 * j);
        const uint32_t c = ((ql >> (4 * (t >> 1))) & 0x0F0F0F0Fu) | (((qh >> (2 * t)) & 0x03030303u) << 4);
        codes[r] = __vsub4(c, 0x20202020u);
      }
      const int sc0 = int(int8_t(rg[192 + q])), sc8 = int(int8_t(rg8[192 + q]));
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        int c[4];
        mma_k16(c, codes[0], codes[1], lds32(xr(8 * nt + g) + 16 * q + 4 * j));
        add_group(total, nt, c, sc0, sc8);
      }
    }
    add_scaled(acc, total, f16_at(rg + 208), f16_at(rg8 + 208), xr, j);
  }
};

// ---- Q2_K: {scales[16], qs[64], d, dmin} --------------------------------------
// Element 128h + 32t + l: bits 2t..2t+1 of qs[32h + l]; group q = 8h + 2t + s
// (l = 16s..16s+15): scale scales[q] & 15, min scales[q] >> 4. The CPU sums
// the mins against Q8_K's 16-column sums (bsums); here the min byte,
// repeated, is the A operand of one more MMA over the same codes of x: the
// same integer. Rows are 4-byte aligned.
template <>
struct Block<DType::Q2_K> {
  template <int kNt, class XRow>
  __device__ __forceinline__ static void dot(const uint8_t* rg, const uint8_t* rg8, XRow xr, int g, int j,
                                             Acc<kNt>& acc) {
    int scaled[kNt][4], mins[kNt][4];
    zero(scaled);
    zero(mins);
#pragma unroll
    for (int q = 0; q < 16; ++q) {
      const int h = q >> 3, t = (q >> 1) & 3, s = q & 1;
      const int off = 16 + 32 * h + 16 * s + 4 * j;
      const uint32_t c0 = (lds32(rg + off) >> (2 * t)) & 0x03030303u;
      const uint32_t c8 = (lds32(rg8 + off) >> (2 * t)) & 0x03030303u;
      const int b0 = rg[q], b8 = rg8[q];
      const uint32_t m0 = uint32_t(b0 >> 4) * 0x01010101u, m8 = uint32_t(b8 >> 4) * 0x01010101u;
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        const uint32_t xb = lds32(xr(8 * nt + g) + 16 * q + 4 * j);
        int c[4];
        mma_k16(c, c0, c8, xb);
        mma_k16_acc(mins[nt], m0, m8, xb);
        add_group(scaled, nt, c, b0 & 15, b8 & 15);
      }
    }
    const float d[2] = {f16_at(rg + 80), f16_at(rg8 + 80)}, dmin[2] = {f16_at(rg + 82), f16_at(rg8 + 82)};
    add_affine(acc, scaled, mins, d, dmin, xr, j);
  }
};

// ---- Q3_K: {hmask[32], qs[64], scales[12], d} ---------------------------------
// Element 128h + 32t + l: low bits 2t of qs[32h + l], minus 4 where bit
// 4h + t of hmask[l] is clear; group q = 8h + 2t + s: scale s_q - 32 with the
// 6-bit s_q packed as tensor/quant_blocks.h's q3_k_scales. Rows are 2-byte
// aligned.
__device__ __forceinline__ int q3_k_scale(const uint8_t* row, int q) {
  const int low = q < 8 ? row[96 + q] & 15 : row[96 + q - 8] >> 4;
  const int high = (row[104 + (q & 3)] >> (2 * (q >> 2))) & 3;
  return (low | (high << 4)) - 32;
}

template <>
struct Block<DType::Q3_K> {
  template <int kNt, class XRow>
  __device__ __forceinline__ static void dot(const uint8_t* rg, const uint8_t* rg8, XRow xr, int g, int j,
                                             Acc<kNt>& acc) {
    int total[kNt][4];
    zero(total);
#pragma unroll
    for (int q = 0; q < 16; ++q) {
      const int h = q >> 3, t = (q >> 1) & 3, s = q & 1;
      uint32_t codes[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint8_t* row = r == 0 ? rg : rg8;
        const uint32_t low = (tcdec::ld32_2(row + 32 + 32 * h + 16 * s + 4 * j) >> (2 * t)) & 0x03030303u;
        const uint32_t high = (tcdec::ld32_2(row + 16 * s + 4 * j) >> (4 * h + t)) & 0x01010101u;
        codes[r] = __vsub4(low, (high ^ 0x01010101u) << 2);
      }
      const int sc0 = q3_k_scale(rg, q), sc8 = q3_k_scale(rg8, q);
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        int c[4];
        mma_k16(c, codes[0], codes[1], lds32(xr(8 * nt + g) + 16 * q + 4 * j));
        add_group(total, nt, c, sc0, sc8);
      }
    }
    add_scaled(acc, total, f16_at(rg + 108), f16_at(rg8 + 108), xr, j);
  }
};

// ---- IQ4_XS: {d, scales_h (u16), scales_l[4], qs[128]} --------------------------
// Group G (32 columns): qs[16G + l] low nibble is column l, high nibble
// column 16 + l, each an index into kIq4nlValues (int8); scale ls - 32 with
// ls = nibble G%2 of scales_l[G/2] | bits 2G of scales_h << 4. Rows are
// 8-byte aligned.
__device__ __forceinline__ int iq4_xs_scale(const uint8_t* row, int G) {
  const int scales_h = *reinterpret_cast<const uint16_t*>(row + 2);
  return (((row[4 + (G >> 1)] >> (4 * (G & 1))) & 15) | (((scales_h >> (2 * G)) & 3) << 4)) - 32;
}

template <>
struct Block<DType::IQ4_XS> {
  template <int kNt, class XRow>
  __device__ __forceinline__ static void dot(const uint8_t* rg, const uint8_t* rg8, XRow xr, int g, int j,
                                             Acc<kNt>& acc) {
    constexpr qdec::Table16 kValues = qdec::iq4nl_table();
    int total[kNt][4];
    zero(total);
#pragma unroll
    for (int G = 0; G < 8; ++G) {
      const uint32_t w0 = lds32(rg + 8 + 16 * G + 4 * j), w8 = lds32(rg8 + 8 + 16 * G + 4 * j);
      const uint32_t a[4] = {qdec::table_lookup4(w0 & 0x0F0F0F0Fu, kValues),
                             qdec::table_lookup4(w8 & 0x0F0F0F0Fu, kValues),
                             qdec::table_lookup4((w0 >> 4) & 0x0F0F0F0Fu, kValues),
                             qdec::table_lookup4((w8 >> 4) & 0x0F0F0F0Fu, kValues)};
      const int sc0 = iq4_xs_scale(rg, G), sc8 = iq4_xs_scale(rg8, G);
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        const uint8_t* xq = xr(8 * nt + g) + 32 * G + 4 * j;
        int c[4];
        mma_k32(c, a, lds32(xq), lds32(xq + 16));
        add_group(total, nt, c, sc0, sc8);
      }
    }
    add_scaled(acc, total, f16_at(rg), f16_at(rg8), xr, j);
  }
};

// The types whose results are bit for bit the reference CPU kernels'.
constexpr bool kq_cpu_exact_type(DType t) {
  return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q2_K || t == DType::Q3_K ||
         t == DType::IQ4_XS;
}

}  // namespace moeserve::cuda::detail::kq
