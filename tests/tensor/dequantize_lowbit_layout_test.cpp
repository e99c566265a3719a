// Hand-built blocks of issue 43's types with known values, element by
// element, written from ggml's definitions (ggml-common.h block structs and
// the reference dequantize_row_* loops) rather than from our dequantizers:
// Q4_1, Q5_0, Q5_1 (the fifth bit of element j in bit j of qh), Q2_K and
// Q3_K (codes of half h, group t, lane l in bits 2t of qs[32h + l]; Q3_K's
// high bit in bit 4h + t of hmask[l]; the 12-byte 6-bit scale packing),
// IQ4_NL / IQ4_XS (the non-linear table; IQ4_XS's split 6-bit scales) and
// MXFP4 (E8M0 scale). The bit-exact check against files written by
// llama.cpp's own quantizer is the device's (issue 43).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tensor/quant_blocks.h"
#include "tensor/quantize.h"

namespace moeserve {
namespace {

constexpr uint16_t kHalfOne = 0x3C00;      // 1.0
constexpr uint16_t kHalfHalf = 0x3800;     // 0.5
constexpr uint16_t kHalfQuarter = 0x3400;  // 0.25
constexpr uint16_t kHalfMinusTwo = 0xC000;

TEST(DequantizeLowbitLayout, Q4_1AndQ5_1AddTheirMinimum) {
  BlockQ4_1 a;
  a.d = kHalfHalf, a.m = kHalfMinusTwo;
  for (int j = 0; j < 16; ++j) a.qs[j] = uint8_t(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::Q4_1, &a, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * float(j) - 2.0f) << j;
    EXPECT_EQ(y[j + 16], 0.5f * float(15 - j) - 2.0f) << j;
  }
  BlockQ5_1 b;
  b.d = kHalfQuarter, b.m = kHalfOne;
  std::memset(b.qs, 0, sizeof b.qs);
  const uint32_t qh = (1u << 3) | (1u << 20);  // elements 3 and 20 get 16
  std::memcpy(b.qh, &qh, 4);
  b.qs[3] = 0x01;  // element 3: 16 + 1
  b.qs[4] = 0x20;  // element 20: 16 + 2
  dequantize_row(DType::Q5_1, &b, y, 32);
  for (int j = 0; j < 32; ++j) {
    const float want = j == 3 ? 0.25f * 17 + 1 : j == 20 ? 0.25f * 18 + 1 : 1.0f;
    EXPECT_EQ(y[j], want) << j;
  }
}

TEST(DequantizeLowbitLayout, Q5_0IsCenteredOnSixteen) {
  BlockQ5_0 b;
  b.d = kHalfHalf;
  const uint32_t qh = 0xFFFF0000u;  // elements 16..31 get the fifth bit
  std::memcpy(b.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | (j << 4));
  float y[32];
  dequantize_row(DType::Q5_0, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * float(j - 16)) << j;
    EXPECT_EQ(y[j + 16], 0.5f * float(j)) << j;
  }
}

TEST(DequantizeLowbitLayout, Q2_KCodesScalesAndMins) {
  BlockQ2_K b;
  std::memset(&b, 0, sizeof b);
  b.d = kHalfHalf, b.dmin = kHalfQuarter;
  for (int s = 0; s < 16; ++s) b.scales[s] = uint8_t((s % 15 + 1) | ((s % 7) << 4));
  for (int i = 0; i < 64; ++i) b.qs[i] = uint8_t(i * 37 + 11);
  std::vector<float> y(256);
  dequantize_row(DType::Q2_K, &b, y.data(), 256);
  // ggml's loop: per half of 128, per shift 0/2/4/6, 16 lanes with one
  // scale byte, then the next 16 lanes (q + 16) with the next.
  int e = 0, is = 0;
  for (int h = 0; h < 2; ++h) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int part = 0; part < 2; ++part, ++is) {
        const float dl = 0.5f * float(b.scales[is] & 15), ml = 0.25f * float(b.scales[is] >> 4);
        for (int l = 0; l < 16; ++l, ++e) {
          EXPECT_EQ(y[size_t(e)], dl * float((b.qs[32 * h + 16 * part + l] >> shift) & 3) - ml) << e;
        }
      }
    }
  }
}

