#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>

#include "tokenizer/tiny_vocab.h"

namespace moeserve::tok {
namespace {

using testing::kAA;
using testing::kAB;
using testing::kABC;
using testing::kEndOfText;
using testing::kIm;
using testing::kImEnd;
using testing::kImStart;
using testing::kThink;
using testing::kUnusedSlot;
using Ids = std::vector<int32_t>;

std::unique_ptr<Tokenizer> make_tiny(VocabData vocab = testing::tiny_vocab()) {
  auto result = Tokenizer::create(std::move(vocab));
  EXPECT_TRUE(result.is_ok()) << result.status().to_string();
  return result.is_ok() ? std::move(result).value() : nullptr;
}

int32_t byte_id(char c) { return static_cast<uint8_t>(c); }  // tiny vocab: byte b has id b

TEST(Tokenizer, MergesByRankNotByPosition) {
  auto t = make_tiny();
  // "b c" (rank 0) beats "a b" (rank 1): a + bc -> abc. Merging left to right
  // would give ab + c, which has no merge.
  EXPECT_EQ(t->encode("abc"), (Ids{kABC}));
  EXPECT_EQ(t->encode("ab"), (Ids{kAB}));
  EXPECT_EQ(t->encode("abd"), (Ids{kAB, byte_id('d')}));
  // " abc": b+c, then a+bc (rank 2) before Ġ+a (rank 4): Ġ, abc.
  EXPECT_EQ(t->encode(" abc"), (Ids{byte_id(' '), kABC}));
}

TEST(Tokenizer, EqualRanksMergeLeftmostFirst) {
  auto t = make_tiny();
  EXPECT_EQ(t->encode("aaa"), (Ids{kAA, byte_id('a')}));
  EXPECT_EQ(t->encode("aaaa"), (Ids{kAA, kAA}));
  EXPECT_EQ(t->encode("aaaaa"), (Ids{kAA, kAA, byte_id('a')}));
}

TEST(Tokenizer, PiecesAreMergedIndependently) {
  auto t = make_tiny();
  // "a" and "bc" are in different pre-tokenizer pieces ("a", "1", "bc")
  // so no "abc" across the digit.
  EXPECT_EQ(t->encode("a1bc"), (Ids{byte_id('a'), byte_id('1'), testing::kBC}));
}

// Control tokens inside a literal range stay text (a chat prompt's user
// content); outside it, and with parse_special, they are split out.
TEST(Tokenizer, LiteralRangesKeepControlTokensAsText) {
  auto t = make_tiny();
  const std::string text = "<|im_start|>ab<|im_start|>ab<|im_end|>";
  const TextRange user{14, 26};  // the second "<|im_start|>"
  EncodeOptions o;
  o.literal_ranges = std::span<const TextRange>(&user, 1);
  const Ids ids = t->encode(text, o);
  EXPECT_EQ(ids.front(), kImStart);
  EXPECT_EQ(ids.back(), kImEnd);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), int32_t(kImStart)), 1)
      << "the literal <|im_start|> was split out";
  // The literal part encodes as the same text would with parse_special off.
  EncodeOptions plain;
  plain.parse_special = false;
  Ids want = {kImStart};
  const Ids middle = t->encode("ab<|im_start|>ab", plain);
  want.insert(want.end(), middle.begin(), middle.end());
  want.push_back(kImEnd);
  EXPECT_EQ(ids, want);
  // A range that starts inside a token's text does not protect a token
  // that starts before it; one covering the token's first byte does.
  const TextRange late{1, 12};
  o.literal_ranges = std::span<const TextRange>(&late, 1);
  EXPECT_EQ(t->encode("<|im_start|>", o), (Ids{kImStart}));
  const TextRange first{0, 1};
  o.literal_ranges = std::span<const TextRange>(&first, 1);
  EXPECT_NE(t->encode("<|im_start|>", o), (Ids{kImStart}));
  // Invalid UTF-8 moves offsets: then no control token is split out.
  const TextRange none{100, 101};
  o.literal_ranges = std::span<const TextRange>(&none, 1);
  for (int32_t id : t->encode("<|im_start|>\xff", o)) EXPECT_NE(id, kImStart);
}

TEST(Tokenizer, ControlTextsListsTheControlTokens) {
  auto t = make_tiny();
  const auto& texts = t->control_texts();
  EXPECT_NE(std::find(texts.begin(), texts.end(), "<|im_start|>"), texts.end());
  EXPECT_NE(std::find(texts.begin(), texts.end(), "<|im_end|>"), texts.end());
  EXPECT_EQ(std::find(texts.begin(), texts.end(), "<think>"), texts.end()) << "user-defined, not control";
}

