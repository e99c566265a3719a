// Sampling with speculation keeps the target distribution, end to end: the
// batch engine samples a short continuation many times with n-gram drafts
// verified every step and many times without, and a two-sample chi-square
// test finds no difference in the distribution of the first verified
// token (nor of the pair it starts). The sampler-level tests
// (runtime/speculation_test.cpp) check the acceptance rule itself.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "runtime/batch_engine.h"
#include "runtime/engine_collector.h"
#include "spec/drafter_factory.h"
#include "test_device.h"

namespace moeserve::spec {
namespace {

const std::string kModel = std::string(MOESERVE_TEST_DATA_DIR) + "/models/qwen3moe-tiny.bf16.gguf";

// The 99.9% quantile of chi-square with df degrees of freedom (Wilson-Hilferty).
double chi2_999(double df) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + 3.090 * std::sqrt(a), 3.0);
}

// Two samples of equal size: sum over categories of (a - b)^2 / (a + b),
// categories with fewer than 10 draws together pooled into one.
void expect_same_distribution(const std::map<int64_t, int>& a, const std::map<int64_t, int>& b,
                              const char* what) {
  std::map<int64_t, std::pair<int, int>> both;
  for (const auto& [k, n] : a) both[k].first += n;
  for (const auto& [k, n] : b) both[k].second += n;
  double chi2 = 0.0;
  int df = -1;
  std::pair<int, int> pooled{0, 0};
  for (const auto& [k, n] : both) {
    if (n.first + n.second < 10) {
      pooled.first += n.first, pooled.second += n.second;
      continue;
    }
    chi2 += double(n.first - n.second) * double(n.first - n.second) / double(n.first + n.second);
    ++df;
  }
  if (pooled.first + pooled.second > 0) {
    chi2 += double(pooled.first - pooled.second) * double(pooled.first - pooled.second) /
            double(pooled.first + pooled.second);
    ++df;
  }
  ASSERT_GE(df, 1) << what << ": the distribution has a single outcome, the test would prove nothing";
  EXPECT_LT(chi2, chi2_999(df)) << what << " over " << df + 1 << " categories";
}

TEST(SpecSampling, EngineKeepsTheDistribution) {
  auto loaded = runtime::Model::load(kModel, {.n_threads = 2, .device = testing::test_device()});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  runtime::Model& model = **loaded;
  runtime::EngineOptions eo;
  eo.n_slots = 4;
  eo.n_ctx = 128;
  eo.prefix_cache_bytes = 16 << 20;  // the shared prompt is prefilled once
  eo.make_drafter = drafter_factory();
  eo.spec.mode = runtime::SpecMode::kNgram;
  eo.spec.max_draft = 2;
  eo.spec.ngram_min = 1;
  eo.spec_adaptive = false;  // every step verifies a draft when n-gram lookup finds one
  runtime::BatchEngine engine(model, eo);
  const std::vector<int32_t> prompt = model.tokenizer().encode("x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1,");
  const int kDraws = 500;
  std::map<int64_t, int> second[2], pair[2];
  int64_t drafted = 0, accepted = 0;
  // Waits for a batch of requests and counts what they sampled.
  auto collect = [&](std::vector<std::unique_ptr<testing::Collector>>& cs, int spec) {
    for (auto& c : cs) c->wait();
    for (auto& c : cs) {
      ASSERT_EQ(c->tokens.size(), 4u);
      ++second[spec][c->tokens[1]];
      ++pair[spec][int64_t(c->tokens[1]) * 1000003 + c->tokens[2]];
      drafted += c->stats.spec.drafted;
      accepted += c->stats.spec.accepted;
    }
    cs.clear();
  };
  for (int spec = 0; spec < 2; ++spec) {
    std::vector<std::unique_ptr<testing::Collector>> cs;
    for (int i = 0; i < kDraws; ++i) {
      runtime::EngineRequest r;
      r.prompt = prompt;
      r.max_tokens = 4;
      r.stop_at_eos = false;
      r.sampling.temperature = 1.0f;
      r.sampling.top_k = 0;
      r.sampling.top_p = 1.0f;
      r.sampling.min_p = 0.0f;
      r.sampling.seed = uint64_t(spec * 100000 + i);
      r.spec = eo.spec;
      if (spec == 0) r.spec->mode = runtime::SpecMode::kNone;
      cs.push_back(std::make_unique<testing::Collector>());
      cs.back()->attach(r);
      ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
      if (cs.size() >= 32) collect(cs, spec);  // stay within the queue
    }
    collect(cs, spec);
  }
  EXPECT_GT(drafted, kDraws) << "drafts were verified in most requests";
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted) << "both the accept and the resample paths ran";
  expect_same_distribution(second[0], second[1], "the first verified token");
  expect_same_distribution(pair[0], pair[1], "the verified token and the one after it");
}

}  // namespace
}  // namespace moeserve::spec
