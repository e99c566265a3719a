// The expert placement flags (--placement, --n-cpu-moe, --cpu-moe,
// --gpu-mem, --expert-stats) resolved against the tiny MoE model (4 layers
// x 16 experts): what each keeps on the GPU, and every conflicting or
// impossible request refused with an error that names the flag or file.
#include "moe/expert_policy.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

#include "backend/expert_cost.h"
#include "moe/json_file.h"
#include "moe/placement.h"
#include "runtime/expert_promotion.h"

namespace moeserve::moe {
namespace {

const std::string kModel = std::string(MOESERVE_TEST_DATA_DIR) + "/models/qwen3moe-tiny.bf16.gguf";

GgufFile tiny() {
  auto f = GgufFile::open(kModel);
  EXPECT_TRUE(f.is_ok());
  return std::move(f.value());
}

size_t n_hot(const ExpertPolicy& p) {
  size_t n = 0;
  for (const auto& l : p.gpu_experts) n += l.size();
  return n;
}

TEST(ExpertPolicy, NCpuMoeAndCpuMoe) {
  const GgufFile f = tiny();
  ExpertPolicyOptions o;
  o.n_cpu_moe = 1;
  auto p = resolve_expert_policy(f, o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  ASSERT_EQ(p->gpu_experts.size(), 4u);
  EXPECT_TRUE(p->split);
  EXPECT_TRUE(p->gpu_experts[0].empty());
  for (int l = 1; l < 4; ++l) EXPECT_EQ(p->gpu_experts[size_t(l)].size(), 16u);
  o.n_cpu_moe = 0;  // nothing on the CPU
  p = resolve_expert_policy(f, o);
  ASSERT_TRUE(p.is_ok());
  EXPECT_FALSE(p->split);
  EXPECT_EQ(n_hot(*p), 64u);
  o.n_cpu_moe = -1, o.cpu_moe = true;
  p = resolve_expert_policy(f, o);
  ASSERT_TRUE(p.is_ok());
  EXPECT_TRUE(p->split);
  EXPECT_EQ(n_hot(*p), 0u);
  EXPECT_EQ(p->gpu_expert_bytes, 0u);
}

TEST(ExpertPolicy, GpuMemPlansAndPlacementFilesAreRead) {
  const GgufFile f = tiny();
  const MoeShape shape = moe_shape(f).value();
  ExpertPolicyOptions o;
  // Dense + KV + 1 GiB reserve + room for about half the experts.
  const uint64_t kv = shape.kv_bytes_per_position * 4096;
  o.gpu_mem = std::to_string(shape.dense_bytes + kv + (uint64_t(1) << 30) + shape.all_expert_bytes() / 2);
  auto p = resolve_expert_policy(f, o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_TRUE(p->split);
  EXPECT_GT(n_hot(*p), 16u);
  EXPECT_LT(n_hot(*p), 64u);
  EXPECT_NE(p->summary.find("--gpu-mem"), std::string::npos) << p->summary;

  ExpertPlacement placement;
  placement.hot = {{0, 1, 2, 3}, {}, {5}, {15}};
  const std::string path = ::testing::TempDir() + "policy_placement.json";
  ASSERT_TRUE(write_text_file(path, to_json(placement, shape)).is_ok());
  ExpertPolicyOptions from_file;
  from_file.placement_path = path;
  p = resolve_expert_policy(f, from_file);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->gpu_experts, placement.hot);
  EXPECT_EQ(p->gpu_expert_bytes, placement.hot_bytes(shape));
  // With --gpu-mem it must fit that budget: dense + KV + reserve + its hot experts.
  const uint64_t placed_need = shape.dense_bytes + kv + (uint64_t(1) << 30) + placement.hot_bytes(shape);
  from_file.gpu_mem = std::to_string(placed_need);
  p = resolve_expert_policy(f, from_file);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->gpu_experts, placement.hot);
  from_file.gpu_mem = std::to_string(placed_need - 1);
  p = resolve_expert_policy(f, from_file);
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find(path), std::string::npos) << p.status().to_string();
  EXPECT_NE(p.status().message().find("--gpu-mem"), std::string::npos) << p.status().to_string();
  from_file.gpu_mem.clear();
  // It must fit the GPU with the dense weights and the KV cache.
  from_file.gpu_free_bytes = shape.dense_bytes + 1;
  p = resolve_expert_policy(f, from_file);
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find(path), std::string::npos) << p.status().to_string();
  // ... and the reserve for activations and the CUDA context.
  from_file.gpu_free_bytes = shape.dense_bytes + kv + placement.hot_bytes(shape);
  EXPECT_FALSE(resolve_expert_policy(f, from_file).is_ok());
  from_file.gpu_free_bytes += uint64_t(1) << 30;
  EXPECT_TRUE(resolve_expert_policy(f, from_file).is_ok());
  std::remove(path.c_str());
  // --n-cpu-moe within a --gpu-mem budget: the experts of its GPU layers must fit.
  ExpertPolicyOptions layers;
  layers.n_cpu_moe = 2;
  layers.gpu_mem =
      std::to_string(shape.dense_bytes + kv + (uint64_t(1) << 30) + shape.all_expert_bytes() / 4);
  p = resolve_expert_policy(f, layers);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("--n-cpu-moe 2"), std::string::npos) << p.status().to_string();
  layers.n_cpu_moe = 3;
  EXPECT_TRUE(resolve_expert_policy(f, layers).is_ok());
}

