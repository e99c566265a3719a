// Layer split in one process: the SPEC parser and the planner (ranges by
// weight bytes, explicit ranges, every mistake refused with the part at
// fault), and a split model decoding exactly as the unsplit one on every
// architecture — shards on distinct device objects, so the boundary rows
// really cross (two or three CPU shards in CI; on the GPU machine, two
// shards on one GPU and GPU + CPU).
#include "split/layer_split.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/expert_backend.h"
#include "runtime/batch_engine.h"
#include "runtime/engine_collector.h"
#include "runtime/generator.h"
#include "runtime/memory_plan.h"
#include "runtime/shard_host.h"
#include "split_test_util.h"
#include "test_device.h"

namespace moeserve::split {
namespace {

using runtime::LayerShard;

using split_test::model_path;

TEST(LayerSplitSpec, ParsesDevicesWeightsAndRanges) {
  auto a = parse_layer_split("cuda:0,cpu");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ((*a)[0].kind, ShardKind::kCuda);
  EXPECT_EQ((*a)[0].device, "cuda:0");
  EXPECT_EQ((*a)[1].kind, ShardKind::kCpu);
  auto b = parse_layer_split("cuda=3,cpu=1.5");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ((*b)[0].device, "cuda:0");
  EXPECT_DOUBLE_EQ((*b)[0].weight, 3.0);
  EXPECT_DOUBLE_EQ((*b)[1].weight, 1.5);
  auto c = parse_layer_split("cuda:0=0:20,proc:cpu=20:48");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ((*c)[1].kind, ShardKind::kProcess);
  EXPECT_EQ((*c)[1].range, (std::pair<int64_t, int64_t>{20, 48}));
  auto d = parse_layer_split("mpi:0:cuda:0,mpi:1");
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ((*d)[0].kind, ShardKind::kMpi);
  EXPECT_EQ((*d)[0].mpi_rank, 0);
  EXPECT_EQ((*d)[0].process_device, "cuda:0");
  EXPECT_EQ((*d)[1].mpi_rank, 1);
  EXPECT_EQ((*d)[1].process_device, "cpu");
  for (const char* bad :
       {"", "cpu", "cpu,", ",cpu", "tpu,cpu", "cpu,cuda:x", "cpu=0:2,cpu", "cpu=2:1,cpu=2:4", "cpu=-1,cpu",
        "cpu=abc,cpu", "cpu=0,cpu", "mpi:x,cpu", "mpi:1:tpu,cpu", "auto,cpu"}) {
    auto r = parse_layer_split(bad);
    EXPECT_FALSE(r.is_ok()) << "'" << bad << "' was accepted";
    if (!r.is_ok()) {
      EXPECT_NE(r.status().message().find("--layer-split"), std::string::npos);
    }
  }
}

TEST(LayerSplitPlan, RangesFollowTheWeightsAndMistakesAreRefused) {
  auto file = GgufFile::open(model_path("qwen3moe"));
  ASSERT_TRUE(file.is_ok());
  auto plan = [&](const char* spec) -> Result<std::vector<ShardPlan>> {
    MOESERVE_ASSIGN_OR_RETURN(std::vector<ShardSpec> s, parse_layer_split(spec));
    return plan_layer_split(*file, s);
  };
  auto even = plan("cpu,cpu");  // 4 equal layers, the embedding and head about equal
  ASSERT_TRUE(even.is_ok()) << even.status().to_string();
  EXPECT_EQ((*even)[0].shard.begin, 0);
  EXPECT_EQ((*even)[0].shard.end, 2);
  EXPECT_EQ((*even)[1].shard.end, 4);
  EXPECT_GT((*even)[0].io_bytes, 0u);
  EXPECT_GT((*even)[1].io_bytes, 0u);
  auto heavy = plan("cpu=1,cpu=100");  // each shard keeps at least one layer
  ASSERT_TRUE(heavy.is_ok());
  EXPECT_EQ((*heavy)[0].shard.end, 1);
  auto three = plan("cpu,cpu,cpu,cpu");
  ASSERT_TRUE(three.is_ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ((*three)[size_t(i)].shard.end - (*three)[size_t(i)].shard.begin, 1);
  auto ranged = plan("cpu=0:3,cpu=3:4");
  ASSERT_TRUE(ranged.is_ok());
  EXPECT_EQ((*ranged)[0].shard.end, 3);
  const std::string text = describe_layer_split(*ranged);
  EXPECT_NE(text.find("layers   0:3"), std::string::npos) << text;
  EXPECT_NE(text.find("output head"), std::string::npos) << text;
  struct Bad {
    const char* spec;
    const char* says;
  };
  for (const Bad& b :
       {Bad{"cpu=0:2,cpu=3:4", "without gaps"}, Bad{"cpu=0:3,cpu=2:4", "without gaps"},
        Bad{"cpu=0:2,cpu=2:9", "without gaps"}, Bad{"cpu=0:2,cpu=2:3", "end at layer 3"},
        Bad{"cpu,cpu,cpu,cpu,cpu", "5 shards for the 4 layers"}, Bad{"mpi:0,mpi:0", "named twice"}}) {
    auto r = plan(b.spec);
    ASSERT_FALSE(r.is_ok()) << b.spec;
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << b.spec << ": " << r.status().message();
  }
}

// ---- split == unsplit ------------------------------------------------------

std::vector<int32_t> greedy(runtime::Model& m, const std::vector<int32_t>& prompt, int64_t n) {
  return split_test::greedy_tokens(m, prompt, n, /*n_batch=*/5,
                                   /*n_ctx=*/256);  // chunks straddling nothing in particular
}

// The engine, two requests at once and a repeated prompt (its prefix comes
// from the prefix cache, the KV of every shard restored): each gives `want`.
void expect_engine_output(runtime::Model& m, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& want, const std::string& where) {
  split_test::expect_engine_output(m, prompt, want, where, {.n_ctx = 256, .rounds = 2});
}

// Splits of a 4-layer model over the test device (and the CPU beside a GPU).
std::vector<std::vector<LayerShard>> splits_for(const std::string& device) {
  std::vector<std::vector<LayerShard>> out = {{{device, 0, 2}, {device, 2, 4}},
                                              {{device, 0, 1}, {device, 1, 3}, {device, 3, 4}}};
  if (device != "cpu") {
    out.push_back({{device, 0, 3}, {"cpu", 3, 4}});
    out.push_back({{"cpu", 0, 1}, {device, 1, 4}});
  }
  return out;
}

class LayerSplitModel : public ::testing::TestWithParam<std::string> {};

TEST_P(LayerSplitModel, DecodesExactlyAsUnsplit) {
  const std::string device = moeserve::testing::test_device();
  auto whole = runtime::Model::load(model_path(GetParam()), {.n_threads = 2, .device = device});
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  const std::vector<int32_t> prompt =
      (*whole)->tokenizer().encode("def add(a, b):\n    return a + b\n\nclass Foo:\n");
  const std::vector<int32_t> want = greedy(**whole, prompt, 24);
  ASSERT_EQ(want.size(), 24u);
  for (const auto& shards : splits_for(device)) {
    runtime::ModelLoadOptions lo{.n_threads = 2};
    lo.layer_shards = shards;
    auto split = runtime::Model::load(model_path(GetParam()), lo);
    ASSERT_TRUE(split.is_ok()) << split.status().to_string();
    EXPECT_EQ((*split)->devices().size(), shards.size());
    EXPECT_EQ(greedy(**split, prompt, 24), want) << GetParam() << " over " << shards.size() << " shards";
    expect_engine_output(**split, prompt, want, fmt::format("{} over {} shards", GetParam(), shards.size()));
  }
}

// Layers in another "process": a ShardHost here stands for it (the same
// object a shard process serves behind its socket), so the remote path —
// hidden rows out and back, the head over there, caches opened, truncated,
// snapshotted and read by number — is checked without a transport.
TEST_P(LayerSplitModel, RemoteRangesDecodeExactlyAsUnsplit) {
  auto whole = runtime::Model::load(model_path(GetParam()), {.n_threads = 2, .device = "cpu"});
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  const std::vector<int32_t> prompt =
      (*whole)->tokenizer().encode("def add(a, b):\n    return a + b\n\nclass Foo:\n");
  const std::vector<int32_t> want = greedy(**whole, prompt, 24);
  struct Case {
    int64_t begin, end;  // the remote range of 4 layers
  };
  for (const Case c : {Case{2, 4}, Case{0, 2}, Case{1, 3}}) {
    auto shard =
        runtime::Model::load(model_path(GetParam()),
                             {.n_threads = 2, .device = "cpu", .first_layer = c.begin, .end_layer = c.end});
    ASSERT_TRUE(shard.is_ok()) << shard.status().to_string();
    runtime::ShardHost host(**shard);
    runtime::ModelLoadOptions lo{.n_threads = 2};
    if (c.begin > 0) lo.layer_shards.push_back({"cpu", 0, c.begin});
    lo.layer_shards.push_back({"proc:cpu", c.begin, c.end, &host});
    if (c.end < 4) lo.layer_shards.push_back({"cpu", c.end, 4});
    auto split = runtime::Model::load(model_path(GetParam()), lo);
    ASSERT_TRUE(split.is_ok()) << split.status().to_string();
    const std::string where = fmt::format("{} remote {}:{}", GetParam(), c.begin, c.end);
    EXPECT_EQ(greedy(**split, prompt, 24), want) << where;
    EXPECT_EQ(host.open_caches(), 0) << where << ": the generator's cache was not closed";
    EXPECT_GE(host.forwards(), 24) << where;
    expect_engine_output(**split, prompt, want, where);
    EXPECT_EQ(host.entries(), 0) << where << ": the prefix cache's entries were not dropped with it";
    // A prefix-cache hit: the remote layers' rows of the entry stay there.
    {
      runtime::EngineOptions eo;
      eo.n_slots = 1;
      eo.n_ctx = 256;
      eo.n_batch = 16;
      runtime::BatchEngine engine(**split, eo);
      for (int round = 0; round < 2; ++round) {
        moeserve::testing::Collector c;
        runtime::EngineRequest r = moeserve::testing::greedy_request(prompt, int(want.size()));
        r.stop_at_eos = false;
        c.attach(r);
        ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
        c.wait();
        ASSERT_TRUE(c.status.is_ok()) << c.status.to_string();
        EXPECT_EQ(c.tokens, want) << where << " round " << round;
      }
      EXPECT_GT(engine.stats().prefix.hits, 0) << where;
      EXPECT_GT(host.entries(), 0) << where << ": no entry kept in the shard";
    }
    EXPECT_EQ(host.entries(), 0) << where;
  }
}

// Hybrid expert placement over a split: each GPU shard keeps half of its
// layers' experts and the CPU threads compute the rest (on CPUs alone the
// same splits, both halves computed by the CPU: their bookkeeping).
TEST_P(LayerSplitModel, HybridExpertsOverASplitDecodeExactly) {
  const std::string device = moeserve::testing::test_device();
  auto whole = runtime::Model::load(model_path(GetParam()), {.n_threads = 2, .device = device});
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  const int64_t n_expert = (*whole)->info().n_expert;
  if (n_expert == 0) GTEST_SKIP() << GetParam() << " has no experts";
  const std::vector<int32_t> prompt =
      (*whole)->tokenizer().encode("def add(a, b):\n    return a + b\n\nclass Foo:\n");
  const std::vector<int32_t> want = greedy(**whole, prompt, 24);
  std::vector<std::vector<int32_t>> hot(4);
  for (auto& layer : hot) {
    for (int32_t e = 0; e < int32_t(n_expert); e += 2) layer.push_back(e);
  }
  std::vector<std::vector<LayerShard>> splits = {{{device, 0, 2}, {device, 2, 4}}};
  if (device != "cpu") splits.push_back({{device, 0, 3}, {"cpu", 3, 4}});
  for (const auto& shards : splits) {
    runtime::ModelLoadOptions lo{.n_threads = 2};
    lo.layer_shards = shards;
    lo.split_experts = true;
    lo.gpu_experts = hot;
    auto split = runtime::Model::load(model_path(GetParam()), lo);
    ASSERT_TRUE(split.is_ok()) << split.status().to_string();
    ASSERT_FALSE((*split)->expert_splits().empty());
    EXPECT_EQ(greedy(**split, prompt, 24), want)
        << GetParam() << " hybrid over " << shards.size() << " shards";
    int64_t host_pairs = 0;
    for (const auto& sp : (*split)->expert_splits())
      host_pairs += sp != nullptr ? int64_t(sp->host_pairs.load()) : 0;
    EXPECT_GT(host_pairs, 0) << "no expert ran off its shard's device";
    if (device != "cpu" && shards.back().device == "cpu") {
      EXPECT_EQ((*split)->expert_splits()[3], nullptr);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, LayerSplitModel,
                         ::testing::Values("qwen3", "qwen3moe", "qwen35", "qwen35moe", "laguna"));

TEST(LayerSplitMemoryPlan, EachShardsCacheIsPlannedWhereItLives) {
  auto whole = runtime::Model::load(model_path("qwen35moe"), {.n_threads = 1, .device = "cpu"});
  ASSERT_TRUE(whole.is_ok());
  runtime::ModelLoadOptions lo{.n_threads = 1};
  lo.layer_shards = {{"cpu", 0, 1}, {"cpu", 1, 4}};
  auto split = runtime::Model::load(model_path("qwen35moe"), lo);
  ASSERT_TRUE(split.is_ok()) << split.status().to_string();
  const runtime::MemoryPlanRequest r{.n_sequences = 2, .n_ctx = 512, .n_batch = 32};
  auto a = runtime::plan_device_memory(**whole, r);
  auto b = runtime::plan_device_memory(**split, r);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(b->kv_bytes, a->kv_bytes) << "the shards' caches add up to the unsplit cache";
  EXPECT_GT(b->workspace_bytes, a->workspace_bytes) << "each shard has its own activations";
  auto huge = runtime::plan_device_memory(**split, {.n_sequences = 1 << 20, .n_ctx = 1 << 20, .n_batch = 32});
  ASSERT_FALSE(huge.is_ok());
  EXPECT_NE(huge.status().message().find("layer split's CPU shards"), std::string::npos)
      << huge.status().message();
}

TEST(LayerSplitModelErrors, ShardsThatDoNotCoverTheModelAreRefused) {
  for (const std::vector<LayerShard>& shards : {std::vector<LayerShard>{{"cpu", 0, 2}, {"cpu", 3, 4}},
                                                std::vector<LayerShard>{{"cpu", 0, 2}, {"cpu", 2, 9}},
                                                std::vector<LayerShard>{{"cpu", 0, 2}, {"tpu", 2, 4}}}) {
    runtime::ModelLoadOptions lo{.n_threads = 1};
    lo.layer_shards = shards;
    auto m = runtime::Model::load(model_path("qwen3"), lo);
    EXPECT_FALSE(m.is_ok());
  }
}

// An expert worker beside a split (an in-process CPU backend stands for
// the worker process: ipc's tests cover the transport): the CPU shards'
// layers hand it the worker's experts, and the text is the unsplit one.
TEST(LayerSplitExpertWorker, CpuShardsHandTheWorkerItsExperts) {
  auto whole = runtime::Model::load(model_path("qwen3moe"), {.n_threads = 2, .device = "cpu"});
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  const std::vector<int32_t> prompt =
      (*whole)->tokenizer().encode("def add(a, b):\n    return a + b\n\nclass Foo:\n");
  const std::vector<int32_t> want = greedy(**whole, prompt, 24);
  backend::CpuExpertBackend worker(nullptr);
  std::vector<std::vector<int32_t>> owned(4);
  for (int32_t e = 1; e < int32_t((*whole)->info().n_expert); e += 3)
    owned[1].push_back(e), owned[3].push_back(e);
  const std::string device = moeserve::testing::test_device();
  std::vector<std::vector<LayerShard>> splits = {{{"cpu", 0, 2}, {"cpu", 2, 4}}};
  if (device != "cpu") splits.push_back({{device, 0, 2}, {"cpu", 2, 4}});
  for (const auto& shards : splits) {
    runtime::ModelLoadOptions lo{.n_threads = 2};
    lo.layer_shards = shards;
    lo.expert_worker = &worker;
    lo.worker_experts = owned;
    auto split = runtime::Model::load(model_path("qwen3moe"), lo);
    ASSERT_TRUE(split.is_ok()) << split.status().to_string();
    const auto& splits_of = (*split)->expert_splits();
    ASSERT_EQ(splits_of.size(), 4u);
    // A GPU shard keeps its layers' experts; CPU layers split off the worker's.
    EXPECT_EQ(splits_of[1] == nullptr, shards[0].device != "cpu");
    ASSERT_NE(splits_of[3], nullptr);
    EXPECT_EQ(greedy(**split, prompt, 24), want) << shards[0].device << " + cpu with a worker";
    EXPECT_GT(splits_of[3]->host_pairs.load(), 0) << "the worker computed nothing";
  }
  // Every shard on GPUs or in other processes: the worker would get nothing.
  if (device != "cpu") {
    runtime::ModelLoadOptions lo{.n_threads = 1};
    lo.layer_shards = {{device, 0, 2}, {device, 2, 4}};
    lo.expert_worker = &worker;
    lo.worker_experts = owned;
    auto m = runtime::Model::load(model_path("qwen3moe"), lo);
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("no shard of the layer split"), std::string::npos)
        << m.status().message();
  }
}

}  // namespace
}  // namespace moeserve::split
