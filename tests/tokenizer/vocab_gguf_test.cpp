#include "tokenizer/vocab_gguf.h"

#include <gtest/gtest.h>

#include "format/gguf_writer.h"
#include "tokenizer/tiny_vocab.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::tok {
namespace {

// The tiny vocab written the way llama.cpp's converter writes a Qwen model.
GgufWriter tiny_gguf_writer() {
  const VocabData v = testing::tiny_vocab();
  GgufWriter w;
  w.set_string("general.architecture", "qwen3moe");
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "qwen2");
  w.set_string_array("tokenizer.ggml.tokens", v.tokens);
  w.set_i32_array("tokenizer.ggml.token_type", v.token_types);
  std::vector<std::string> merges;
  for (const auto& [a, b] : v.merges) merges.push_back(a + " " + b);
  w.set_string_array("tokenizer.ggml.merges", merges);
  w.set_u32("tokenizer.ggml.bos_token_id", testing::kEndOfText);
  w.set_u32("tokenizer.ggml.eos_token_id", testing::kImEnd);
  w.set_u32("tokenizer.ggml.padding_token_id", testing::kEndOfText);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_string("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}");
  return w;
}

Result<VocabData> vocab_of(const GgufWriter& w) {
  auto bytes = w.write_to_buffer();
  if (!bytes.is_ok()) return bytes.status();
  // parse_bytes does not own the buffer; VocabData copies what it needs, so
  // the buffer may go away once vocab_from_gguf returns.
  auto gguf = GgufFile::parse_bytes(bytes.value(), "tiny.gguf");
  if (!gguf.is_ok()) return gguf.status();
  return vocab_from_gguf(gguf.value());
}

TEST(VocabFromGguf, ReadsTheTokenizerKeys) {
  auto vocab = vocab_of(tiny_gguf_writer());
  ASSERT_TRUE(vocab.is_ok()) << vocab.status().to_string();
  EXPECT_EQ(vocab->pre, "qwen2");
  EXPECT_EQ(vocab->normalization, Normalization::kNfc);
  EXPECT_EQ(vocab->bos_id, testing::kEndOfText);
  EXPECT_EQ(vocab->pad_id, testing::kEndOfText);
  EXPECT_FALSE(vocab->eot_id.has_value());
  EXPECT_FALSE(vocab->add_bos);
  EXPECT_NE(vocab->chat_template.find("messages"), std::string::npos);
  auto t = Tokenizer::create(std::move(vocab).value());
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ((*t)->encode("<|im_start|>abc"), (std::vector<int32_t>{testing::kImStart, testing::kABC}));
}

TEST(VocabFromGguf, RejectsOtherModelsAndBrokenKeys) {
  GgufWriter w = tiny_gguf_writer();
  w.set_string("tokenizer.ggml.model", "llama");
  auto r = vocab_of(w);
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("'llama'"), std::string::npos) << r.status().message();

  w = tiny_gguf_writer();
  w.erase("tokenizer.ggml.model");
  EXPECT_EQ(vocab_of(w).status().code(), StatusCode::kNotFound);

  w = tiny_gguf_writer();
  w.erase("tokenizer.ggml.merges");
  EXPECT_NE(vocab_of(w).status().message().find("tokenizer.ggml.merges"), std::string::npos);

  w = tiny_gguf_writer();
  w.set_string_array("tokenizer.ggml.merges", {"a b", "nospace"});
  EXPECT_NE(vocab_of(w).status().message().find("merges[1]"), std::string::npos);

  w = tiny_gguf_writer();
  w.set_string("tokenizer.ggml.eos_token_id", "two");
  EXPECT_EQ(vocab_of(w).status().code(), StatusCode::kInvalidFormat);

  w = tiny_gguf_writer();
  w.set_i32_array("tokenizer.ggml.token_type", {1, 9});
  EXPECT_NE(vocab_of(w).status().message().find("not a token type"), std::string::npos);

  w = tiny_gguf_writer();
  w.set_string("tokenizer.ggml.pre", "llama-bpe");
  auto v = vocab_of(w);
  ASSERT_TRUE(v.is_ok());  // the key is fine; the Tokenizer refuses it
  EXPECT_EQ(Tokenizer::create(std::move(v).value()).status().code(), StatusCode::kUnsupported);
}

}  // namespace
}  // namespace moeserve::tok
