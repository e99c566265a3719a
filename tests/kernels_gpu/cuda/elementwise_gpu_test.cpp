// The CUDA row-wise and element-wise ops (kernels/cuda/elementwise.h) vs the
// plain CPU reference: RMSNorm (plain, in place, gathered rows, fused add),
// SwiGLU, add, fill, the softplus gate, and the embedding gather of every
// weight type. Odd sizes, random data, outputs poisoned so every element
// must be written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/elementwise.h"
#include "kernels_gpu/cuda/gpu_test_util.h"
#include "tensor/quantize.h"

namespace moeserve {
namespace {

using testing::DeviceArray;
using testing::random_floats;

const cpu::CpuKernels& ref() { return *cpu::cpu_kernels_for(cpu::SimdLevel::kReference); }

// The GPU sums the squares in f32 in a tree (the reference in double), so the
// scale may differ by ~1e-6 relative for the longest rows; every output is
// x * scale * w, so the same relative bound holds element by element.
constexpr float kNormTol = 2e-6f;

void expect_close_rel(const std::vector<float>& got, const std::vector<float>& want, float tol,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i << " not written (or not finite): " << got[i];
    ASSERT_NEAR(got[i], want[i], tol * std::abs(want[i]) + 1e-30f) << what << " at " << i;
  }
}

// Rows with different magnitudes, so the per-row scale matters.
std::vector<float> random_rows(int64_t n_rows, int64_t n_cols, uint32_t seed) {
  std::vector<float> x = random_floats(size_t(n_rows * n_cols), seed);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t i = 0; i < n_cols; ++i) x[size_t(r * n_cols + i)] *= 0.25f + 0.5f * float(r % 7);
  }
  return x;
}

std::vector<float> norm_ref(const std::vector<float>& x, const std::vector<float>& w,
                            const std::vector<int32_t>& rows, int64_t n_cols, float eps) {
  std::vector<float> out(rows.size() * size_t(n_cols));
  for (size_t r = 0; r < rows.size(); ++r) {
    ref().rms_norm(x.data() + rows[r] * n_cols, w.data(), out.data() + r * size_t(n_cols), n_cols, eps);
  }
  return out;
}

std::vector<int32_t> iota_rows(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t(i);
  return v;
}

class RmsNormGpu : public ::testing::TestWithParam<int64_t> {};

TEST_P(RmsNormGpu, MatchesReference) {
  MOESERVE_REQUIRE_GPU();
  const int64_t n_cols = GetParam(), n_rows = 5;
  const float eps = 1e-6f;
  const auto x = random_rows(n_rows, n_cols, 11);
  const auto w = random_floats(size_t(n_cols), 12);
  DeviceArray<float> dx(x), dw(w), dout(x.size());
  dout.poison();
  cuda::RmsNormArgs a;
  a.x = dx.get(), a.w = dw.get(), a.out = dout.get(), a.n_rows = n_rows, a.n_cols = n_cols, a.eps = eps;
  ASSERT_TRUE(cuda::rms_norm(a, nullptr).is_ok());
  const auto want = norm_ref(x, w, iota_rows(n_rows), n_cols, eps);
  expect_close_rel(dout.download(), want, kNormTol, "rms_norm");

  // In place (out == x) gives the same values.
  a.out = dx.get();
  ASSERT_TRUE(cuda::rms_norm(a, nullptr).is_ok());
  expect_close_rel(dx.download(), want, kNormTol, "rms_norm in place");
}

TEST_P(RmsNormGpu, GathersSourceRows) {
  MOESERVE_REQUIRE_GPU();
  const int64_t n_cols = GetParam(), n_src = 6;
  const auto x = random_rows(n_src, n_cols, 21);
  const auto w = random_floats(size_t(n_cols), 22);
  const std::vector<int32_t> rows = {5, 0, 3, 3, 1, 5, 2};  // out of order, with repeats
  DeviceArray<float> dx(x), dw(w), dout(rows.size() * size_t(n_cols));
  DeviceArray<int32_t> drows(rows);
  dout.poison();
  cuda::RmsNormArgs a;
  a.x = dx.get(), a.w = dw.get(), a.out = dout.get(), a.src_rows = drows.get();
  a.n_rows = int64_t(rows.size()), a.n_cols = n_cols;
  ASSERT_TRUE(cuda::rms_norm(a, nullptr).is_ok());
  expect_close_rel(dout.download(), norm_ref(x, w, rows, n_cols, a.eps), kNormTol, "rms_norm src_rows");
}

