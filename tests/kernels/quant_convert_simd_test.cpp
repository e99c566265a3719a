// Activation quantizers and dequantizers of every level against the
// reference level: the SIMD quantizers repeat the reference arithmetic and
// must produce identical bytes; dequantizers must produce identical floats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"
#include "weight_bytes.h"

namespace moeserve::cpu {
namespace {

constexpr SimdLevel kSimdLevels[] = {SimdLevel::kAvx2, SimdLevel::kAvx512};
constexpr DType kActivationTypes[] = {DType::Q8_0, DType::Q8_K, DType::F16};

// Rows that stress the quantizers' edge cases, each a multiple of 256 long.
std::vector<std::vector<float>> activation_rows() {
  std::vector<std::vector<float>> rows;
  std::mt19937 rng(42);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int64_t blocks : {1, 2, 3, 5, 8, 17}) {
    std::vector<float> r(size_t(blocks * 256));
    for (auto& v : r) v = g(rng);
    rows.push_back(r);
  }
  // Exact .5 ties after scaling: the max is 127 (scale exactly 1 for Q8_0,
  // -1 for Q8_K), the rest k + 0.5.
  std::vector<float> ties(256);
  for (int i = 0; i < 256; ++i) ties[i] = (i % 32 == 0) ? 127.0f : float((i * 7) % 250 - 125) + 0.5f;
  rows.push_back(ties);
  // +a and -a both present (sign tie), zeros, a lone outlier.
  std::vector<float> mixed(512, 0.0f);
  mixed[3] = -9.0f;
  mixed[100] = 9.0f;
  for (int i = 256; i < 512; ++i) mixed[i] = (i % 5) * 0.01f;
  mixed[300] = -1000.0f;
  rows.push_back(mixed);
  // Huge (the Q8_0 f16 scale saturates) and tiny (subnormal f16 scale) values.
  std::vector<float> scaled(512);
  for (int i = 0; i < 512; ++i) scaled[i] = g(rng) * (i < 256 ? 1e9f : 1e-6f);
  rows.push_back(scaled);
  return rows;
}

class ActivationQuantizer : public ::testing::TestWithParam<SimdLevel> {};

TEST_P(ActivationQuantizer, IdenticalBytesToReference) {
  const CpuKernels* k = cpu_kernels_for(GetParam());
  if (k == nullptr) GTEST_SKIP() << simd_level_name(GetParam()) << " not supported on this CPU";
  const CpuKernels* ref = cpu_kernels_for(SimdLevel::kReference);
  const auto rows = activation_rows();
  for (DType t : kActivationTypes) {
    for (size_t r = 0; r < rows.size(); ++r) {
      const int64_t n = int64_t(rows[r].size());
      const size_t bytes = dtype_row_bytes(t, n);
      std::vector<uint8_t> got(bytes, 0xCD), want(bytes, 0xAB);
      k->quantize_row[dtype_slot(t)](rows[r].data(), got.data(), n);
      ref->quantize_row[dtype_slot(t)](rows[r].data(), want.data(), n);
      size_t first_diff = bytes;
      for (size_t i = 0; i < bytes; ++i) {
        if (got[i] != want[i]) {
          first_diff = i;
          break;
        }
      }
      EXPECT_EQ(first_diff, bytes) << dtype_name(t) << " row " << r << ": first differing byte "
                                   << first_diff;
    }
  }
}

// f32 -> f16 (the KV cache) at lengths that are not a multiple of the vector
// width, through rounding ties, overflow, subnormals and signed zeros. NaN
// payloads may differ between the hardware conversion and the reference, so
// a NaN is only checked to stay a NaN.
TEST_P(ActivationQuantizer, F16EdgeValuesMatchReference) {
  const CpuKernels* k = cpu_kernels_for(GetParam());
  if (k == nullptr) GTEST_SKIP() << simd_level_name(GetParam()) << " not supported on this CPU";
  const CpuKernels* ref = cpu_kernels_for(SimdLevel::kReference);
  const float edges[] = {0.0f,
                         -0.0f,
                         1.0f + 1.0f / 2048,
                         1.0f + 3.0f / 2048,
                         65504.0f,
                         65519.0f,
                         65520.0f,
                         -70000.0f,
                         6.0e-8f,
                         2.9e-8f,
                         3.0e-8f,
                         -1.0e-5f,
                         6.1e-5f,
                         1.0e-30f,
                         INFINITY,
                         -INFINITY};
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 100.0f);
  for (int64_t n : {1, 7, 15, 16, 17, 23, 263}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (size_t i = 0; i < x.size(); ++i) x[i] = i < std::size(edges) ? edges[i] : g(rng);
    if (n == 263) x[200] = NAN;
    std::vector<uint16_t> got(size_t(n) + 1, 0xCDCD), want(size_t(n) + 1, 0xCDCD);
    k->quantize_row[dtype_slot(DType::F16)](x.data(), got.data(), n);
    ref->quantize_row[dtype_slot(DType::F16)](x.data(), want.data(), n);
    for (size_t i = 0; i < size_t(n); ++i) {
      if (std::isnan(x[i])) {
        EXPECT_EQ(got[i] & 0x7c00, 0x7c00) << "NaN stays NaN";
        EXPECT_NE(got[i] & 0x03ff, 0) << "NaN stays NaN";
        continue;
      }
      EXPECT_EQ(got[i], want[i]) << "n " << n << " index " << i << " value " << x[i];
    }
    EXPECT_EQ(got[size_t(n)], 0xCDCD) << "wrote past the end, n " << n;
  }
}