TEST(Tokenizer, SpecialTokensAreSplitOutLongestFirst) {
  auto t = make_tiny();
  EXPECT_EQ(t->encode("<|im_start|>ab<|im_end|>"), (Ids{kImStart, kAB, kImEnd}));
  // "<|im" is a user-defined prefix of both: only used when nothing longer fits.
  EXPECT_EQ(t->encode("<|im_x"), (Ids{kIm, byte_id('_'), byte_id('x')}));
  EXPECT_EQ(t->encode("<|im_start|><|im_start|>"), (Ids{kImStart, kImStart}));
  EXPECT_EQ(t->encode("x<think>y"), (Ids{byte_id('x'), kThink, byte_id('y')}));
}

TEST(Tokenizer, ParseSpecialOffKeepsUserDefinedTokens) {
  auto t = make_tiny();
  EncodeOptions plain;
  plain.parse_special = false;
  // Control tokens become text; the user-defined "<|im" and "<think>" still
  // split out (as in llama.cpp and HF with split_special_tokens).
  const Ids ids = t->encode("<|im_end|><think>", plain);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), kIm);
  EXPECT_EQ(ids.back(), kThink);
  EXPECT_EQ(t->decode(ids), "<|im_end|><think>");
  for (int32_t id : ids) EXPECT_NE(id, kImEnd);
}

TEST(Tokenizer, AddBosFollowsOptionsAndVocab) {
  auto t = make_tiny();
  EXPECT_EQ(t->encode("ab"), (Ids{kAB}));  // tiny vocab: add_bos false
  EncodeOptions with_bos;
  with_bos.add_bos = true;
  EXPECT_EQ(t->encode("ab", with_bos), (Ids{kEndOfText, kAB}));
  VocabData v = testing::tiny_vocab();
  v.add_bos = true;
  auto t2 = make_tiny(std::move(v));
  EXPECT_EQ(t2->encode("ab"), (Ids{kEndOfText, kAB}));
}

TEST(Tokenizer, EveryByteRoundTrips) {
  auto t = make_tiny();
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    EXPECT_EQ(t->token_to_bytes(b), one) << b;
    EXPECT_EQ(t->decode(Ids{b}), one) << b;
  }
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  // Raw bytes pass through encode as U+FFFD where invalid; the valid part
  // (0x00..0x7F) must come back exactly.
  EXPECT_EQ(t->decode(t->encode(all.substr(0, 128))), all.substr(0, 128));
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementCharacter) {
  auto t = make_tiny();
  // One U+FFFD per maximal invalid subpart (WHATWG): FF | E4 BD (truncated).
  EXPECT_EQ(t->decode(t->encode("a\xFF"
                                "b")),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(t->decode(t->encode("\xE4\xBD"
                                "c")),
            "\xEF\xBF\xBD"
            "c");
  EXPECT_EQ(t->decode(t->encode("\xC0\xAF")), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(t->encode("\xFF"), t->encode("\xEF\xBF\xBD"));
}

TEST(Tokenizer, DecodeOfEncodeIsIdentityForValidUtf8) {
  auto t = make_tiny();
  const std::vector<std::string> alphabet = {
      "a",       "b",    "c", " ",   "  ", "\n",           "\t",
      "'s",      "1",    "é", "你",  "😀",  "\xE2\x80\x8D", "<|im_start|>",
      "<think>", "<|im", "!", "\r\n"};
  std::mt19937 rng(1234);
  for (int i = 0; i < 500; ++i) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 20);
    for (int k = 0; k < n; ++k) text += alphabet[rng() % alphabet.size()];
    EXPECT_EQ(t->decode(t->encode(text)), text);
  }
}

TEST(Tokenizer, NfcIsAppliedBetweenAddedTokens) {
  auto t = make_tiny();
  // e + U+0301 encodes like the precomposed é (the tiny vocab says NFC).
  EXPECT_EQ(t->encode("e\xCC\x81"), t->encode("\xC3\xA9"));
  VocabData raw = testing::tiny_vocab();
  raw.normalization = Normalization::kNone;
  auto t2 = make_tiny(std::move(raw));
  EXPECT_NE(t2->encode("e\xCC\x81"), t2->encode("\xC3\xA9"));
}

TEST(Tokenizer, DecodeSkipsSpecialOnRequestAndUnusedAlways) {
  auto t = make_tiny();
  const Ids ids = {kImStart, kAB, kThink, kImEnd, kUnusedSlot, -5, 1 << 30};
  EXPECT_EQ(t->decode(ids), "<|im_start|>ab<think><|im_end|>");
  EXPECT_EQ(t->decode(ids, DecodeOptions{.skip_special = true}), "ab<think>");
}