TEST_P(RmsNormGpu, AddThenNorm) {
  MOESERVE_REQUIRE_GPU();
  const int64_t n_cols = GetParam(), n_rows = 3;
  auto x = random_rows(n_rows, n_cols, 31);
  const auto delta = random_floats(x.size(), 32, 0.5f);
  const auto w = random_floats(size_t(n_cols), 33);
  DeviceArray<float> dx(x), ddelta(delta), dw(w), dout(x.size());
  dout.poison();
  cuda::AddRmsNormArgs a;
  a.x = dx.get(), a.delta = ddelta.get(), a.w = dw.get(), a.out = dout.get();
  a.n_rows = n_rows, a.n_cols = n_cols, a.eps = 1e-5f;
  ASSERT_TRUE(cuda::add_rms_norm(a, nullptr).is_ok());
  for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
  // The residual is a plain f32 add: bit-exact.
  const auto got_x = dx.download();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got_x[i], x[i]) << "residual at " << i;
  expect_close_rel(dout.download(), norm_ref(x, w, iota_rows(n_rows), n_cols, a.eps), kNormTol,
                   "add_rms_norm");

  // Without delta: the norm only, x untouched.
  a.delta = nullptr;
  dout.poison();
  ASSERT_TRUE(cuda::add_rms_norm(a, nullptr).is_ok());
  const auto again = dx.download();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(again[i], x[i]) << "x changed at " << i;
  expect_close_rel(dout.download(), norm_ref(x, w, iota_rows(n_rows), n_cols, a.eps), kNormTol, "norm only");
}

// Tiny, odd, the real hidden sizes, and odd sizes near them (scalar path).
INSTANTIATE_TEST_SUITE_P(Sizes, RmsNormGpu, ::testing::Values(1, 7, 33, 256, 2048, 2051, 4096, 4099, 5120));

