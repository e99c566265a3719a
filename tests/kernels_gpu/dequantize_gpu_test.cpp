#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/gpu_api.h"
#include "tensor/quantize.h"
#include "weight_bytes.h"

namespace moeserve {
namespace {

bool have_gpu() {
  if (!gpu::built_with_cuda()) return false;
  auto devices = gpu::list_devices();
  return devices.is_ok() && !devices.value().empty();
}

TEST(GpuApi, ReportsBuildAndDevices) {
  auto devices = gpu::list_devices();
  ASSERT_TRUE(devices.is_ok()) << devices.status().to_string();
  if (!gpu::built_with_cuda()) {
    EXPECT_TRUE(devices.value().empty());
    std::vector<float> out(32);
    std::vector<uint8_t> in(dtype_row_bytes(DType::Q8_0, 32));
    Status st = gpu::dequantize_on_gpu(0, DType::Q8_0, in.data(), out.data(), 32);
    EXPECT_EQ(st.code(), StatusCode::kUnsupported);
    EXPECT_NE(st.message().find("without CUDA"), std::string::npos);
  }
}

class DequantizeGpu : public ::testing::TestWithParam<DType> {};

TEST_P(DequantizeGpu, MatchesCpuReferenceExactly) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU here";
  const DType type = GetParam();
  const int64_t n = 7 * 256;  // a multiple of every block size
  std::mt19937 rng(1234);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> src(n);
  for (float& v : src) v = dist(rng);
  // Random bytes with finite scales for the types without a quantizer.
  const std::vector<uint8_t> packed = testing::weight_rows(type, src, 1, n, 1235);

  std::vector<float> want(n), got(n, -1.0f);
  dequantize_row(type, packed.data(), want.data(), n);
  Status st = gpu::dequantize_on_gpu(0, type, packed.data(), got.data(), n);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  for (int64_t i = 0; i < n; ++i) {
    // Same products of exactly representable factors; the GPU may fuse the
    // K-quant "d*sc*q - dmin*m" into an FMA, so allow one rounding step.
    ASSERT_NEAR(got[i], want[i], 1e-6f * (1.0f + std::abs(want[i]))) << dtype_name(type) << " at " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, DequantizeGpu, ::testing::ValuesIn(kGpuWeightDTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace moeserve
