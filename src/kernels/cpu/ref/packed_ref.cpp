// Scalar definition of the packed-group dot products (packed_layout.h). It
// reads the interleaved bytes directly and performs, per (row, column), the
// exact integer sums and the same float operations in the same order as the
// SIMD kernels: per block acc = fma(float(isum), d * xd, acc) (Q4_K also
// accm for the mins, subtracted at the end).
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/packed_layout.h"
#include "tensor/quant_blocks.h"

namespace moeserve::cpu {
namespace {

constexpr size_t kPlane = 4 * kPackRows;

uint8_t plane_byte(const uint8_t* plane, int lane, int k) { return plane[4 * lane + k]; }
float f16_at(const uint8_t* p, int lane) {
  uint16_t h;
  std::memcpy(&h, p + 2 * lane, 2);
  return fp16_to_fp32(h);
}

float q4_k_lane(int64_t n, const uint8_t* w, int lane, const BlockQ8_K* x) {
  float acc = 0.0f, accm = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* g = w + size_t(b) * kPackRows * sizeof(BlockQ4_K);
    uint8_t scales[kKScaleBytes];
    for (int p = 0; p < 3; ++p) {
      for (int k = 0; k < 4; ++k) scales[4 * p + k] = plane_byte(g + 64 + kPlane * size_t(p), lane, k);
    }
    int32_t isum = 0, imin = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc = 0, m = 0;
      k_scale_min(j, scales, &sc, &m);
      const int ch = j / 2, shift = 4 * (j % 2);
      int32_t dot = 0;
      for (int l = 0; l < 32; ++l) {
        const uint8_t byte = plane_byte(g + 256 + kPlane * size_t(8 * ch + l / 4), lane, l % 4);
        dot += ((byte >> shift) & 15) * x[b].qs[32 * j + l];
      }
      isum += int32_t(sc) * dot;
      imin += int32_t(m) * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
    }
    const float d = f16_at(g, lane), dmin = f16_at(g + 32, lane);
    const float dx = d * x[b].d, dminx = dmin * x[b].d;
    acc = std::fma(float(isum), dx, acc);
    accm = std::fma(float(imin), dminx, accm);
  }
  return acc - accm;
}

float q6_k_lane(int64_t n, const uint8_t* w, int lane, const BlockQ8_K* x) {
  float acc = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* g = w + size_t(b) * kPackRows * sizeof(BlockQ6_K);
    int32_t isum = 0;
    for (int s = 0; s < 16; ++s) {
      const int h = s / 8, t = (s % 8) / 2, q = s % 2;
      int32_t dot = 0;
      for (int l = 0; l < 16; ++l) {
        const int i = 4 * q + l / 4, k = l % 4;
        const uint8_t* p = g + 3 * kPlane * size_t(8 * h + i);
        int code = 0;
        if (t < 3) {
          code = plane_byte(p + kPlane * size_t(t), lane, k) & 63;
        } else {
          for (int u = 0; u < 3; ++u) code |= (plane_byte(p + kPlane * size_t(u), lane, k) >> 6) << (2 * u);
        }
        dot += code * x[b].qs[128 * h + 32 * t + 4 * i + k];
      }
      const int8_t sc = int8_t(g[48 * kPlane + 16 * size_t(s) + size_t(lane)]);
      isum += int32_t(sc) * (dot - 32 * x[b].bsums[s]);
    }
    const float dx = f16_at(g + 52 * kPlane, lane) * x[b].d;
    acc = std::fma(float(isum), dx, acc);
  }
  return acc;
}

template <float (*Lane)(int64_t, const uint8_t*, int, const BlockQ8_K*)>
void packed_ref(int64_t n, const void* w, const void* x, size_t x_stride, int n_x, float* out,
                int64_t out_stride) {
  for (int c = 0; c < n_x; ++c) {
    const auto* xc =
        reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(x) + size_t(c) * x_stride);
    for (int r = 0; r < kPackRows; ++r)
      out[c * out_stride + r] = Lane(n, static_cast<const uint8_t*>(w), r, xc);
  }
}

}  // namespace

PackedDotFn packed_dot_reference(DType type) {
  switch (type) {
    case DType::Q4_K:
      return packed_ref<q4_k_lane>;
    case DType::Q6_K:
      return packed_ref<q6_k_lane>;
    default:
      return nullptr;
  }
}

}  // namespace moeserve::cpu