TEST(ExpertPolicy, RefusesConflictsAndBadValues) {
  const GgufFile f = tiny();
  auto refused = [&](const ExpertPolicyOptions& o, const char* needle) {
    auto p = resolve_expert_policy(f, o);
    ASSERT_FALSE(p.is_ok()) << needle;
    EXPECT_NE(p.status().message().find(needle), std::string::npos) << p.status().to_string();
  };
  // Each case changes one field of the defaults (two for the conflict).
  const std::pair<std::function<void(ExpertPolicyOptions&)>, const char*> cases[] = {
      {[](ExpertPolicyOptions& o) { o.cpu_moe = true, o.n_cpu_moe = 2; }, "give one"},
      {[](ExpertPolicyOptions& o) { o.n_cpu_moe = 5; }, "--n-cpu-moe 5"},
      {[](ExpertPolicyOptions& o) { o.stats_path = "stats.json"; }, "--expert-stats"},
      {[](ExpertPolicyOptions& o) { o.stats_path = "stats.json", o.gpu_mem = "8GiB", o.cpu_moe = true; },
       "--expert-stats"},
      {[](ExpertPolicyOptions& o) { o.placement_path = "p.json", o.cpu_moe = true; }, "give one"},
      {[](ExpertPolicyOptions& o) { o.gpu_mem = "1MiB"; }, ""},
      {[](ExpertPolicyOptions& o) { o.gpu_mem = "lots"; }, "--gpu-mem"},
      {[](ExpertPolicyOptions& o) { o.placement_path = "/nonexistent/placement.json"; },
       "/nonexistent/placement.json"},
  };
  for (const auto& [change, needle] : cases) {
    ExpertPolicyOptions o;
    change(o);
    refused(o, needle);
  }
  EXPECT_FALSE(policy_requested(ExpertPolicyOptions{}));
  // A dense model has no experts to place.
  auto dense = GgufFile::open(
      (std::filesystem::path(MOESERVE_TEST_DATA_DIR) / "models/qwen3-tiny.bf16.gguf").string());
  ASSERT_TRUE(dense.is_ok());
  ExpertPolicyOptions cpu;
  cpu.cpu_moe = true;
  EXPECT_FALSE(resolve_expert_policy(dense.value(), cpu).is_ok());
}

// The cost model on given bandwidths (the 30b-a3b shapes: an expert of
// 2.65 MB, 2048 x 768): decode computes cold experts on the CPU, a prefill
// chunk copies them; no PCIe or a forced policy decide alone; compute-bound
// host calls teach it the CPU's speed.
TEST(ExpertCostModel, DecodeOnTheCpuPrefillCopies) {
  backend::ExpertCostInputs in;
  in.pcie_bytes_per_s = 55e9, in.dram_bytes_per_s = 135e9, in.cpu_flops_per_s = 800e9;
  backend::ExpertCostModel m(in);
  const double expert = 2.65e6, pair_flops = 6.0 * 2048 * 768;
  const int64_t chunk_copies =
      m.experts_to_copy(std::vector<int32_t>(64, 32), expert, pair_flops);  // 512 tokens
  EXPECT_GE(chunk_copies, 48);
  EXPECT_LT(chunk_copies, 64);  // while the CPU computes a few
  EXPECT_EQ(m.experts_to_copy(std::vector<int32_t>(64, 1), expert, pair_flops), 0);  // 64 tokens, 64 experts
  // Decode (one token an expert): all on the CPU; a chunk: the busiest
  // experts copied while the CPU takes the ones with few tokens.
  const std::vector<int32_t> decode = {1, 1, 1, 1};
  EXPECT_EQ(m.experts_to_copy(decode, expert, pair_flops), 0);
  std::vector<int32_t> chunk(64, 2);
  for (int i = 0; i < 32; ++i) chunk[size_t(i)] = 100;
  const int64_t k = m.experts_to_copy(chunk, expert, pair_flops);
  EXPECT_GE(k, 16);
  EXPECT_LT(k, 64);  // the CPU keeps some of the two-token experts meanwhile
  m.observe_host(64 * expert, 2048 * pair_flops, 0.5, 2048, 64);  // the CPU was far slower than guessed
  EXPECT_NEAR(m.inputs().cpu_flops_per_s, 0.7 * 800e9 + 0.3 * (2048 * pair_flops / 0.5), 1e3);
  m.observe_host(4 * expert, 4 * pair_flops, 0.5, 4, 4);  // one token an expert: overheads, nothing learned
  EXPECT_NEAR(m.inputs().cpu_flops_per_s, 0.7 * 800e9 + 0.3 * (2048 * pair_flops / 0.5), 1e3);
  in.pcie_bytes_per_s = 0;
  EXPECT_EQ(backend::ExpertCostModel(in).experts_to_copy(chunk, expert, 1e15), 0);  // nothing pinned: never
  in.pcie_bytes_per_s = 55e9, in.policy = backend::ExpertCopyPolicy::kAlways;
  EXPECT_EQ(backend::ExpertCostModel(in).experts_to_copy(decode, expert, 1), 4);
  in.policy = backend::ExpertCopyPolicy::kNever;
  EXPECT_EQ(backend::ExpertCostModel(in).experts_to_copy(chunk, expert, 1e15), 0);
}

