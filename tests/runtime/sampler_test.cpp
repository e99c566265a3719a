#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace moeserve::runtime {
namespace {

// Logits whose softmax is exactly `probs`.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

std::vector<int32_t> ids(const std::vector<TokenProb>& d) {
  std::vector<int32_t> out;
  for (const TokenProb& t : d) out.push_back(t.id);
  return out;
}

SamplerOptions no_filters() {
  SamplerOptions o;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0.0f;
  return o;
}

TEST(Sampler, GreedyPicksArgmax) {
  SamplerOptions o;
  o.temperature = 0.0f;
  Sampler s(o);
  const std::vector<float> l = {0.1f, 2.5f, -1.0f, 2.4f};
  EXPECT_EQ(s.sample(l, {}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 3.0f, 3.0f}, {}), 1);  // tie: lowest id
}

TEST(Sampler, TopKKeepsTheKMostLikely) {
  SamplerOptions o = no_filters();
  o.top_k = 2;
  const auto d = Sampler(o).distribution(logits_of({0.1, 0.4, 0.2, 0.3}), {});
  EXPECT_EQ(ids(d), (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(d[0].p, 0.4 / 0.7, 1e-6);
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingP) {
  SamplerOptions o = no_filters();
  o.top_p = 0.7f;  // 0.4 + 0.3 = 0.7 reaches it: {1, 3}
  EXPECT_EQ(ids(Sampler(o).distribution(logits_of({0.1, 0.4, 0.2, 0.3}), {})), (std::vector<int32_t>{1, 3}));
  o.top_p = 0.75f;  // needs the third
  EXPECT_EQ(ids(Sampler(o).distribution(logits_of({0.1, 0.4, 0.2, 0.3}), {})), (std::vector<int32_t>{1, 3, 2}));
}

TEST(Sampler, MinPDropsTokensBelowFractionOfTop) {
  SamplerOptions o = no_filters();
  o.min_p = 0.5f;  // threshold 0.2: keeps 0.4, 0.3, 0.2
  EXPECT_EQ(ids(Sampler(o).distribution(logits_of({0.1, 0.4, 0.2, 0.3}), {})), (std::vector<int32_t>{1, 3, 2}));
  o.min_p = 0.6f;  // threshold 0.24
  EXPECT_EQ(ids(Sampler(o).distribution(logits_of({0.1, 0.4, 0.2, 0.3}), {})), (std::vector<int32_t>{1, 3}));
}

TEST(Sampler, TemperatureSharpensAfterFiltering) {
  SamplerOptions o = no_filters();
  o.temperature = 0.5f;
  const auto d = Sampler(o).distribution(logits_of({0.25, 0.75}), {});
  EXPECT_EQ(d[0].id, 1);
  EXPECT_NEAR(d[0].p, 0.75 * 0.75 / (0.75 * 0.75 + 0.25 * 0.25), 1e-6);
}

TEST(Sampler, SameSeedSameSamples) {
  SamplerOptions o = no_filters();
  o.seed = 1234;
  const std::vector<float> l = logits_of({0.1, 0.2, 0.3, 0.4});
  Sampler a(o), b(o);
  std::vector<int32_t> sa, sb;
  for (int i = 0; i < 200; ++i) {
    sa.push_back(a.sample(l, {}));
    sb.push_back(b.sample(l, {}));
  }
  EXPECT_EQ(sa, sb);
  int count3 = 0;
  for (int32_t x : sa) count3 += x == 3;
  EXPECT_GT(count3, 50);  // ~80 of 200 expected; guards against a constant sampler
  EXPECT_LT(count3, 120);
}

TEST(Sampler, PenaltiesChangeLogitsAsSpecified) {
  SamplerOptions o = no_filters();
  o.repeat_penalty = 2.0f;
  o.presence_penalty = 0.5f;
  o.frequency_penalty = 0.25f;
  o.repeat_last_n = 3;
  std::vector<float> l = {4.0f, -4.0f, 1.0f, 1.0f};
  // Window is the last 3: {1, 1, 2}; token 3 is outside it.
  const std::vector<int32_t> history = {3, 1, 1, 2};
  Sampler(o).apply_penalties(l, history);
  EXPECT_FLOAT_EQ(l[0], 4.0f);
  EXPECT_FLOAT_EQ(l[1], -4.0f * 2.0f - 2 * 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(l[2], 1.0f / 2.0f - 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(l[3], 1.0f);
}

}  // namespace
}  // namespace moeserve::runtime
