#include "runtime/generator.h"

#include <gtest/gtest.h>

#include "models/tiny_qwen3.h"
#include "runtime/sampler.h"

namespace moeserve::runtime {
namespace {

std::unique_ptr<Model> tiny_model(const testing::TinyModel& tm) {
  auto file = tm.parse();
  EXPECT_TRUE(file.is_ok());
  auto m = Model::from_gguf(std::move(file.value()), {.n_threads = 1});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return std::move(m.value());
}

TEST(StopStringFilter, StopAcrossPiecesIsNeverPartlyEmitted) {
  StopStringFilter f({"<END>", "xyz"});
  std::string out;
  for (const char* piece : {"hello <", "E", "N", "D> world"}) out += f.push(piece);
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(out, "hello ");
  EXPECT_EQ(f.matched(), "<END>");
}

TEST(StopStringFilter, MatchedIsTheEarliestStop) {
  StopStringFilter f({"zz", "b", "ab"});
  EXPECT_EQ(f.push("xxabzz"), "xx");
  EXPECT_EQ(f.matched(), "ab");  // starts first, though listed after "b"
}

TEST(StopStringFilter, FalseStartIsReleased) {
  StopStringFilter f({"<END>"});
  std::string out = f.push("a <EN");
  EXPECT_EQ(out, "a ");  // "<EN" held back
  out += f.push("X and <");
  EXPECT_FALSE(f.stopped());
  EXPECT_EQ(out, "a <ENX and ");
  out += f.flush();
  EXPECT_EQ(out, "a <ENX and <");
}

TEST(Generator, PromptLongerThanContextFailsBeforeWork) {
  const testing::TinyModel tm = testing::build_tiny_model({});
  auto model = tiny_model(tm);
  Generator gen(*model, 8);
  std::vector<int32_t> prompt(9, 65);
  auto r = gen.generate(prompt, {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(r.status().message().find("context size 8"), std::string::npos) << r.status().message();
  EXPECT_EQ(gen.sequence().position(), 0);
}

TEST(Generator, StopsAtContextEndWithReason) {
  const testing::TinyModel tm = testing::build_tiny_model({});
  auto model = tiny_model(tm);
  Generator gen(*model, 6);
  GenerateOptions o;
  o.max_tokens = 100;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  auto r = gen.generate(std::vector<int32_t>{65, 66, 67}, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->reason, StopReason::kContextFull);
  EXPECT_EQ(r->tokens.size(), 4u);  // 3 more fit the cache, and the last one is sampled from position 5
}

TEST(Generator, GreedyIsDeterministicAndStreamsTheSameText) {
  const testing::TinyModel tm = testing::build_tiny_model({});
  auto model = tiny_model(tm);
  Generator gen(*model, 64);
  GenerateOptions o;
  o.max_tokens = 12;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  o.n_batch = 2;
  std::string streamed;
  auto a = gen.generate(std::vector<int32_t>{65, 66, 67, 68, 69}, o, [&](std::string_view p) {
    streamed += p;
    return true;
  });
  o.n_batch = 512;
  auto b = gen.generate(std::vector<int32_t>{65, 66, 67, 68, 69}, o);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->tokens.size(), 12u);
  EXPECT_EQ(streamed, a->text);
  // (decode() would return raw bytes; the stream replaces invalid UTF-8 with U+FFFD.)
}

// decode_greedy (the arg-max taken by the model's device, only the id read
// back) picks what the host sampler picks from decode()'s logits, step by
// step, and generate() at temperature 0 (which takes that path) equals a
// loop over the logits.
TEST(Generator, DeviceGreedyEqualsTheHostArgMax) {
  const testing::TinyModel tm = testing::build_tiny_model({});
  auto model = tiny_model(tm);
  const std::vector<int32_t> prompt = {65, 66, 67, 68, 69};
  Sampler host(SamplerOptions{.temperature = 0.0f});
  std::vector<float> logits(size_t(model->info().n_vocab));
  Generator by_logits(*model, 64), by_id(*model, 64);
  ASSERT_TRUE(by_logits.prefill(prompt, 3, logits).is_ok());
  int32_t id = -1;
  ASSERT_TRUE(by_id.prefill_greedy(prompt, 3, &id).is_ok());
  std::vector<int32_t> loop;
  for (int step = 0; step < 10; ++step) {
    const int32_t want = host.sample(logits, {});
    ASSERT_EQ(id, want) << "step " << step;
    loop.push_back(want);
    ASSERT_TRUE(by_logits.decode(want, logits).is_ok());
    ASSERT_TRUE(by_id.decode_greedy(want, &id).is_ok());
  }
  GenerateOptions o;
  o.max_tokens = 10;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  auto r = by_id.generate(prompt, o);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->tokens, loop);
}

TEST(Generator, StopStringCutsTheText) {
  const testing::TinyModel tm = testing::build_tiny_model({});
  auto model = tiny_model(tm);
  Generator gen(*model, 64);
  GenerateOptions o;
  o.max_tokens = 12;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  auto full = gen.generate(std::vector<int32_t>{65, 66, 67}, o);
  ASSERT_TRUE(full.is_ok());
  const std::string text = full->text;
  ASSERT_GE(text.size(), 4u);
  // Stop on a piece from the middle of the greedy text: the output is what precedes it.
  const std::string stop = text.substr(text.size() / 2, 2);
  o.stop = {stop};
  auto cut = gen.generate(std::vector<int32_t>{65, 66, 67}, o);
  ASSERT_TRUE(cut.is_ok());
  EXPECT_EQ(cut->reason, StopReason::kStopString);
  EXPECT_EQ(cut->text, text.substr(0, text.find(stop)));
}

}  // namespace
}  // namespace moeserve::runtime
