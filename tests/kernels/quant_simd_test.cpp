// vec_dot of every level and weight type against the reference level and
// against a double-precision dot of the dequantized operands.
//
// Tolerances:
//  - level vs reference, and any level vs the double dot of the dequantized
//    operands: |a - b| <= 1e-5 * Σ|w_i*x_i| (dequantized values). The integer
//    block sums are exact in every level; only the float scaling and the
//    summation order differ (each a few ulps of the magnitude sum).
//  - vec_dot(w, quantize(x)) vs Σ w_i*x_i with the f32 x: bounded by
//    Cauchy-Schwarz, |Σ w (x - x_q)| <= ||w|| * ||x - x_q||, plus the above.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/half.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/register.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"
#include "weight_bytes.h"

namespace moeserve::cpu {
namespace {

constexpr double kRelTol = 1e-5;

struct Operands {
  std::vector<uint8_t> w;  // weight row of type t
  std::vector<uint8_t> x;  // activation row of vec_dot_type(t)
  std::vector<float> x_f32;
  std::vector<float> w_deq, x_deq;
};

enum class WeightData { kQuantizedGaussian, kRandomBytes };

std::vector<float> gaussian(std::mt19937& rng, int64_t n, float sigma) {
  std::normal_distribution<float> g(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = g(rng);
  return v;
}

Operands make_operands(DType t, int64_t n, WeightData data, uint32_t seed) {
  std::mt19937 rng(seed);
  const DType xt = dtype_traits(t).vec_dot_type;
  Operands op;
  op.w.resize(dtype_row_bytes(t, n));
  if ((data == WeightData::kRandomBytes || !dtype_has_quantizer(t)) && dtype_traits(t).quantized) {
    moeserve::testing::randomize_weight_bytes(t, op.w, rng);
  } else {
    const auto wf = gaussian(rng, n, 0.05f);
    quantize_row(t, wf.data(), op.w.data(), n);
  }
  op.x_f32 = gaussian(rng, n, 1.0f);
  op.x.resize(dtype_row_bytes(xt, n));
  quantize_row(xt, op.x_f32.data(), op.x.data(), n);
  op.w_deq.resize(size_t(n));
  op.x_deq.resize(size_t(n));
  dequantize_row(t, op.w.data(), op.w_deq.data(), n);
  dequantize_row(xt, op.x.data(), op.x_deq.data(), n);
  return op;
}

struct Exact {
  double dot = 0;
  double magnitude = 0;  // Σ|w*x|
};

Exact exact_dot(const std::vector<float>& w, const std::vector<float>& x) {
  Exact e;
  for (size_t i = 0; i < w.size(); ++i) {
    e.dot += double(w[i]) * x[i];
    e.magnitude += std::fabs(double(w[i]) * x[i]);
  }
  return e;
}

std::vector<int64_t> test_sizes(DType t) {
  if (!dtype_traits(t).quantized) return {1, 7, 8, 16, 33, 64, 65, 1000, 4096};
  const int64_t blk = dtype_block_elems(t);
  std::vector<int64_t> sizes;
  for (int64_t nb : {1, 2, 3, 5, 8, 17}) sizes.push_back(nb * blk);
  return sizes;
}

// A level's table, or (novbmi) the AVX-512 table built without the VBMI
// kernels that cpu_kernels_for gives where the CPU has VBMI: both variants
// run on such a CPU.
struct Case {
  SimdLevel level;
  DType type;
  bool novbmi = false;
};

std::string table_name(const Case& c) {
  return std::string(simd_level_name(c.level)) + (c.novbmi ? "_novbmi" : "");
}

void PrintTo(const Case& c, std::ostream* os) { *os << table_name(c) << "/" << dtype_name(c.type); }

const CpuKernels* avx512_without_vbmi() {
  if (cpu_kernels_for(SimdLevel::kAvx512) == nullptr) return nullptr;
  static const CpuKernels table = detail::build_kernels(SimdLevel::kAvx512, /*vbmi=*/false);
  return &table;
}

bool has_vbmi_kernels() { return cpu_features().avx512_vbmi && cpu_features().avx512_bitalg; }

class VecDot : public ::testing::TestWithParam<Case> {
 protected:
  const CpuKernels* kernels() {
    return GetParam().novbmi ? avx512_without_vbmi() : cpu_kernels_for(GetParam().level);
  }
};

TEST_P(VecDot, MatchesReferenceAndDoubleDot) {
  const Case c = GetParam();
  const CpuKernels* k = kernels();
  if (k == nullptr) GTEST_SKIP() << table_name(c) << " not supported on this CPU";
  const CpuKernels* ref = cpu_kernels_for(SimdLevel::kReference);
  for (WeightData data : {WeightData::kQuantizedGaussian, WeightData::kRandomBytes}) {
    for (int64_t n : test_sizes(c.type)) {
      const Operands op = make_operands(c.type, n, data, uint32_t(n * 31 + int(data)));
      const VecDotFn fn = k->vec_dot[dtype_slot(c.type)];
      ASSERT_NE(fn, nullptr);
      const float got = fn(n, op.w.data(), op.x.data());
      const float want = ref->vec_dot[dtype_slot(c.type)](n, op.w.data(), op.x.data());
      const Exact e = exact_dot(op.w_deq, op.x_deq);
      const double tol = kRelTol * e.magnitude + 1e-30;
      EXPECT_NEAR(got, want, tol) << "n=" << n << " data=" << int(data);
      EXPECT_NEAR(got, e.dot, tol) << "n=" << n << " data=" << int(data);
    }
  }
}

TEST_P(VecDot, CloseToFloatDotWithinQuantizationError) {
  const Case c = GetParam();
  const CpuKernels* k = kernels();
  if (k == nullptr) GTEST_SKIP() << table_name(c) << " not supported on this CPU";
  for (int64_t n : test_sizes(c.type)) {
    const Operands op = make_operands(c.type, n, WeightData::kQuantizedGaussian, uint32_t(n + 5));
    const float got = k->vec_dot[dtype_slot(c.type)](n, op.w.data(), op.x.data());
    double w_norm = 0, x_err = 0;
    for (int64_t i = 0; i < n; ++i) {
      w_norm += double(op.w_deq[i]) * op.w_deq[i];
      x_err += (double(op.x_f32[i]) - op.x_deq[i]) * (double(op.x_f32[i]) - op.x_deq[i]);
    }
    const Exact e = exact_dot(op.w_deq, op.x_f32);
    const double bound = std::sqrt(w_norm) * std::sqrt(x_err) + kRelTol * e.magnitude + 1e-30;
    EXPECT_NEAR(got, e.dot, bound) << "n=" << n;
  }
}

// Every weight byte set to 0xFF, 0x80 or 0x7F (codes and scale codes at
// their extremes: Q8_0 -1/-128/127, nibbles 15, Q6_K codes 63 and scales
// -128, 6-bit scales and mins 63) against activations all at +127 or -127:
// each int16 pair sum at its largest, where a wrong operand order or sign
// trick would saturate or wrap.
TEST_P(VecDot, ExtremeCodesDoNotSaturate) {
  const Case c = GetParam();
  const CpuKernels* k = kernels();
  if (k == nullptr) GTEST_SKIP() << table_name(c) << " not supported on this CPU";
  if (!dtype_traits(c.type).quantized) GTEST_SKIP() << "float type";
  const int64_t n = 4 * dtype_block_elems(c.type);
  const DType xt = dtype_traits(c.type).vec_dot_type;
  std::mt19937 rng(17);
  for (uint8_t fill : {uint8_t(0xFF), uint8_t(0x80), uint8_t(0x7F)}) {
    for (float sign : {1.0f, -1.0f}) {
      std::vector<uint8_t> w(dtype_row_bytes(c.type, n), fill);
      moeserve::testing::set_finite_scales(c.type, w, rng);
      const std::vector<float> xf(size_t(n), sign);
      std::vector<uint8_t> x(dtype_row_bytes(xt, n));
      quantize_row(xt, xf.data(), x.data(), n);
      std::vector<float> wd(static_cast<size_t>(n)), xd(static_cast<size_t>(n));
      dequantize_row(c.type, w.data(), wd.data(), n);
      dequantize_row(xt, x.data(), xd.data(), n);
      const Exact e = exact_dot(wd, xd);
      const float got = k->vec_dot[dtype_slot(c.type)](n, w.data(), x.data());
      EXPECT_NEAR(got, e.dot, kRelTol * e.magnitude) << "fill " << int(fill) << " sign " << sign;
    }
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (SimdLevel level : {SimdLevel::kReference, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    for (DType t : kWeightDTypes) cases.push_back({level, t});
  }
  for (DType t : kWeightDTypes) cases.push_back({SimdLevel::kAvx512, t, /*novbmi=*/true});
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return table_name(info.param) + "_" + std::string(dtype_name(info.param.type));
}

// Multi-column dots (vec_dot_columns, through vec_dot_cols where a level has
// it) equal vec_dot of each column bit for bit, for every column count, so a
// token's result does not depend on which tokens share its batch.
TEST_P(VecDot, ColumnsAreBitIdenticalToSingleDots) {
  const CpuKernels* k = kernels();
  if (k == nullptr) GTEST_SKIP() << "level not supported on this CPU";
  const DType t = GetParam().type;
  const DType xt = dtype_traits(t).vec_dot_type;
  for (int64_t n : test_sizes(t)) {
    const size_t x_bytes = dtype_row_bytes(xt, n) + 8;  // padded stride
    std::vector<uint8_t> xs(x_bytes * 9);
    std::mt19937 rng{uint32_t(n)};
    const Operands w = make_operands(t, n, WeightData::kRandomBytes, uint32_t(n) + 1);
    for (int i = 0; i < 9; ++i) {
      const auto xf = gaussian(rng, n, 1.0f);
      quantize_row(xt, xf.data(), xs.data() + size_t(i) * x_bytes, n);
    }
    for (int64_t cols = 0; cols <= 9; ++cols) {
      std::vector<float> out(size_t(cols) * 3 + 1, -1.0f);
      vec_dot_columns(*k, t, n, w.w.data(), xs.data(), x_bytes, cols, out.data(), 3);
      for (int64_t i = 0; i < cols; ++i) {
        const float want = k->vec_dot[dtype_slot(t)](n, w.w.data(), xs.data() + size_t(i) * x_bytes);
        ASSERT_EQ(out[size_t(i) * 3], want) << "n=" << n << " cols=" << cols << " column " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, VecDot, ::testing::ValuesIn(all_cases()), case_name);

float dot_low(int64_t, const void*, const void*) { return 1.0f; }
float dot_high(int64_t, const void*, const void*) { return 2.0f; }
void cols_low(int64_t, const void*, const void*, size_t, int, float*, int64_t) {}
void cols_high(int64_t, const void*, const void*, size_t, int, float*, int64_t) {}

// A level that replaces a type's dot but not its column kernel drops the
// inherited one (AVX-512's own Q5_K dot once ran beside AVX2's Q5_K column
// kernel, and their results differed in the last bits); a level that
// replaces both keeps its own, and types it leaves alone keep theirs.
TEST(KernelTables, AReplacedDotDropsTheInheritedColumnKernel) {
  CpuKernels lower;
  const size_t both = dtype_slot(DType::Q4_K), dot_only = dtype_slot(DType::Q5_K),
               untouched = dtype_slot(DType::Q6_K);
  for (size_t s : {both, dot_only, untouched}) lower.vec_dot[s] = dot_low, lower.vec_dot_cols[s] = cols_low;
  CpuKernels higher = lower;
  higher.vec_dot[both] = dot_high, higher.vec_dot_cols[both] = cols_high;
  higher.vec_dot[dot_only] = dot_high;
  detail::drop_inherited_columns(higher, lower);
  EXPECT_EQ(higher.vec_dot_cols[both], &cols_high);
  EXPECT_EQ(higher.vec_dot_cols[dot_only], nullptr);
  EXPECT_EQ(higher.vec_dot_cols[untouched], &cols_low);
  EXPECT_EQ(higher.vec_dot[dot_only], &dot_high);
}

// Where the CPU has VBMI, the AVX-512 table holds the VBMI kernels of the
// types that have them, so the avx512 cases above test those and the
// avx512_novbmi cases the plain ones.
TEST(KernelTables, Avx512HasTheVbmiKernelsWhereTheCpuHasVbmi) {
  const CpuKernels* with = cpu_kernels_for(SimdLevel::kAvx512);
  if (with == nullptr || !has_vbmi_kernels()) GTEST_SKIP() << "no AVX-512 VBMI on this CPU";
  if (std::getenv("MOESERVE_SIMD") != nullptr) GTEST_SKIP() << "MOESERVE_SIMD set";
  const CpuKernels* without = avx512_without_vbmi();
  for (DType t : {DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_S,
                  DType::IQ1_M}) {
    EXPECT_NE(with->vec_dot[dtype_slot(t)], without->vec_dot[dtype_slot(t)]) << dtype_name(t);
    EXPECT_NE(with->vec_dot_cols[dtype_slot(t)], without->vec_dot_cols[dtype_slot(t)]) << dtype_name(t);
  }
  EXPECT_EQ(with->vec_dot[dtype_slot(DType::Q4_K)], without->vec_dot[dtype_slot(DType::Q4_K)]);
}

// The block sums are exact and both variants scale and add them in the same
// order, so a VBMI kernel gives the plain AVX-512 kernel's result bit for bit
// (IQ1's plain kernels are AVX2's, whose float steps differ: the reference
// tests above check it).
TEST(KernelTables, VbmiKernelsEqualThePlainOnesBitForBit) {
  const CpuKernels* with = cpu_kernels_for(SimdLevel::kAvx512);
  if (with == nullptr || !has_vbmi_kernels()) GTEST_SKIP() << "no AVX-512 VBMI on this CPU";
  const CpuKernels* without = avx512_without_vbmi();
  for (DType t : kWeightDTypes) {
    const size_t slot = dtype_slot(t);
    if (with->vec_dot[slot] == without->vec_dot[slot]) continue;
    if (without->vec_dot[slot] == cpu_kernels_for(SimdLevel::kAvx2)->vec_dot[slot]) continue;
    for (WeightData data : {WeightData::kQuantizedGaussian, WeightData::kRandomBytes}) {
      for (int64_t n : test_sizes(t)) {
        const Operands op = make_operands(t, n, data, uint32_t(n * 7 + int(data)));
        ASSERT_EQ(with->vec_dot[slot](n, op.w.data(), op.x.data()),
                  without->vec_dot[slot](n, op.w.data(), op.x.data()))
            << dtype_name(t) << " n=" << n << " data=" << int(data);
      }
    }
  }
}

}  // namespace
}  // namespace moeserve::cpu
