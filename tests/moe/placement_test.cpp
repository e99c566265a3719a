// Expert placement (src/moe): the model's MoE shape and fingerprint from the
// GGUF tensor table, the budget arithmetic, the hot-expert choice (layer
// floor, selections per byte, an even spread without statistics), the
// statistics and placement files (round trips, and every malformed or
// foreign input refused with an error naming the file and the entry), and
// size parsing.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "moe/json_file.h"
#include "moe/plan.h"
#include "runtime/model.h"

namespace moeserve::moe {
namespace {

const std::string kDir = std::string(MOESERVE_TEST_DATA_DIR) + "/models/";

MoeShape tiny_shape() {
  auto f = GgufFile::open(kDir + "qwen3moe-tiny.bf16.gguf");
  EXPECT_TRUE(f.is_ok());
  auto s = moe_shape(f.value());
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.value();
}

// Three layers of 8 experts, 2 used; the last layer's experts twice the size.
MoeShape toy_shape() {
  MoeShape s;
  s.arch = "qwen3moe", s.fingerprint = "00112233aabbccdd";
  s.n_layer = 3, s.n_expert = 8, s.n_expert_used = 2;
  s.expert_bytes = {100, 100, 200};
  s.dense_bytes = 1000, s.kv_bytes_per_position = 10;
  return s;
}

TEST(MoeShape, ReadsTheTensorTable) {
  auto f = GgufFile::open(kDir + "qwen3moe-tiny.bf16.gguf");
  ASSERT_TRUE(f.is_ok());
  const MoeShape s = tiny_shape();
  EXPECT_EQ(s.arch, "qwen3moe");
  EXPECT_EQ(s.n_layer, 4);
  EXPECT_EQ(s.n_expert, 16);
  EXPECT_EQ(s.n_expert_used, 4);
  uint64_t all = 0;
  for (const GgufTensorInfo& t : f->tensors()) all += t.nbytes;
  EXPECT_EQ(s.dense_bytes + s.all_expert_bytes(), all);
  for (uint64_t b : s.expert_bytes) EXPECT_GT(b, 0u);
  EXPECT_GT(s.kv_bytes_per_position, 0u);
  EXPECT_EQ(s.fingerprint.size(), 16u);
  EXPECT_EQ(s.fingerprint, model_fingerprint(f.value()));  // stable
  auto dense = GgufFile::open(kDir + "qwen3-tiny.bf16.gguf");
  ASSERT_TRUE(dense.is_ok());
  EXPECT_NE(model_fingerprint(dense.value()), s.fingerprint);
  const auto r = moe_shape(dense.value());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("no stacked experts"), std::string::npos) << r.status().to_string();
}

// The KV the budget reserves is what the model's attention layers keep: a
// hybrid's Gated DeltaNet layers keep a fixed state, no K/V rows.
TEST(MoeShape, CountsKvForTheAttentionLayersOnly) {
  for (const char* name : {"qwen3moe-tiny.bf16.gguf", "qwen35moe-tiny.bf16.gguf"}) {
    SCOPED_TRACE(name);
    auto f = GgufFile::open(kDir + name);
    ASSERT_TRUE(f.is_ok());
    auto shape = moe_shape(f.value());
    ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
    auto model = runtime::Model::load(kDir + name, {.n_threads = 1, .pack_weights = false});
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    const models::ModelInfo& info = (*model)->info();
    uint64_t want = 0;
    for (int64_t l = 0; l < info.n_layer; ++l)
      want += info.layer_cache(l).kv ? uint64_t(2 * info.kv_dim * 2) : 0;
    EXPECT_EQ(shape->kv_bytes_per_position, want);
  }
}

TEST(ExpertBudget, CountsDenseKvAndReserve) {
  const MoeShape s = toy_shape();
  auto b = expert_budget(s, {.gpu_bytes = 5000, .ctx_size = 100, .parallel = 2, .reserve_bytes = 500});
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->dense, 1000u);
  EXPECT_EQ(b->kv, 2000u);
  EXPECT_EQ(b->experts, 1500u);
  auto tight = expert_budget(s, {.gpu_bytes = 3499, .ctx_size = 100, .parallel = 2, .reserve_bytes = 500});
  ASSERT_FALSE(tight.is_ok());
  EXPECT_EQ(tight.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(tight.status().message().find("--gpu-mem"), std::string::npos);
  EXPECT_FALSE(expert_budget(s, {.gpu_bytes = 5000, .ctx_size = 0}).is_ok());
}

ExpertStats skewed_stats(const MoeShape& s) {
  ExpertStats st = ExpertStats::zeros_for(s);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    for (int64_t e = 0; e < s.n_expert; ++e)
      st.decode[size_t(l)][size_t(e)] = (e + 1) * (l + 1);  // expert 7 most used
  }
  st.prefill[0][0] = 1000;  // layer 0's expert 0 dominates its prefill
  return st;
}

