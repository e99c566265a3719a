// Pipelined micro-batches over a layer split (models/micro_batches.h): how a
// batch is cut (sequences continued across micro-batches, logit rows put
// back in their order), which placements pipeline at all, and a split
// whose stages can overlap — the CPU beside another "process", and on the
// GPU machine a GPU beside the CPU — giving the unsplit greedy output with
// its prompt in pipelined micro-batches, on every architecture.
#include "models/micro_batches.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/gpu_api.h"
#include "runtime/batch_engine.h"
#include "runtime/engine_collector.h"
#include "runtime/generator.h"
#include "runtime/shard_host.h"
#include "split_test_util.h"
#include "test_device.h"

namespace moeserve::models {
namespace {

TEST(MicroBatches, SequencesContinueAcrossMicroBatchesAndLogitsComeBackInOrder) {
  // Three sequences over 46 rows; logit rows out of order.
  std::vector<int32_t> tokens(46, 1);
  const std::vector<SequenceSlice> seqs = {{0, 10, 5, {}}, {10, 30, 0, {}}, {40, 6, 2, {}}};
  const std::vector<int64_t> logit_rows = {45, 9, 39};
  const int64_t n_vocab = 3;
  std::vector<float> logits(logit_rows.size() * n_vocab, -1.0f);
  std::vector<int32_t> greedy(logit_rows.size(), -1);
  ForwardBatch b;
  b.tokens = tokens;
  b.sequences = seqs;
  b.logit_rows = logit_rows;
  b.logits = logits.data();
  b.greedy = greedy.data();
  b.decode_rows = 20;
  BatchRows rows;
  rows.slices = seqs;
  std::vector<MicroBatch> mbs;
  cut_micro_batches(b, rows, 3, n_vocab, mbs);
  ASSERT_EQ(mbs.size(), 3u);
  // Rows 0..14, 15..29, 30..45.
  EXPECT_EQ(mbs[0].rows, 15);
  EXPECT_EQ(mbs[1].row0, 15);
  EXPECT_EQ(mbs[2].rows, 16);
  // The first: sequence 0 whole (pos 5..14), sequence 1's first 5 rows.
  ASSERT_EQ(mbs[0].slices.size(), 2u);
  EXPECT_EQ(mbs[0].slices[1].row0, 10);
  EXPECT_EQ(mbs[0].slices[1].n_tokens, 5);
  EXPECT_EQ(mbs[0].slices[1].pos0, 0);
  // The second: sequence 1 at positions 5..19.
  ASSERT_EQ(mbs[1].slices.size(), 1u);
  EXPECT_EQ(mbs[1].slices[0].row0, 0);
  EXPECT_EQ(mbs[1].slices[0].pos0, 5);
  EXPECT_EQ(mbs[1].slices[0].n_tokens, 15);
  // The third: sequence 1's last 10 (positions 20..29), then sequence 2.
  ASSERT_EQ(mbs[2].slices.size(), 2u);
  EXPECT_EQ(mbs[2].slices[0].pos0, 20);
  EXPECT_EQ(mbs[2].slices[1].row0, 10);
  EXPECT_EQ(mbs[2].slices[1].pos0, 2);
  // Decode rows only in the first two; logit rows in the first and last.
  EXPECT_EQ(mbs[0].batch.decode_rows, 15);
  EXPECT_EQ(mbs[1].batch.decode_rows, 5);
  EXPECT_EQ(mbs[2].batch.decode_rows, 0);
  EXPECT_EQ(mbs[0].logit_rows, std::vector<int64_t>{9});
  EXPECT_TRUE(mbs[1].logit_rows.empty());
  EXPECT_EQ(mbs[1].batch.logits, nullptr);
  EXPECT_EQ(mbs[2].logit_rows, (std::vector<int64_t>{15, 9}));  // rows 45 and 39
  // Their logits back where the whole batch wants them.
  for (MicroBatch& mb : mbs) {
    for (size_t j = 0; j < mb.logit_rows.size(); ++j) {
      const int64_t row = mb.row0 + mb.logit_rows[j];
      for (int64_t v = 0; v < n_vocab; ++v) mb.logits[j * n_vocab + size_t(v)] = float(row * 10 + v);
      mb.greedy[j] = int32_t(row);
    }
  }
  gather_micro_logits(mbs, b, n_vocab);
  for (size_t i = 0; i < logit_rows.size(); ++i) {
    EXPECT_EQ(greedy[i], logit_rows[i]);
    EXPECT_EQ(logits[i * n_vocab + 2], float(logit_rows[i] * 10 + 2));
  }
}

// ---- split == unsplit, pipelined -------------------------------------------

using split_test::model_path;

std::vector<int32_t> greedy(runtime::Model& m, const std::vector<int32_t>& prompt, int64_t n, int64_t n_batch) {
  return split_test::greedy_tokens(m, prompt, n, n_batch, /*n_ctx=*/512);
}

std::vector<int32_t> long_prompt(runtime::Model& m) {
  std::string text;
  for (int i = 0; i < 6; ++i) text += fmt::format("def add{}(a, b):\n    return a + b * {}\n\n", i, i);
  return m.tokenizer().encode(text + "class Foo:\n");
}

// Two requests of the long prompt at once through the engine: each gives `want`.
void expect_engine_output(runtime::Model& m, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& want, const std::string& where) {
  split_test::expect_engine_output(m, prompt, want, where, {.n_ctx = 512, .rounds = 1});
}

class PipelinedSplit : public ::testing::TestWithParam<std::string> {};

// The CPU beside a "process" (a ShardHost here, as in layer_split_test):
// two lanes, so a forward of 64 rows goes as 4 micro-batches of 16 — the
// shard sees 4 forwards where the unpipelined split sends 1.
TEST_P(PipelinedSplit, CpuBesideAProcessGivesTheUnsplitOutput) {
  auto whole = runtime::Model::load(model_path(GetParam()), {.n_threads = 2, .device = "cpu"});
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  const std::vector<int32_t> prompt = long_prompt(**whole);
  ASSERT_GE(prompt.size(), 64u);
  const std::vector<int32_t> want = greedy(**whole, prompt, 16, 64);
  ASSERT_EQ(want.size(), 16u);
  int64_t forwards[2] = {0, 0};
  for (const int64_t micro : {int64_t(1), int64_t(4)}) {
    auto shard = runtime::Model::load(model_path(GetParam()),
                                      {.n_threads = 2, .device = "cpu", .first_layer = 2, .end_layer = 4});
    ASSERT_TRUE(shard.is_ok()) << shard.status().to_string();
    runtime::ShardHost host(**shard);
    runtime::ModelLoadOptions lo{.n_threads = 2};
    lo.layer_shards = {{"cpu", 0, 2}, {"proc:cpu", 2, 4, &host}};
    lo.micro_batches = micro;
    lo.min_micro_batch_rows = 16;  // the tiny models' 64-row forwards in 4 parts
    auto split = runtime::Model::load(model_path(GetParam()), lo);
    ASSERT_TRUE(split.is_ok()) << split.status().to_string();
    EXPECT_EQ(pipeline_depth((*split)->net().placement(), 4), micro);
    const std::string where = fmt::format("{} cpu + remote, {} micro-batches", GetParam(), micro);
    // --batch 16: the pipelined split's forwards take 64 rows.
    EXPECT_EQ(greedy(**split, prompt, 16, micro == 1 ? 64 : 16), want) << where;
    forwards[micro == 1 ? 0 : 1] = host.forwards();
    expect_engine_output(**split, prompt, want, where);
  }
  // Same prefill chunks of 64 rows; the pipelined one sends each in 4 parts.
  EXPECT_GT(forwards[1], forwards[0] + int64_t(prompt.size()) / 64) << GetParam();
}

// On the GPU machine: the GPU beside the CPU threads, two in-process lanes.
TEST_P(PipelinedSplit, GpuBesideTheCpuGivesTheUnsplitOutput) {
  const std::string device = moeserve::testing::test_device();
  if (device == "cpu") GTEST_SKIP() << "needs a GPU";
  auto whole = runtime::Model::load(model_path(GetParam()), {.n_threads = 2, .device = device});
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  const std::vector<int32_t> prompt = long_prompt(**whole);
  const std::vector<int32_t> want = greedy(**whole, prompt, 16, 64);
  for (const std::vector<runtime::LayerShard>& shards :
       {std::vector<runtime::LayerShard>{{device, 0, 3}, {"cpu", 3, 4}},
        std::vector<runtime::LayerShard>{{"cpu", 0, 1}, {device, 1, 4}}}) {
    runtime::ModelLoadOptions lo{.n_threads = 2};
    lo.layer_shards = shards;
    lo.micro_batches = 4;
    lo.min_micro_batch_rows = 16;  // the tiny models' 64-row forwards in 4 parts
    auto split = runtime::Model::load(model_path(GetParam()), lo);
    ASSERT_TRUE(split.is_ok()) << split.status().to_string();
    EXPECT_EQ(pipeline_depth((*split)->net().placement(), 4), 4);
    const std::string where = fmt::format("{} {}+{} pipelined", GetParam(), shards[0].device, shards[1].device);
    EXPECT_EQ(greedy(**split, prompt, 16, 16), want) << where;
    expect_engine_output(**split, prompt, want, where);
  }
}

// On a machine with two GPUs: a lane each. Each wave hands both stages their
// rows before it runs them, so each stage's kernels must go to its own GPU.
TEST_P(PipelinedSplit, TwoGpusGiveTheUnsplitOutput) {
  const std::string device = moeserve::testing::test_device();
  auto gpus = gpu::list_devices();
  if (device == "cpu" || !gpus.is_ok() || gpus->size() < 2) GTEST_SKIP() << "needs two GPUs";
  auto whole = runtime::Model::load(model_path(GetParam()), {.n_threads = 2, .device = "cuda:0"});
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  const std::vector<int32_t> prompt = long_prompt(**whole);
  const std::vector<int32_t> want = greedy(**whole, prompt, 16, 64);
  for (const int64_t micro : {int64_t(1), int64_t(4)}) {
    runtime::ModelLoadOptions lo{.n_threads = 2};
    lo.layer_shards = {{"cuda:0", 0, 2}, {"cuda:1", 2, 4}};
    lo.micro_batches = micro;
    lo.min_micro_batch_rows = 16;  // the tiny models' 64-row forwards in 4 parts
    auto split = runtime::Model::load(model_path(GetParam()), lo);
    ASSERT_TRUE(split.is_ok()) << split.status().to_string();
    EXPECT_EQ(pipeline_depth((*split)->net().placement(), 4), micro);
    const std::string where = fmt::format("{} cuda:0 + cuda:1, {} micro-batches", GetParam(), micro);
    EXPECT_EQ(greedy(**split, prompt, 16, micro == 1 ? 64 : 16), want) << where;
    expect_engine_output(**split, prompt, want, where);
  }
}

// Shards on one lane (two on the CPU) do not pipeline: nothing to overlap.
TEST(PipelinedSplitPlan, OneLaneDoesNotPipeline) {
  runtime::ModelLoadOptions lo{.n_threads = 1};
  lo.layer_shards = {{"cpu", 0, 2}, {"cpu", 2, 4}};
  lo.micro_batches = 4;
  lo.min_micro_batch_rows = 16;  // the tiny models' 64-row forwards in 4 parts
  auto split = runtime::Model::load(model_path("qwen3"), lo);
  ASSERT_TRUE(split.is_ok()) << split.status().to_string();
  EXPECT_EQ(pipeline_depth((*split)->net().placement(), 4), 1);
  const std::vector<PipelineStage> stages = pipeline_stages((*split)->net().placement(), 4);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].lane, "host");
  EXPECT_TRUE(stages[1].blocks_host);
  EXPECT_EQ(count_lanes(stages), 1);
}

INSTANTIATE_TEST_SUITE_P(Architectures, PipelinedSplit,
                         ::testing::Values("qwen3", "qwen3moe", "qwen35", "qwen35moe", "laguna"));

}  // namespace
}  // namespace moeserve::models
