// ColdPairs (backend/cold_pairs.h): the host's pairs of a split layer are
// grouped by expert, counted once each in the split's statistics, computed
// through the host backend with the right rows, skipped experts left out,
// and a bad id is an error naming the layer.
#include "backend/cold_pairs.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace moeserve::backend {
namespace {

// A host backend whose expert e maps row x to x * 10 + e (every column),
// recording the jobs it was given.
class FakeHost final : public ExpertBackend {
 public:
  Status compute(const ExpertBatch& batch) override {
    for (const ExpertJob& j : batch.jobs) {
      seen[j.expert] += j.n_tokens;
      for (int64_t t = 0; t < j.n_tokens; ++t)
        for (int64_t c = 0; c < batch.n_embd; ++c)
          j.y[t * batch.n_embd + c] = j.x[t * batch.n_embd + c] * 10.0f + float(j.expert);
    }
    return Status::ok();
  }
  std::map<int32_t, int64_t> seen;
};

struct Fixture {
  static constexpr int64_t kExperts = 6;
  Fixture() : split(kExperts, {1, 4}, &host) {
    WeightView v;
    v.data = bytes.data(), v.matrix_stride = 1;
    for (WeightUse u : {WeightUse::kExpertGate, WeightUse::kExpertUp, WeightUse::kExpertDown})
      split.set_host_view(u, v);
  }
  std::vector<uint8_t> bytes = std::vector<uint8_t>(kExperts);
  FakeHost host;
  ExpertSplit split;
};

TEST(ColdPairs, GroupsCountsAndComputesTheHostsPairs) {
  Fixture f;
  // 3 tokens x 2 slots; experts 1 and 4 are local.
  const std::vector<int32_t> ids = {0, 1, 5, 0, 4, 2};
  const std::vector<float> xn = {1, 1, 1, 2, 2, 2, 3, 3, 3};  // token t's row is t + 1
  ColdPairs cold;
  auto n = cold.collect(f.split, 7, ids, 2);
  ASSERT_TRUE(n.is_ok()) << n.status().to_string();
  EXPECT_EQ(*n, 4);
  EXPECT_EQ(cold.experts(), (std::vector<int32_t>{0, 2, 5}));
  EXPECT_EQ(cold.tokens(0), 2);
  EXPECT_EQ(f.split.host_pairs.load(), 4);
  EXPECT_EQ(f.split.local_pairs.load(), 2);
  for (int32_t e = 0; e < 6; ++e) EXPECT_EQ(f.split.selections(e), e == 3 ? 0 : (e == 0 ? 2 : 1)) << e;

  std::vector<float> out(4 * 3, -1.0f);
  std::vector<int32_t> rows(4, -1);
  ColdPairs::ComputeArgs a;
  a.layer = 7, a.n_embd = 3, a.n_ff = 1, a.xn = xn.data(), a.out = out.data(), a.rows = rows.data();
  auto m = cold.compute(f.split, a);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_EQ(*m, 4);
  // Expert order, pairs ascending: expert 0 (pairs 0, 3), 2 (pair 5), 5 (pair 2).
  EXPECT_EQ(rows, (std::vector<int32_t>{0, 3, 5, 2}));
  const std::vector<float> want_first = {10, 20, 32, 25};  // token (pair / 2) + 1, times 10, plus the expert
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(out[size_t(i * 3 + c)], want_first[size_t(i)]) << i << "," << c;
  EXPECT_EQ(f.host.seen, (std::map<int32_t, int64_t>{{0, 2}, {2, 1}, {5, 1}}));
}

TEST(ColdPairs, SkippedExpertsAreLeftOutAndOneTokenReadsInPlace) {
  Fixture f;
  const std::vector<int32_t> ids = {3, 0, 1, 5};  // one token, 4 slots
  const std::vector<float> xn = {2, 2, 2};
  ColdPairs cold;
  ASSERT_EQ(cold.collect(f.split, 0, ids, 4).value(), 3);
  std::vector<uint8_t> skip(6, 0);
  skip[3] = 1;  // computed elsewhere (copied to the device)
  std::vector<float> out(3 * 3, -1.0f);
  std::vector<int32_t> rows(3, -1);
  ColdPairs::ComputeArgs a;
  a.n_embd = 3, a.n_ff = 1, a.xn = xn.data(), a.skip = skip.data(), a.out = out.data(), a.rows = rows.data();
  auto m = cold.compute(f.split, a);
  ASSERT_TRUE(m.is_ok());
  ASSERT_EQ(*m, 2);
  EXPECT_EQ((std::vector<int32_t>(rows.begin(), rows.begin() + 2)), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(out[0], 20.0f);
  EXPECT_EQ(out[3], 25.0f);
  EXPECT_EQ(f.host.seen, (std::map<int32_t, int64_t>{{0, 1}, {5, 1}}));
}

TEST(ColdPairs, AllLocalComputesNothing) {
  Fixture f;
  ColdPairs cold;
  ASSERT_EQ(cold.collect(f.split, 0, std::vector<int32_t>{1, 4, 4, 1}, 2).value(), 0);
  ColdPairs::ComputeArgs a;
  a.n_embd = 3, a.n_ff = 1;
  ASSERT_EQ(cold.compute(f.split, a).value(), 0);
  EXPECT_TRUE(f.host.seen.empty());
  EXPECT_EQ(f.split.local_pairs.load(), 4);
}

TEST(ColdPairs, AnIdOutOfRangeIsAnErrorNamingTheLayer) {
  Fixture f;
  ColdPairs cold;
  auto n = cold.collect(f.split, 12, std::vector<int32_t>{0, 6}, 2);
  ASSERT_FALSE(n.is_ok());
  EXPECT_NE(n.status().to_string().find("layer 12"), std::string::npos) << n.status().to_string();
  EXPECT_FALSE(cold.collect(f.split, 1, std::vector<int32_t>{0, 1, 2}, 2).is_ok());  // not whole tokens
}

}  // namespace
}  // namespace moeserve::backend
