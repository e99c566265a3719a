#include "runtime/perplexity.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "runtime/generator.h"
#include "test_device.h"

namespace moeserve::runtime {
namespace {

std::unique_ptr<Model> load(const std::string& arch) {
  auto m = Model::load(fmt::format("{}/models/{}-tiny.bf16.gguf", MOESERVE_TEST_DATA_DIR, arch),
                       {.n_threads = 2, .device = moeserve::testing::test_device()});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m.value()) : nullptr;
}

std::vector<int32_t> text_tokens(const Model& m, int64_t at_least) {
  std::string text;
  std::vector<int32_t> t;
  for (int i = 0; int64_t(t.size()) < at_least; ++i) {
    text += fmt::format("def f{}(x):\n    return x * {} + {}\n\n", i, i % 7, i % 3);
    t = m.tokenizer().encode(text);
  }
  return t;
}

// The plain definition, one token a forward: each chunk from a clean cache,
// the logits of positions n_ctx/2 .. n_ctx-2 against the next token.
double reference_ppl(Model& m, const std::vector<int32_t>& tokens, int64_t n_ctx, int64_t chunks) {
  Generator gen(m, n_ctx);
  std::vector<float> logits(size_t(m.info().n_vocab));
  double nll = 0.0;
  int64_t count = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    gen.sequence().clear();
    for (int64_t p = 0; p < n_ctx - 1; ++p) {
      int32_t tok = tokens[size_t(c * n_ctx + p)];
      if (p == 0 && m.tokenizer().add_bos() && m.tokenizer().bos_id()) tok = *m.tokenizer().bos_id();
      EXPECT_TRUE(gen.decode(tok, logits).is_ok());
      if (p >= n_ctx / 2) {
        nll += negative_log_likelihood(logits, tokens[size_t(c * n_ctx + p + 1)]);
        ++count;
      }
    }
  }
  return std::exp(nll / double(count));
}

TEST(Perplexity, MatchesTokenByTokenScoringOfTheSameWindows) {
  for (const char* arch : {"qwen3moe", "qwen35moe"}) {
    auto m = load(arch);
    ASSERT_NE(m, nullptr);
    const int64_t n_ctx = 24;
    const std::vector<int32_t> tokens = text_tokens(*m, 3 * n_ctx + 5);
    const double want = reference_ppl(*m, tokens, n_ctx, 3);
    for (const int64_t n_batch : {int64_t(512), int64_t(5)}) {  // the second half in one forward, or in pieces
      int64_t calls = 0;
      auto r = perplexity(*m, tokens, {.n_ctx = n_ctx, .n_batch = n_batch},
                          [&](int64_t chunk, int64_t n, double) {
                            EXPECT_EQ(chunk, calls++);
                            EXPECT_EQ(n, 3);
                          });
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      EXPECT_EQ(r->chunks, 3);
      EXPECT_EQ(calls, 3);
      EXPECT_EQ(r->tokens_scored, 3 * (n_ctx - n_ctx / 2 - 1));
      EXPECT_NEAR(r->ppl, want, 2e-3 * want) << arch << " batch " << n_batch;
      EXPECT_GT(r->ppl, 1.0);
      EXPECT_GT(r->ppl_error, 0.0);
      ASSERT_EQ(r->running_ppl.size(), 3u);
      EXPECT_DOUBLE_EQ(r->running_ppl.back(), r->ppl);
    }
  }
}

TEST(Perplexity, ChunkLimitAndShortTexts) {
  auto m = load("qwen3moe");
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> tokens = text_tokens(*m, 64);
  auto two = perplexity(*m, tokens, {.n_ctx = 16, .max_chunks = 2});
  ASSERT_TRUE(two.is_ok());
  EXPECT_EQ(two->chunks, 2);
  auto short_text = perplexity(*m, std::span<const int32_t>(tokens).first(20), {.n_ctx = 16});
  ASSERT_FALSE(short_text.is_ok());
  EXPECT_NE(short_text.status().message().find("at least 32"), std::string::npos) << short_text.status().message();
}

TEST(Perplexity, NegativeLogLikelihoodIsLogSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(negative_log_likelihood(logits, 2), -(3.0 - std::log(z)), 1e-12);
  EXPECT_NEAR(negative_log_likelihood(logits, 0), -(1.0 - std::log(z)), 1e-12);
}

}  // namespace
}  // namespace moeserve::runtime
