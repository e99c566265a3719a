// The batch engine with a recurrent model (qwen35moe, make-model's tiny
// preset): concurrent requests equal their solo runs, a chat's next turn
// reuses the previous exchange's cache entry (recurrent states included)
// and still gives the solo answer, a repeated prompt reuses the snapshot
// taken one token before its end, and a partial prefix match is not reused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>

#include "convert/make_model.h"
#include "runtime/batch_engine.h"
#include "runtime/engine_collector.h"
#include "runtime/generator.h"
#include "temp_dir.h"
#include "test_device.h"

namespace moeserve::runtime {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Model> load_tiny_qwen35moe() {
  const fs::path dir =
      testing::process_temp_dir("recurrent_engine_test");  // a copy (see forward_test_util.h)
  const std::string path = (dir / "qwen35moe.gguf").string();
  convert::MakeModelOptions o;
  o.shape = convert::model_preset(convert::ModelArch::kQwen35Moe, "tiny").value();
  o.file_type = convert::FileType::kF32;
  o.seed = 11;
  o.n_threads = 2;
  EXPECT_TRUE(convert::make_model(o, path).is_ok());
  auto m = Model::load(path, {.n_threads = 2, .device = testing::test_device()});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

using testing::Collector;

// Solo greedy tokens, prefilled in chunks of 8 (the engine's chunk below),
// so both run the recurrent form over the same token runs.
std::vector<int32_t> solo(Model& m, const std::vector<int32_t>& prompt, int64_t n) {
  Generator gen(m, 256);
  GenerateOptions o;
  o.max_tokens = n;
  o.n_batch = 8;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  return gen.generate(prompt, o).value().tokens;
}

TEST(RecurrentEngine, ConcurrentRequestsEqualSoloAndAChatTurnReusesTheState) {
  auto model = load_tiny_qwen35moe();
  ASSERT_TRUE(model);
  std::vector<std::vector<int32_t>> prompts;
  for (const char* p : {"def main(", "import os\nimport sys\n", "class Foo:", "x = [1, 2", "while True:"}) {
    prompts.push_back(model->tokenizer().encode(p));
  }
  EngineOptions eo;
  eo.n_slots = 3;  // 5 requests: some wait, slots are reused (states cleared)
  eo.n_ctx = 256;
  eo.n_batch = 8;
  eo.prefix_cache_bytes = size_t(64) << 20;
  BatchEngine engine(*model, eo);
  std::vector<std::unique_ptr<Collector>> cs;
  for (const auto& p : prompts) {
    cs.push_back(std::make_unique<Collector>());
    EngineRequest r = cs.back()->request(p, 12);
    r.stop_at_eos = false;
    ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    cs[i]->wait();
    ASSERT_TRUE(cs[i]->status.is_ok()) << cs[i]->status.to_string();
    EXPECT_EQ(cs[i]->tokens, solo(*model, prompts[i], 12)) << "prompt " << i;
  }
  // The next turn: the first exchange (its prompt and the generated tokens
  // the engine fed back, i.e. all but the last) plus new text.
  std::vector<int32_t> turn = prompts[0];
  turn.insert(turn.end(), cs[0]->tokens.begin(), cs[0]->tokens.end());
  const std::vector<int32_t> more = model->tokenizer().encode("\n# next");
  turn.insert(turn.end(), more.begin(), more.end());
  Collector next;
  EngineRequest r = next.request(turn, 10);
  r.stop_at_eos = false;
  ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  next.wait();
  ASSERT_TRUE(next.status.is_ok());
  EXPECT_EQ(next.stats.cached_tokens, int64_t(prompts[0].size() + cs[0]->tokens.size()) - 1);
  EXPECT_EQ(next.tokens, solo(*model, turn, 10));

  // The same prompt again: its prefill stored the states one token before
  // its end, so all but the last token come from the cache.
  Collector again;
  r = again.request(prompts[2], 6);
  r.stop_at_eos = false;
  ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  again.wait();
  EXPECT_EQ(again.stats.cached_tokens, int64_t(prompts[2].size()) - 1);
  EXPECT_EQ(again.tokens, solo(*model, prompts[2], 6));

  // A prompt that shares only part of an entry cannot use its states.
  std::vector<int32_t> partial = prompts[1];
  ASSERT_GT(partial.size(), 3u);
  partial[1] = partial[1] == 5 ? 6 : 5;
  Collector other;
  r = other.request(partial, 4);
  r.stop_at_eos = false;
  ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  other.wait();
  EXPECT_EQ(other.stats.cached_tokens, 0);
  EXPECT_EQ(other.tokens, solo(*model, partial, 4));
}

// Paged KV on a hybrid model: its attention rows in a pool too small for
// the running set, so sequences are swapped out (recurrent states stay
// put) and back; outputs equal solo runs.
TEST(RecurrentEngine, PagedPoolPreemptionKeepsSoloOutput) {
  auto model = load_tiny_qwen35moe();
  ASSERT_TRUE(model);
  if (!model->pages_kv()) GTEST_SKIP() << "this device does not page KV";
  std::vector<std::vector<int32_t>> prompts;
  for (const char* p : {"def main(", "import os\nimport sys\n", "class Foo:", "x = [1, 2"}) {
    prompts.push_back(model->tokenizer().encode(p));
  }
  auto probe = model->new_kv_pool({.bytes = size_t(64) << 20, .block_rows = 4});
  ASSERT_TRUE(probe.is_ok());
  EngineOptions eo;
  eo.n_slots = 4;
  eo.n_ctx = 256;
  eo.n_batch = 8;
  eo.prefix_cache_bytes = size_t(64) << 20;
  eo.kv_block_rows = 4;
  eo.kv_pool_bytes = (*probe)->block_bytes() * 14;
  eo.kv_swap_bytes = 0;  // recurrent sequences are swapped whatever the budget
  BatchEngine engine(*model, eo);
  ASSERT_TRUE(engine.status().is_ok());
  std::vector<std::unique_ptr<Collector>> cs;
  for (const auto& p : prompts) {
    cs.push_back(std::make_unique<Collector>());
    EngineRequest r = cs.back()->request(p, 24);
    r.stop_at_eos = false;
    ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    cs[i]->wait();
    ASSERT_TRUE(cs[i]->status.is_ok()) << cs[i]->status.to_string();
    EXPECT_EQ(cs[i]->tokens, solo(*model, prompts[i], 24)) << "prompt " << i;
  }
  EXPECT_GT(engine.stats().preemptions, 0);
  EXPECT_EQ(engine.stats().recompute_preemptions, 0);
}

// Paged KV with the block tree: a prompt's prefill keeps the recurrent
// states every kv_state_interval positions, so prompts that share a system
// prompt resume from the last such point before they differ (cached
// tokens, whole intervals), with their solo output.
TEST(RecurrentEngine, SharedSystemPromptResumesFromAStatePoint) {
  auto model = load_tiny_qwen35moe();
  ASSERT_TRUE(model);
  if (!model->pages_kv()) GTEST_SKIP() << "this device does not page KV";
  const std::string system =
      "You are a careful assistant. Answer in Python, with comments, and keep it short. Never guess.\n";
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(model->tokenizer().encode(system + "Task " + std::to_string(i) + ": def f(x"));
  }
  const int64_t common = int64_t(model->tokenizer().encode(system).size());
  ASSERT_GT(common, 16);
  auto probe = model->new_kv_pool({.bytes = size_t(64) << 20, .block_rows = 4});
  ASSERT_TRUE(probe.is_ok());
  EngineOptions eo;
  eo.n_slots = 2;
  eo.n_ctx = 256;
  eo.n_batch = 8;
  eo.prefix_cache_bytes = size_t(64) << 20;
  eo.kv_block_rows = 4;
  eo.kv_pool_bytes = (*probe)->block_bytes() * 64;
  eo.kv_state_interval = 8;
  BatchEngine engine(*model, eo);
  ASSERT_TRUE(engine.status().is_ok());
  for (size_t i = 0; i < prompts.size(); ++i) {  // one after another: each finds the states of those before
    Collector c;
    EngineRequest r = c.request(prompts[i], 12);
    r.stop_at_eos = false;
    ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
    c.wait();
    ASSERT_TRUE(c.status.is_ok()) << c.status.to_string();
    EXPECT_EQ(c.tokens, solo(*model, prompts[i], 12)) << "prompt " << i;
    if (i == 0) {
      EXPECT_EQ(c.stats.cached_tokens, 0);
    } else {
      EXPECT_GT(c.stats.cached_tokens, 0) << "prompt " << i;
      EXPECT_EQ(c.stats.cached_tokens % 8, 0);
      EXPECT_LE(c.stats.cached_tokens, common);
      EXPECT_GT(c.stats.cached_tokens + 8, common - 4);  // the last state point before they differ
    }
  }
  const EngineStats st = engine.stats();
  EXPECT_GT(st.shared_prefix.states, 0);
  EXPECT_GT(st.shared_prefix.state_bytes, size_t(0));
  EXPECT_GT(st.shared_prefix.hits, 0);
}

}  // namespace
}  // namespace moeserve::runtime
