// Experts shared between the GPU and the CPU (runtime ModelLoadOptions::
// gpu_experts): on the tiny trained MoE model, greedy continuations with
// half of each layer's experts on the GPU, with the experts of the first
// layers on the CPU (--n-cpu-moe), with every expert on the CPU (--cpu-moe)
// equal those of all experts on the GPU and of the CPU alone, in prefill
// chunks and in decode; the splits count their hits. Needs a GPU
// (MOESERVE_TEST_DEVICE=cuda on the GPU machine); skips elsewhere.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <string>

#include "runtime/generator.h"
#include "runtime/model.h"
#include "test_device.h"

namespace moeserve::runtime {
namespace {

const std::string kModel = std::string(MOESERVE_TEST_DATA_DIR) + "/models/qwen3moe-tiny.bf16.gguf";
constexpr int64_t kLayers = 4, kExperts = 16;

std::unique_ptr<Model> load(const std::string& device, std::vector<std::vector<int32_t>> gpu_experts,
                            bool split, bool pin_file = true) {
  ModelLoadOptions o{.n_threads = 2, .device = device};
  o.gpu_experts = std::move(gpu_experts);
  o.split_experts = split;
  o.pin_file = pin_file;
  auto m = Model::load(kModel, o);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m.value()) : nullptr;
}

std::vector<int32_t> greedy(Model& m, const std::vector<int32_t>& prompt, int64_t n_batch, int n) {
  Generator g(m, 256);
  EXPECT_TRUE(g.status().is_ok());
  std::vector<int32_t> out;
  int32_t id = -1;
  EXPECT_TRUE(g.prefill_greedy(prompt, n_batch, &id).is_ok());
  out.push_back(id);
  while (int(out.size()) < n) {
    EXPECT_TRUE(g.decode_greedy(id, &id).is_ok());
    out.push_back(id);
  }
  return out;
}

TEST(HybridExperts, SameGreedyOutputWhereverTheExpertsRun) {
  if (testing::test_device().rfind("cuda", 0) != 0) GTEST_SKIP() << "needs MOESERVE_TEST_DEVICE=cuda (a GPU)";
  const std::vector<std::vector<int32_t>> prompts = {
      {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17,
       18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33},
      {500, 17, 900, 4, 77, 1200},
      {42}};
  auto cpu = load("cpu", {}, false);
  auto gpu = load(testing::test_device(), {}, false);
  ASSERT_TRUE(cpu && gpu);
  std::vector<int32_t> all(kExperts), even, odd_layers_none;
  std::iota(all.begin(), all.end(), 0);
  for (int32_t e = 0; e < kExperts; e += 2) even.push_back(e);
  struct Case {
    const char* name;
    std::vector<std::vector<int32_t>> gpu_experts;
  };
  const std::vector<Case> cases = {
      {"half of each layer", {even, even, even, even}},
      {"--n-cpu-moe 2", {{}, {}, all, all}},
      {"--cpu-moe", {{}, {}, {}, {}}},
      {"mixed", {{3}, all, {}, even}},
  };
  // copies never: the CPU computes every cold expert of a chunk; always: a
  // chunk of more than 16 rows copies them to the GPU; auto: the cost model
  // picks. Forwards of up to 16 rows (decode, batch 5) trade through
  // mailboxes in their graph, or (mailbox 0) through the eager stage; in a
  // mailbox the GPU streams none, every or (auto) some of the cold experts
  // from host memory itself.
  // share 0.3: a chunk's layers after the first (prefetched) leave 30% of
  // their cold experts to the CPU, computed while the GPU's stream waits.
  struct Setting {
    const char *copies, *mailbox, *stream, *share;
  };
  const Setting settings[] = {{"never", "1", "never", "auto"},  {"always", "1", "never", "auto"},
                              {"auto", "1", "auto", "auto"},    {"never", "0", "never", "auto"},
                              {"never", "1", "always", "auto"}, {"always", "1", "never", "0.3"}};
  for (const auto& [copies, mailbox, stream, share] : settings) {
    setenv("MOESERVE_EXPERT_COPIES", copies, 1);
    setenv("MOESERVE_EXPERT_MAILBOX", mailbox, 1);
    setenv("MOESERVE_EXPERT_STREAM", stream, 1);
    setenv("MOESERVE_PREFETCH_SHARE", share, 1);
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.name) + ", copies " + copies + ", mailbox " + mailbox + ", stream " +
                   stream + ", share " + share);
      auto hybrid = load(testing::test_device(), c.gpu_experts, true);
      ASSERT_TRUE(hybrid);
      for (const auto& p : prompts) {
        for (int64_t n_batch : {int64_t(512), int64_t(5)}) {
          const std::vector<int32_t> want_gpu = greedy(*gpu, p, n_batch, 24);
          EXPECT_EQ(greedy(*hybrid, p, n_batch, 24), want_gpu)
              << "prompt of " << p.size() << ", batch " << n_batch;
          EXPECT_EQ(greedy(*cpu, p, n_batch, 24), want_gpu);
        }
      }
      // Layers with experts on the CPU counted their hits; every routed pair once.
      const auto& splits = hybrid->expert_splits();
      ASSERT_EQ(int64_t(splits.size()), kLayers);
      for (int64_t l = 0; l < kLayers; ++l) {
        const backend::ExpertSplit& s = *splits[size_t(l)];
        if (s.all_local()) continue;
        EXPECT_GT(s.host_pairs.load(), 0) << "layer " << l;
        EXPECT_EQ((s.local_pairs + s.host_pairs) % 4, 0) << "layer " << l;  // n_expert_used 4 a token
        if (s.local().empty()) {
          EXPECT_EQ(s.local_pairs.load(), 0) << "layer " << l;
        }
        if (std::string(copies) == "never" && std::string(stream) == "never") {
          EXPECT_EQ(s.copied_pairs.load(), 0) << "layer " << l;
        } else if (std::string(stream) == "always") {
          // Decode's cold experts streamed by the GPU; the prompt's computed on the CPU.
          EXPECT_GT(s.copied_pairs.load(), 0) << "layer " << l;
          EXPECT_LT(s.copied_pairs.load(), s.host_pairs.load()) << "layer " << l;
        } else if (std::string(copies) == "always") {
          // The 33-token prompt in one chunk copied; decode computed on the CPU.
          EXPECT_GT(s.copied_pairs.load(), 0) << "layer " << l;
          EXPECT_LT(s.copied_pairs.load(), s.host_pairs.load()) << "layer " << l;
        }
      }
    }
  }
  unsetenv("MOESERVE_EXPERT_COPIES");
  unsetenv("MOESERVE_EXPERT_MAILBOX");
  unsetenv("MOESERVE_EXPERT_STREAM");
  unsetenv("MOESERVE_PREFETCH_SHARE");
}