TEST(PlanPlacement, FloorThenSelectionsPerByte) {
  const MoeShape s = toy_shape();
  const ExpertStats st = skewed_stats(s);
  // Floor: 2 experts x (100 + 100 + 200) = 800; then 300 more bytes.
  const PlacementPlan p = plan_placement(s, &st, 1100);
  EXPECT_TRUE(p.layer_floor);
  EXPECT_LE(p.hot_bytes, 1100u);
  // Floor: layer 0 {0 (1001 selections), 7 (8)}, layer 1 {7, 6}, layer 2 {7, 6}. Then by selections per
  // byte: layer 1's expert 5 (12/100), 4 (10/100); layer 2's 5 (18/200) no longer fits; layer 1's 3 (8/100).
  EXPECT_EQ(p.placement.hot[0], (std::vector<int32_t>{0, 7}));
  EXPECT_EQ(p.placement.hot[1], (std::vector<int32_t>{3, 4, 5, 6, 7}));
  EXPECT_EQ(p.placement.hot[2], (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(p.hot_bytes, 1100u);
  EXPECT_GT(p.expected_hit_ratio, 0.0);
  EXPECT_LT(p.expected_hit_ratio, 1.0);
}

TEST(PlanPlacement, BelowTheFloorAndAboveEverything) {
  const MoeShape s = toy_shape();
  const ExpertStats st = skewed_stats(s);
  const PlacementPlan small = plan_placement(s, &st, 450);
  EXPECT_FALSE(small.layer_floor);
  EXPECT_LE(small.hot_bytes, 450u);
  EXPECT_EQ(small.placement.hot[0], (std::vector<int32_t>{0}));  // 1001/100 first
  const PlacementPlan all = plan_placement(s, &st, 1u << 30);
  EXPECT_EQ(all.placement.n_hot(), 24);
  EXPECT_EQ(all.hot_bytes, s.all_expert_bytes());
  EXPECT_DOUBLE_EQ(all.expected_hit_ratio, 1.0);
  const PlacementPlan none = plan_placement(s, &st, 0);
  EXPECT_EQ(none.placement.n_hot(), 0);
}

TEST(PlanPlacement, WithoutStatisticsSpreadsEvenly) {
  MoeShape s = toy_shape();
  s.expert_bytes = {100, 100, 100};
  const PlacementPlan p = plan_placement(s, nullptr, 1400);  // 14 experts over 3 layers
  EXPECT_EQ(p.placement.n_hot(), 14);
  for (const auto& h : p.placement.hot) {
    EXPECT_GE(h.size(), 4u);
    EXPECT_LE(h.size(), 5u);
  }
  EXPECT_NEAR(p.expected_hit_ratio, 14.0 / 24.0, 1e-12);
}

TEST(HostCost, ChargesEachLayerWithColdWorkItsRoundTripAndItsColdExperts) {
  const MoeShape s = toy_shape();  // 8 experts, 2 used, 100 / 100 / 200 bytes
  ExpertPlacement p;
  p.hot = {{0, 1, 2, 3, 4, 5, 6, 7}, {}, {0, 1, 2, 3}};
  const HostCostModel costs{.layer_seconds = 1.0, .bytes_per_s = 100.0};
  // Layer 0 all hot: 0. Layer 1 all cold: 1 + 2 x 100 / 100 = 3. Layer 2 half cold:
  // (1 - 0.5^2) + 2 x 0.5 x 200 / 100 = 2.75.
  EXPECT_NEAR(host_seconds_per_token(s, nullptr, p, costs), 5.75, 1e-12);
  // Statistics weigh the experts: layer 2's hot half takes (nearly) every
  // selection there (each expert is credited 4 selections before the counts).
  ExpertStats st = ExpertStats::zeros_for(s);
  for (int e = 0; e < 4; ++e) st.decode[2][size_t(e)] = 1000;
  const double c2 = 16.0 / 4032.0;  // layer 2's cold share
  EXPECT_NEAR(host_seconds_per_token(s, &st, p, costs), 3.0 + (1 - (1 - c2) * (1 - c2)) + 2 * c2 * 2, 1e-12);
}

TEST(HostCost, LayerwiseSplitInTheSameBudget) {
  const MoeShape s = toy_shape();  // whole layers: 800, 800, 1600 bytes
  EXPECT_EQ(layerwise_cpu_layers(s, 0), 3);
  EXPECT_EQ(layerwise_cpu_layers(s, 1599), 3);
  EXPECT_EQ(layerwise_cpu_layers(s, 1600), 2);
  EXPECT_EQ(layerwise_cpu_layers(s, 3199), 1);
  EXPECT_EQ(layerwise_cpu_layers(s, 3200), 0);
  const ExpertPlacement p = layerwise_placement(s, 2);
  EXPECT_TRUE(p.hot[0].empty());
  EXPECT_TRUE(p.hot[1].empty());
  EXPECT_EQ(p.hot[2].size(), 8u);
}

TEST(HostCost, HintsAtTheLayerwiseSplitOnlyWhenRoutingIsEven) {
  MoeShape s = toy_shape();
  s.expert_bytes = {100, 100, 100};
  // Even routing: spreading 16 of 24 experts leaves every layer a cold expert
  // in reach (each pays its round trip 56% of the tokens: 1.67 a token),
  // where layers 1 and 2 whole on the GPU leave one layer that always pays.
  const PlacementPlan even = plan_placement(s, nullptr, 1600);
  const std::string hint = layerwise_hint(s, nullptr, even, 1600);
  EXPECT_NE(hint.find("--n-cpu-moe 1 "), std::string::npos) << hint;
  // Skewed routing: two experts a layer take every selection and are hot.
  ExpertStats st = ExpertStats::zeros_for(s);
  for (int64_t l = 0; l < 3; ++l) st.decode[size_t(l)][0] = st.decode[size_t(l)][1] = 100;
  const PlacementPlan skewed = plan_placement(s, &st, 1600);
  EXPECT_EQ(layerwise_hint(s, &st, skewed, 1600), "");
}

TEST(PlacementFile, RoundTrips) {
  const MoeShape s = tiny_shape();
  const PlacementPlan p = plan_placement(s, nullptr, s.all_expert_bytes() / 3);
  const std::string text = to_json(p.placement, s);
  auto back = parse_placement(text, "p.json", s);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->hot, p.placement.hot);
  const std::string path = ::testing::TempDir() + "placement_roundtrip.json";
  ASSERT_TRUE(write_text_file(path, text).is_ok());
  auto read = read_placement(path, s);
  ASSERT_TRUE(read.is_ok()) << read.status().to_string();
  EXPECT_EQ(read->hot, p.placement.hot);
  std::remove(path.c_str());
}

std::string placement_with(const MoeShape& s, const std::string& layers,
                           const std::string& fingerprint = "") {
  return R"({"format":"moeserve-placement","version":1,"model":{"arch":"qwen3moe","fingerprint":")" +
         (fingerprint.empty() ? s.fingerprint : fingerprint) +
         R"(","n_layer":3,"n_expert":8,"n_expert_used":2},)" + R"("layers":[)" + layers + "]}";
}