// A prefetched prefill layer's share of cold experts left to the CPU: the
// balance of copying the rest against computing these (the same shapes:
// 48 us to copy an expert, 11.8 us of CPU arithmetic a token), smaller for
// busier experts, then moved by what the layers show; never past what the
// CPU could read from DRAM; none when turned off or not copying.
TEST(ExpertCost, PrefetchLeavesTheCpuABalancedShare) {
  backend::ExpertCostInputs in;
  in.pcie_bytes_per_s = 55e9, in.dram_bytes_per_s = 135e9, in.cpu_flops_per_s = 800e9;
  const double expert = 2.65e6, pair_flops = 6.0 * 2048 * 768;
  backend::ExpertCostModel m(in);
  const double copy = expert / 55e9, per_token = pair_flops / 800e9;
  const double at32 = m.prefetch_host_share(32, expert, pair_flops);
  // s/(1-s) = copy / (32 tokens' arithmetic): both sides take as long.
  EXPECT_NEAR(at32 / (1 - at32), copy / (32 * per_token), 1e-9);
  EXPECT_GT(m.prefetch_host_share(8, expert, pair_flops),
            2 * at32);       // few tokens an expert: the CPU takes more
  m.observe_prefetch(true);  // the CPU finished first: more for it
  const double up = m.prefetch_host_share(32, expert, pair_flops);
  EXPECT_GT(up, at32);
  m.observe_prefetch(false), m.observe_prefetch(false);
  EXPECT_LT(m.prefetch_host_share(32, expert, pair_flops), at32);
  for (int i = 0; i < 200; ++i) m.observe_prefetch(true);
  const double cap = (135e9 / 55e9) / (1 + 135e9 / 55e9);  // copying and reading from DRAM take as long
  EXPECT_NEAR(m.prefetch_host_share(32, expert, pair_flops), cap, 1e-9);
  for (int i = 0; i < 400; ++i) m.observe_prefetch(false);
  EXPECT_LT(m.prefetch_host_share(32, expert, pair_flops), 1e-3);  // the copy was never the bound
  in.prefetch_host_share = false;
  EXPECT_EQ(backend::ExpertCostModel(in).prefetch_host_share(32, expert, pair_flops), 0.0);
  in.prefetch_host_share = true, in.policy = backend::ExpertCopyPolicy::kAlways;
  EXPECT_EQ(backend::ExpertCostModel(in).prefetch_host_share(32, expert, pair_flops), 0.0);
  in.policy = backend::ExpertCopyPolicy::kAuto, in.pcie_bytes_per_s = 0;
  EXPECT_EQ(backend::ExpertCostModel(in).prefetch_host_share(32, expert, pair_flops), 0.0);
}

// The CPU's experts of a prefetched layer: the least selected, wherever
// they are; on even counts the top ids (the copy of the rest stays whole).
TEST(ExpertCost, PrefetchHostExpertsAreTheLeastSelected) {
  std::vector<int32_t> cold;
  for (int32_t e = 0; e < 16; ++e) cold.push_back(e * 2);  // every other id
  std::vector<int64_t> even(16, 100);
  EXPECT_EQ(backend::prefetch_host_experts(cold, even, 3), (std::vector<int32_t>{26, 28, 30}));
  std::vector<int64_t> skewed(16, 400);
  skewed[1] = 10, skewed[7] = 3, skewed[12] = 20;
  EXPECT_EQ(backend::prefetch_host_experts(cold, skewed, 3), (std::vector<int32_t>{2, 14, 24}));
  EXPECT_TRUE(backend::prefetch_host_experts(cold, skewed, 0).empty());
  EXPECT_EQ(backend::prefetch_host_experts(cold, skewed, 40).size(), 16u);  // at most every cold expert
}

