// moeserve calibrate's core (src/moe/calibrate.h) on the tiny trained MoE
// model: prompts from text and chat lines, and counts that add up (each
// layer's selections are n_expert_used per counted token, prefill and decode
// apart), the same on a second run, refused when the forward is given counts
// of the wrong size. Runs on MOESERVE_TEST_DEVICE (the GPU machine: cuda).
#include "moe/calibrate.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "test_device.h"

namespace moeserve::moe {
namespace {

const std::string kModel = std::string(MOESERVE_TEST_DATA_DIR) + "/models/qwen3moe-tiny.bf16.gguf";

std::unique_ptr<runtime::Model> load() {
  auto m = runtime::Model::load(kModel, {.n_threads = 2, .device = testing::test_device()});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return std::move(m.value());
}

TEST(Calibrate, PromptsFromTextAndChatLines) {
  auto model = load();
  const std::string lines =
      "def main(\n\n   "
      "\n{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\r\n[{\"role\":\"user\",\"content\":\"x\"}]"
      "\n";
  auto p = calibration_prompts(*model, lines, "prompts.txt");
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  ASSERT_EQ(p->size(), 3u);
  EXPECT_EQ((*p)[0], model->tokenizer().encode("def main("));
  // Rendered with the template's turn markers: longer than their text.
  EXPECT_GT((*p)[1].size(), model->tokenizer().encode("hi").size() + 2);
  EXPECT_GT((*p)[2].size(), model->tokenizer().encode("x").size() + 2);
  auto bad = calibration_prompts(*model, "ok\n{\"messages\": 3}\n", "prompts.txt");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("prompts.txt:2"), std::string::npos) << bad.status().to_string();
  EXPECT_FALSE(calibration_prompts(*model, "\n \n", "empty.txt").is_ok());
}

TEST(Calibrate, CountsAddUpAndRepeat) {
  auto model = load();
  auto f = GgufFile::open(kModel);
  ASSERT_TRUE(f.is_ok());
  auto shape = moe_shape(f.value());
  ASSERT_TRUE(shape.is_ok());
  auto prompts = calibration_prompts(*model, "def fibonacci(n):\nimport os\nclass Foo:\n", "p");
  ASSERT_TRUE(prompts.is_ok());
  CalibrateOptions o;
  o.n_predict = 6, o.ctx_size = 128, o.n_batch = 4;  // prompts prefilled in several chunks
  size_t progress = 0, progress_total = 0;
  o.on_prompt = [&](size_t done, size_t total) { progress = done, progress_total = total; };
  auto a = calibrate(*model, *shape, *prompts, o);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(progress, 3u);
  EXPECT_EQ(progress_total, 3u);
  int64_t prompt_tokens = 0;
  for (const auto& p : *prompts) prompt_tokens += int64_t(p.size());
  EXPECT_EQ(a->prefill_tokens, prompt_tokens);
  EXPECT_GT(a->decode_tokens, 0);
  EXPECT_LE(a->decode_tokens, 18);
  for (int64_t l = 0; l < a->n_layer; ++l) {
    const auto& pre = a->prefill[size_t(l)];
    const auto& dec = a->decode[size_t(l)];
    EXPECT_EQ(std::accumulate(pre.begin(), pre.end(), int64_t(0)), a->n_expert_used * a->prefill_tokens) << l;
    EXPECT_EQ(std::accumulate(dec.begin(), dec.end(), int64_t(0)), a->n_expert_used * a->decode_tokens) << l;
  }
  auto b = calibrate(*model, *shape, *prompts, o);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(a->prefill, b->prefill);
  EXPECT_EQ(a->decode, b->decode);
  // The file round trip and a placement from it.
  auto back = parse_expert_stats(to_json(*a), "stats.json", &shape.value());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->decode, a->decode);
  o.n_predict = 0;
  auto none = calibrate(*model, *shape, *prompts, o);
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(none->decode_tokens, 0);
  EXPECT_EQ(none->prefill, a->prefill);
}

TEST(Calibrate, ForwardRefusesCountsOfTheWrongSize) {
  auto model = load();
  auto kv = model->new_kv_cache(16);
  ASSERT_TRUE(kv.is_ok());
  auto ws = model->new_workspace(4);
  ASSERT_TRUE(ws.is_ok());
  std::vector<int64_t> counts(7, 0);
  const std::vector<int32_t> tokens = {1, 2};
  models::ForwardBatch b;
  b.tokens = tokens;
  b.kv = kv->view();
  b.expert_counts = counts;
  const Status st = model->net().forward(b, **ws);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_EQ(counts, std::vector<int64_t>(7, 0));
}

}  // namespace
}  // namespace moeserve::moe
