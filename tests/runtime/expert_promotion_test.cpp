// Promotion in the batch engine (EngineOptions::promotion): with half of
// each layer's experts "local" (the CPU device takes splits, so CI checks
// the bookkeeping bit for bit; the GPU machine runs the same on a GPU),
// swaps made every few tokens while several sequences decode and prefill
// leave every request's greedy tokens those of its solo run, and the
// splits' ids, maps and masks stay consistent; between-requests mode
// promotes once each time the engine goes idle, never while a request runs
// or waits. And serve's flag values (parse_promotion_flags).
#include "runtime/expert_promotion.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "runtime/batch_engine.h"
#include "runtime/engine_collector.h"
#include "runtime/generator.h"
#include "test_device.h"

namespace moeserve::runtime {
namespace {

const std::string kModel = std::string(MOESERVE_TEST_DATA_DIR) + "/models/qwen3moe-tiny.bf16.gguf";
constexpr int32_t kLayers = 4, kExperts = 16;

// Every second expert of each layer local (the GPU's on a GPU), the others on the host.
std::unique_ptr<Model> load_half_local() {
  std::vector<int32_t> even;
  for (int32_t e = 0; e < kExperts; e += 2) even.push_back(e);
  // Unpacked on the CPU: the host half reads the file's stacks, so both
  // halves then run the same kernels on the same layout, bit for bit.
  ModelLoadOptions o{.n_threads = 2, .pack_weights = false, .device = testing::test_device()};
  o.gpu_experts = {even, even, even, even};
  o.split_experts = true;
  auto m = Model::load(kModel, o);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (!m.is_ok()) return nullptr;
  EXPECT_EQ(m.value()->expert_splits().size(), size_t(kLayers));
  return std::move(m.value());
}

// Forced: any cold expert selected once in the window beats the idlest hot
// one (margin -1 drops the comparison), so a pass over real traffic swaps.
constexpr PromotionOptions kForced{.min_selections = 1, .margin = -1.0, .max_swaps_per_layer = 2};

std::vector<std::vector<int32_t>> local_sets(const Model& m) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& s : m.expert_splits()) out.emplace_back(s->local().begin(), s->local().end());
  return out;
}

// The ids in the stack's slots, the id -> slot map and the mask say the same.
void expect_consistent(const Model& m) {
  for (size_t l = 0; l < m.expert_splits().size(); ++l) {
    const backend::ExpertSplit& s = *m.expert_splits()[l];
    const std::span<const int32_t> local = s.local();
    EXPECT_EQ(local.size(), size_t(kExperts / 2)) << "layer " << l;
    for (int32_t e = 0; e < kExperts; ++e) {
      const auto it = std::find(local.begin(), local.end(), e);
      EXPECT_EQ(s.is_local(e), it != local.end()) << "layer " << l << " expert " << e;
      EXPECT_EQ(s.local_index(e), it == local.end() ? -1 : int32_t(it - local.begin()))
          << "layer " << l << " expert " << e;
      if (it != local.end()) {
        EXPECT_EQ(std::count(local.begin(), local.end(), e), 1);
      }
    }
  }
}

std::vector<std::vector<int32_t>> prompts(const Model& m) {
  std::vector<std::vector<int32_t>> out;
  for (const char* p :
       {"def main(", "import os\nimport sys\n", "class Foo:\n    def __init__(self", "# comment",
        "for i in range(", "return self._", "while True:\n", "x = [1, 2, 3]\nprint("}) {
    out.push_back(m.tokenizer().encode(p));
  }
  return out;
}

EngineRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  return testing::greedy_request(std::move(prompt), max_tokens);
}

// As the shared one, and the request must end well.
struct Collector : testing::Collector {
  void wait() {
    testing::Collector::wait();
    ASSERT_TRUE(status.is_ok()) << status.to_string();
  }
};

// One greedy request of 12 tokens through the engine, waited for.
void run_one(BatchEngine& engine, const std::vector<int32_t>& prompt) {
  Collector c;
  EngineRequest r = greedy(prompt, 12);
  c.attach(r);
  ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  c.wait();
}

