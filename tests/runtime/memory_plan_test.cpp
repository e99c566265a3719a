// Start-up memory planning (runtime/memory_plan.h) on the CPU device: the
// KV caches, workspace and prefix cache checked against what the process
// may use, with a message naming the flags; the largest context that fits.
#include "runtime/memory_plan.h"

#include <gtest/gtest.h>

#include <string>

#include "runtime/model.h"

namespace moeserve::runtime {
namespace {

const std::string kModel = std::string(MOESERVE_TEST_DATA_DIR) + "/models/qwen3moe-tiny.bf16.gguf";

std::unique_ptr<Model> load_cpu() {
  auto m = Model::load(kModel, {.n_threads = 1, .device = "cpu"});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

TEST(MemoryPlan, SmallRequestFitsOnTheHost) {
  auto model = load_cpu();
  ASSERT_TRUE(model);
  auto plan = plan_device_memory(*model, {.n_sequences = 2, .n_ctx = 2048, .n_batch = 64});
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_GT(plan->kv_bytes, uint64_t(0));
  EXPECT_GT(plan->free_bytes, plan->kv_bytes);
}

TEST(MemoryPlan, ADraftsContextCountsWithTheKvCache) {
  auto model = load_cpu();
  ASSERT_NE(model, nullptr);
  MemoryPlanRequest r{.n_sequences = 3, .n_ctx = 1000, .n_batch = 64};
  auto plain = plan_device_memory(*model, r);
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  r.extra_bytes_per_token = 4096;
  auto with_draft = plan_device_memory(*model, r);
  ASSERT_TRUE(with_draft.is_ok()) << with_draft.status().to_string();
  EXPECT_EQ(with_draft->kv_bytes, plain->kv_bytes + 3u * 1000u * 4096u);
}

TEST(MemoryPlan, ImpossibleRequestIsRefusedWithTheFlags) {
  auto model = load_cpu();
  ASSERT_TRUE(model);
  // 2^20 sequences of 2^20 tokens: petabytes of KV cache.
  auto plan = plan_device_memory(*model, {.n_sequences = int64_t(1) << 20, .n_ctx = int64_t(1) << 20});
  ASSERT_FALSE(plan.is_ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  const std::string msg = plan.status().message();
  EXPECT_NE(msg.find("--ctx-size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--parallel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bytes per token"), std::string::npos) << msg;
}

TEST(MemoryPlan, LargestFittingContextFitsAndTheNextStepDoesNot) {
  auto model = load_cpu();
  ASSERT_TRUE(model);
  MemoryPlanRequest r{.n_sequences = 1024, .n_ctx = int64_t(1) << 24, .n_batch = 64};
  const int64_t fits = largest_fitting_context(*model, r);
  ASSERT_GT(fits, 0) << "even 256 tokens a sequence should fit for the tiny model";
  EXPECT_EQ(fits % 256, 0);
  r.n_ctx = fits;
  EXPECT_TRUE(plan_device_memory(*model, r).is_ok());
  r.n_ctx = fits + 256;
  EXPECT_FALSE(plan_device_memory(*model, r).is_ok());
}

}  // namespace
}  // namespace moeserve::runtime