// The reference table's quantizers are the tensor layer's (the ground truth).
TEST(ActivationQuantizerReference, IsTheTensorLayerQuantizer) {
  const CpuKernels* ref = cpu_kernels_for(SimdLevel::kReference);
  ASSERT_NE(ref, nullptr);
  const auto rows = activation_rows();
  for (DType t : kActivationTypes) {
    const int64_t n = int64_t(rows[0].size());
    std::vector<uint8_t> got(dtype_row_bytes(t, n)), want(dtype_row_bytes(t, n));
    ref->quantize_row[dtype_slot(t)](rows[0].data(), got.data(), n);
    quantize_row(t, rows[0].data(), want.data(), n);
    EXPECT_EQ(got, want) << dtype_name(t);
  }
}

class Dequantizer : public ::testing::TestWithParam<SimdLevel> {};

TEST_P(Dequantizer, IdenticalToReference) {
  const CpuKernels* k = cpu_kernels_for(GetParam());
  if (k == nullptr) GTEST_SKIP() << simd_level_name(GetParam()) << " not supported on this CPU";
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 0.05f);
  for (DType t : kWeightDTypes) {
    for (int64_t blocks : {1, 3, 17}) {
      // Float types also get lengths that are not a multiple of the vector width.
      const int64_t n = dtype_traits(t).quantized ? blocks * dtype_block_elems(t) : blocks * 256 + 7;
      std::vector<float> src(static_cast<size_t>(n));
      for (auto& v : src) v = g(rng);
      const std::vector<uint8_t> q = moeserve::testing::weight_rows(t, src, 1, n, uint32_t(n));
      std::vector<float> got(size_t(n), -1.0f), want(static_cast<size_t>(n), -2.0f);
      ASSERT_NE(k->dequantize_row[dtype_slot(t)], nullptr) << dtype_name(t);
      k->dequantize_row[dtype_slot(t)](q.data(), got.data(), n);
      dequantize_row(t, q.data(), want.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], want[i]) << dtype_name(t) << " n=" << n << " i=" << i;
      }
    }
  }
}

std::string level_name(const ::testing::TestParamInfo<SimdLevel>& info) {
  return std::string(simd_level_name(info.param));
}

INSTANTIATE_TEST_SUITE_P(Simd, ActivationQuantizer, ::testing::ValuesIn(kSimdLevels), level_name);
INSTANTIATE_TEST_SUITE_P(AllLevels, Dequantizer,
                         ::testing::Values(SimdLevel::kReference, SimdLevel::kAvx2, SimdLevel::kAvx512),
                         level_name);

}  // namespace
}  // namespace moeserve::cpu