// An idle pass runs on the engine thread after the last request's end is
// delivered: wait for it (the deadline only turns a hang into a failure).
int64_t wait_for_passes(const BatchEngine& engine, int64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (engine.stats().promotion_passes < n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return engine.stats().promotion_passes;
}

TEST(EnginePromotion, SwapsWhileOtherSequencesRunKeepEveryGreedyOutput) {
  auto model = load_half_local();
  ASSERT_TRUE(model);
  const auto ps = prompts(*model);
  std::vector<GenerateResult> solo;  // promotion off: the splits as loaded
  {
    Generator gen(*model, 256);
    for (const auto& p : ps) {
      GenerateOptions o;
      o.max_tokens = 20;
      o.sampling.temperature = 0.0f;
      solo.push_back(gen.generate(p, o).value());
    }
  }
  const auto loaded = local_sets(*model);
  EngineOptions eo;
  eo.n_slots = 4;  // 8 requests: some wait in the queue
  eo.n_ctx = 256;
  eo.n_batch = 6;  // prompts prefilled in chunks between decode steps
  eo.prefix_cache_bytes = 0;
  eo.promotion.every_tokens = 3;
  eo.promotion.thresholds = kForced;
  BatchEngine engine(*model, eo);
  // Swaps seen from the token events (engine thread, in order), with how
  // many sequences were running around them.
  std::mutex log_mu;
  std::vector<std::pair<int64_t, int64_t>> log;  // active slots, experts promoted
  std::vector<std::unique_ptr<Collector>> cs;
  for (const auto& p : ps) {
    cs.push_back(std::make_unique<Collector>());
    cs.back()->on_token = [&] {
      const EngineStats st = engine.stats();
      std::lock_guard lock(log_mu);
      log.emplace_back(st.active_slots, st.experts_promoted);
    };
    EngineRequest r = greedy(p, 20);
    cs.back()->attach(r);
    ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    cs[i]->wait();
    EXPECT_EQ(cs[i]->tokens, solo[i].tokens) << "prompt " << i;
    EXPECT_EQ(cs[i]->text, solo[i].text) << "prompt " << i;
  }
  const EngineStats st = engine.stats();
  EXPECT_GT(st.promotion_passes, 0);
  EXPECT_GT(st.experts_promoted, 0);
  EXPECT_NE(local_sets(*model), loaded);
  expect_consistent(*model);
  std::lock_guard lock(log_mu);
  bool swapped_mid_batch = false;
  for (size_t i = 1; i < log.size(); ++i) {
    swapped_mid_batch |= log[i].second > log[i - 1].second && log[i - 1].first >= 2 && log[i].first >= 2;
  }
  EXPECT_TRUE(swapped_mid_batch) << "no swap between two tokens of a step with several sequences running";
}

// The thresholds are the schedule's: passes run, none of them swaps.
TEST(EnginePromotion, ThresholdsComeFromTheSchedule) {
  auto model = load_half_local();
  ASSERT_TRUE(model);
  const auto loaded = local_sets(*model);
  EngineOptions eo;
  eo.n_ctx = 128;
  eo.promotion.every_tokens = 2;
  eo.promotion.thresholds = kForced;
  eo.promotion.thresholds.min_selections = int64_t(1) << 40;
  BatchEngine engine(*model, eo);
  run_one(engine, prompts(*model)[1]);
  EXPECT_GT(engine.stats().promotion_passes, 0);
  EXPECT_EQ(engine.stats().experts_promoted, 0);
  EXPECT_EQ(local_sets(*model), loaded);
}

TEST(EnginePromotion, BetweenRequestsPromotesOnceEachTimeTheEngineGoesIdle) {
  auto model = load_half_local();
  ASSERT_TRUE(model);
  const auto ps = prompts(*model);
  const auto loaded = local_sets(*model);
  EngineOptions eo;
  eo.n_slots = 1;
  eo.n_ctx = 128;
  eo.n_batch = 4;
  eo.prefix_cache_bytes = 0;
  eo.promotion.between_requests = true;  // and never by count
  eo.promotion.thresholds = kForced;
  BatchEngine engine(*model, eo);
  // The passes each request's tokens saw.
  auto request = [&](Collector& c, std::vector<int64_t>& seen, const std::vector<int32_t>& prompt) {
    c.on_token = [&engine, &seen] { seen.push_back(engine.stats().promotion_passes); };
    EngineRequest r = greedy(prompt, 10);
    r.stop_at_eos = false;
    c.attach(r);
    return r;
  };
  // b is submitted at a's first token: when a ends, b waits, so the engine
  // is not idle until b ends.
  Collector a, b;
  std::vector<int64_t> seen_a, seen_b;
  EngineRequest rb = request(b, seen_b, ps[1]);
  EngineRequest ra = request(a, seen_a, ps[0]);
  a.on_token = [&, first = true]() mutable {
    seen_a.push_back(engine.stats().promotion_passes);
    if (first) {
      EXPECT_TRUE(engine.submit(std::move(rb)).is_ok());
    }
    first = false;
  };
  ASSERT_TRUE(engine.submit(std::move(ra)).is_ok());
  a.wait();
  b.wait();
  EXPECT_EQ(seen_a, std::vector<int64_t>(10, 0));
  EXPECT_EQ(seen_b, std::vector<int64_t>(10, 0));
  ASSERT_EQ(wait_for_passes(engine, 1), 1);
  EXPECT_GT(engine.stats().experts_promoted, 0);
  const auto after_first = local_sets(*model);
  EXPECT_NE(after_first, loaded);
  expect_consistent(*model);
  // c runs alone: no pass while it runs, one after.
  Collector c;
  std::vector<int64_t> seen_c;
  ASSERT_TRUE(engine.submit(request(c, seen_c, ps[2])).is_ok());
  c.wait();
  EXPECT_EQ(seen_c, std::vector<int64_t>(10, 1));
  ASSERT_EQ(wait_for_passes(engine, 2), 2);
  expect_consistent(*model);
  // The next request runs without a pass until it ends (the guard against
  // passing again on an idle engine that served nothing is not reached
  // here: an idle engine sleeps until a request or a cancel wakes it).
  Collector d;
  std::vector<int64_t> seen_d;
  ASSERT_TRUE(engine.submit(request(d, seen_d, ps[3])).is_ok());
  d.wait();
  EXPECT_EQ(seen_d, std::vector<int64_t>(10, 2));
}

// No schedule: the splits stay as loaded.
TEST(EnginePromotion, OffByDefault) {
  auto model = load_half_local();
  ASSERT_TRUE(model);
  const auto loaded = local_sets(*model);
  {
    EngineOptions eo;
    eo.n_ctx = 128;
    BatchEngine engine(*model, eo);
    run_one(engine, prompts(*model)[0]);
    EXPECT_EQ(engine.stats().promotion_passes, 0);
  }  // the engine thread has ended: nothing can promote later
  EXPECT_EQ(local_sets(*model), loaded);
}

TEST(PromotionFlags, DefaultsAreEveryTokensWithPromotionOptionsThresholds) {
  auto s = parse_promotion_flags({});
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->every_tokens, 4096);
  EXPECT_FALSE(s->between_requests);
  EXPECT_EQ(s->thresholds.min_selections, PromotionOptions{}.min_selections);
  EXPECT_EQ(s->thresholds.margin, PromotionOptions{}.margin);
  EXPECT_EQ(s->thresholds.max_swaps_per_layer, PromotionOptions{}.max_swaps_per_layer);
}