TEST(PlacementFile, RefusesBadInputNamingTheEntry) {
  const MoeShape s = toy_shape();
  struct Case {
    std::string text, want;
  };
  const Case cases[] = {
      {"{not json", "not JSON"},
      {"[]", "expected a JSON object"},
      {R"({"format":"other","version":1})", "format is \"other\""},
      {R"({"format":"moeserve-placement","version":2})", "version 2 is not supported"},
      {placement_with(s, "", "ffffffffffffffff"), "made for another model"},
      {placement_with(s, R"({"layer":3,"hot":[1]})"), "layers[0]: layer 3 does not exist"},
      {placement_with(s, R"({"layer":-1,"hot":[1]})"), "layer -1 does not exist"},
      {placement_with(s, R"({"layer":"0","hot":[1]})"), "layers[0].layer must be an integer"},
      {placement_with(s, R"({"layer":0,"hot":[1]},{"layer":0,"hot":[2]})"),
       "layers[1]: layer 0 appears twice"},
      {placement_with(s, R"({"layer":1,"hot":[1,8]})"), "layers[0].hot[1] is 8: not an expert id"},
      {placement_with(s, R"({"layer":1,"hot":[-2]})"), "layers[0].hot[0] is -2"},
      {placement_with(s, R"({"layer":1,"hot":[1.5]})"), "layers[0].hot[0] is 1.5"},
      {placement_with(s, R"({"layer":2,"hot":[3,1,3]})"), "layers[0].hot lists expert 3 twice"},
      {placement_with(s, R"({"layer":2})"), "layers[0].hot must be an array"},
      {placement_with(s, R"(7)"), "layers[0] must be an object"},
  };
  for (const Case& c : cases) {
    auto r = parse_placement(c.text, "bad.json", s);
    ASSERT_FALSE(r.is_ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(r.status().message().find("bad.json"), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().message().find(c.want), std::string::npos)
        << "want '" << c.want << "' in " << r.status().to_string();
  }
  auto missing = read_placement(::testing::TempDir() + "no_such_placement.json", s);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  // A layer without an entry has no hot experts.
  auto sparse = parse_placement(placement_with(s, R"({"layer":1,"hot":[5,2]})"), "ok.json", s);
  ASSERT_TRUE(sparse.is_ok()) << sparse.status().to_string();
  EXPECT_EQ(sparse->hot, (std::vector<std::vector<int32_t>>{{}, {2, 5}, {}}));
}

TEST(PlacementFile, WorkerListsSayWhatTheExpertWorkerComputes) {
  const MoeShape s = toy_shape();
  auto p = parse_placement(placement_with(s, R"({"layer":0,"hot":[1],"worker":[7,3]},{"layer":2,"hot":[]})"),
                           "w.json", s);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_TRUE(p->has_worker());
  EXPECT_EQ(p->worker, (std::vector<std::vector<int32_t>>{{3, 7}, {}, {}}));
  // Round trip: "worker" is written only where a layer has some.
  auto back = parse_placement(to_json(*p, s), "back.json", s);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->worker, p->worker);
  EXPECT_EQ(back->hot, p->hot);
  const std::pair<std::string, std::string> bad[] = {
      {R"({"layer":0,"hot":[1],"worker":[1]})", "both hot and the worker's"},
      {R"({"layer":0,"hot":[],"worker":[8]})", "layers[0].worker[0] is 8"},
      {R"({"layer":0,"hot":[],"worker":[2,2]})", "lists expert 2 twice"},
      {R"({"layer":0,"hot":[],"worker":3})", "worker"},
  };
  for (const auto& [layers, want] : bad) {
    auto r = parse_placement(placement_with(s, layers), "bad.json", s);
    ASSERT_FALSE(r.is_ok()) << layers;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().to_string();
  }
  // Without a file the worker computes every expert; a file that gives it none is refused.
  auto all = worker_experts("", s);
  ASSERT_TRUE(all.is_ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[2].size(), 8u);
  const std::string path = ::testing::TempDir() + "placement_no_worker.json";
  ASSERT_TRUE(write_text_file(path, placement_with(s, R"({"layer":1,"hot":[2]})")).is_ok());
  auto none = worker_experts(path, s);
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("gives the worker any expert"), std::string::npos);
  std::remove(path.c_str());
  // The fingerprint tells lists apart, and is stable.
  EXPECT_EQ(experts_fingerprint(*all), experts_fingerprint(*all));
  EXPECT_NE(experts_fingerprint(*all), experts_fingerprint(p->worker));
  EXPECT_NE(experts_fingerprint({{1}, {}}), experts_fingerprint({{}, {1}}));
}

