// Continuous batching: every request's output equals the same request run
// alone through Generator (greedy, bit-exact rows), prefix-cache reuse does
// not change results, and the queue/cancel/error paths behave.
#include "runtime/batch_engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "runtime/engine_collector.h"
#include "test_device.h"

namespace moeserve::runtime {
namespace {

const std::string kModel = std::string(MOESERVE_TEST_DATA_DIR) + "/models/qwen3moe-tiny.bf16.gguf";

std::unique_ptr<Model> load(int threads) {
  auto m = Model::load(kModel, {.n_threads = threads, .device = testing::test_device()});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return std::move(m.value());
}

using testing::Collector;

EngineRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  return testing::greedy_request(std::move(prompt), max_tokens);
}

std::vector<std::vector<int32_t>> prompts(const Model& m) {
  std::vector<std::vector<int32_t>> out;
  for (const char* p :
       {"def main(", "import os\nimport sys\n", "class Foo:\n    def __init__(self", "# comment",
        "for i in range(", "return self._", "while True:\n", "x = [", "def main(args"}) {
    out.push_back(m.tokenizer().encode(p));
  }
  return out;
}

TEST(BatchEngine, ConcurrentGreedyMatchesSoloGeneration) {
  auto model = load(2);
  const auto ps = prompts(*model);
  std::vector<GenerateResult> solo;
  {
    Generator gen(*model, 256);
    for (const auto& p : ps) {
      GenerateOptions o;
      o.max_tokens = 24;
      o.sampling.temperature = 0.0f;
      solo.push_back(gen.generate(p, o).value());
    }
  }
  for (size_t prefix_mb : {size_t(0), size_t(64)}) {
    EngineOptions eo;
    eo.n_slots = 4;  // 9 requests: some wait in the queue
    eo.n_ctx = 256;
    eo.n_batch = 8;  // small, so prompts are prefilled in several chunks between decode steps
    eo.prefix_cache_bytes = prefix_mb << 20;
    BatchEngine engine(*model, eo);
    std::vector<std::unique_ptr<Collector>> cs;
    for (int round = 0; round < 2; ++round) {  // round 2 hits the prefix cache (when on)
      cs.clear();
      for (const auto& p : ps) {
        cs.push_back(std::make_unique<Collector>());
        EngineRequest r = greedy(p, 24);
        cs.back()->attach(r);
        ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
      }
      int64_t cached = 0;
      for (size_t i = 0; i < ps.size(); ++i) {
        cs[i]->wait();
        ASSERT_TRUE(cs[i]->status.is_ok()) << cs[i]->status.to_string();
        EXPECT_EQ(cs[i]->tokens, solo[i].tokens) << "prompt " << i << " round " << round;
        EXPECT_EQ(cs[i]->text, solo[i].text) << "prompt " << i;
        EXPECT_EQ(cs[i]->stats.completion_tokens, int64_t(solo[i].tokens.size()));
        cached += cs[i]->stats.cached_tokens;
      }
      if (prefix_mb == 0) {
        EXPECT_EQ(cached, 0);
      } else if (round == 1) {
        EXPECT_GT(cached, 0);  // every prompt was seen in round 0
      }
    }
    const EngineStats st = engine.stats();
    EXPECT_EQ(st.active_slots, 0);
    EXPECT_EQ(st.queue_depth, 0);
    EXPECT_GT(st.decode_tokens, 0);
    EXPECT_GT(st.prefill_tokens, 0);
    if (prefix_mb > 0) {
      EXPECT_GT(st.prefix.hits, 0);
    }
  }
}

// One step can mix rows that need only their arg-max (plain greedy: the
// device's choice, no logits read back) with rows that need the logits
// (logprobs, a repetition penalty, sampling): each still equals its solo run.
TEST(BatchEngine, RowsWithAndWithoutLogitsInOneStep) {
  auto model = load(2);
  const auto ps = prompts(*model);
  auto request = [&](size_t i) {
    EngineRequest r = greedy(ps[(i / 4) % ps.size()], 16);  // each prompt in all four kinds
    if (i % 4 == 1) r.top_logprobs = 2;
    if (i % 4 == 2) r.sampling.repeat_penalty = 1.3f;
    if (i % 4 == 3) r.sampling.temperature = 0.7f, r.sampling.seed = 1234 + i;
    return r;
  };
  auto solo = [&](size_t i) {
    EngineOptions eo;
    eo.n_slots = 1;
    eo.n_ctx = 128;
    BatchEngine engine(*model, eo);
    Collector c;
    EngineRequest r = request(i);
    c.attach(r);
    EXPECT_TRUE(engine.submit(std::move(r)).is_ok());
    c.wait();
    return c.tokens;
  };
  const size_t n = 8;
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < n; ++i) want.push_back(solo(i));
  EngineOptions eo;
  eo.n_slots = int(n);
  eo.n_ctx = 128;
  BatchEngine engine(*model, eo);
  std::vector<std::unique_ptr<Collector>> cs;
  for (size_t i = 0; i < n; ++i) {
    cs.push_back(std::make_unique<Collector>());
    EngineRequest r = request(i);
    cs.back()->attach(r);
    ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  }
  for (size_t i = 0; i < n; ++i) {
    cs[i]->wait();
    ASSERT_TRUE(cs[i]->status.is_ok()) << cs[i]->status.to_string();
    EXPECT_EQ(cs[i]->tokens, want[i]) << "request " << i;
    if (i % 4 == 1) {
      for (const TokenEvent& ev : cs[i]->events) EXPECT_EQ(ev.top.size(), 2u);
    }
  }
  // The plain greedy rows are the logits rows' greedy choice too.
  EXPECT_EQ(want[0], want[1]);
  EXPECT_EQ(want[4], want[5]);
}

