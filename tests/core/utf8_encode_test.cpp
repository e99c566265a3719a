#include "core/utf8_encode.h"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

std::string encode(char32_t cp) {
  std::string out;
  append_utf8(out, cp);
  return out;
}

TEST(Utf8Encode, EachLengthBoundary) {
  EXPECT_EQ(encode(0x00), std::string(1, '\0'));
  EXPECT_EQ(encode(0x7F), "\x7F");
  EXPECT_EQ(encode(0x80), "\xC2\x80");
  EXPECT_EQ(encode(0x7FF), "\xDF\xBF");
  EXPECT_EQ(encode(0x800), "\xE0\xA0\x80");
  EXPECT_EQ(encode(0xFFFF), "\xEF\xBF\xBF");
  EXPECT_EQ(encode(0x10000), "\xF0\x90\x80\x80");
  EXPECT_EQ(encode(0x10FFFF), "\xF4\x8F\xBF\xBF");
}

TEST(Utf8Encode, BeyondUnicodeBecomesReplacementCharacter) {
  EXPECT_EQ(encode(0x110000), "\xEF\xBF\xBD");
  EXPECT_EQ(encode(0xFFFFFFFF), "\xEF\xBF\xBD");
}

TEST(Utf8Encode, Appends) {
  std::string out = "a";
  append_utf8(out, 0x1F600);
  EXPECT_EQ(out, "a\xF0\x9F\x98\x80");
}

}  // namespace
}  // namespace moeserve
