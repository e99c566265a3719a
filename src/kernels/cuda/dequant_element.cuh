// Device decoding of one element of any weight type, byte-exact to the GGUF
// block layouts of tensor/quant_blocks.h and equal to the CPU reference
// dequantize_row (up to the FMA the compiler may form in the K-quants'
// "d*sc*q - dmin*m" and Q4_1/Q5_1's "d*q + m"). The plain building block of
// every GPU consumer that reads weights element by element: dequantize.cu,
// the embedding gather. The table types' values come from
// quant_decode_lowbit.cuh's packed tables (device code cannot index
// quant_blocks.h's host arrays), the i-quants' from their Traits
// (quant_decode_iquants.cuh: the codebooks' device copies).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/quant_decode.cuh"
#include "tensor/dtype.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cuda::dev {

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf2f(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

// The 6-bit (scale, min) pair j (0..7) of a Q4_K/Q5_K block (k_scale_min on the host).
__device__ __forceinline__ void scale_min(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// The 4-bit code of element j (0..31) of a 32-element block's 16 bytes:
// low nibble of qs[j] for j < 16, high nibble of qs[j - 16] after.
__device__ __forceinline__ int nibble32(const uint8_t* qs, int j) {
  return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
}

// Q5_0 / Q5_1: the 5-bit code of element j, bit 4 from bit j of qh (4 bytes,
// little-endian; read bytewise: Q5_0's qh is only 2-byte aligned).
__device__ __forceinline__ int code5(const uint8_t* qh, const uint8_t* qs, int j) {
  return nibble32(qs, j) | (((qh[j >> 3] >> (j & 7)) & 1) << 4);
}

// Element j (0..255) of the 2-bit codes of a Q2_K / Q3_K block: half hf,
// quarter t, position l (quant_blocks.h).
__device__ __forceinline__ int code2(const uint8_t* qs, int j) {
  const int hf = j / 128, t = (j % 128) / 32, l = j % 32;
  return (qs[32 * hf + l] >> (2 * t)) & 3;
}

// element() of issue 43's types (Q4_1 .. Q3_K): element i of the row at src.
__device__ inline float element_lowbit(DType type, const uint8_t* src, int64_t i) {
  switch (type) {
    case DType::Q4_1: {
      const auto* b = reinterpret_cast<const BlockQ4_1*>(src) + i / kQK4_1;
      return h2f(b->d) * float(nibble32(b->qs, int(i % kQK4_1))) + h2f(b->m);
    }
    case DType::Q5_0: {
      const auto* b = reinterpret_cast<const BlockQ5_0*>(src) + i / kQK5_0;
      return h2f(b->d) * float(code5(b->qh, b->qs, int(i % kQK5_0)) - 16);
    }
    case DType::Q5_1: {
      const auto* b = reinterpret_cast<const BlockQ5_1*>(src) + i / kQK5_1;
      return h2f(b->d) * float(code5(b->qh, b->qs, int(i % kQK5_1))) + h2f(b->m);
    }
    case DType::IQ4_NL: {
      const auto* b = reinterpret_cast<const BlockIQ4_NL*>(src) + i / kQK4_NL;
      return h2f(b->d) * float(qdec::table_value(nibble32(b->qs, int(i % kQK4_NL)), qdec::iq4nl_table()));
    }
    case DType::MXFP4: {
      const auto* b = reinterpret_cast<const BlockMXFP4*>(src) + i / kQK_MXFP4;
      return float(qdec::table_value(nibble32(b->qs, int(i % kQK_MXFP4)), qdec::mxfp4_table())) *
             qdec::mxfp4_block_scale(b->e);
    }
    case DType::IQ4_XS: {
      const auto* b = reinterpret_cast<const BlockIQ4_XS*>(src) + i / kQK_K;
      const int j = int(i % kQK_K), s = j / 32;
      const int ls = ((b->scales_l[s / 2] >> (4 * (s % 2))) & 15) | (((b->scales_h >> (2 * s)) & 3) << 4);
      const float dl = h2f(b->d) * float(ls - 32);
      return dl * float(qdec::table_value(nibble32(b->qs + 16 * s, j % 32), qdec::iq4nl_table()));
    }
    case DType::Q2_K: {
      const auto* b = reinterpret_cast<const BlockQ2_K*>(src) + i / kQK_K;
      const int j = int(i % kQK_K), sc = b->scales[j / 16];
      return h2f(b->d) * float(sc & 15) * float(code2(b->qs, j)) - h2f(b->dmin) * float(sc >> 4);
    }
    case DType::Q3_K: {
      const auto* b = reinterpret_cast<const BlockQ3_K*>(src) + i / kQK_K;
      const int j = int(i % kQK_K), sub = j / 16, t = (j % 128) / 32, l = j % 32;
      const int low = (b->scales[sub % 8] >> (4 * (sub / 8))) & 15;
      const int high = (b->scales[8 + sub % 4] >> (2 * (sub / 4))) & 3;
      const int q = code2(b->qs, j) - (((b->hmask[l] >> (4 * (j / 128) + t)) & 1) ? 0 : 4);
      return h2f(b->d) * float((low | (high << 4)) - 32) * float(q);
    }
    default:
      return 0.0f;
  }
}

// Element i of the row at src of an i-quant with codebooks: its 256-element
// block's Traits::element (one group's entry and the run's scale).
template <DType T>
__device__ __forceinline__ float element_iquant(const uint8_t* src, int64_t i) {
  using Q = qdec::Traits<T>;
  return Q::element(src + (i / Q::kBlockElems) * Q::kBlockBytes, int(i % Q::kBlockElems));
}

// Element i of a row of `type` starting at src (i counts from the row start).
// Types without a decoder here (Q8_K, an activation type) give 0.
__device__ inline float element(DType type, const uint8_t* src, int64_t i) {
  switch (type) {
    case DType::F32:
      return reinterpret_cast<const float*>(src)[i];
    case DType::F16:
      return h2f(reinterpret_cast<const uint16_t*>(src)[i]);
    case DType::BF16:
      return bf2f(reinterpret_cast<const uint16_t*>(src)[i]);
    case DType::Q8_0: {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(src) + i / kQK8_0;
      return h2f(b->d) * b->qs[i % kQK8_0];
    }
    case DType::Q4_0: {
      const auto* b = reinterpret_cast<const BlockQ4_0*>(src) + i / kQK4_0;
      const int j = int(i % kQK4_0);
      const int q = j < 16 ? (b->qs[j] & 15) : (b->qs[j - 16] >> 4);
      return h2f(b->d) * (q - 8);
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      const int j = int(i % kQK_K), chunk = j / 64, hi = (j % 64) / 32, l = j % 32;
      const uint8_t *scales, *qs, *qh = nullptr;
      uint16_t d, dmin;
      if (type == DType::Q4_K) {
        const auto* b = reinterpret_cast<const BlockQ4_K*>(src) + i / kQK_K;
        scales = b->scales, qs = b->qs, d = b->d, dmin = b->dmin;
      } else {
        const auto* b = reinterpret_cast<const BlockQ5_K*>(src) + i / kQK_K;
        scales = b->scales, qs = b->qs, qh = b->qh, d = b->d, dmin = b->dmin;
      }
      int sc, m;
      scale_min(2 * chunk + hi, scales, &sc, &m);
      const uint8_t byte = qs[32 * chunk + l];
      int q = hi ? (byte >> 4) : (byte & 15);
      if (qh != nullptr && (qh[l] & (1 << (2 * chunk + hi)))) q += 16;
      return h2f(d) * sc * q - h2f(dmin) * m;
    }
    case DType::Q6_K: {
      const auto* b = reinterpret_cast<const BlockQ6_K*>(src) + i / kQK_K;
      const int j = int(i % kQK_K), half = j / 128, r = j % 128, quarter = r / 32, l = r % 32;
      const uint8_t* ql = b->ql + 64 * half;
      const uint8_t* qh = b->qh + 32 * half;
      const int8_t* sc = b->scales + 8 * half;
      const int low = (quarter & 1) ? ql[l + 32] : ql[l];
      const int nib = (quarter < 2) ? (low & 15) : (low >> 4);
      const int q = nib | (((qh[l] >> (2 * quarter)) & 3) << 4);
      return h2f(b->d) * sc[l / 16 + 2 * quarter] * (q - 32);
    }
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::IQ4_NL:
    case DType::MXFP4:
    case DType::IQ4_XS:
    case DType::Q2_K:
    case DType::Q3_K:
      return element_lowbit(type, src, i);
    case DType::IQ2_XXS:
      return element_iquant<DType::IQ2_XXS>(src, i);
    case DType::IQ2_XS:
      return element_iquant<DType::IQ2_XS>(src, i);
    case DType::IQ2_S:
      return element_iquant<DType::IQ2_S>(src, i);
    case DType::IQ3_XXS:
      return element_iquant<DType::IQ3_XXS>(src, i);
    case DType::IQ3_S:
      return element_iquant<DType::IQ3_S>(src, i);
    case DType::IQ1_S:
      return element_iquant<DType::IQ1_S>(src, i);
    case DType::IQ1_M:
      return element_iquant<DType::IQ1_M>(src, i);
    default:
      return 0.0f;
  }
}

}  // namespace moeserve::cuda::dev