TEST(BatchEngine, LogprobsAreNormalisedAndSorted) {
  auto model = load(1);
  EngineOptions eo;
  eo.n_slots = 1;
  eo.n_ctx = 64;
  BatchEngine engine(*model, eo);
  Collector c;
  EngineRequest r = greedy(model->tokenizer().encode("def "), 5);
  r.top_logprobs = 3;
  c.attach(r);
  ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  c.wait();
  ASSERT_EQ(c.events.size(), 5u);
  for (const TokenEvent& ev : c.events) {
    ASSERT_EQ(ev.top.size(), 3u);
    EXPECT_EQ(ev.top[0].id, ev.token);  // greedy picks the most likely token
    EXPECT_FLOAT_EQ(ev.top[0].logprob, ev.logprob);
    EXPECT_LE(ev.logprob, 0.0f);
    EXPECT_GE(ev.top[0].logprob, ev.top[1].logprob);
    EXPECT_GE(ev.top[1].logprob, ev.top[2].logprob);
  }
}

TEST(BatchEngine, RejectsWhatCanNeverRunAndAFullQueue) {
  auto model = load(1);
  EngineOptions eo;
  eo.n_slots = 1;
  eo.n_ctx = 32;
  eo.max_queue = 1;
  BatchEngine engine(*model, eo);
  EXPECT_EQ(engine.submit(greedy({}, 4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.submit(greedy(std::vector<int32_t>(32, 65), 1)).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(engine.submit(greedy(std::vector<int32_t>(20, 65), 13)).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(engine.submit(greedy({1 << 30}, 4)).status().code(), StatusCode::kInvalidArgument);
  // One running (long), one waiting, then the queue is full.
  Collector a, b;
  EngineRequest ra = greedy({65, 66}, 29), rb = greedy({67}, 29);
  ra.stop_at_eos = rb.stop_at_eos = false;
  a.cancel_after = 3;  // the first stream "disconnects" after 3 tokens
  a.attach(ra);
  b.attach(rb);
  ASSERT_TRUE(engine.submit(std::move(ra)).is_ok());
  auto id_b = engine.submit(std::move(rb));
  ASSERT_TRUE(id_b.is_ok());
  auto third = engine.submit(greedy({68}, 4));
  if (third.is_ok()) {
    // The engine had already admitted the first request: one more fits the queue.
    EXPECT_EQ(engine.submit(greedy({69}, 4)).status().code(), StatusCode::kResourceExhausted);
  } else {
    EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  }
  engine.cancel(*id_b);
  a.wait();
  b.wait();
  EXPECT_EQ(a.stats.reason, StopReason::kCallback);
  EXPECT_EQ(a.tokens.size(), 3u);
  EXPECT_EQ(b.stats.reason, StopReason::kCallback);
  EXPECT_LT(b.tokens.size(), 29u);
}

TEST(BatchEngine, StopStringsAndMaxTokens) {
  auto model = load(1);
  EngineOptions eo;
  eo.n_slots = 2;
  eo.n_ctx = 128;
  BatchEngine engine(*model, eo);
  Collector full;
  EngineRequest r = greedy(model->tokenizer().encode("import "), 20);
  r.stop_at_eos = false;
  full.attach(r);
  ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  full.wait();
  EXPECT_EQ(full.stats.reason, StopReason::kMaxTokens);
  EXPECT_EQ(full.tokens.size(), 20u);
  ASSERT_GE(full.text.size(), 6u);
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  Collector cut;
  EngineRequest r2 = greedy(model->tokenizer().encode("import "), 20);
  r2.stop_at_eos = false;
  r2.stop = {stop};
  cut.attach(r2);
  ASSERT_TRUE(engine.submit(std::move(r2)).is_ok());
  cut.wait();
  EXPECT_EQ(cut.stats.reason, StopReason::kStopString);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
}

}  // namespace
}  // namespace moeserve::runtime

namespace moeserve::runtime {
namespace {

// --prefill-chunk: while a sequence decodes, a long prompt comes in at most
// that many rows a step, so the running stream keeps getting a token every
// step; without it the prompt takes the step's whole budget at once. The
// outputs are the same either way.
TEST(BatchEngine, PrefillChunkKeepsRunningStreamsGoing) {
  auto model = load(2);
  std::vector<int32_t> long_prompt;
  const std::vector<int32_t> piece = model->tokenizer().encode("def add(a, b):\n    return a + b\n");
  while (long_prompt.size() < 64) long_prompt.insert(long_prompt.end(), piece.begin(), piece.end());
  long_prompt.resize(64);
  std::vector<int32_t> first_tokens;
  for (int64_t chunk : {int64_t(0), int64_t(4)}) {
    EngineOptions eo;
    eo.n_slots = 2;
    eo.n_ctx = 256;
    eo.n_batch = 64;
    eo.prefill_chunk = chunk;
    eo.prefix_cache_bytes = 0;
    BatchEngine engine(*model, eo);
    Collector running, arriving;
    EngineRequest a = greedy(model->tokenizer().encode("import os\n"), 80);
    a.stop_at_eos = false;
    running.attach(a);
    ASSERT_TRUE(engine.submit(std::move(a)).is_ok());
    auto running_tokens = [&] {
      std::lock_guard lock(running.mu);
      return int64_t(running.tokens.size());
    };
    while (running_tokens() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // The running stream's tokens when the arriving prompt's first token comes.
    std::atomic<int64_t> at_first{-1};
    arriving.on_token = [&] {
      if (at_first.load() < 0) at_first = running_tokens();
    };
    EngineRequest b = greedy(long_prompt, 2);
    b.stop_at_eos = false;
    arriving.attach(b);
    const int64_t before = running_tokens();
    ASSERT_TRUE(engine.submit(std::move(b)).is_ok());
    arriving.wait();
    running.wait();
    ASSERT_TRUE(arriving.status.is_ok() && running.status.is_ok());
    const int64_t steps_meanwhile = at_first.load() - before;
    if (chunk == 0) {
      EXPECT_LT(steps_meanwhile, 8) << "the whole prompt should fit one or two steps";
      first_tokens = arriving.tokens;
    } else {
      EXPECT_GE(steps_meanwhile, 64 / chunk - 1) << "the prompt came in faster than " << chunk << " rows a step";
      EXPECT_EQ(arriving.tokens, first_tokens);
    }
  }
}

}  // namespace
}  // namespace moeserve::runtime

namespace moeserve::runtime {
namespace {

// Requests waiting for the engine's one slot: the record of the order in
// which they start (their first token), while a blocker holds the slot
// until every request has been submitted.
struct AdmissionOrder {
  std::mutex mu;
  std::vector<std::string> started;
  std::vector<std::unique_ptr<Collector>> collectors;

  EngineRequest request(const std::string& name, int priority, const std::string& client,
                        int64_t tokens = 2) {
    collectors.push_back(std::make_unique<Collector>());
    Collector& c = *collectors.back();
    EngineRequest r = greedy({65, 66}, tokens);
    r.stop_at_eos = false;
    r.priority = priority;
    r.client = client;
    c.on_token = [this, name, &c] {
      std::lock_guard lock(mu);
      if (c.tokens.empty()) started.push_back(name);
    };
    c.attach(r);
    return r;
  }
  void wait_all() {
    for (auto& c : collectors) c->wait();
  }
};

// Blocks the engine thread in the first request's first token until
// released, so that the rest queue up behind it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return open; });
  }
  void release() {
    std::lock_guard lock(mu);
    open = true;
    cv.notify_all();
  }
};

TEST(BatchEngineAdmission, LowerPriorityFirstThenArrival) {
  auto model = load(1);
  EngineOptions eo;
  eo.n_slots = 1;
  eo.n_ctx = 32;
  BatchEngine engine(*model, eo);
  AdmissionOrder order;
  Gate gate;
  EngineRequest blocker = order.request("blocker", 0, "");
  order.collectors.back()->on_token = [&] { gate.wait(); };
  ASSERT_TRUE(engine.submit(std::move(blocker)).is_ok());
  ASSERT_TRUE(engine.submit(order.request("b0", 0, "")).is_ok());
  ASSERT_TRUE(engine.submit(order.request("c-5", -5, "")).is_ok());
  ASSERT_TRUE(engine.submit(order.request("d0", 0, "")).is_ok());
  ASSERT_TRUE(engine.submit(order.request("e-5", -5, "")).is_ok());
  ASSERT_TRUE(engine.submit(order.request("f9", 9, "")).is_ok());
  gate.release();
  order.wait_all();
  EXPECT_EQ(order.started, (std::vector<std::string>{"c-5", "e-5", "b0", "d0", "f9"}));
}

TEST(BatchEngineAdmission, OneClientCannotTakeEverySlot) {
  auto model = load(1);
  EngineOptions eo;
  eo.n_slots = 2;
  eo.n_ctx = 32;
  eo.max_running_per_client = 1;
  BatchEngine engine(*model, eo);
  AdmissionOrder order;
  Gate gate;
  // x holds one slot (gated); its second request must wait although a slot
  // is free, and y's, sent later, takes that slot first.
  EngineRequest x1 = order.request("x1", 0, "x", 20);  // still running while y1 and anon finish
  order.collectors.back()->on_token = [&] { gate.wait(); };
  ASSERT_TRUE(engine.submit(std::move(x1)).is_ok());
  ASSERT_TRUE(engine.submit(order.request("x2", 0, "x")).is_ok());
  ASSERT_TRUE(engine.submit(order.request("y1", 0, "y")).is_ok());
  ASSERT_TRUE(engine.submit(order.request("anon", 0, "")).is_ok());  // nobody's: no cap
  gate.release();
  order.wait_all();
  // x1 blocked in its first token, so the others' first tokens came in the
  // same or later steps: y1 and anon ran beside x1; x2 only after x1 ended.
  ASSERT_EQ(order.started.size(), 3u);  // (x1's on_token was replaced by the gate)
  EXPECT_EQ(order.started.back(), "x2");
  for (auto& c : order.collectors) EXPECT_TRUE(c->status.is_ok());
}

}  // namespace
}  // namespace moeserve::runtime
