// ColdPairs (backend/cold_pairs.h): the host's pairs of a split layer are
// grouped by expert, counted once each in the split's statistics, computed
// through the host backend with the right rows, skipped experts left out,
// and a bad id is an error naming the layer.
#include "backend/cold_pairs.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "backend/cpu/expert_backend.h"
#include "core/thread_pool.h"
#include "moe/f32_view.h"

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

// The first decode_rows rows of a forward are decode rows: their pairs
// count in the decode totals too (the live statistics' phases).
TEST(ColdPairs, CountsDecodeRowsApart) {
  Fixture f;
  // 3 tokens x 2 slots, the first two decode rows; experts 1 and 4 are local.
  const std::vector<int32_t> ids = {0, 1, 5, 4, 0, 2};
  ColdPairs cold;
  ASSERT_TRUE(cold.collect(f.split, 0, ids, 2, /*decode_rows=*/2).is_ok());
  EXPECT_EQ(f.split.decode_local_pairs.load(), 2);  // 1 and 4
  EXPECT_EQ(f.split.decode_host_pairs.load(), 2);   // 0 and 5
  EXPECT_EQ(f.split.local_pairs.load() + f.split.host_pairs.load(), 6);
  for (int32_t e = 0; e < 6; ++e) {
    EXPECT_EQ(f.split.decode_selections(e), e == 0 || e == 1 || e == 4 || e == 5 ? 1 : 0) << e;
    EXPECT_EQ(f.split.selections(e), e == 0 ? 2 : (e == 3 ? 0 : 1)) << e;
  }
  ASSERT_TRUE(cold.collect(f.split, 0, ids, 2).is_ok());  // a prompt chunk: no decode rows
  EXPECT_EQ(f.split.decode_host_pairs.load(), 2);
  EXPECT_EQ(f.split.selections(0), 4);
  EXPECT_EQ(f.split.decode_selections(0), 1);
}

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
  EXPECT_EQ(f.split.cold_experts_seen.load(), 3);  // experts 0, 2 and 5
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

// probe_host_flops: two experts' worth of rows through the host backend,
// FLOP/s from the timed calls (6 * n_embd * n_ff a row); an error without
// host views.
class SlowHost final : public ExpertBackend {
 public:
  Status compute(const ExpertBatch& batch) override {
    calls += 1;
    for (const ExpertJob& j : batch.jobs) rows += j.n_tokens;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return Status::ok();
  }
  int calls = 0;
  int64_t rows = 0;
};

TEST(ExpertSplit, ProbeHostFlopsTimesTwoExpertsOfRows) {
  SlowHost host;
  ExpertSplit split(8, {0}, &host);
  EXPECT_FALSE(split.probe_host_flops(3, 32).is_ok());  // no host views yet
  std::vector<uint8_t> bytes(8);
  WeightView gate;
  gate.data = bytes.data(), gate.matrix_stride = 1, gate.n_cols = 64, gate.n_rows = 16;  // n_embd 64, n_ff 16
  for (WeightUse u : {WeightUse::kExpertGate, WeightUse::kExpertUp, WeightUse::kExpertDown})
    split.set_host_view(u, gate);
  auto flops = split.probe_host_flops(3, 32);
  ASSERT_TRUE(flops.is_ok()) << flops.status().to_string();
  EXPECT_EQ(host.calls, 3);  // one to page the weights in, two timed
  EXPECT_EQ(host.rows, 3 * 2 * 32);
  const double per_call = 6.0 * 64 * 16 * 2 * 32;
  EXPECT_GT(*flops, 0.0);
  EXPECT_LE(*flops, per_call / 0.019);  // each call slept 20 ms
}

// The same through the CPU expert backend on real (f32) stacks: the views'
// shapes are what the backend expects, and it reports a positive rate.
TEST(ExpertSplit, ProbeHostFlopsRunsTheCpuBackend) {
  ThreadPool pool(2);
  CpuExpertBackend cpu(&pool);
  constexpr int64_t kEmbd = 64, kFf = 32, kExperts = 4;
  std::vector<float> up_gate(size_t(kExperts * kFf * kEmbd), 0.01f),
      down(size_t(kExperts * kEmbd * kFf), 0.02f);
  const auto view = testing::f32_stack_view;
  ExpertSplit split(kExperts, {}, &cpu);
  split.set_host_view(WeightUse::kExpertGate, view(up_gate, kFf, kEmbd));
  split.set_host_view(WeightUse::kExpertUp, view(up_gate, kFf, kEmbd));
  split.set_host_view(WeightUse::kExpertDown, view(down, kEmbd, kFf));
  auto flops = split.probe_host_flops(0, 8);
  ASSERT_TRUE(flops.is_ok()) << flops.status().to_string();
  EXPECT_GT(*flops, 0.0);
}

}  // namespace
}  // namespace moeserve::backend
