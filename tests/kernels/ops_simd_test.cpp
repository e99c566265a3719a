// Element-wise ops, softmax, RoPE and top-k: the reference against
// double-precision formulas, then every SIMD level against the reference.
//
// Tolerances (|got - want| <= abs + rel * |want| unless said otherwise):
//   reference vs double: rms_norm 1e-6 rel; rope 1e-6 * (|a| + |b|);
//     softmax 1e-5 rel (float sum of up to 4097 terms); silu/swiglu 1e-6 rel;
//     axpy 1 rounding of each of a*x and the sum (2.4e-7 * (|y| + |a x|)).
//   SIMD vs reference: rms_norm 2e-6 rel; rope 1e-6 * (|a| + |b|);
//     softmax 1e-5 rel; silu/swiglu 2e-6 rel + 1e-37 abs (the vector exp has
//     ~2 ulp and flushes results below FLT_MIN); axpy 2.4e-7 * (|y| + |a x|)
//     (FMA skips one rounding); top_k exactly equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/rope_table.h"
#include "ops_test_util.h"

namespace moeserve::cpu {
namespace {

using testing::expect_close;
using testing::odd_sizes;
using testing::random_floats;
using testing::random_normal;

const CpuKernels& ref() { return *cpu_kernels_for(SimdLevel::kReference); }

double silu_d(double v) { return v / (1.0 + std::exp(-v)); }

// ---- reference vs double precision -------------------------------------------

TEST(OpsReference, RmsNormMatchesDouble) {
  for (int64_t n : odd_sizes()) {
    const auto x = random_normal(n, 1 + uint32_t(n), 3.0f);
    const auto w = random_floats(n, 2 + uint32_t(n), 0.5f, 1.5f);
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double scale = 1.0 / std::sqrt(ss / double(n) + 1e-6);
    std::vector<double> want(static_cast<size_t>(n)), want_nw(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      want_nw[size_t(i)] = x[size_t(i)] * scale;
      want[size_t(i)] = want_nw[size_t(i)] * w[size_t(i)];
    }
    std::vector<float> y(static_cast<size_t>(n)), y_nw = x;
    ref().rms_norm(x.data(), w.data(), y.data(), n, 1e-6f);
    ref().rms_norm(y_nw.data(), nullptr, y_nw.data(), n, 1e-6f);  // in place, no weight
    expect_close(y, want, 1e-30, 1e-6, "rms_norm n=" + std::to_string(n));
    expect_close(y_nw, want_nw, 1e-30, 1e-6, "rms_norm (no w, in place) n=" + std::to_string(n));
  }
}

TEST(OpsReference, RopeTableAndRotationMatchDouble) {
  for (int64_t n_rot : {2, 6, 32, 64, 128, 34}) {
    for (int64_t pos : {0, 1, 17, 4095, 1000003}) {
      for (double base : {10000.0, 1e6, 1e7}) {
        std::vector<float> cs(static_cast<size_t>(n_rot));
        rope_cos_sin(pos, n_rot, base, cs.data());
        const int64_t half = n_rot / 2;
        const int64_t head_dim = n_rot + 5;  // dims past n_rot are left alone
        const auto x0 = random_normal(head_dim, uint32_t(pos + n_rot));
        std::vector<double> want(x0.begin(), x0.end());
        for (int64_t i = 0; i < half; ++i) {
          const double theta = double(pos) * std::pow(base, -2.0 * double(i) / double(n_rot));
          ASSERT_NEAR(cs[size_t(i)], std::cos(theta), 1e-7);
          ASSERT_NEAR(cs[size_t(half + i)], std::sin(theta), 1e-7);
          const double a = x0[size_t(i)], b = x0[size_t(half + i)];
          want[size_t(i)] = a * std::cos(theta) - b * std::sin(theta);
          want[size_t(half + i)] = a * std::sin(theta) + b * std::cos(theta);
        }
        std::vector<double> scale(static_cast<size_t>(head_dim));
        for (int64_t i = 0; i < head_dim; ++i) {
          const int64_t pair = i < half ? i + half : (i < n_rot ? i - half : i);
          scale[size_t(i)] = std::fabs(x0[size_t(i)]) + std::fabs(x0[size_t(pair)]);
        }
        auto x = x0;
        ref().rope_neox(x.data(), n_rot, cs.data());
        expect_close(x, want, 0.0, 1e-6, "rope n_rot=" + std::to_string(n_rot) + " pos=" + std::to_string(pos),
                     &scale);
      }
    }
  }
}

TEST(OpsReference, SoftmaxMatchesDouble) {
  for (int64_t n : odd_sizes()) {
    auto x = random_normal(n, 7 + uint32_t(n), 4.0f);
    const double max = *std::max_element(x.begin(), x.end());
    double sum = 0;
    std::vector<double> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) sum += want[size_t(i)] = std::exp(double(x[size_t(i)]) - max);
    for (double& w : want) w /= sum;
    const float got_max = ref().softmax(x.data(), n);
    EXPECT_EQ(double(got_max), max);
    expect_close(x, want, 1e-30, 1e-5, "softmax n=" + std::to_string(n));
  }
  EXPECT_EQ(ref().softmax(nullptr, 0), -INFINITY);
}

TEST(OpsReference, SiluSwigluAxpyMatchDouble) {
  for (int64_t n : odd_sizes()) {
    const auto g = random_normal(n, 11 + uint32_t(n), 6.0f);
    const auto u = random_normal(n, 12 + uint32_t(n));
    std::vector<double> want_silu(static_cast<size_t>(n)), want_swiglu(static_cast<size_t>(n)), want_axpy(static_cast<size_t>(n)), axpy_scale(static_cast<size_t>(n));
    const float a = 0.37f;
    for (size_t i = 0; i < size_t(n); ++i) {
      want_silu[i] = silu_d(g[i]);
      want_swiglu[i] = silu_d(g[i]) * u[i];
      want_axpy[i] = double(u[i]) + double(a) * g[i];
      axpy_scale[i] = std::fabs(u[i]) + std::fabs(double(a) * g[i]);
    }
    std::vector<float> silu(static_cast<size_t>(n)), swiglu(static_cast<size_t>(n)), axpy = u;
    ref().silu(g.data(), silu.data(), n);
    ref().swiglu(g.data(), u.data(), swiglu.data(), n);
    ref().axpy(a, g.data(), axpy.data(), n);
    const std::string sz = " n=" + std::to_string(n);
    expect_close(silu, want_silu, 1e-37, 1e-6, "silu" + sz);
    expect_close(swiglu, want_swiglu, 1e-37, 1e-6, "swiglu" + sz);
    expect_close(axpy, want_axpy, 0.0, 2.4e-7, "axpy" + sz, &axpy_scale);
  }
}

// Sort all (value, index) pairs; an independent statement of the contract.
std::vector<int32_t> naive_top_k(const std::vector<float>& x, int64_t k) {
  std::vector<std::pair<float, int32_t>> all;
  for (size_t i = 0; i < x.size(); ++i) all.push_back({std::isnan(x[i]) ? -INFINITY : x[i], int32_t(i)});
  std::stable_sort(all.begin(), all.end(), [&](const auto& a, const auto& b) {
    const bool na = std::isnan(x[size_t(a.second)]), nb = std::isnan(x[size_t(b.second)]);
    if (na != nb) return nb;  // NaN last
    return a.first > b.first;
  });
  std::vector<int32_t> out;
  for (int64_t i = 0; i < k; ++i) out.push_back(i < int64_t(all.size()) ? all[size_t(i)].second : -1);
  return out;
}

// Few distinct values so ties are everywhere, plus some NaN and infinities.
std::vector<float> tie_heavy(int64_t n, uint32_t seed) {
  auto x = random_floats(n, seed, 0.0f, 6.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::floor(x[i]);
    if (i % 13 == 5) x[i] = NAN;
    if (i % 29 == 3) x[i] = -INFINITY;
    if (i % 41 == 40) x[i] = INFINITY;
  }
  return x;
}

TEST(OpsReference, TopKMatchesFullSort) {
  for (int64_t n : odd_sizes()) {
    for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{8}, int64_t{10}, n / 2, n}) {
      if (k < 1 || k > n) continue;
      for (const auto& x : {random_normal(n, uint32_t(n * 3 + k)), tie_heavy(n, uint32_t(n + k))}) {
        std::vector<int32_t> got(size_t(k), -7);
        ref().top_k(x.data(), n, k, got.data());
        ASSERT_EQ(got, naive_top_k(x, k)) << "n=" << n << " k=" << k;
      }
    }
  }
}

