// quantize_row -> dequantize_row round trips of every type on several kinds
// of data, against per-type error bounds.
//
// Bounds: relative RMSE = sqrt(Σ(x-y)²/Σx²) in percent, measured on these
// exact rows (fixed seeds) with the quantizers of this commit, plus ~10%
// margin. "gaussian": N(0,1); "outliers": N(0,1) with every 97th value x20.
//   type   gaussian  outliers   (measured)
//   f16      0.05      0.05     (0.021 / 0.021)
//   bf16     0.25      0.25     (0.17 / 0.17)
//   q8_0     0.6       1.3      (0.53 / 1.15)
//   q8_K     0.8       3.1      (0.69 / 2.78)
//   q6_K     1.9       3.5      (1.68 / 3.21)
//   q5_K     3.8       5.3      (3.43 / 4.79)
//   q4_K     7.5      10.5      (6.96 / 9.65)
//   q4_0     9.5      16.5      (8.58 / 15.1)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/quant_blocks.h"
#include "tensor/quantize.h"

namespace moeserve {
namespace {

constexpr int64_t kRowElems = 4096;
constexpr int64_t kRows = 16;

struct Bound {
  DType type;
  double gaussian_pct;
  double outliers_pct;
};

constexpr Bound kBounds[] = {
    {DType::F32, 0.0, 0.0},  {DType::F16, 0.05, 0.05}, {DType::BF16, 0.25, 0.25},
    {DType::Q8_0, 0.6, 1.3}, {DType::Q8_K, 0.8, 3.1},  {DType::Q6_K, 1.9, 3.5},
    {DType::Q5_K, 3.8, 5.3}, {DType::Q4_K, 7.5, 10.5}, {DType::Q4_0, 9.5, 16.5},
    // Issue 43's types (measured 2026-11-29 on these rows, then ~5% margin):
    // Q4_1 6.96 / 9.65, Q5_0 4.12 / 9.12, Q5_1 3.35 / 4.69, Q2_K 26.66 /
    // 23.44, Q3_K 16.11 / 16.03, IQ4_NL 7.71 / 12.75, IQ4_XS 7.78 / 12.95,
    // MXFP4 11.20 / 16.42.
    {DType::Q4_1, 7.3, 10.1}, {DType::Q5_0, 4.35, 9.6}, {DType::Q5_1, 3.55, 4.95}, {DType::Q2_K, 27.9, 24.6},
    {DType::Q3_K, 16.9, 16.9}, {DType::IQ4_NL, 8.1, 13.4}, {DType::IQ4_XS, 8.2, 13.6}, {DType::MXFP4, 11.8, 17.2},
};

std::vector<float> gaussian_rows(uint32_t seed, bool outliers) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(size_t(kRows * kRowElems));
  for (auto& v : x) v = g(rng);
  if (outliers) {
    for (size_t i = 0; i < x.size(); i += 97) x[i] *= 20.0f;
  }
  return x;
}

std::vector<float> round_trip(DType t, const std::vector<float>& x) {
  const int64_t rows = int64_t(x.size()) / kRowElems;
  std::vector<uint8_t> q(dtype_row_bytes(t, kRowElems) * size_t(rows));
  const size_t written = quantize_rows(t, x.data(), q.data(), rows, kRowElems);
  EXPECT_EQ(written, q.size());
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t, q.data() + size_t(r) * dtype_row_bytes(t, kRowElems), y.data() + r * kRowElems,
                   kRowElems);
  }
  return y;
}

double relative_rmse_pct(const std::vector<float>& x, const std::vector<float>& y) {
  double err = 0, sig = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    sig += double(x[i]) * x[i];
  }
  return 100.0 * std::sqrt(err / sig);
}

class RoundTrip : public ::testing::TestWithParam<Bound> {};

TEST_P(RoundTrip, GaussianWithinBound) {
  const Bound b = GetParam();
  const auto x = gaussian_rows(1234, false);
  const double pct = relative_rmse_pct(x, round_trip(b.type, x));
  EXPECT_LE(pct, b.gaussian_pct) << dtype_name(b.type);
  RecordProperty("rel_rmse_pct", std::to_string(pct));
}

TEST_P(RoundTrip, OutliersWithinBound) {
  const Bound b = GetParam();
  const auto x = gaussian_rows(99, true);
  const double pct = relative_rmse_pct(x, round_trip(b.type, x));
  EXPECT_LE(pct, b.outliers_pct) << dtype_name(b.type);
}

TEST_P(RoundTrip, AllZeroStaysZero) {
  const Bound b = GetParam();
  const std::vector<float> x(size_t(2 * kRowElems), 0.0f);
  for (float v : round_trip(b.type, x)) ASSERT_EQ(v, 0.0f) << dtype_name(b.type);
}

