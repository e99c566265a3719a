#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "format/gguf_value.h"

namespace moeserve {
namespace {

TEST(GgufValue, IntegerAccessorsRespectRangeAndType) {
  EXPECT_EQ(GgufValue::u32(7).as_int(), 7);
  EXPECT_EQ(GgufValue::i8(-3).as_int(), -3);
  EXPECT_EQ(GgufValue::i8(-3).as_uint(), std::nullopt);  // negative
  EXPECT_EQ(GgufValue::u64(std::numeric_limits<uint64_t>::max()).as_int(), std::nullopt);
  EXPECT_EQ(GgufValue::u64(std::numeric_limits<uint64_t>::max()).as_uint(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(GgufValue::boolean(true).as_int(), std::nullopt);  // bool is not an integer
  EXPECT_EQ(GgufValue::f32(1.0f).as_int(), std::nullopt);
  EXPECT_EQ(GgufValue::string("5").as_int(), std::nullopt);
}

TEST(GgufValue, FloatBoolStringAccessors) {
  EXPECT_EQ(GgufValue::f32(0.5f).as_float(), 0.5);
  EXPECT_EQ(GgufValue::f64(1e-300).as_float(), 1e-300);
  EXPECT_EQ(GgufValue::u32(1).as_float(), std::nullopt);
  EXPECT_EQ(GgufValue::boolean(false).as_bool(), false);
  EXPECT_EQ(GgufValue::u8(1).as_bool(), std::nullopt);
  ASSERT_NE(GgufValue::string("qwen3moe").as_string(), nullptr);
  EXPECT_EQ(*GgufValue::string("qwen3moe").as_string(), "qwen3moe");
  EXPECT_EQ(GgufValue::u8(1).as_string(), nullptr);
}

TEST(GgufValue, TypeNames) {
  EXPECT_EQ(GgufValue::u32(1).type_name(), "u32");
  EXPECT_EQ(GgufValue::array(std::vector<std::string>{"a"}).type_name(), "array[string]");
  EXPECT_EQ(GgufValue::bool_array({true}).type_name(), "array[bool]");
  EXPECT_EQ(gguf_type_from_id(12), GgufType::kF64);
  EXPECT_EQ(gguf_type_from_id(13), std::nullopt);
}

TEST(GgufValue, ArrayConversions) {
  const GgufValue ints = GgufValue::array(std::vector<uint16_t>{1, 2, 65535});
  EXPECT_EQ(ints.as_int_array(), (std::vector<int64_t>{1, 2, 65535}));
  EXPECT_EQ(ints.as_float_array(), std::nullopt);
  const GgufValue big = GgufValue::array(std::vector<uint64_t>{1, std::numeric_limits<uint64_t>::max()});
  EXPECT_EQ(big.as_int_array(), std::nullopt);  // does not fit int64
  const GgufValue floats = GgufValue::array(std::vector<float>{0.25f, -2.0f});
  EXPECT_EQ(floats.as_float_array(), (std::vector<double>{0.25, -2.0}));
  EXPECT_EQ(floats.as_int_array(), std::nullopt);
  EXPECT_EQ(GgufValue::bool_array({true, false}).as_int_array(), std::nullopt);
  EXPECT_EQ(GgufValue::bool_array({true, false}).as_bool_array(), (std::vector<bool>{true, false}));
  EXPECT_EQ(ints.as_bool_array(), std::nullopt);
  EXPECT_EQ(GgufValue::u32(3).as_int_array(), std::nullopt);
  EXPECT_EQ(GgufValue::u32(3).array_size(), 0u);
}

TEST(GgufValue, FromStorageChecksElementType) {
  EXPECT_TRUE(GgufValue::from_storage(GgufType::kBool, std::vector<uint8_t>{1, 0}).has_value());
  EXPECT_FALSE(GgufValue::from_storage(GgufType::kI32, std::vector<uint8_t>{1}).has_value());
  EXPECT_FALSE(GgufValue::from_storage(GgufType::kArray, std::vector<uint8_t>{}).has_value());
}

TEST(GgufValue, DisplaySummarizesLongArrays) {
  EXPECT_EQ(GgufValue::array(std::vector<int32_t>{11, 11, 10, 0}).to_display(), "[11, 11, 10, 0]");
  std::vector<std::string> tokens(151936, "x");
  EXPECT_EQ(GgufValue::array(tokens).to_display(), "[151936 strings]");
  EXPECT_EQ(GgufValue::array(std::vector<int32_t>(100, 1)).to_display(), "[100 x i32]");
  EXPECT_EQ(GgufValue::f32(1e-6f).to_display(), "1e-06");
  EXPECT_EQ(GgufValue::boolean(true).to_display(), "true");
  EXPECT_EQ(GgufValue::i64(-5).to_display(), "-5");
  EXPECT_EQ(GgufValue::bool_array({true, false}).to_display(), "[true, false]");
}

TEST(GgufValue, EscapeControlBytesAndCutOnUtf8Boundary) {
  EXPECT_EQ(gguf_escape("a\nb\x01\""), "\"a\\nb\\x01\\\"\"");
  EXPECT_EQ(gguf_escape("it's", 80, '\''), "'it\\'s'");
  // "é" is two bytes; cutting at 2 must not split it.
  EXPECT_EQ(gguf_escape("aé", 2), "\"a\"... (3 bytes)");
}

}  // namespace
}  // namespace moeserve