TEST(OpsReference, TopKWithKPastNFillsMinusOne) {
  const std::vector<float> x = {1.0f, 3.0f, 2.0f};
  std::vector<int32_t> got(5, 99);
  ref().top_k(x.data(), 3, 5, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{1, 2, 0, -1, -1}));
}

// ---- every SIMD level vs the reference ----------------------------------------

class OpsSimd : public testing::SimdLevelTest {};

TEST_P(OpsSimd, RmsNorm) {
  for (int64_t n : odd_sizes()) {
    const auto x = random_normal(n, 21 + uint32_t(n), 2.0f);
    const auto w = random_floats(n, 22 + uint32_t(n), -2.0f, 2.0f);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    ref_->rms_norm(x.data(), w.data(), want.data(), n, 1e-5f);
    simd_->rms_norm(x.data(), w.data(), got.data(), n, 1e-5f);
    expect_close(got, want, 1e-30, 2e-6, "rms_norm n=" + std::to_string(n));
    auto in_place = x;
    ref_->rms_norm(x.data(), nullptr, want.data(), n, 1e-5f);
    simd_->rms_norm(in_place.data(), nullptr, in_place.data(), n, 1e-5f);
    expect_close(in_place, want, 1e-30, 2e-6, "rms_norm in place n=" + std::to_string(n));
  }
}

