#include "tokenizer/pretokenizer.h"

#include <gtest/gtest.h>

namespace moeserve::tok {
namespace {

using Pieces = std::vector<std::string>;

Pieces split(const PreTokenizer& pre, std::string_view text) {
  std::vector<std::string_view> views;
  pre.split(text, views);
  return {views.begin(), views.end()};
}

class PreTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto q2 = PreTokenizer::create("qwen2");
    auto q35 = PreTokenizer::create("qwen35");
    ASSERT_TRUE(q2.is_ok()) << q2.status().to_string();
    ASSERT_TRUE(q35.is_ok()) << q35.status().to_string();
    qwen2_ = std::move(q2).value();
    qwen35_ = std::move(q35).value();
  }
  // Pieces that both patterns agree on.
  void expect_both(std::string_view text, const Pieces& expected) {
    EXPECT_EQ(split(*qwen2_, text), expected) << "qwen2: " << text;
    EXPECT_EQ(split(*qwen35_, text), expected) << "qwen35: " << text;
  }
  std::unique_ptr<PreTokenizer> qwen2_, qwen35_;
};

TEST_F(PreTokenizerTest, WordsKeepTheirLeadingSpace) {
  expect_both("Hello world", {"Hello", " world"});
  expect_both("foo!!! bar", {"foo", "!!!", " bar"});
  expect_both("a.\n\nb", {"a", ".\n\n", "b"});
  expect_both("<|im_start|>", {"<|", "im", "_start", "|>"});
}

TEST_F(PreTokenizerTest, Contractions) {
  expect_both("it's", {"it", "'s"});
  expect_both("IT'S", {"IT", "'S"});
  expect_both("we'll WE'LL We'lL", {"we", "'ll", " WE", "'LL", " We", "'lL"});
  expect_both("they've I'd you're I'm", {"they", "'ve", " I", "'d", " you", "'re", " I", "'m"});
  // Only the listed suffixes: "'x" is punctuation plus a word.
  expect_both("'xyz", {"'xyz"});
  expect_both("’s", {"’s"});  // curly apostrophe is not a contraction
}

TEST_F(PreTokenizerTest, DigitsOneByOne) {
  expect_both("12345", {"1", "2", "3", "4", "5"});
  expect_both("a1b", {"a", "1", "b"});
  expect_both(" 42", {" ", "4", "2"});
  expect_both("3.14", {"3", ".", "1", "4"});
  expect_both("\xEF\xBC\x91\xEF\xBC\x92", {"\xEF\xBC\x91", "\xEF\xBC\x92"});  // fullwidth １２
}

TEST_F(PreTokenizerTest, WhitespaceRunsLeaveOneSpaceForTheNextWord) {
  expect_both("a   b", {"a", "  ", " b"});
  expect_both("a   ", {"a", "   "});
  expect_both("a  \nb", {"a", "  \n", "b"});
  expect_both("a\n\n  b", {"a", "\n\n", " ", " b"});
  expect_both("x\r\ny", {"x", "\r\n", "y"});
  expect_both("\t\tx", {"\t", "\tx"});
  expect_both("a \n", {"a", " \n"});
}

TEST_F(PreTokenizerTest, WhiteSpaceIsTheUnicodeProperty) {
  // U+0085 is White_Space: it behaves like a space.
  expect_both("a\xC2\x85\xC2\x85" "b", {"a", "\xC2\x85", "\xC2\x85" "b"});
  // U+FEFF and U+180E are not (JavaScript's \s has U+FEFF, PCRE2's has U+180E).
  expect_both("a\xEF\xBB\xBF\xEF\xBB\xBF" "b", {"a", "\xEF\xBB\xBF\xEF\xBB\xBF", "b"});
  expect_both("a\xE1\xA0\x8E\xE1\xA0\x8E" "b", {"a", "\xE1\xA0\x8E\xE1\xA0\x8E", "b"});
  expect_both("a\xE3\x80\x80\xE3\x80\x80" "b", {"a", "\xE3\x80\x80", "\xE3\x80\x80" "b"});  // U+3000
}