// The other MoE families through the same split: qwen35moe (Gated DeltaNet
// layers, a shared expert beside the routed ones) and laguna, half of each
// layer's experts on the GPU and every expert on the CPU, prompt chunks and
// decode, equal the all-GPU greedy continuation.
TEST(HybridExperts, OtherArchitecturesSplitTheSameWay) {
  if (testing::test_device().rfind("cuda", 0) != 0) GTEST_SKIP() << "needs MOESERVE_TEST_DEVICE=cuda (a GPU)";
  const std::vector<int32_t> prompt = {11, 2,  300, 4,  57, 6,  7,  800, 9, 10,
                                       11, 12, 13,  14, 15, 16, 17, 18,  19};
  for (const char* name : {"qwen35moe-tiny.bf16.gguf", "laguna-tiny.bf16.gguf"}) {
    SCOPED_TRACE(name);
    const std::string path = std::string(MOESERVE_TEST_DATA_DIR) + "/models/" + name;
    auto gpu = Model::load(path, {.n_threads = 2, .device = testing::test_device()});
    ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
    const int64_t n_layer = (*gpu)->info().n_layer, n_expert = (*gpu)->info().n_expert;
    ASSERT_GT(n_expert, 1);
    std::vector<int32_t> even;
    for (int32_t e = 0; e < n_expert; e += 2) even.push_back(e);
    for (const auto& placed : {std::vector<std::vector<int32_t>>(size_t(n_layer), even),
                               std::vector<std::vector<int32_t>>(size_t(n_layer))}) {
      ModelLoadOptions o{.n_threads = 2, .device = testing::test_device()};
      o.gpu_experts = placed, o.split_experts = true;
      auto hybrid = Model::load(path, o);
      ASSERT_TRUE(hybrid.is_ok()) << hybrid.status().to_string();
      for (int64_t n_batch : {int64_t(512), int64_t(5)}) {
        EXPECT_EQ(greedy(**hybrid, prompt, n_batch, 20), greedy(**gpu, prompt, n_batch, 20))
            << (placed[0].empty() ? "every expert on the CPU" : "half on the GPU") << ", batch " << n_batch;
      }
      int64_t host_pairs = 0;
      for (const auto& s : (*hybrid)->expert_splits()) host_pairs += s->host_pairs.load();
      EXPECT_GT(host_pairs, 0);
    }
  }
}