TEST_P(OpsSimd, RopeNeox) {
  for (int64_t n_rot : {2, 14, 16, 30, 32, 34, 64, 128, 256}) {
    for (int64_t pos : {0, 3, 777, 131071}) {
      std::vector<float> cs(static_cast<size_t>(n_rot));
      rope_cos_sin(pos, n_rot, 1e6, cs.data());
      const auto x0 = random_normal(n_rot + 3, uint32_t(n_rot * 7 + pos));
      auto want = x0, got = x0;
      ref_->rope_neox(want.data(), n_rot, cs.data());
      simd_->rope_neox(got.data(), n_rot, cs.data());
      std::vector<double> scale(x0.size());
      const int64_t half = n_rot / 2;
      for (int64_t i = 0; i < int64_t(x0.size()); ++i) {
        const int64_t pair = i < half ? i + half : (i < n_rot ? i - half : i);
        scale[size_t(i)] = std::fabs(x0[size_t(i)]) + std::fabs(x0[size_t(pair)]);
      }
      expect_close(got, want, 0.0, 1e-6, "rope n_rot=" + std::to_string(n_rot), &scale);
      for (size_t i = size_t(n_rot); i < x0.size(); ++i) ASSERT_EQ(got[i], x0[i]) << "rope wrote past n_rot";
    }
  }
}

TEST_P(OpsSimd, Softmax) {
  for (int64_t n : odd_sizes()) {
    for (float spread : {0.1f, 5.0f, 40.0f}) {
      const auto x = random_normal(n, 31 + uint32_t(n), spread);
      auto want = x, got = x;
      const float want_max = ref_->softmax(want.data(), n);
      const float got_max = simd_->softmax(got.data(), n);
      EXPECT_EQ(got_max, want_max);
      expect_close(got, want, 1e-37, 1e-5, "softmax n=" + std::to_string(n));
    }
  }
}

