// What the split tests share: the tiny trained models, greedy generation
// through the generator, and the engine's output for two requests at once.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/batch_engine.h"
#include "runtime/engine_collector.h"
#include "runtime/generator.h"

namespace moeserve::split_test {

inline std::string model_path(const std::string& arch) {
  return fmt::format("{}/models/{}-tiny.bf16.gguf", MOESERVE_TEST_DATA_DIR, arch);
}

// n greedy tokens after `prompt`, the prompt fed n_batch tokens a chunk.
inline std::vector<int32_t> greedy_tokens(runtime::Model& m, const std::vector<int32_t>& prompt, int64_t n,
                                          int64_t n_batch, int64_t n_ctx) {
  runtime::Generator gen(m, n_ctx);
  runtime::GenerateOptions o;
  o.max_tokens = n;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  o.n_batch = n_batch;
  auto r = gen.generate(prompt, o);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? r->tokens : std::vector<int32_t>{};
}

struct EngineCheck {
  int64_t n_ctx = 256;
  int rounds = 1;  // a repeated round takes its prefix from the prefix cache
};

// Two requests of `prompt` at once through the engine (16 rows a step),
// `rounds` times: each gives `want`.
inline void expect_engine_output(runtime::Model& m, const std::vector<int32_t>& prompt,
                                 const std::vector<int32_t>& want, const std::string& where, EngineCheck check) {
  runtime::EngineOptions eo;
  eo.n_slots = 2;
  eo.n_ctx = check.n_ctx;
  eo.n_batch = 16;
  runtime::BatchEngine engine(m, eo);
  for (int round = 0; round < check.rounds; ++round) {
    std::vector<std::unique_ptr<moeserve::testing::Collector>> cs;
    for (int i = 0; i < 2; ++i) {
      cs.push_back(std::make_unique<moeserve::testing::Collector>());
      runtime::EngineRequest r = moeserve::testing::greedy_request(prompt, int(want.size()));
      r.stop_at_eos = false;
      cs.back()->attach(r);
      ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
    }
    for (auto& c : cs) {
      c->wait();
      ASSERT_TRUE(c->status.is_ok()) << c->status.to_string();
      EXPECT_EQ(c->tokens, want) << where << " engine round " << round;
    }
  }
}

}  // namespace moeserve::split_test