TEST(RmsNormGpu, UnalignedRowsTakeTheScalarPath) {
  MOESERVE_REQUIRE_GPU();
  const int64_t n_cols = 256, n_rows = 3;
  const auto x = random_rows(n_rows, n_cols, 41);
  const auto w = random_floats(size_t(n_cols), 42);
  DeviceArray<float> dx(x.size() + 1), dw(w), dout(x.size() + 1);
  MOESERVE_CUDA_ASSERT(cudaMemcpy(dx.get() + 1, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  dout.poison();
  cuda::RmsNormArgs a;
  a.x = dx.get() + 1, a.w = dw.get(), a.out = dout.get() + 1, a.n_rows = n_rows, a.n_cols = n_cols;
  ASSERT_TRUE(cuda::rms_norm(a, nullptr).is_ok());
  auto got = dout.download();
  got.erase(got.begin());
  expect_close_rel(got, norm_ref(x, w, iota_rows(n_rows), n_cols, a.eps), kNormTol, "unaligned");
}

TEST(RmsNormGpu, RejectsBadArguments) {
  float dummy = 0.0f;
  cuda::RmsNormArgs a;
  a.x = &dummy, a.out = &dummy, a.n_rows = 1, a.n_cols = 0;
  EXPECT_EQ(cuda::rms_norm(a, nullptr).code(), StatusCode::kInvalidArgument);
  a.n_cols = 4, a.n_rows = -1;
  EXPECT_EQ(cuda::rms_norm(a, nullptr).code(), StatusCode::kInvalidArgument);
  int32_t rows = 0;
  a.n_rows = 1, a.src_rows = &rows;  // gathered rows in place would race
  EXPECT_EQ(cuda::rms_norm(a, nullptr).code(), StatusCode::kInvalidArgument);
  cuda::AddRmsNormArgs b;
  b.n_rows = 2, b.n_cols = 8;  // null x
  EXPECT_EQ(cuda::add_rms_norm(b, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::swiglu(nullptr, nullptr, nullptr, 5, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::add(&dummy, &dummy, -1, nullptr).code(), StatusCode::kInvalidArgument);
}

// Sizes with every n % 4 and a large odd one; offset 1 makes the pointers
// unaligned (scalar path).
class FlatOpsGpu : public ::testing::TestWithParam<std::tuple<int64_t, int>> {};

TEST_P(FlatOpsGpu, SwigluMatchesReference) {
  MOESERVE_REQUIRE_GPU();
  const auto [n, off] = GetParam();
  const auto gate = random_floats(size_t(n + off), 51, 3.0f);
  const auto up = random_floats(size_t(n + off), 52);
  std::vector<float> want(static_cast<size_t>(n));
  ref().swiglu(gate.data() + off, up.data() + off, want.data(), n);
  DeviceArray<float> dgate(gate), dup(up), dout(size_t(n + off));
  dout.poison();
  ASSERT_TRUE(cuda::swiglu(dgate.get() + off, dup.get() + off, dout.get() + off, n, nullptr).is_ok());
  auto got = dout.download();
  got.erase(got.begin(), got.begin() + off);
  // expf on the GPU is within 2 ulp (the CPU's within 1), plus one division
  // and one product: a few ulp.
  expect_close_rel(got, want, 1e-6f, "swiglu");

  // out aliasing gate.
  ASSERT_TRUE(cuda::swiglu(dgate.get() + off, dup.get() + off, dgate.get() + off, n, nullptr).is_ok());
  got = dgate.download();
  got.erase(got.begin(), got.begin() + off);
  expect_close_rel(got, want, 1e-6f, "swiglu in place");
}

TEST_P(FlatOpsGpu, AddAndFillAreExact) {
  MOESERVE_REQUIRE_GPU();
  const auto [n, off] = GetParam();
  auto y = random_floats(size_t(n + off), 61);
  const auto x = random_floats(size_t(n + off), 62);
  DeviceArray<float> dy(y), dx(x);
  ASSERT_TRUE(cuda::add(dy.get() + off, dx.get() + off, n, nullptr).is_ok());
  for (int64_t i = off; i < n + off; ++i) y[size_t(i)] += x[size_t(i)];
  const auto got = dy.download();
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(got[i], y[i]) << "add at " << i;

  ASSERT_TRUE(cuda::fill_f32(dy.get() + off, -2.5f, n, nullptr).is_ok());
  const auto filled = dy.download();
  for (int64_t i = 0; i < n + off; ++i) {
    ASSERT_EQ(filled[size_t(i)], i < off ? y[size_t(i)] : -2.5f) << "fill at " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, FlatOpsGpu,
                         ::testing::Combine(::testing::Values(1, 5, 6, 7, 4096, 100003),
                                            ::testing::Values(0, 1)));

// ---- softplus gate -------------------------------------------------------------

// x[t][g * group + i] *= softplus(gate[t][g]) in double, torch's threshold.
std::vector<float> mul_softplus_ref(std::vector<float> x, const std::vector<float>& gate, int64_t group) {
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = gate[i / size_t(group)];
    x[i] = float(double(x[i]) * (v > 20.0 ? v : std::log1p(std::exp(v))));
  }
  return x;
}

// Laguna's attention output gate: one gate per head (group = head_dim) or
// per element (group 1). Gates over -30..30 and exactly at the threshold.
TEST(MulSoftplusGpu, PerHeadAndPerElement) {
  MOESERVE_REQUIRE_GPU();
  struct Shape {
    int64_t n_rows, n_gates, group;
  };
  for (const Shape sh : {Shape{5, 4, 128}, Shape{3, 16, 64}, Shape{7, 333, 1}, Shape{1, 1, 1}}) {
    const int64_t n = sh.n_rows * sh.n_gates * sh.group;
    std::vector<float> gate = random_floats(size_t(sh.n_rows * sh.n_gates), 71, 12.0f);
    gate[0] = 20.0f;  // the threshold itself: log1p(exp(20))
    if (gate.size() > 2) gate[1] = 20.5f, gate[2] = -30.0f;
    const std::vector<float> x = random_floats(size_t(n), 72);
    DeviceArray<float> dx(x), dgate(gate);
    ASSERT_TRUE(cuda::mul_softplus(dx.get(), dgate.get(), sh.n_rows, sh.n_gates, sh.group, nullptr).is_ok());
    // expf / log1pf within 2 ulp each (the reference exact to double), one product.
    expect_close_rel(dx.download(), mul_softplus_ref(x, gate, sh.group), 1e-6f,
                     "mul_softplus group " + std::to_string(sh.group));
  }
}

TEST(MulSoftplusGpu, RejectsBadArguments) {
  float v = 0.0f;
  EXPECT_EQ(cuda::mul_softplus(&v, &v, -1, 1, 1, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::mul_softplus(nullptr, &v, 1, 1, 1, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(cuda::mul_softplus(nullptr, nullptr, 0, 4, 128, nullptr).is_ok());  // nothing to do
}

// ---- embedding ---------------------------------------------------------------

class EmbedGpu : public ::testing::TestWithParam<DType> {};

TEST_P(EmbedGpu, GathersDequantizedRows) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  const int64_t n_cols = 3 * 256, n_vocab = 37;  // a whole number of blocks of every type
  const auto values = random_floats(size_t(n_vocab * n_cols), 71);
  const size_t row_bytes = dtype_row_bytes(type, n_cols);
  std::vector<uint8_t> table(row_bytes * size_t(n_vocab));
  for (int64_t r = 0; r < n_vocab; ++r) {
    testing::weight_row(type, values.data() + r * n_cols, table.data() + size_t(r) * row_bytes, n_cols,
                        uint32_t(73 + r));
  }

  std::mt19937 rng(72);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(n_vocab - 1));
  std::vector<int32_t> ids(19);
  for (auto& id : ids) id = pick(rng);
  ids[3] = ids[11];  // a repeat for sure
  ids[0] = int32_t(n_vocab - 1);

  DeviceArray<uint8_t> dtable(table);
  DeviceArray<int32_t> dids(ids);
  DeviceArray<float> dout(ids.size() * size_t(n_cols));
  dout.poison();
  cuda::EmbedArgs a;
  a.table = dtable.get(), a.type = type, a.row_bytes = row_bytes, a.n_cols = n_cols;
  a.ids = dids.get(), a.n_rows = int64_t(ids.size()), a.out = dout.get(), a.n_table_rows = n_vocab;
  ASSERT_TRUE(cuda::embed(a, nullptr).is_ok());
  const auto got = dout.download();
  std::vector<float> want(static_cast<size_t>(n_cols));
  for (size_t r = 0; r < ids.size(); ++r) {
    dequantize_row(type, table.data() + size_t(ids[r]) * row_bytes, want.data(), n_cols);
    for (int64_t i = 0; i < n_cols; ++i) {
      // Same exactly representable factors; the GPU may fuse the K-quant
      // "d*sc*q - dmin*m" into one FMA: one rounding step.
      ASSERT_NEAR(got[r * size_t(n_cols) + size_t(i)], want[size_t(i)],
                  1e-6f * (1.0f + std::abs(want[size_t(i)])))
          << dtype_name(type) << " row " << r << " col " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, EmbedGpu, ::testing::ValuesIn(kGpuWeightDTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(EmbedGpuChecks, BadIdsGiveNanRows) {
  MOESERVE_REQUIRE_GPU();
  const int64_t n_cols = 5, n_vocab = 4;
  const auto table = random_floats(size_t(n_vocab * n_cols), 81);
  const std::vector<int32_t> ids = {2, -1, 4, 0};
  DeviceArray<float> dtable(table), dout(ids.size() * size_t(n_cols));
  DeviceArray<int32_t> dids(ids);
  cuda::EmbedArgs a;
  a.table = dtable.get(), a.type = DType::F32, a.row_bytes = n_cols * sizeof(float), a.n_cols = n_cols;
  a.ids = dids.get(), a.n_rows = int64_t(ids.size()), a.out = dout.get(), a.n_table_rows = n_vocab;
  ASSERT_TRUE(cuda::embed(a, nullptr).is_ok());
  const auto got = dout.download();
  for (size_t r = 0; r < ids.size(); ++r) {
    for (int64_t i = 0; i < n_cols; ++i) {
      const float g = got[r * size_t(n_cols) + size_t(i)];
      if (ids[r] < 0 || ids[r] >= n_vocab) {
        EXPECT_TRUE(std::isnan(g)) << "row " << r;
      } else {
        EXPECT_EQ(g, table[size_t(ids[r] * n_cols + i)]) << "row " << r;
      }
    }
  }
}

TEST(EmbedGpuChecks, RejectsBadArguments) {
  cuda::EmbedArgs a;
  uint8_t byte = 0;
  int32_t id = 0;
  float out = 0.0f;
  a.table = &byte, a.ids = &id, a.out = &out, a.n_rows = 1;
  a.type = DType::Q4_K, a.n_cols = 100, a.row_bytes = 1000;  // not a whole number of blocks
  EXPECT_EQ(cuda::embed(a, nullptr).code(), StatusCode::kInvalidArgument);
  a.n_cols = 256, a.row_bytes = 100;  // rows shorter than 256 elements of Q4_K
  EXPECT_EQ(cuda::embed(a, nullptr).code(), StatusCode::kInvalidArgument);
  a.type = DType::Q8_K, a.row_bytes = 4096;  // activation type
  EXPECT_EQ(cuda::embed(a, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moeserve