// The file left unpinned (--no-pin; also where pinning fails): a chunk's
// cold experts still go to the GPU, through the pinned staging buffers,
// and the greedy continuations stay the all-GPU ones.
TEST(HybridExperts, UnpinnedFileCopiesThroughStaging) {
  if (testing::test_device().rfind("cuda", 0) != 0) GTEST_SKIP() << "needs MOESERVE_TEST_DEVICE=cuda (a GPU)";
  setenv("MOESERVE_EXPERT_COPIES", "always", 1);
  const std::vector<int32_t> prompt = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17,
                                       18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33};
  auto gpu = load(testing::test_device(), {}, false);
  ASSERT_TRUE(gpu);
  std::vector<int32_t> all(kExperts), even;
  std::iota(all.begin(), all.end(), 0);
  for (int32_t e = 0; e < kExperts; e += 2) even.push_back(e);
  for (const auto& placed : {std::vector<std::vector<int32_t>>{even, even, even, even},
                             std::vector<std::vector<int32_t>>{{}, {}, all, all}}) {
    auto hybrid = load(testing::test_device(), placed, true, /*pin_file=*/false);
    ASSERT_TRUE(hybrid);
    for (int64_t n_batch : {int64_t(512), int64_t(20)}) {
      EXPECT_EQ(greedy(*hybrid, prompt, n_batch, 16), greedy(*gpu, prompt, n_batch, 16))
          << "batch " << n_batch;
    }
    for (const auto& s : hybrid->expert_splits()) {
      if (!s->all_local()) {
        EXPECT_GT(s->copied_pairs.load(), 0);
      }
    }
  }
  unsetenv("MOESERVE_EXPERT_COPIES");
}

// Promotion on the GPU: between decode steps a forced schedule swaps a cold
// expert into each split layer's compact stack (its weights copied into the
// slot), and Model::promote_experts swaps by the counts; the greedy
// continuation stays the all-GPU one.
TEST(HybridExperts, SwapsBetweenStepsKeepTheGreedyOutput) {
  if (testing::test_device().rfind("cuda", 0) != 0) GTEST_SKIP() << "needs MOESERVE_TEST_DEVICE=cuda (a GPU)";
  setenv("MOESERVE_EXPERT_COPIES", "never", 1);
  const std::vector<int32_t> prompt = {7, 300, 41, 1000, 5, 5, 90};
  auto gpu = load(testing::test_device(), {}, false);
  ASSERT_TRUE(gpu);
  const std::vector<int32_t> want = greedy(*gpu, prompt, 512, 32);
  const std::vector<int32_t> some = {0, 3, 5, 9, 12};
  auto hybrid = load(testing::test_device(), {some, some, some, some}, true);
  ASSERT_TRUE(hybrid);
  Generator g(*hybrid, 256);
  int32_t id = -1;
  ASSERT_TRUE(g.prefill_greedy(prompt, 512, &id).is_ok());
  std::vector<int32_t> got = {id};
  backend::Device& device = *hybrid->net().placement().io;
  int64_t promoted = 0;
  for (int step = 1; step < 32; ++step) {
    for (const auto& s : hybrid->expert_splits()) {
      int32_t in = int32_t((step * 7) % kExperts);
      while (s->is_local(in)) in = int32_t((in + 1) % kExperts);
      ASSERT_TRUE(device.replace_local_expert(*s, size_t(step) % some.size(), in).is_ok());
    }
    if (step % 8 == 0) {
      auto swaps = hybrid->promote_experts({.min_selections = 1, .margin = 0.0, .max_swaps_per_layer = 2});
      ASSERT_TRUE(swaps.is_ok()) << swaps.status().to_string();
      promoted += int64_t(swaps->size());
    }
    ASSERT_TRUE(g.decode_greedy(id, &id).is_ok());
    got.push_back(id);
  }
  unsetenv("MOESERVE_EXPERT_COPIES");
  EXPECT_EQ(got, want);
  EXPECT_GT(promoted, 0);
  for (const auto& s : hybrid->expert_splits()) EXPECT_EQ(s->local().size(), some.size());
}

// The splits carry their layer's router from the file (f32 [n_embd][n_expert]),
// which the host's decode warm-up guesses with: the guess is one of the
// layer's cold experts. Runs on the CPU device too (it takes splits).
TEST(HybridExperts, SplitsCarryTheirRoutersForTheWarmUp) {
  std::vector<int32_t> even;
  for (int32_t e = 0; e < kExperts; e += 2) even.push_back(e);
  auto hybrid = load("cpu", {even, even, even, even}, true);
  ASSERT_TRUE(hybrid);
  const int64_t n_embd = hybrid->info().n_embd;
  const std::vector<float> x(static_cast<size_t>(n_embd), 0.5f);
  ASSERT_EQ(int64_t(hybrid->expert_splits().size()), kLayers);  // the CPU device takes splits
  for (const auto& s : hybrid->expert_splits()) {
    ASSERT_TRUE(s->has_router());
    std::vector<int32_t> chosen;
    backend::ExpertSplit::WarmArgs a;
    a.x = x.data(), a.n_embd = n_embd, a.max_experts = 3, a.chosen = &chosen;
    ASSERT_TRUE(s->warm_on_host(a));
    ASSERT_EQ(chosen.size(), 3u);
    for (int32_t e : chosen) EXPECT_FALSE(s->is_local(e)) << e;
  }
}

}  // namespace
}  // namespace moeserve::runtime
