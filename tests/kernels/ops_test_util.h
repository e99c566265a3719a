// Shared helpers of the ops/matmul kernel tests: random data, SIMD-level
// parameters, a tolerance check that reports the worst element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace moeserve::cpu::testing {

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(size_t(std::max<int64_t>(n, 0)));
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> random_normal(int64_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(size_t(std::max<int64_t>(n, 0)));
  for (float& x : v) x = dist(rng);
  return v;
}

// Sizes that hit every tail case of 8- and 16-wide vectors.
inline const std::vector<int64_t>& odd_sizes() {
  static const std::vector<int64_t> sizes = {1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 100, 255, 4097};
  return sizes;
}

// Expect |got[i] - want[i]| <= abs_tol + rel_tol * scale[i] for all i, where
// scale defaults to |want[i]|. Reports the worst element only.
template <typename Want>
void expect_close(const std::vector<float>& got, const std::vector<Want>& want, double abs_tol, double rel_tol,
                  const std::string& what, const std::vector<double>* scale = nullptr) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst_excess = 0.0;
  size_t worst = 0;
  bool bad = false;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = double(want[i]);
    const double s = scale != nullptr ? (*scale)[i] : std::fabs(w);
    const double err = std::fabs(double(got[i]) - w);
    const double excess = err - (abs_tol + rel_tol * s);
    if (!(excess <= 0.0)) {  // also catches NaN
      if (!bad || excess > worst_excess || std::isnan(excess)) {
        worst_excess = excess;
        worst = i;
      }
      bad = true;
    }
  }
  if (bad) {
    ADD_FAILURE() << what << ": element " << worst << " of " << got.size() << " got " << got[worst] << " want "
                  << double(want[worst]) << " (abs " << abs_tol << ", rel " << rel_tol << ")";
  }
}

// Parameter of the SIMD-vs-reference tests: one SIMD level each.
class SimdLevelTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    simd_ = cpu_kernels_for(GetParam());
    ref_ = cpu_kernels_for(SimdLevel::kReference);
    if (simd_ == nullptr) GTEST_SKIP() << "this CPU cannot run " << simd_level_name(GetParam());
  }
  const CpuKernels* simd_ = nullptr;
  const CpuKernels* ref_ = nullptr;
};

inline std::string simd_param_name(const ::testing::TestParamInfo<SimdLevel>& info) {
  return std::string(simd_level_name(info.param));
}

}  // namespace moeserve::cpu::testing
