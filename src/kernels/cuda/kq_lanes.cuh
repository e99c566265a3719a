// The block math of gemm_kq.cu's integer kernel (kq_blocks.cuh,
// kq_blocks_iquants.cuh) for one lane of kq_vec.cu's one-token kernel:
// the lane takes a quarter of one row's 256-column block (columns
// 64k..64k+63) and forms its integer sums with dp4a, four lanes add theirs
// (integers: any order gives the same sum), and one lane forms the block's
// float exactly as the MMA kernel forms it (add_scaled / add_affine: the
// same operations, no contraction). The per-block floats, added in block
// order from 0, are then the MMA kernel's bits: a pair's result is the same
// on either kernel, which speculative verify (many tokens, the MMA kernel)
// needs against decode (one token, here).
// The codes are those of each type's Block<T>::dot, read from global memory
// instead of the staged copy (same offsets, same helpers).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kq_blocks_iquants.cuh"

namespace moeserve::cuda::detail::kq {

// A lane's (then, summed, a block's) integer sums: the scale-weighted code
// products, and for the affine types (Q4_K, Q5_K, Q2_K) the min-weighted
// activation sums.
struct LaneSums {
  int scaled = 0, mins = 0;
};

__device__ __forceinline__ int dp4a(uint32_t a, uint32_t b, int c) { return __dp4a(int(a), int(b), c); }

// The 4 lanes of a quad (one block) add their sums.
__device__ __forceinline__ LaneSums quad_sum(LaneSums s) {
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    s.scaled += __shfl_xor_sync(kFull, s.scaled, o);
    s.mins += __shfl_xor_sync(kFull, s.mins, o);
  }
  return s;
}

// add_scaled's block float: (x.d * d) * total.
__device__ __forceinline__ float scaled_float(float xd, float d, const LaneSums& s) {
  return __fmul_rn(__fmul_rn(xd, d), float(s.scaled));
}
// add_affine's: x.d * (d * scaled - dmin * mins).
__device__ __forceinline__ float affine_float(float xd, float d, float dmin, const LaneSums& s) {
  return __fmul_rn(xd, __fsub_rn(__fmul_rn(d, float(s.scaled)), __fmul_rn(dmin, float(s.mins))));
}

// Q8_K group G's activation sum (32 columns), as staged: 64 hi + lo.
__device__ __forceinline__ int x_group_sum(const uint8_t* xq, int G) {
  return 64 * int(int8_t(xq[kQ8SumHi + G])) + int(xq[kQ8SumLo + G]);
}

template <DType T>
struct Lane;

// ---- Q4_K / Q5_K: groups 2k (low nibbles of qs[32k..]) and 2k + 1 (high).
template <bool kHigh>
struct AffineLane {
  __device__ __forceinline__ static LaneSums sums(const uint8_t* blk, const uint8_t* xq, int k) {
    const GroupScales gs = group_scales(blk);
    LaneSums s;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int G = 2 * k + h;
      int dot = 0;
#pragma unroll
      for (int l0 = 0; l0 < 32; l0 += 4)
        dot = dp4a(affine_codes<kHigh>(blk, G, l0), lds32(xq + 32 * G + l0), dot);
      s.scaled += group_byte(gs.sc, G) * dot;
      s.mins += group_byte(gs.m, G) * x_group_sum(xq, G);
    }
    return s;
  }
  __device__ __forceinline__ static float block_float(const uint8_t* blk, float xd, const LaneSums& s) {
    return affine_float(xd, f16_at(blk), f16_at(blk + 2), s);
  }
};
template <>
struct Lane<DType::Q4_K> : AffineLane<false> {};
template <>
struct Lane<DType::Q5_K> : AffineLane<true> {};

// ---- 16-column groups q = 4k..4k+3 (Q6_K, Q2_K, Q3_K): the word of group
// q's columns 4j..4j+3 as Block<T>::dot decodes it.
template <>
struct Lane<DType::Q6_K> {
  __device__ __forceinline__ static LaneSums sums(const uint8_t* blk, const uint8_t* xq, int k) {
    LaneSums s;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = 4 * k + i, hf = q >> 3, t = (q >> 1) & 3, sh = q & 1;
      int dot = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t ql = tcdec::ld32_2(blk + 64 * hf + 32 * (t & 1) + 16 * sh + 4 * j);
        const uint32_t qh = tcdec::ld32_2(blk + 128 + 32 * hf + 16 * sh + 4 * j);
        const uint32_t c = ((ql >> (4 * (t >> 1))) & 0x0F0F0F0Fu) | (((qh >> (2 * t)) & 0x03030303u) << 4);
        dot = dp4a(__vsub4(c, 0x20202020u), lds32(xq + 16 * q + 4 * j), dot);
      }
      s.scaled += int(int8_t(blk[192 + q])) * dot;
    }
    return s;
  }
  __device__ __forceinline__ static float block_float(const uint8_t* blk, float xd, const LaneSums& s) {
    return scaled_float(xd, f16_at(blk + 208), s);
  }
};