// A constant row is one level times a scale, so only the f16 rounding of the
// scale (2^-11 relative) may remain; bf16 itself keeps 8 significant bits (half an ulp: 2^-8).
// (Constants are kept where the K-quant super-scales, c/63 or c/(32*127),
// are normal f16 numbers: subnormal super-scales lose relative precision.)
TEST_P(RoundTrip, ConstantRowsAreNearlyExact) {
  const Bound b = GetParam();
  // MXFP4's scale is a power of two: a constant is exact only when it is one
  // of the E2M1 values times one.
  if (b.type == DType::MXFP4) GTEST_SKIP() << "power-of-two scales";
  const double rel_tol = b.type == DType::BF16 ? 4e-3 : 1e-3;
  for (float c : {0.37f, -2.5f, 1000.0f, -7.75f}) {
    const std::vector<float> x(size_t(kRowElems), c);
    const auto y = round_trip(b.type, x);
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(y[i], c, std::fabs(c) * rel_tol) << dtype_name(b.type) << " c=" << c << " i=" << i;
    }
  }
}

// Typical weight magnitudes put the K-quant super-scales in the f16
// subnormal range; the scale refit must keep the error at the gaussian bound.
TEST_P(RoundTrip, SmallWeightsWithinBound) {
  const Bound b = GetParam();
  auto x = gaussian_rows(4321, false);
  for (auto& v : x) v *= 0.003f;
  const double pct = relative_rmse_pct(x, round_trip(b.type, x));
  EXPECT_LE(pct, b.gaussian_pct) << dtype_name(b.type);
}

// Values far past the f16 range saturate the stored scale: no inf or nan.
TEST_P(RoundTrip, HugeValuesStayFinite) {
  const Bound b = GetParam();
  if (b.type == DType::F32) GTEST_SKIP() << "f32 stores the values as they are";
  auto x = gaussian_rows(7, false);
  x.resize(size_t(kRowElems));
  for (auto& v : x) v *= 1e9f;
  const bool saturating_float = b.type == DType::F16;  // f16 itself rounds to inf
  for (float v : round_trip(b.type, x)) {
    if (saturating_float) continue;
    ASSERT_TRUE(std::isfinite(v)) << dtype_name(b.type);
  }
}

std::string bound_name(const ::testing::TestParamInfo<Bound>& info) {
  return std::string(dtype_name(info.param.type));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, RoundTrip, ::testing::ValuesIn(kBounds), bound_name);

// The scale search must beat plain min/max scaling, or it is not searching.
// Plain min/max Q4_K on N(0,1) (scale = (max-min)/15, no refinement) gives
// 7.86% relative RMSE on these rows, the search 6.99% (ratio 0.89).
TEST(QuantizeKQuants, SearchBeatsMinMaxScaling) {
  const auto x = gaussian_rows(5, false);
  double err = 0, sig = 0;
  for (size_t s = 0; s < x.size(); s += 32) {
    float lo = 0.0f, hi = x[s];
    for (size_t i = s; i < s + 32; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    const float scale = (hi - lo) / 15.0f;
    for (size_t i = s; i < s + 32; ++i) {
      const float y = lo + scale * std::nearbyint((x[i] - lo) / scale);
      err += (double(x[i]) - y) * (double(x[i]) - y);
      sig += double(x[i]) * x[i];
    }
  }
  const double minmax_pct = 100.0 * std::sqrt(err / sig);
  const double searched_pct = relative_rmse_pct(x, round_trip(DType::Q4_K, x));
  EXPECT_LT(searched_pct, 0.92 * minmax_pct)
      << "min/max " << minmax_pct << "%, searched " << searched_pct << "%";
}

TEST(QuantizeQ8_0, LargestMagnitudeMapsTo127) {
  std::vector<float> x(32, 0.0f);
  x[3] = -4.0f;
  x[9] = 2.0f;
  BlockQ8_0 b;
  quantize_row(DType::Q8_0, x.data(), &b, 32);
  EXPECT_EQ(b.qs[3], -127);
  EXPECT_EQ(b.qs[9], 64);  // 2 / f16(4/127) = 63.504
  EXPECT_EQ(b.qs[0], 0);
}

TEST(QuantizeQ4_0, LargestMagnitudeMapsToCodeZero) {
  std::vector<float> x(32, 0.0f);
  x[20] = 3.0f;  // largest magnitude, positive: d = 3/-8, so 3 -> -8 -> code 0
  x[1] = -1.5f;  // -1.5 / (-3/8) = 4 -> code 12
  BlockQ4_0 b;
  quantize_row(DType::Q4_0, x.data(), &b, 32);
  EXPECT_EQ(b.qs[4] >> 4, 0);  // element 20 is the high nibble of byte 4
  EXPECT_EQ(b.qs[1] & 15, 12);
  EXPECT_EQ(b.qs[0] & 15, 8);  // zero
}

TEST(QuantizeQ8_K, SignedMaxScaleAndBlockSums) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(512);
  for (auto& v : x) v = u(rng);
  x[17] = 5.0f;    // block 0: positive max -> d < 0
  x[300] = -7.0f;  // block 1: negative max -> d > 0
  BlockQ8_K b[2];
  quantize_row(DType::Q8_K, x.data(), b, 512);
  EXPECT_FLOAT_EQ(b[0].d, -5.0f / 127.0f);
  EXPECT_EQ(b[0].qs[17], -127);
  EXPECT_FLOAT_EQ(b[1].d, 7.0f / 127.0f);
  EXPECT_EQ(b[1].qs[300 - 256], -127);
  for (const auto& blk : b) {
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += blk.qs[16 * g + i];
      EXPECT_EQ(blk.bsums[g], sum) << g;
    }
  }
}

