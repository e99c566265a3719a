#include <gtest/gtest.h>

#include "tokenizer/tiny_vocab.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::tok {
namespace {

std::unique_ptr<Tokenizer> make_tiny() {
  auto result = Tokenizer::create(testing::tiny_vocab());
  EXPECT_TRUE(result.is_ok()) << result.status().to_string();
  return std::move(result).value();
}

// In the tiny vocab, byte b has id b, so multi-byte characters arrive one
// byte-token at a time: the worst case for a streaming decoder.
std::vector<int32_t> byte_ids(std::string_view bytes) {
  std::vector<int32_t> ids;
  for (char c : bytes) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

TEST(IncrementalDecoder, NeverEmitsHalfACharacter) {
  auto t = make_tiny();
  const std::string text = "a😀你\xC3\xA9 👨\xE2\x80\x8D👩";
  IncrementalDecoder decoder(*t);
  std::string streamed;
  for (int32_t id : byte_ids(text)) {
    const std::string out = decoder.feed(id);
    EXPECT_TRUE(is_valid_utf8(out)) << "after id " << id;
    streamed += out;
  }
  EXPECT_EQ(streamed + decoder.flush(), text);
}

TEST(IncrementalDecoder, HoldsTheTailUntilItCompletes) {
  auto t = make_tiny();
  IncrementalDecoder decoder(*t);
  EXPECT_EQ(decoder.feed(0xF0), "");
  EXPECT_EQ(decoder.feed(0x9F), "");
  EXPECT_EQ(decoder.feed(0x98), "");
  EXPECT_TRUE(decoder.has_pending());
  EXPECT_EQ(decoder.feed(0x80), "\xF0\x9F\x98\x80");
  EXPECT_FALSE(decoder.has_pending());
}

TEST(IncrementalDecoder, InvalidBytesBecomeReplacementInsteadOfStalling) {
  auto t = make_tiny();
  IncrementalDecoder decoder(*t);
  EXPECT_EQ(decoder.feed(0xE4), "");
  // 'x' cannot continue E4: the held byte is emitted as U+FFFD, then 'x'.
  EXPECT_EQ(decoder.feed('x'), "\xEF\xBF\xBD" "x");
  EXPECT_EQ(decoder.feed(0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(decoder.feed(0xC3), "");
  EXPECT_EQ(decoder.flush(), "\xEF\xBF\xBD");  // truncated at the end
  EXPECT_EQ(decoder.flush(), "");
}

TEST(IncrementalDecoder, SpecialTokensAndSkipping) {
  auto t = make_tiny();
  IncrementalDecoder keep(*t);
  EXPECT_EQ(keep.feed(testing::kImStart), "<|im_start|>");
  EXPECT_EQ(keep.feed(testing::kThink), "<think>");
  EXPECT_EQ(keep.feed(-1), "");  // invalid ids are ignored
  IncrementalDecoder skip(*t, DecodeOptions{.skip_special = true});
  EXPECT_EQ(skip.feed(testing::kImStart), "");
  EXPECT_EQ(skip.feed(testing::kThink), "<think>");  // user-defined: kept
}

TEST(IncrementalDecoder, StreamEqualsSanitizedDecode) {
  auto t = make_tiny();
  const std::string text = "mixed \xF0\x9F\x98\x80 text with \xE4\xBD\xA0\xE5\xA5\xBD and <|im_end|> end";
  const std::vector<int32_t> ids = t->encode(text);
  IncrementalDecoder decoder(*t);
  std::string streamed;
  for (int32_t id : ids) streamed += decoder.feed(id);
  streamed += decoder.flush();
  EXPECT_EQ(streamed, sanitize_utf8(t->decode(ids)));
  EXPECT_EQ(streamed, text);
}

}  // namespace
}  // namespace moeserve::tok