// Decode's split of a layer's cold experts between the GPU reading them
// over PCIe and the CPU reading them from DRAM: the two finish together.
TEST(ExpertCost, StreamSplitsDecodeReadsBetweenPcieAndTheCpu) {
  backend::ExpertCostInputs in;
  in.dram_bytes_per_s = 100e9, in.stream_bytes_per_s = 50e9;
  in.host_call_latency_s = 20e-6, in.stream_latency_s = 8e-6, in.min_cold_to_stream = 6;
  const double expert = 2.65e6;  // 26.5 us from DRAM, 53 us over PCIe
  backend::ExpertCostModel m(in);
  EXPECT_EQ(m.experts_to_stream(0, expert), 0);
  EXPECT_EQ(m.experts_to_stream(1, expert), 0);  // 46.5 us on the CPU beats 61 us streamed
  EXPECT_EQ(m.experts_to_stream(5, expert), 0);  // below min_cold_to_stream (6)
  // 8 cold: the CPU alone 232 us; 3 streamed: max(152.5, 167) = 167 beats 2 (179) and 4 (220).
  EXPECT_EQ(m.experts_to_stream(8, expert), 3);
  for (int64_t c = 6; c <= 64; ++c) {
    const int64_t g = m.experts_to_stream(c, expert);
    EXPECT_GE(g, 1) << c;
    EXPECT_LE(g, c / 2) << c;  // PCIe is the slower reader: it takes the smaller share
  }
  in.stream_policy = backend::ExpertCopyPolicy::kAlways;
  EXPECT_EQ(backend::ExpertCostModel(in).experts_to_stream(8, expert), 8);
  in.stream_policy = backend::ExpertCopyPolicy::kNever;
  EXPECT_EQ(backend::ExpertCostModel(in).experts_to_stream(8, expert), 0);
  in.stream_policy = backend::ExpertCopyPolicy::kAuto, in.stream_bytes_per_s = 0;
  EXPECT_EQ(backend::ExpertCostModel(in).experts_to_stream(8, expert), 0);  // kernels cannot read host memory
}

// Promotion's choice from window counts: the busiest cold experts for the
// idlest hot ones while the gain clears the margin; a new window starts
// from zero.
TEST(ExpertPromotion, BusiestColdForIdlestHot) {
  backend::ExpertSplit s(8, {0, 1, 2, 3}, nullptr);
  auto select = [&](int32_t e, int n) { s.count_selection(e, n); };
  select(0, 50), select(1, 3), select(2, 20), select(3, 0);  // hot
  select(4, 40), select(5, 10), select(6, 2), select(7, 12);  // cold
  runtime::PromotionOptions o;
  o.min_selections = 8, o.margin = 0.5, o.max_swaps_per_layer = 4;
  const auto swaps = runtime::plan_swaps(s, 3, o);
  ASSERT_EQ(swaps.size(), 2u);  // 4 (40) for 3 (0), 7 (12) for 1 (3); 5 (10) < 1.5 x 2's 20: stop
  EXPECT_EQ(swaps[0].expert_in, 4);
  EXPECT_EQ(swaps[0].expert_out, 3);
  EXPECT_EQ(swaps[0].slot, 3u);
  EXPECT_EQ(swaps[0].layer, 3);
  EXPECT_EQ(swaps[1].expert_in, 7);
  EXPECT_EQ(swaps[1].expert_out, 1);
  o.max_swaps_per_layer = 1;
  EXPECT_EQ(runtime::plan_swaps(s, 0, o).size(), 1u);
  s.start_window();  // nothing counted since
  EXPECT_TRUE(runtime::plan_swaps(s, 0, o).empty());
  select(6, 9);
  ASSERT_EQ(runtime::plan_swaps(s, 0, o).size(), 1u);
  EXPECT_EQ(runtime::plan_swaps(s, 0, o)[0].expert_in, 6);
  s.replace_local(runtime::plan_swaps(s, 0, o)[0].slot, 6);
  EXPECT_TRUE(s.is_local(6));
  EXPECT_TRUE(runtime::plan_swaps(s, 0, o).empty());  // 6 is hot now
  backend::ExpertSplit all(4, {0, 1, 2, 3}, nullptr);
  EXPECT_TRUE(runtime::plan_swaps(all, 0, o).empty());
}

}  // namespace
}  // namespace moeserve::moe
