#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
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

// The plain reference the fast paths must match: every token becomes a
// candidate, sorted (logit descending, ties to the lower id, NaN as -inf),
// then top-k, softmax, top-p, min-p, temperature, exactly as specified.
std::vector<TokenProb> reference_distribution(const SamplerOptions& o, std::vector<float> l,
                                              std::span<const int32_t> history) {
  Sampler(o).apply_penalties(l, history);
  struct C {
    int32_t id;
    float logit;
    float p;
  };
  std::vector<C> c;
  for (size_t i = 0; i < l.size(); ++i) c.push_back({int32_t(i), std::isnan(l[i]) ? -INFINITY : l[i], 0.0f});
  std::stable_sort(c.begin(), c.end(), [](const C& a, const C& b) { return a.logit > b.logit; });
  if (o.temperature <= 0.0f) return {{c.front().id, 1.0f}};
  if (o.top_k > 0 && size_t(o.top_k) < c.size()) c.resize(size_t(o.top_k));
  auto softmax = [&](float temp) {
    double sum = 0.0;
    for (C& x : c) sum += x.p = std::exp((x.logit - c.front().logit) / temp);
    for (C& x : c) x.p = float(x.p / sum);
  };
  softmax(1.0f);
  double cum = 0.0;
  for (size_t i = 0; o.top_p < 1.0f && i < c.size(); ++i) {
    if ((cum += c[i].p) >= o.top_p) {
      c.resize(i + 1);
      break;
    }
  }
  size_t keep = 1;
  while (o.min_p > 0.0f && keep < c.size() && c[keep].p >= o.min_p * c.front().p) ++keep;
  if (o.min_p > 0.0f) c.resize(keep);
  softmax(o.temperature);
  std::vector<TokenProb> out;
  for (const C& x : c) out.push_back({x.id, x.p});
  return out;
}

// Logits like a model's over a large vocabulary, with exact ties, NaN and
// -inf mixed in.
std::vector<float> awkward_logits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> l(n);
  for (float& x : l) x = normal(rng);
  for (size_t i = 0; i < n; i += 97) l[i] = l[(i * 7 + 13) % n];  // ties
  for (size_t i = 5; i < n; i += 1009) l[i] = NAN;
  for (size_t i = 11; i < n; i += 997) l[i] = -INFINITY;
  l[n / 2] = l[n / 3] = 12.0f;  // a tie at the top
  return l;
}

TEST(Sampler, FastPathsMatchThePlainReference) {
  const std::vector<int32_t> history = {7, 7, 100, 12345, 5};
  for (uint32_t seed : {1u, 2u}) {
    const std::vector<float> l = awkward_logits(seed == 1 ? 151936 : 30000, seed);
    for (float temp : {0.0f, 0.7f}) {
      for (int32_t top_k : {0, 1, 40, 160000}) {
        for (float top_p : {1.0f, 0.9f}) {
          for (float min_p : {0.0f, 0.05f}) {
            if (top_k == 0 && min_p == 0.0f && seed == 2) continue;  // the full sort: once is enough
            for (float penalty : {1.0f, 1.3f}) {
              SamplerOptions o;
              o.temperature = temp, o.top_k = top_k, o.top_p = top_p, o.min_p = min_p,
              o.repeat_penalty = penalty;
              SCOPED_TRACE(testing::Message()
                           << "seed " << seed << " temp " << temp << " top_k " << top_k << " top_p " << top_p
                           << " min_p " << min_p << " penalty " << penalty);
              const std::vector<TokenProb> want = reference_distribution(o, l, history);
              const std::vector<TokenProb> got = Sampler(o).distribution(l, history);
              ASSERT_EQ(ids(got), ids(want));
              for (size_t i = 0; i < got.size(); ++i)
                ASSERT_NEAR(got[i].p, want[i].p, 1e-6f * want[i].p + 1e-12f);
            }
          }
        }
      }
    }
  }
}

TEST(Sampler, GreedyWithNothingAboveMinusInfinityPicksTheFirstToken) {
  SamplerOptions o;
  o.temperature = 0.0f;
  Sampler s(o);
  EXPECT_EQ(s.sample(std::vector<float>{NAN, -INFINITY, NAN}, {}), 0);
  EXPECT_EQ(s.sample(std::vector<float>{-INFINITY, NAN, 3.0f, 3.0f}, {}), 2);
  std::vector<float> many(1000, -1.0f);
  many[999] = 0.0f;
  many[998] = NAN;
  EXPECT_EQ(s.sample(many, {}), 999);
}

TEST(Logprobs, MatchAPlainDoublePrecisionReference) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> l(151936);
  for (float& x : l) x = normal(rng);
  l[100] = l[200] = 30.0f;  // tied top: the lower id first
  l[300] = 29.5f;
  double max = -INFINITY, sum = 0.0;
  for (float x : l) max = std::max(max, double(x));
  for (float x : l) sum += std::exp(double(x) - max);
  const double log_z = max + std::log(sum);
  const Logprobs lp = logprobs_of(l, 300, 4);
  EXPECT_NEAR(lp.chosen, double(l[300]) - log_z, 1e-5);
  ASSERT_EQ(lp.top.size(), 4u);
  EXPECT_EQ(lp.top[0].id, 100);
  EXPECT_EQ(lp.top[1].id, 200);
  EXPECT_EQ(lp.top[2].id, 300);
  std::vector<int32_t> order(l.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(lp.top[i].id, order[i]);
    EXPECT_NEAR(lp.top[i].logprob, double(l[size_t(order[i])]) - log_z, 1e-5);
  }
  EXPECT_TRUE(logprobs_of(l, 5, 0).top.empty());
  EXPECT_EQ(logprobs_of(std::vector<float>{1.0f, 2.0f}, 1, 5).top.size(), 2u);  // capped at the vocabulary
  EXPECT_NEAR(logprobs_of(std::vector<float>{0.0f, 0.0f}, 0, 0).chosen, std::log(0.5), 1e-6);
}

}  // namespace
}  // namespace moeserve::runtime