TEST(QuantizeQ8_K, TieBetweenSignsPicksPositive) {
  std::vector<float> x(256, 0.25f);
  x[10] = -3.0f;
  x[200] = 3.0f;
  BlockQ8_K b;
  quantize_row(DType::Q8_K, x.data(), &b, 256);
  EXPECT_LT(b.d, 0.0f);
  EXPECT_EQ(b.qs[200], -127);
  EXPECT_EQ(b.qs[10], 127);
}

TEST(QuantizeRows, MatchesRowByRow) {
  const auto x = gaussian_rows(11, false);
  const size_t row_bytes = dtype_row_bytes(DType::Q4_K, kRowElems);
  std::vector<uint8_t> all(row_bytes * 3), one(row_bytes);
  EXPECT_EQ(quantize_rows(DType::Q4_K, x.data(), all.data(), 3, kRowElems), row_bytes * 3);
  for (int r = 0; r < 3; ++r) {
    quantize_row(DType::Q4_K, x.data() + r * kRowElems, one.data(), kRowElems);
    EXPECT_EQ(std::memcmp(one.data(), all.data() + r * row_bytes, row_bytes), 0) << r;
  }
}

// QuantEffort::kQuick (make-model --quick-quant): valid blocks of the same
// type whose error is larger than the search's but bounded (measured on
// these rows: Q4_K 7.83% vs 6.95%, Q5_K 3.80% vs 3.43%, Q6_K 1.89% vs
// 1.69%: 1.11-1.13x; Q2_K 32.86% vs 26.63% (1.23x), IQ4_XS 8.02% vs 7.80%,
// IQ2_XXS 35.82% vs 32.74%, IQ2_XS 30.83% vs 28.41%, IQ2_S 26.25% vs
// 23.80%, IQ3_XXS 18.72% vs 17.63%, IQ3_S 13.72% vs 12.88%: 1.03-1.10x;
// Q3_K 15.57% vs 16.20%: on these unweighted rows the plain range, which
// maps the largest magnitude to the extra level -4, does better than the
// per-sub-block scale search), and kBest is exactly quantize_rows.
TEST(QuantizeRows, QuickEffortIsBoundedAndBestIsTheDefault) {
  const auto x = gaussian_rows(12, false);
  const int64_t rows = int64_t(x.size()) / kRowElems;
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q2_K, DType::Q3_K, DType::IQ4_XS,
                  DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S}) {
    const size_t bytes = dtype_row_bytes(t, kRowElems) * size_t(rows);
    std::vector<uint8_t> best(bytes), quick(bytes), plain(bytes);
    quantize_rows(t, x.data(), plain.data(), rows, kRowElems);
    quantize_rows(t, x.data(), best.data(), rows, kRowElems, QuantEffort::kBest);
    EXPECT_EQ(quick.size(), quantize_rows(t, x.data(), quick.data(), rows, kRowElems, QuantEffort::kQuick));
    EXPECT_EQ(std::memcmp(best.data(), plain.data(), bytes), 0) << dtype_name(t);
    auto error_pct = [&](const std::vector<uint8_t>& q) {
      std::vector<float> y(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        dequantize_row(t, q.data() + size_t(r) * dtype_row_bytes(t, kRowElems), y.data() + r * kRowElems,
                       kRowElems);
      }
      return relative_rmse_pct(x, y);
    };
    const double e_best = error_pct(best), e_quick = error_pct(quick);
    EXPECT_NE(std::memcmp(best.data(), quick.data(), bytes), 0)
        << dtype_name(t) << ": the quick effort should skip the search";
    EXPECT_LT(e_quick, 1.3 * e_best) << dtype_name(t) << ": quick " << e_quick << "%, best " << e_best << "%";
  }
}

}  // namespace
}  // namespace moeserve