template <>
struct Lane<DType::Q2_K> {
  __device__ __forceinline__ static LaneSums sums(const uint8_t* blk, const uint8_t* xq, int k) {
    LaneSums s;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = 4 * k + i, h = q >> 3, t = (q >> 1) & 3, sh = q & 1;
      int dot = 0, xsum = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t c = (lds32(blk + 16 + 32 * h + 16 * sh + 4 * j) >> (2 * t)) & 0x03030303u;
        const uint32_t x = lds32(xq + 16 * q + 4 * j);
        dot = dp4a(c, x, dot);
        xsum = dp4a(0x01010101u, x, xsum);
      }
      const int b = blk[q];
      s.scaled += (b & 15) * dot;
      s.mins += (b >> 4) * xsum;
    }
    return s;
  }
  __device__ __forceinline__ static float block_float(const uint8_t* blk, float xd, const LaneSums& s) {
    return affine_float(xd, f16_at(blk + 80), f16_at(blk + 82), s);
  }
};

template <>
struct Lane<DType::Q3_K> {
  __device__ __forceinline__ static LaneSums sums(const uint8_t* blk, const uint8_t* xq, int k) {
    LaneSums s;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = 4 * k + i, h = q >> 3, t = (q >> 1) & 3, sh = q & 1;
      int dot = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t low = (tcdec::ld32_2(blk + 32 + 32 * h + 16 * sh + 4 * j) >> (2 * t)) & 0x03030303u;
        const uint32_t high = (tcdec::ld32_2(blk + 16 * sh + 4 * j) >> (4 * h + t)) & 0x01010101u;
        dot = dp4a(__vsub4(low, (high ^ 0x01010101u) << 2), lds32(xq + 16 * q + 4 * j), dot);
      }
      s.scaled += q3_k_scale(blk, q) * dot;
    }
    return s;
  }
  __device__ __forceinline__ static float block_float(const uint8_t* blk, float xd, const LaneSums& s) {
    return scaled_float(xd, f16_at(blk + 108), s);
  }
};

// ---- IQ4_XS: groups 2k, 2k + 1 (32 columns; low nibbles columns 0..15).
template <>
struct Lane<DType::IQ4_XS> {
  __device__ __forceinline__ static LaneSums sums(const uint8_t* blk, const uint8_t* xq, int k) {
    constexpr qdec::Table16 kValues = qdec::iq4nl_table();
    LaneSums s;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int G = 2 * k + h;
      int dot = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t w = lds32(blk + 8 + 16 * G + 4 * j);
        dot = dp4a(qdec::table_lookup4(w & 0x0F0F0F0Fu, kValues), lds32(xq + 32 * G + 4 * j), dot);
        dot =
            dp4a(qdec::table_lookup4((w >> 4) & 0x0F0F0F0Fu, kValues), lds32(xq + 32 * G + 16 + 4 * j), dot);
      }
      s.scaled += iq4_xs_scale(blk, G) * dot;
    }
    return s;
  }
  __device__ __forceinline__ static float block_float(const uint8_t* blk, float xd, const LaneSums& s) {
    return scaled_float(xd, f16_at(blk), s);
  }
};

// ---- the codebook i-quants: runs r = 4k..4k+3 (16 columns: groups 2r, 2r + 1).
template <DType T>
struct IqLane {
  __device__ __forceinline__ static LaneSums sums(const uint8_t* blk, const uint8_t* xq, int k) {
    LaneSums s;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 4 * k + i;
      uint32_t c[4];
      qdec::iq_codes8<T>(blk, 2 * r, c[0], c[1]);
      qdec::iq_codes8<T>(blk, 2 * r + 1, c[2], c[3]);
      int dot = 0;
#pragma unroll
      for (int w = 0; w < 4; ++w) dot = dp4a(c[w], lds32(xq + 16 * r + 4 * w), dot);
      s.scaled += qdec::IqInt<T>::iscale(blk, r) * dot;
    }
    return s;
  }
  __device__ __forceinline__ static float block_float(const uint8_t* blk, float xd, const LaneSums& s) {
    return scaled_float(xd, qdec::IqInt<T>::dfac(blk), s);
  }
};
template <>
struct Lane<DType::IQ2_XXS> : IqLane<DType::IQ2_XXS> {};
template <>
struct Lane<DType::IQ2_XS> : IqLane<DType::IQ2_XS> {};
template <>
struct Lane<DType::IQ2_S> : IqLane<DType::IQ2_S> {};
template <>
struct Lane<DType::IQ3_XXS> : IqLane<DType::IQ3_XXS> {};
template <>
struct Lane<DType::IQ3_S> : IqLane<DType::IQ3_S> {};
template <>
struct Lane<DType::IQ1_S> : IqLane<DType::IQ1_S> {};
template <>
struct Lane<DType::IQ1_M> : IqLane<DType::IQ1_M> {};

}  // namespace moeserve::cuda::detail::kq