TEST(DequantizeLowbitLayout, Q3_KHighBitsAndSixBitScales) {
  BlockQ3_K b;
  std::memset(&b, 0, sizeof b);
  b.d = kHalfHalf;
  // Scales 0..15 with values s - 32: low nibbles in bytes 0..7 (j < 8 low,
  // j >= 8 high), high 2 bits in bytes 8..11 at bit 2 (j / 4).
  int want_scale[16];
  for (int j = 0; j < 16; ++j) want_scale[j] = (j * 23 + 7) % 64;
  for (int j = 0; j < 16; ++j) {
    const int s = want_scale[j];
    if (j < 8) b.scales[j] |= uint8_t(s & 15);
    else b.scales[j - 8] |= uint8_t((s & 15) << 4);
    b.scales[8 + j % 4] |= uint8_t((s >> 4) << (2 * (j / 4)));
  }
  for (int i = 0; i < 64; ++i) b.qs[i] = uint8_t(i * 53 + 9);
  for (int i = 0; i < 32; ++i) b.hmask[i] = uint8_t(i * 97 + 41);
  std::vector<float> y(256);
  dequantize_row(DType::Q3_K, &b, y.data(), 256);
  // ggml's loop: the high-bit mask m steps 1, 2, 4, ... with each shift.
  int e = 0, is = 0;
  uint8_t m = 1;
  for (int h = 0; h < 2; ++h) {
    for (int shift = 0; shift < 8; shift += 2, m = uint8_t(m << 1)) {
      for (int part = 0; part < 2; ++part, ++is) {
        const float dl = 0.5f * float(want_scale[is] - 32);
        for (int l = 0; l < 16; ++l, ++e) {
          const int lane = 16 * part + l;
          const int q = ((b.qs[32 * h + lane] >> shift) & 3) - ((b.hmask[lane] & m) ? 0 : 4);
          EXPECT_EQ(y[size_t(e)], dl * float(q)) << e;
        }
      }
    }
  }
}

TEST(DequantizeLowbitLayout, Iq4NonLinearValues) {
  BlockIQ4_NL a;
  a.d = kHalfHalf;
  for (int j = 0; j < 16; ++j) a.qs[j] = uint8_t(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::IQ4_NL, &a, y, 32);
  const int table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * float(table[j]));
    EXPECT_EQ(y[j + 16], 0.5f * float(table[15 - j]));
  }
  BlockIQ4_XS x;
  std::memset(&x, 0, sizeof x);
  x.d = kHalfQuarter;
  int ls[8];
  for (int s = 0; s < 8; ++s) {
    ls[s] = (s * 19 + 5) % 64;
    x.scales_l[s / 2] |= uint8_t((ls[s] & 15) << (4 * (s % 2)));
    x.scales_h |= uint16_t((ls[s] >> 4) << (2 * s));
  }
  for (int i = 0; i < 128; ++i) x.qs[i] = uint8_t(i * 71 + 3);
  std::vector<float> z(256);
  dequantize_row(DType::IQ4_XS, &x, z.data(), 256);
  for (int s = 0; s < 8; ++s) {
    for (int j = 0; j < 16; ++j) {
      const float dl = 0.25f * float(ls[s] - 32);
      EXPECT_EQ(z[size_t(32 * s + j)], dl * float(table[x.qs[16 * s + j] & 15]));
      EXPECT_EQ(z[size_t(32 * s + j + 16)], dl * float(table[x.qs[16 * s + j] >> 4]));
    }
  }
}

TEST(DequantizeLowbitLayout, Mxfp4E2M1TimesPowerOfTwo) {
  BlockMXFP4 b;
  b.e = 127 + 3;  // 2^3
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::MXFP4, &b, y, 32);
  // E2M1 codes: 0, 0.5, 1, 1.5, 2, 3, 4, 6, then the same negated.
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], e2m1[j] * 8.0f) << j;
    EXPECT_EQ(y[j + 16], e2m1[15 - j] * 8.0f) << j;
  }
  b.e = 0;  // ggml reads 0 as 2^-128 (a subnormal float)
  b.qs[0] = 0x07;
  dequantize_row(DType::MXFP4, &b, y, 32);
  EXPECT_EQ(y[0], 6.0f * 0x1p-127f);
}

}  // namespace
}  // namespace moeserve
