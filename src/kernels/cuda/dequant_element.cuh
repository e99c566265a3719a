// Device decoding of one element of any weight type, byte-exact to the GGUF
// block layouts of tensor/quant_blocks.h and equal to the CPU reference
// dequantize_row (up to the FMA the compiler may form in the K-quants'
// "d*sc*q - dmin*m"). The plain building block of every GPU consumer that
// reads weights element by element: dequantize.cu, the embedding gather.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

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
    default:
      return 0.0f;
  }
}

}  // namespace moeserve::cuda::dev
