// Reference dequantizers of the i-quants with codebooks (IQ2_XXS, IQ2_XS,
// IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), from the block layouts of
// quant_blocks.h and the codebooks of iquant_grids.h: each group of 8 (IQ3:
// two of 4) values is a codebook entry times its sub-block's scale, with a
// sign bit per value (IQ2, IQ3) or a shift of ±1/8 per group (IQ1).
// Quantizers: quantize_iquants.cpp, quantize_iq1.cpp.
#include <cstring>

#include "core/half.h"
#include "tensor/iquant_grids.h"
#include "tensor/quant_blocks.h"
#include "tensor/quantize_internal.h"

namespace moeserve::quant_detail {
namespace {

uint32_t u32_at(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 8 values of a grid entry (byte j: magnitude of value j) under sign byte
// `signs` (bit j negates value j), times `scale`.
void put_group(uint64_t entry, uint8_t signs, float scale, float* y) {
  for (int j = 0; j < 8; ++j) y[j] = scale * float(grid_byte(entry, j)) * ((signs >> j) & 1 ? -1.0f : 1.0f);
}

void iq2_xxs_block(const BlockIQ2_XXS& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t idx = uint32_t(b.qs[4 * ib]) | uint32_t(b.qs[4 * ib + 1]) << 16;
    const uint32_t aux = uint32_t(b.qs[4 * ib + 2]) | uint32_t(b.qs[4 * ib + 3]) << 16;
    const float db = d * (0.5f + float(aux >> 28)) * 0.25f;
    for (int l = 0; l < 4; ++l) {
      put_group(kIq2xxsGrid[(idx >> (8 * l)) & 255], kIqSigns[(aux >> (7 * l)) & 127], db, y + 32 * ib + 8 * l);
    }
  }
}

void iq2_xs_block(const BlockIQ2_XS& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    const float db[2] = {d * (0.5f + float(b.scales[ib] & 15)) * 0.25f,
                         d * (0.5f + float(b.scales[ib] >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l) {
      const uint16_t q = b.qs[4 * ib + l];
      put_group(kIq2xsGrid[q & 511], kIqSigns[q >> 9], db[l / 2], y + 32 * ib + 8 * l);
    }
  }
}

void iq2_s_block(const BlockIQ2_S& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    const float db[2] = {d * (0.5f + float(b.scales[ib] & 15)) * 0.25f,
                         d * (0.5f + float(b.scales[ib] >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l) {
      const int idx = b.qs[4 * ib + l] | ((b.qh[ib] << (8 - 2 * l)) & 0x300);
      put_group(kIq2sGrid[idx], b.qs[32 + 4 * ib + l], db[l / 2], y + 32 * ib + 8 * l);
    }
  }
}

// IQ3: a group of 8 is two entries of 4.
void put_group3(uint32_t first, uint32_t second, uint8_t signs, float scale, float* y) {
  put_group(uint64_t(first) | uint64_t(second) << 32, signs, scale, y);
}

void iq3_xxs_block(const BlockIQ3_XXS& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t aux = u32_at(b.qs + 64 + 4 * ib);
    const float db = d * (0.5f + float(aux >> 28)) * 0.5f;
    const uint8_t* q = b.qs + 8 * ib;
    for (int l = 0; l < 4; ++l) {
      put_group3(kIq3xxsGrid[q[2 * l]], kIq3xxsGrid[q[2 * l + 1]], kIqSigns[(aux >> (7 * l)) & 127], db,
                 y + 32 * ib + 8 * l);
    }
  }
}

void iq3_s_block(const BlockIQ3_S& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    const int s = (b.scales[ib / 2] >> (4 * (ib % 2))) & 15;
    const float db = d * float(1 + 2 * s);
    const uint8_t* q = b.qs + 8 * ib;
    for (int l = 0; l < 4; ++l) {
      const int i1 = q[2 * l] | ((b.qh[ib] << (8 - 2 * l)) & 256);
      const int i2 = q[2 * l + 1] | ((b.qh[ib] << (7 - 2 * l)) & 256);
      put_group3(kIq3sGrid[i1], kIq3sGrid[i2], b.signs[4 * ib + l], db, y + 32 * ib + 8 * l);
    }
  }
}

// IQ1: 8 values of {-1, 0, 1} (int8 bytes) plus a shift, times the scale.
void put_group1(uint64_t entry, float delta, float scale, float* y) {
  for (int j = 0; j < 8; ++j) y[j] = scale * (float(int8_t(grid_byte(entry, j))) + delta);
}

void iq1_s_block(const BlockIQ1_S& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    const uint16_t h = b.qh[ib];
    const float dl = d * float(2 * ((h >> 12) & 7) + 1);
    const float delta = (h & 0x8000) ? -kIq1Delta : kIq1Delta;
    for (int l = 0; l < 4; ++l) {
      put_group1(kIq1sGrid[b.qs[4 * ib + l] | (((h >> (3 * l)) & 7) << 8)], delta, dl, y + 32 * ib + 8 * l);
    }
  }
}

}  // namespace

namespace {

void iq1_m_block(const BlockIQ1_M& b, float* y) {
  const float d = fp16_to_fp32(iq1_m_scale_bits(b));
  uint16_t sc[4];
  std::memcpy(sc, b.scales, 8);
  for (int ib = 0; ib < 8; ++ib) {
    const int shift = 6 * (ib % 2);
    const float dl[2] = {d * float(2 * ((sc[ib / 2] >> shift) & 7) + 1),
                         d * float(2 * ((sc[ib / 2] >> (shift + 3)) & 7) + 1)};
    const uint8_t* q = b.qs + 4 * ib;
    const uint8_t* h = b.qh + 2 * ib;
    for (int l = 0; l < 4; ++l) {
      const uint8_t hb = h[l / 2];
      const int high = l % 2 == 0 ? (hb << 8) & 0x700 : (hb << 4) & 0x700;
      const float delta = (hb & (l % 2 == 0 ? 0x08 : 0x80)) ? -kIq1Delta : kIq1Delta;
      put_group1(kIq1sGrid[q[l] | high], delta, dl[l / 2], y + 32 * ib + 8 * l);
    }
  }
}

template <typename Block, void (*kDecode)(const Block&, float*)>
void dequantize_blocks(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) kDecode(in[b], dst + b * kQK_K);
}

}  // namespace

void dequantize_iq2_xxs(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockIQ2_XXS, iq2_xxs_block>(src, dst, n);
}
void dequantize_iq2_xs(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockIQ2_XS, iq2_xs_block>(src, dst, n);
}
void dequantize_iq2_s(const void* src, float* dst, int64_t n) { dequantize_blocks<BlockIQ2_S, iq2_s_block>(src, dst, n); }
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockIQ3_XXS, iq3_xxs_block>(src, dst, n);
}
void dequantize_iq3_s(const void* src, float* dst, int64_t n) { dequantize_blocks<BlockIQ3_S, iq3_s_block>(src, dst, n); }
void dequantize_iq1_s(const void* src, float* dst, int64_t n) { dequantize_blocks<BlockIQ1_S, iq1_s_block>(src, dst, n); }
void dequantize_iq1_m(const void* src, float* dst, int64_t n) { dequantize_blocks<BlockIQ1_M, iq1_m_block>(src, dst, n); }

}  // namespace moeserve::quant_detail