TEST(Tokenizer, Accessors) {
  auto t = make_tiny();
  EXPECT_EQ(t->vocab_size(), testing::kTinyVocabSize);
  EXPECT_EQ(t->find_token("ab"), kAB);
  EXPECT_EQ(t->find_token("\xC4\xA0"), byte_id(' '));
  EXPECT_FALSE(t->find_token("zz").has_value());
  EXPECT_EQ(t->token_text(byte_id(' ')), "\xC4\xA0");
  EXPECT_EQ(t->token_to_bytes(byte_id(' ')), " ");
  EXPECT_EQ(t->token_text(-1), "");
  EXPECT_EQ(t->token_type(kImStart), TokenType::kControl);
  EXPECT_EQ(t->token_type(kThink), TokenType::kUserDefined);
  EXPECT_EQ(t->bos_id(), kEndOfText);
  EXPECT_EQ(t->eos_id(), kImEnd);
  EXPECT_FALSE(t->pad_id().has_value());
  EXPECT_EQ(t->pre(), "qwen2");
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  auto t = make_tiny();
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i)
    texts.push_back(std::string(static_cast<size_t>(i % 7 + 1), 'a') + " abc" + std::to_string(i));
  std::vector<Ids> expected;
  for (const auto& text : texts) expected.push_back(t->encode(text));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int round = 0; round < 50; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          if (t->encode(texts[(i + static_cast<size_t>(w)) % texts.size()]) !=
              expected[(i + static_cast<size_t>(w)) % texts.size()]) {
            ++mismatches[w];
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(Tokenizer, LongHostileInputsDoNotCrash) {
  auto t = make_tiny();
  const std::string spaces(200000, ' ');
  EXPECT_EQ(t->decode(t->encode(spaces + "x")), spaces + "x");
  const std::string letters(200000, 'a');
  EXPECT_EQ(t->encode(letters).size(), 100000u);  // all "aa"
  std::string marks = "a";
  for (int i = 0; i < 20000; ++i) marks += "\xCC\x81";
  // NFC composes the first acute into "á"; the rest are blocked and stay.
  EXPECT_EQ(t->decode(t->encode(marks)), "\xC3\xA1" + marks.substr(3));
}

// ---- validation ---------------------------------------------------------

Status create_status(VocabData v) { return Tokenizer::create(std::move(v)).status(); }

TEST(TokenizerValidation, RejectsDuplicateTokens) {
  VocabData v = testing::tiny_vocab();
  v.tokens[kAB] = "bc";
  Status s = create_status(v);
  EXPECT_EQ(s.code(), StatusCode::kInvalidFormat);
  EXPECT_NE(s.message().find("'bc' appears twice"), std::string::npos) << s.message();
}

TEST(TokenizerValidation, RejectsMergesOfUnknownTokens) {
  VocabData v = testing::tiny_vocab();
  v.merges.push_back({"zz", "a"});
  Status s = create_status(v);
  EXPECT_EQ(s.code(), StatusCode::kInvalidFormat);
  EXPECT_NE(s.message().find("merge 6 'zz a'"), std::string::npos) << s.message();
  v = testing::tiny_vocab();
  v.merges.push_back({"c", "c"});  // both exist, "cc" does not
  s = create_status(v);
  EXPECT_NE(s.message().find("makes 'cc'"), std::string::npos) << s.message();
}

TEST(TokenizerValidation, RejectsBadIdsTypesAndPre) {
  VocabData v = testing::tiny_vocab();
  v.eos_id = 100000;
  EXPECT_NE(create_status(v).message().find("eos id 100000"), std::string::npos);
  v = testing::tiny_vocab();
  v.token_types[3] = 42;
  EXPECT_NE(create_status(v).message().find("unknown type 42"), std::string::npos);
  v = testing::tiny_vocab();
  v.token_types.pop_back();
  EXPECT_EQ(create_status(v).code(), StatusCode::kInvalidFormat);
  v = testing::tiny_vocab();
  v.pre = "llama3";
  EXPECT_EQ(create_status(v).code(), StatusCode::kUnsupported);
  v = testing::tiny_vocab();
  v.tokens[0x41] = "A-renamed";  // byte 0x41 'A' loses its symbol
  EXPECT_NE(create_status(v).message().find("byte 0x41"), std::string::npos);
  EXPECT_EQ(create_status(VocabData{}).code(), StatusCode::kInvalidFormat);
}

}  // namespace
}  // namespace moeserve::tok