TEST(PromotionFlags, EveryIdleOrOff) {
  auto idle = parse_promotion_flags({.every = "idle"});
  ASSERT_TRUE(idle.is_ok());
  EXPECT_TRUE(idle->between_requests);
  EXPECT_EQ(idle->every_tokens, 0);
  for (const char* off : {"off", "0"}) {
    auto s = parse_promotion_flags({.every = off});
    ASSERT_TRUE(s.is_ok()) << off;
    EXPECT_FALSE(s->enabled()) << off;
  }
  auto n = parse_promotion_flags({.every = "128", .min_selections = "1", .margin = "0"});
  ASSERT_TRUE(n.is_ok());
  EXPECT_EQ(n->every_tokens, 128);
  EXPECT_FALSE(n->between_requests);
  EXPECT_EQ(n->thresholds.min_selections, 1);
  EXPECT_EQ(n->thresholds.margin, 0.0);
  EXPECT_EQ(parse_promotion_flags({.margin = "0.25"})->thresholds.margin, 0.25);
  EXPECT_EQ(parse_promotion_flags({.margin = "1e-1"})->thresholds.margin, 0.1);
}

TEST(PromotionFlags, BadValuesNameTheFlag) {
  struct Case {
    PromotionFlags flags;
    const char* flag;
  };
  const std::vector<Case> cases = {
      {{.every = "-1"}, "--expert-promotion "},
      {{.every = "abc"}, "--expert-promotion "},
      {{.every = ""}, "--expert-promotion "},
      {{.every = "12x"}, "--expert-promotion "},
      {{.every = " 12"}, "--expert-promotion "},
      {{.every = "+5"}, "--expert-promotion "},
      {{.every = "99999999999999999999"}, "--expert-promotion "},
      {{.min_selections = "0"}, "--expert-promotion-min "},
      {{.min_selections = "-3"}, "--expert-promotion-min "},
      {{.min_selections = "1.5"}, "--expert-promotion-min "},
      {{.min_selections = "x"}, "--expert-promotion-min "},
      {{.margin = "-0.1"}, "--expert-promotion-margin "},
      {{.margin = "nan"}, "--expert-promotion-margin "},
      {{.margin = "inf"}, "--expert-promotion-margin "},
      {{.margin = ""}, "--expert-promotion-margin "},
      {{.margin = "abc"}, "--expert-promotion-margin "},
      {{.margin = "0x1p-1"}, "--expert-promotion-margin "},
      {{.margin = " 0.5"}, "--expert-promotion-margin "},
      {{.margin = "1e999"}, "--expert-promotion-margin "},
      {{.margin = "0.5x"}, "--expert-promotion-margin "},
  };
  for (const Case& c : cases) {
    auto s = parse_promotion_flags(c.flags);
    ASSERT_FALSE(s.is_ok()) << c.flags.every << " / " << c.flags.min_selections << " / " << c.flags.margin;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.status().message().rfind(c.flag, 0), 0u) << s.status().message();
  }
}

}  // namespace
}  // namespace moeserve::runtime
