// Hand-built blocks with known values for every dequantizer, so a layout bug
// cannot hide behind a self-consistent quantize/dequantize round trip.
// Scale bytes and bit positions below were worked out by hand from the
// layout description in the design spec §4.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tensor/quant_blocks.h"
#include "tensor/quantize.h"

namespace moeserve {
namespace {

constexpr uint16_t kHalfOne = 0x3C00;      // 1.0
constexpr uint16_t kHalfHalf = 0x3800;     // 0.5
constexpr uint16_t kHalfTwo = 0x4000;      // 2.0
constexpr uint16_t kHalfQuarter = 0x3400;  // 0.25

TEST(DequantizeLayout, F16AndBF16BitPatterns) {
  const uint16_t h[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x3555};
  const float hx[] = {1.0f, -2.0f, 65504.0f, 5.9604645e-8f, -0.0f, 0.33325195f};
  float y[6];
  dequantize_row(DType::F16, h, y, 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], hx[i]) << i;
  const uint16_t b[] = {0x3F80, 0xC0A0, 0x4049, 0x0000};
  const float bx[] = {1.0f, -5.0f, 3.140625f, 0.0f};
  dequantize_row(DType::BF16, b, y, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], bx[i]) << i;
}

TEST(DequantizeLayout, Q8_0) {
  BlockQ8_0 b[2];
  b[0].d = kHalfHalf;
  b[1].d = kHalfTwo;
  for (int i = 0; i < 32; ++i) {
    b[0].qs[i] = int8_t(i - 16);
    b[1].qs[i] = int8_t(i == 5 ? -128 : 127 - i);
  }
  float y[64];
  dequantize_row(DType::Q8_0, b, y, 64);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.5f * float(i - 16)) << i;
  EXPECT_EQ(y[32 + 5], -256.0f);
  EXPECT_EQ(y[32 + 0], 254.0f);
}

TEST(DequantizeLayout, Q4_0NibbleOrder) {
  BlockQ4_0 b;
  b.d = kHalfTwo;
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::Q4_0, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * float(j - 8)) << j;       // low nibbles: first half
    EXPECT_EQ(y[j + 16], 2.0f * float(7 - j)) << j;  // high nibbles: second half
  }
}

TEST(DequantizeLayout, Q8_K) {
  BlockQ8_K b{};
  b.d = -0.125f;
  for (int i = 0; i < 256; ++i) b.qs[i] = int8_t((i * 7) % 255 - 127);
  std::vector<float> y(256);
  dequantize_row(DType::Q8_K, &b, y.data(), 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], -0.125f * float((i * 7) % 255 - 127)) << i;
}

// 6-bit codes: sc = {1, 2, 3, 4, 17, 33, 50, 63}, m = {0, 5, 10, 15, 20, 40, 61, 63}.
// Bytes 0..3: sc[j] | (sc[j+4] >> 4) << 6; bytes 4..7: m[j] | (m[j+4] >> 4) << 6;
// bytes 8..11: (sc[j+4] & 15) | (m[j+4] & 15) << 4.
constexpr uint8_t kScaleBytes[12] = {0x41, 0x82, 0xC3, 0xC4, 0x40, 0x85, 0xCA, 0xCF, 0x41, 0x81, 0xD2, 0xFF};
constexpr int kSc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
constexpr int kMin[8] = {0, 5, 10, 15, 20, 40, 61, 63};

TEST(DequantizeLayout, KScaleMinUnpack) {
  for (int j = 0; j < 8; ++j) {
    uint8_t sc = 0, m = 0;
    k_scale_min(j, kScaleBytes, &sc, &m);
    EXPECT_EQ(sc, kSc[j]) << j;
    EXPECT_EQ(m, kMin[j]) << j;
  }
}

BlockQ4_K q4_k_block() {
  BlockQ4_K b;
  b.d = kHalfOne;
  b.dmin = kHalfHalf;
  std::memcpy(b.scales, kScaleBytes, 12);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) b.qs[32 * c + l] = uint8_t((l & 15) | (((l * 7 + c) & 15) << 4));
  }
  return b;
}

TEST(DequantizeLayout, Q4_KChunksAndScales) {
  const BlockQ4_K b = q4_k_block();
  std::vector<float> y(256);
  dequantize_row(DType::Q4_K, &b, y.data(), 256);
  // Chunk c of 64: low nibbles are elements 64c..64c+31 (sub-block 2c), high
  // nibbles 64c+32.. (sub-block 2c+1).
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      EXPECT_EQ(y[64 * c + l], float(kSc[2 * c] * (l & 15)) - 0.5f * float(kMin[2 * c])) << c << "," << l;
      EXPECT_EQ(y[64 * c + 32 + l],
                float(kSc[2 * c + 1] * ((l * 7 + c) & 15)) - 0.5f * float(kMin[2 * c + 1]))
          << c << "," << l;
    }
  }
}