TEST(ExpertStatsFile, RoundTripsAndRefusesBadCounts) {
  const MoeShape s = toy_shape();
  ExpertStats st = skewed_stats(s);
  st.prefill_tokens = 10, st.decode_tokens = 20;
  auto back = parse_expert_stats(to_json(st), "stats.json", &s);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->prefill, st.prefill);
  EXPECT_EQ(back->decode, st.decode);
  EXPECT_EQ(back->decode_tokens, 20);
  MoeShape other = s;
  other.fingerprint = "0000000000000000";
  auto foreign = parse_expert_stats(to_json(st), "stats.json", &other);
  ASSERT_FALSE(foreign.is_ok());
  EXPECT_NE(foreign.status().message().find("another model"), std::string::npos);
  std::string text = to_json(st);
  const std::string bad_count = std::string(text).replace(text.find("\"decode\":[1,"), 12, "\"decode\":[-1,");
  auto neg = parse_expert_stats(bad_count, "stats.json", &s);
  ASSERT_FALSE(neg.is_ok());
  EXPECT_NE(neg.status().message().find("layers[0].decode[0] must be a count"), std::string::npos)
      << neg.status().to_string();
  const std::string short_row = std::string(text).replace(text.find("\"decode\":[1,"), 12, "\"decode\":[");
  auto wrong = parse_expert_stats(short_row, "stats.json", &s);
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find("has 7 counts"), std::string::npos) << wrong.status().to_string();
}

TEST(ParseSize, UnitsAndJunk) {
  EXPECT_EQ(parse_size("4096", "x").value(), 4096u);
  EXPECT_EQ(parse_size("24GiB", "x").value(), 24ull << 30);
  EXPECT_EQ(parse_size("24G", "x").value(), 24ull << 30);
  EXPECT_EQ(parse_size("24g", "x").value(), 24ull << 30);
  EXPECT_EQ(parse_size("512MiB", "x").value(), 512ull << 20);
  EXPECT_EQ(parse_size("1.5GB", "x").value(), 1500000000ull);
  EXPECT_EQ(parse_size("2T", "x").value(), 2ull << 40);
  for (const char* bad : {"", " 1G", "-1", "1 G", "G", "1.2.3G", ".5G", "1Q", "99999999999T", "1e9"}) {
    auto r = parse_size(bad, "--gpu-mem");
    ASSERT_FALSE(r.is_ok()) << "'" << bad << "'";
    EXPECT_NE(r.status().message().find("--gpu-mem"), std::string::npos);
  }
}

}  // namespace
}  // namespace moeserve::moe
