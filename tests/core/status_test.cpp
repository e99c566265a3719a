#include <gtest/gtest.h>

#include "core/half.h"
#include "core/status.h"

namespace moeserve {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return make_error(StatusCode::kInvalidArgument, "value {} is not positive", v);
  return v;
}

Status twice(int v, int* out) {
  MOESERVE_ASSIGN_OR_RETURN(int x, parse_positive(v));
  *out = 2 * x;
  return Status::ok();
}

TEST(Status, ResultCarriesValueOrError) {
  int out = 0;
  EXPECT_TRUE(twice(4, &out).is_ok());
  EXPECT_EQ(out, 8);
  Status st = twice(-1, &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.to_string(), "invalid argument: value -1 is not positive");
}

TEST(Half, Fp16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(uint16_t(h));
    if (f != f) continue;  // nan payloads need not round-trip
    EXPECT_EQ(fp32_to_fp16(f), h) << std::hex << h;
  }
}

TEST(Half, Fp16RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);            // rounds up to inf
  EXPECT_EQ(fp32_to_fp16(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
  EXPECT_EQ(fp32_to_fp16(1.0f + 3.0f / 2048), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(fp32_to_fp16(5.96046448e-08f), 0x0001);     // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
}

TEST(Half, Bf16) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(fp32_to_bf16(bits_float(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(fp32_to_bf16(bits_float(0x3f818000u)), 0x3f82);  // tie -> even (up)
}

}  // namespace
}  // namespace moeserve