TEST_P(OpsSimd, SiluAndSwiglu) {
  for (int64_t n : odd_sizes()) {
    const auto g = random_normal(n, 41 + uint32_t(n), 8.0f);
    const auto u = random_normal(n, 42 + uint32_t(n));
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    ref_->silu(g.data(), want.data(), n);
    simd_->silu(g.data(), got.data(), n);
    expect_close(got, want, 1e-37, 2e-6, "silu n=" + std::to_string(n));
    ref_->swiglu(g.data(), u.data(), want.data(), n);
    auto in_place = g;
    simd_->swiglu(in_place.data(), u.data(), in_place.data(), n);
    expect_close(in_place, want, 1e-37, 2e-6, "swiglu in place n=" + std::to_string(n));
  }
}

// A dense sweep over the whole range where exp matters, including the
// overflow/underflow edges and non-finite inputs.
TEST_P(OpsSimd, SiluSweepCoversExpRange) {
  std::vector<float> x;
  for (float v = -104.0f; v <= 104.0f; v += 0.00731f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 88.72f, -88.72f, 87.33f, -87.34f, 1e-30f, -1e-30f, INFINITY, -INFINITY, NAN}) {
    x.push_back(v);
  }
  const int64_t n = int64_t(x.size());
  std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  ref_->silu(x.data(), want.data(), n);
  simd_->silu(x.data(), got.data(), n);
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(want[i])) {  // silu(inf) = inf, silu(-inf) and silu(nan) = nan
      ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i])) << "silu(" << x[i] << ")";
      if (!std::isnan(want[i])) {
        ASSERT_EQ(got[i], want[i]) << "silu(" << x[i] << ")";
      }
      continue;
    }
    ASSERT_NEAR(got[i], want[i], 1e-37 + 2e-6 * std::fabs(want[i])) << "silu(" << x[i] << ")";
  }
}

TEST_P(OpsSimd, Axpy) {
  for (int64_t n : odd_sizes()) {
    const auto x = random_normal(n, 51 + uint32_t(n));
    const auto y0 = random_normal(n, 52 + uint32_t(n));
    auto want = y0, got = y0;
    ref_->axpy(-1.75f, x.data(), want.data(), n);
    simd_->axpy(-1.75f, x.data(), got.data(), n);
    std::vector<double> scale(static_cast<size_t>(n));
    for (size_t i = 0; i < size_t(n); ++i) scale[i] = std::fabs(y0[i]) + std::fabs(1.75 * x[i]);
    expect_close(got, want, 0.0, 2.4e-7, "axpy n=" + std::to_string(n), &scale);
  }
}

TEST_P(OpsSimd, TopKIsIdentical) {
  for (int64_t n : odd_sizes()) {
    for (int64_t k : {int64_t{1}, int64_t{4}, int64_t{8}, int64_t{10}, n / 3, n}) {
      if (k < 1 || k > n) continue;
      for (const auto& x : {random_normal(n, uint32_t(61 + n + k)), tie_heavy(n, uint32_t(62 + n * k))}) {
        std::vector<int32_t> want(static_cast<size_t>(k)), got(size_t(k), -7);
        ref_->top_k(x.data(), n, k, want.data());
        simd_->top_k(x.data(), n, k, got.data());
        ASSERT_EQ(got, want) << "n=" << n << " k=" << k;
      }
    }
  }
  // Router-sized: 512 experts, top 10, all NaN but one.
  std::vector<float> x(512, NAN);
  x[300] = -5.0f;
  std::vector<int32_t> want(10), got(10);
  ref_->top_k(x.data(), 512, 10, want.data());
  simd_->top_k(x.data(), 512, 10, got.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], 300);
  std::vector<int32_t> past(4, 9);
  simd_->top_k(x.data(), 2, 4, past.data());
  EXPECT_EQ(past[2], -1);
  EXPECT_EQ(past[3], -1);
}

INSTANTIATE_TEST_SUITE_P(Levels, OpsSimd, ::testing::Values(SimdLevel::kAvx2, SimdLevel::kAvx512),
                         testing::simd_param_name);

}  // namespace
}  // namespace moeserve::cpu
