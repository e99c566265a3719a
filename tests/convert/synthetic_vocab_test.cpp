#include "convert/synthetic_vocab.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_gguf.h"

namespace moeserve::convert {
namespace {

std::unique_ptr<tok::Tokenizer> make_tokenizer(int64_t vocab_size) {
  Result<tok::VocabData> vocab = make_synthetic_vocab({.vocab_size = vocab_size});
  EXPECT_TRUE(vocab.is_ok()) << vocab.status().to_string();
  if (!vocab.is_ok()) return nullptr;
  auto tk = tok::Tokenizer::create(std::move(vocab.value()));
  EXPECT_TRUE(tk.is_ok()) << tk.status().to_string();
  return tk.is_ok() ? std::move(tk.value()) : nullptr;
}

TEST(SyntheticVocab, SmallVocabularyPutsSpecialTokensLast) {
  Result<tok::VocabData> v = make_synthetic_vocab({.vocab_size = 2048});
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  ASSERT_EQ(v->tokens.size(), 2048u);
  EXPECT_EQ(v->tokens[2041], "<|endoftext|>");
  EXPECT_EQ(v->tokens[2043], "<|im_end|>");
  EXPECT_EQ(v->tokens[2047], "</think>");
  EXPECT_EQ(v->token_types[2042], int32_t(tok::TokenType::kControl));
  EXPECT_EQ(v->token_types[2046], int32_t(tok::TokenType::kUserDefined));
  EXPECT_EQ(v->bos_id, 2041);
  EXPECT_EQ(v->eos_id, 2043);
  EXPECT_EQ(v->pad_id, 2041);
  EXPECT_FALSE(v->add_bos);
  // The embedded text supports a few hundred merges (pairs seen at least twice).
  EXPECT_GT(v->merges.size(), 300u);
  EXPECT_EQ(v->tokens[0], "\u0100");  // byte 0x00 is 'Ā' in the byte-level alphabet
  EXPECT_EQ(v->tokens['!'], "!");
}

TEST(SyntheticVocab, QwenSizedVocabularyUsesQwenIds) {
  Result<tok::VocabData> v = make_synthetic_vocab({.vocab_size = 151936});
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->tokens[151643], "<|endoftext|>");
  EXPECT_EQ(v->tokens[151644], "<|im_start|>");
  EXPECT_EQ(v->tokens[151645], "<|im_end|>");
  EXPECT_EQ(v->tokens[151657], "<tool_call>");
  EXPECT_EQ(v->tokens[151658], "</tool_call>");
  EXPECT_EQ(v->tokens[151667], "<think>");
  EXPECT_EQ(v->tokens[151668], "</think>");
  EXPECT_EQ(v->tokens[151935], "[PAD151935]");
  EXPECT_EQ(v->token_types[151935], int32_t(tok::TokenType::kUnused));
  EXPECT_EQ(v->eos_id, 151645);
}

TEST(SyntheticVocab, IsDeterministic) {
  Result<tok::VocabData> a = make_synthetic_vocab({.vocab_size = 4096});
  Result<tok::VocabData> b = make_synthetic_vocab({.vocab_size = 4096});
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->merges, b->merges);
}

TEST(SyntheticVocab, TooSmallIsAnError) {
  Result<tok::VocabData> v = make_synthetic_vocab({.vocab_size = 100});
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
}

TEST(SyntheticVocab, TokenizesAndRoundTrips) {
  std::unique_ptr<tok::Tokenizer> tk = make_tokenizer(2048);
  ASSERT_NE(tk, nullptr);
  const std::string text = "The model routes each token to a few experts.\nint main() { return 0; } 😀 ünïcödé";
  const std::vector<int32_t> ids = tk->encode(text);
  EXPECT_EQ(tk->decode(ids), text);
  // Learned merges make common English much shorter than its bytes.
  const std::string common = "The quick brown fox jumps over the lazy dog and the model";
  EXPECT_LT(tk->encode(common).size() * 2, common.size());
  ASSERT_TRUE(tk->find_token("Ġthe").has_value());
}

TEST(SyntheticVocab, RecognisesChatMLTokens) {
  std::unique_ptr<tok::Tokenizer> tk = make_tokenizer(2048);
  ASSERT_NE(tk, nullptr);
  const std::vector<int32_t> ids = tk->encode("<|im_start|>user\nhi<|im_end|><think></think>");
  ASSERT_GE(ids.size(), 5u);
  EXPECT_EQ(ids.front(), 2042);  // <|im_start|>
  EXPECT_NE(std::find(ids.begin(), ids.end(), 2043), ids.end());  // <|im_end|>
  EXPECT_NE(std::find(ids.begin(), ids.end(), 2046), ids.end());  // <think>
  EXPECT_EQ(ids.back(), 2047);                                   // </think>
  EXPECT_EQ(tk->decode(ids, {.skip_special = true}), "user\nhi<think></think>");
}

TEST(SyntheticVocab, MetadataLoadsThroughGguf) {
  Result<tok::VocabData> v = make_synthetic_vocab({.vocab_size = 2048});
  ASSERT_TRUE(v.is_ok());
  GgufWriter w;
  w.set_string("general.architecture", "qwen3");
  set_vocab_metadata(w, *v);
  Result<std::vector<uint8_t>> bytes = w.write_to_buffer();
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  Result<GgufFile> file = GgufFile::parse_bytes(*bytes, "vocab.gguf");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  Result<tok::VocabData> back = tok::vocab_from_gguf(*file);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->tokens, v->tokens);
  EXPECT_EQ(back->merges, v->merges);
  EXPECT_EQ(back->eos_id, v->eos_id);
  EXPECT_EQ(back->chat_template, qwen3_chat_template());
  EXPECT_TRUE(tok::Tokenizer::create(std::move(back.value())).is_ok());
}

TEST(SyntheticVocab, EmbeddedChatTemplateMatchesReferenceFile) {
  std::ifstream in(std::filesystem::path(MOESERVE_TEST_DATA_DIR) / "../reference/templates/qwen3.jinja",
                   std::ios::binary);
  ASSERT_TRUE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(qwen3_chat_template(), ss.str());
}

}  // namespace
}  // namespace moeserve::convert