TEST(DequantizeLayout, Q4_KSingleElement) {
  // All codes 0 and all mins 0, except element 100: chunk 1, 100-64 = 36 >= 32,
  // so the high nibble of qs[32 + 4], sub-block 3 (sc = 4).
  BlockQ4_K b = q4_k_block();
  std::memset(b.qs, 0, sizeof b.qs);
  b.dmin = 0;
  b.qs[36] = 0xB0;  // code 11
  std::vector<float> y(256);
  dequantize_row(DType::Q4_K, &b, y.data(), 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], i == 100 ? 44.0f : 0.0f) << i;
}

TEST(DequantizeLayout, Q5_KHighBits) {
  BlockQ5_K b;
  const BlockQ4_K b4 = q4_k_block();
  b.d = b4.d;
  b.dmin = b4.dmin;
  std::memcpy(b.scales, b4.scales, 12);
  std::memcpy(b.qs, b4.qs, sizeof b.qs);
  for (int l = 0; l < 32; ++l) b.qh[l] = uint8_t(l * 37 + 11);
  std::vector<float> y(256);
  dequantize_row(DType::Q5_K, &b, y.data(), 256);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = (l & 15) + ((b.qh[l] >> (2 * c)) & 1) * 16;
      const int hi = ((l * 7 + c) & 15) + ((b.qh[l] >> (2 * c + 1)) & 1) * 16;
      EXPECT_EQ(y[64 * c + l], float(kSc[2 * c] * lo) - 0.5f * float(kMin[2 * c])) << c << "," << l;
      EXPECT_EQ(y[64 * c + 32 + l], float(kSc[2 * c + 1] * hi) - 0.5f * float(kMin[2 * c + 1]))
          << c << "," << l;
    }
  }
}

TEST(DequantizeLayout, Q5_KSingleHighBit) {
  // Element 100 (sub-block 3, sc = 4): low nibble 0, high bit = bit 3 of qh[4] -> code 16.
  BlockQ5_K b;
  b.d = kHalfOne;
  b.dmin = 0;
  std::memcpy(b.scales, kScaleBytes, 12);
  std::memset(b.qs, 0, sizeof b.qs);
  std::memset(b.qh, 0, sizeof b.qh);
  b.qh[4] = 0x08;
  std::vector<float> y(256);
  dequantize_row(DType::Q5_K, &b, y.data(), 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], i == 100 ? 64.0f : 0.0f) << i;
}

BlockQ6_K q6_k_zero_block() {
  // Code 32 is zero: low nibble 0, high 2 bits = 2 (binary 10 in every field).
  BlockQ6_K b;
  std::memset(b.ql, 0, sizeof b.ql);
  std::memset(b.qh, 0xAA, sizeof b.qh);
  for (int j = 0; j < 16; ++j) b.scales[j] = int8_t(j * 9 - 70);
  b.d = kHalfQuarter;
  return b;
}

TEST(DequantizeLayout, Q6_KSingleElements) {
  // Element 200: half 1, offset 72 = 32*2 + 8 -> quarter 3 (q3): high nibble of
  // ql[64 + 8], bits 4..5 of qh[32 + 8]; sub-block 12 (scale 38).
  // Element 45: half 0, offset 45 = 32*1 + 13 -> q2: low nibble of ql[32 + 13],
  // bits 2..3 of qh[13]; sub-block 2 (scale -52).
  BlockQ6_K b = q6_k_zero_block();
  b.ql[72] = 0xF0;                  // low 4 bits of code 63
  b.qh[40] = uint8_t(0xAA | 0x30);  // high bits 3
  b.ql[32 + 13] = 0x01;             // code 1: low 4 bits 1, high bits 0
  b.qh[13] = uint8_t(0xAA & ~0x0C);
  std::vector<float> y(256);
  dequantize_row(DType::Q6_K, &b, y.data(), 256);
  for (int i = 0; i < 256; ++i) {
    float want = 0.0f;
    if (i == 200) want = 0.25f * 38.0f * 31.0f;
    if (i == 45) want = 0.25f * -52.0f * -31.0f;
    EXPECT_EQ(y[i], want) << i;
  }
}

TEST(DequantizeLayout, Q6_KQuarterLayout) {
  BlockQ6_K b = q6_k_zero_block();
  for (int i = 0; i < 128; ++i) b.ql[i] = uint8_t(i * 13 + 5);
  for (int i = 0; i < 64; ++i) b.qh[i] = uint8_t(i * 29 + 3);
  std::vector<float> y(256);
  dequantize_row(DType::Q6_K, &b, y.data(), 256);
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, i = (e % 128) / 32, l = e % 32;
    const uint8_t ql = b.ql[64 * half + l + 32 * (i & 1)];
    const int low = i < 2 ? (ql & 15) : (ql >> 4);
    const int high = (b.qh[32 * half + l] >> (2 * i)) & 3;
    const float want = 0.25f * float(b.scales[e / 16]) * float((low | (high << 4)) - 32);
    EXPECT_EQ(y[e], want) << e;
  }
}

}  // namespace
}  // namespace moeserve
