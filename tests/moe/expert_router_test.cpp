// ExpertRouter (backend/expert_router.h): a batch's jobs are split between
// the remote executor (the experts it owns in that layer) and the local one;
// whatever the remote answers kUnavailable for, at start or at finish, is
// computed locally with the same result; other errors are passed on.
#include "backend/expert_router.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace moeserve::backend {
namespace {

// Expert e maps row x to x * 10 + e (every column); records the experts it computed.
class FakeExperts final : public ExpertBackend {
 public:
  Status compute(const ExpertBatch& batch) override {
    if (fail_compute) return Status(StatusCode::kUnavailable, "gone");
    for (const ExpertJob& j : batch.jobs) {
      seen.insert(j.expert);
      for (int64_t i = 0; i < j.n_tokens * batch.n_embd; ++i) j.y[i] = j.x[i] * 10.0f + float(j.expert);
    }
    return Status::ok();
  }
  Status start(const ExpertBatch& batch) override {
    starts += 1;
    if (fail_start.code() != StatusCode::kOk) return fail_start;
    return compute(batch);
  }
  Status finish() override {
    finishes += 1;
    return fail_finish;
  }
  std::set<int32_t> seen;
  int starts = 0, finishes = 0;
  bool fail_compute = false;
  Status fail_start = Status::ok(), fail_finish = Status::ok();
};

struct Batch {
  static constexpr int64_t kEmbd = 2;
  Batch() {
    for (int32_t e : {0, 1, 2, 3}) {
      x.push_back({float(e), float(e) + 0.5f});
      y.push_back({-1.0f, -1.0f});
    }
    for (int32_t e = 0; e < 4; ++e) jobs.push_back({e, x[size_t(e)].data(), 1, y[size_t(e)].data()});
    batch.layer = 1, batch.n_embd = kEmbd, batch.jobs = jobs;
  }
  void expect_all_computed() const {
    for (int32_t e = 0; e < 4; ++e) {
      EXPECT_EQ(y[size_t(e)][0], float(e) * 10.0f + float(e)) << e;
      EXPECT_EQ(y[size_t(e)][1], (float(e) + 0.5f) * 10.0f + float(e)) << e;
    }
  }
  std::vector<std::vector<float>> x, y;
  std::vector<ExpertJob> jobs;
  ExpertBatch batch;
};

// The remote owns experts 1 and 3 of layer 1 (and expert 0 of layer 0 only).
const std::vector<std::vector<int32_t>> kOwned = {{0}, {1, 3, 99, -1}};

TEST(ExpertRouter, SplitsTheJobsByOwner) {
  FakeExperts remote, local;
  ExpertRouter router(&remote, &local, kOwned, 4);
  EXPECT_TRUE(router.owns(1, 3));
  EXPECT_FALSE(router.owns(1, 0));
  EXPECT_FALSE(router.owns(2, 1));  // a layer without a list
  Batch b;
  ASSERT_TRUE(router.compute(b.batch).is_ok());
  b.expect_all_computed();
  EXPECT_EQ(remote.seen, (std::set<int32_t>{1, 3}));
  EXPECT_EQ(local.seen, (std::set<int32_t>{0, 2}));
  EXPECT_EQ(remote.starts, 1);
  EXPECT_EQ(remote.finishes, 1);
  EXPECT_EQ(router.fallbacks(), 0);
}

TEST(ExpertRouter, ComputesLocallyWhatTheRemoteCannot) {
  for (int where = 0; where < 2; ++where) {
    FakeExperts remote, local;
    (where == 0 ? remote.fail_start : remote.fail_finish) = Status(StatusCode::kUnavailable, "worker died");
    ExpertRouter router(&remote, &local, kOwned, 4);
    Batch b;
    ASSERT_TRUE(router.compute(b.batch).is_ok()) << where;
    b.expect_all_computed();
    EXPECT_EQ(local.seen, (std::set<int32_t>{0, 1, 2, 3})) << where;
    EXPECT_EQ(remote.finishes, 1) << "every start is finished, whatever it said";
    EXPECT_EQ(router.fallbacks(), 1);
  }
}

TEST(ExpertRouter, PassesOtherErrorsOn) {
  FakeExperts remote, local;
  remote.fail_finish = Status(StatusCode::kInvalidArgument, "required worker gone");
  ExpertRouter router(&remote, &local, kOwned, 4);
  Batch b;
  const Status st = router.compute(b.batch);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(router.fallbacks(), 0);
}

TEST(ExpertRouter, WithoutRemoteJobsTheRemoteIsNotCalled) {
  FakeExperts remote, local;
  ExpertRouter router(&remote, &local, kOwned, 4);
  Batch b;
  b.jobs = {b.jobs[0], b.jobs[2]};
  b.batch.jobs = b.jobs;
  ASSERT_TRUE(router.compute(b.batch).is_ok());
  EXPECT_EQ(remote.starts, 0);
  EXPECT_EQ(remote.finishes, 0);
  EXPECT_EQ(local.seen, (std::set<int32_t>{0, 2}));
}

}  // namespace
}  // namespace moeserve::backend