TEST_F(PreTokenizerTest, CjkAndEmoji) {
  expect_both("你好世界", {"你好世界"});
  expect_both("你好，世界", {"你好", "，世界"});  // a punctuation mark may lead a word
  expect_both("hi 😀😀", {"hi", " 😀😀"});
  expect_both("안녕 세계", {"안녕", " 세계"});
}

TEST_F(PreTokenizerTest, CombiningMarksDifferBetweenQwen2AndQwen35) {
  // x + U+0301: qwen2 sees the mark as a non-letter that leads the next word.
  EXPECT_EQ(split(*qwen2_, "x\xCC\x81y"), (Pieces{"x", "\xCC\x81y"}));
  EXPECT_EQ(split(*qwen35_, "x\xCC\x81y"), (Pieces{"x\xCC\x81y"}));
  // Devanagari नमस्ते: virama (Mn) and vowel sign (Mc) split qwen2's words.
  const std::string namaste = "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87";
  EXPECT_EQ(split(*qwen2_, namaste),
            (Pieces{"\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8", "\xE0\xA5\x8D\xE0\xA4\xA4", "\xE0\xA5\x87"}));
  EXPECT_EQ(split(*qwen35_, namaste), (Pieces{namaste}));
  // A mark after punctuation: qwen35 keeps marks out of punctuation runs.
  EXPECT_EQ(split(*qwen2_, "!\xCC\x81"), (Pieces{"!\xCC\x81"}));
  EXPECT_EQ(split(*qwen35_, "!\xCC\x81"), (Pieces{"!\xCC\x81"}));  // "!" prefix + mark run
  // Leftmost-first alternation: the punctuation run takes "!!" before the
  // word alternative could use the second "!" as its prefix.
  EXPECT_EQ(split(*qwen35_, "!!\xCC\x81"), (Pieces{"!!", "\xCC\x81"}));
  EXPECT_EQ(split(*qwen2_, "!!\xCC\x81"), (Pieces{"!!\xCC\x81"}));
}

TEST_F(PreTokenizerTest, PiecesCoverTheInput) {
  const std::string text = "Mixed 123 text\t\twith ü, 漢字, emoji 👍🏽 and\r\n\r\n  trailing   ";
  std::string joined;
  for (const auto& piece : split(*qwen35_, text)) joined += piece;
  EXPECT_EQ(joined, text);
  EXPECT_TRUE(split(*qwen2_, "").empty());
}

// Laguna splits newline runs off first: whitespace before a newline stays
// apart from it, where the Qwen pattern's \s*[\r\n]+ joins them.
TEST_F(PreTokenizerTest, LagunaSplitsNewlineRunsFirst) {
  auto laguna = PreTokenizer::create("laguna");
  ASSERT_TRUE(laguna.is_ok()) << laguna.status().to_string();
  EXPECT_EQ(split(*qwen2_, "a  \nfoo\n\nbar"), (Pieces{"a", "  \n", "foo", "\n\n", "bar"}));
  EXPECT_EQ(split(**laguna, "a  \nfoo\n\nbar"), (Pieces{"a", "  ", "\n", "foo", "\n\n", "bar"}));
  EXPECT_EQ(split(**laguna, "Hello world 12"), (Pieces{"Hello", " world", " ", "1", "2"}));
  EXPECT_EQ(split(**laguna, "x.\r\n"), (Pieces{"x", ".\r", "\n"}));
  EXPECT_TRUE(split(**laguna, "").empty());
}

TEST(PreTokenizer, UnknownNamesAreUnsupported) {
  auto r = PreTokenizer::create("gpt4o");
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("gpt4o"), std::string::npos);
}

TEST(PreTokenizer, RecognisesHfAndLlamaCppSpellings) {
  const std::string hf_qwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::string cpp_qwen35 =
      R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(pre_name_for_hf_regex(hf_qwen2), "qwen2");
  EXPECT_EQ(pre_name_for_hf_regex(cpp_qwen35), "qwen35");
  // Llama-3 style digit groups are a different tokenizer.
  EXPECT_FALSE(pre_name_for_hf_regex(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"));
}

}  // namespace
}  // namespace moeserve::tok
