// Greedy sampling on the GPU (kernels/cuda/sample.h) vs the host sampler's
// arg-max rule (the CPU reference top_k with k = 1, as runtime/sampler.cpp):
// the largest value, NaN as -inf, ties to the lowest index, 0 when nothing
// is above -inf. Odd row lengths and offsets (the float4 path's edges),
// planted ties, NaN and +-inf, a vocabulary-sized row, ids poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/sample.h"
#include "kernels_gpu/cuda/gpu_test_util.h"

namespace moeserve {
namespace {

using testing::DeviceArray;

int32_t argmax_ref(const float* row, int64_t n) {
  int32_t best = 0;
  cpu::cpu_kernels_for(cpu::SimdLevel::kReference)->top_k(row, n, 1, &best);
  return row[best] > -INFINITY ? best : 0;
}

// Rows of random logits; row r gets a planted feature by r % 8.
std::vector<float> logit_rows(int64_t n_rows, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::uniform_int_distribution<int64_t> col(0, n - 1);
  std::vector<float> x(size_t(n_rows * n));
  for (float& v : x) v = dist(rng);
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x.data() + r * n;
    const int64_t a = col(rng), b = col(rng);
    switch (r % 8) {
      case 1:  // a tie at the top: the lower index wins
        row[a] = row[b] = 100.0f;
        break;
      case 2:  // NaN above everything counts as -inf
        row[a] = NAN, row[b] = 50.0f;
        break;
      case 3:
        for (int64_t i = 0; i < n; ++i) row[i] = -INFINITY;
        break;
      case 4:
        for (int64_t i = 0; i < n; ++i) row[i] = NAN;
        break;
      case 5:
        row[a] = INFINITY;
        break;
      case 6:  // the best at the very end of the row
        row[n - 1] = 1000.0f;
        break;
      default:
        break;
    }
  }
  return x;
}

class ArgmaxGpu : public ::testing::TestWithParam<std::tuple<int64_t, int>> {};

TEST_P(ArgmaxGpu, MatchesTheHostSampler) {
  MOESERVE_REQUIRE_GPU();
  const auto [n, off] = GetParam();
  const int64_t R = 16;
  auto x = logit_rows(R, n, uint32_t(n + off));
  x.insert(x.begin(), size_t(off), 7.0f);  // rows start `off` floats into the buffer
  DeviceArray<float> dx(x);
  DeviceArray<int32_t> ids{size_t(R)};
  ids.poison();
  ASSERT_TRUE(cuda::argmax_rows({dx.get() + off, R, n, ids.get()}, nullptr).is_ok());
  const auto got = ids.download();
  for (int64_t r = 0; r < R; ++r) {
    ASSERT_EQ(got[size_t(r)], argmax_ref(x.data() + off + r * n, n)) << "row " << r << " of " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ArgmaxGpu,
                         ::testing::Combine(::testing::Values(1, 2, 5, 1023, 4099, 151936),
                                            ::testing::Values(0, 1, 3)));

// top_k_rows against a plain double-precision reference: the k largest of
// scale * x (softcapped), ties to the lower index, NaN as -inf, with their
// log-softmax over the row.
void top_k_ref(const float* row, int64_t n, int k, float scale, float softcap, std::vector<int32_t>& ids,
               std::vector<double>& lps) {
  std::vector<double> v(static_cast<size_t>(n));
  double max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    float x = row[i] * scale;
    if (softcap > 0.0f) x = softcap * std::tanh(x / softcap);
    v[size_t(i)] = std::isnan(x) ? -INFINITY : double(x);
    max = std::max(max, v[size_t(i)]);
  }
  double z = 0;
  for (double x : v) z += std::isfinite(max) ? std::exp(x - max) : 0.0;
  const double lse = std::isfinite(max) ? max + std::log(z) : 0.0;
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[size_t(i)] = int32_t(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return v[size_t(a)] > v[size_t(b)]; });
  ids.assign(order.begin(), order.begin() + k);
  lps.clear();
  for (int j = 0; j < k; ++j) lps.push_back(v[size_t(ids[size_t(j)])] - lse);
}

TEST(TopKGpu, MatchesAPlainReference) {
  MOESERVE_REQUIRE_GPU();
  for (const int64_t n : {int64_t(7), int64_t(4099), int64_t(151936)}) {
    for (const int k : {1, 8, 64}) {
      if (k > n) continue;
      for (const float softcap : {0.0f, 30.0f}) {
        const int64_t R = 9;
        auto x = logit_rows(R, n, uint32_t(n + k));
        DeviceArray<float> dx(x);
        DeviceArray<int32_t> ids{size_t(R * k)};
        DeviceArray<float> lps{size_t(R * k)};
        ids.poison();
        ASSERT_TRUE(
            cuda::top_k_rows({dx.get(), R, n, k, 1.5f, softcap, ids.get(), lps.get()}, nullptr).is_ok());
        const auto got_ids = ids.download();
        const auto got_lps = lps.download();
        std::vector<int32_t> want_ids;
        std::vector<double> want_lps;
        for (int64_t r = 0; r < R; ++r) {
          top_k_ref(x.data() + r * n, n, k, 1.5f, softcap, want_ids, want_lps);
          const bool finite_row = std::isfinite(want_lps[0]);
          for (int j = 0; j < k; ++j) {
            const size_t at = size_t(r * k + j);
            if (!finite_row) continue;  // an all -inf / NaN row: any ids, -inf log-probabilities
            ASSERT_EQ(got_ids[at], want_ids[size_t(j)])
                << "n " << n << " k " << k << " row " << r << " rank " << j;
            if (std::isfinite(want_lps[size_t(j)])) {
              EXPECT_NEAR(got_lps[at], want_lps[size_t(j)], 1e-4 * (1.0 + std::abs(want_lps[size_t(j)])));
            }
          }
        }
      }
    }
  }
}

TEST(TopKGpuChecks, RejectsBadArguments) {
  float v = 0.0f, lp = 0.0f;
  int32_t id = 0;
  EXPECT_EQ(cuda::top_k_rows({&v, 1, 4, 0, 1.0f, 0.0f, &id, &lp}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::top_k_rows({&v, 1, 4, 5, 1.0f, 0.0f, &id, &lp}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::top_k_rows({&v, 1, 100, 65, 1.0f, 0.0f, &id, &lp}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::top_k_rows({nullptr, 1, 4, 1, 1.0f, 0.0f, &id, &lp}, nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST(ArgmaxGpuChecks, RejectsBadArguments) {
  float v = 0.0f;
  int32_t id = 0;
  EXPECT_EQ(cuda::argmax_rows({&v, 1, 0, &id}, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::argmax_rows({&v, -1, 4, &id}, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::argmax_rows({nullptr, 1, 4, &id}, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(cuda::argmax_rows({nullptr, 0, 4, nullptr}, nullptr).is_ok());
}

}  // namespace
}  // namespace moeserve
