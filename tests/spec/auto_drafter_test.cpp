// --spec auto with a draft model: each step goes to the source with the
// better record for this request, learnt from the tokens that followed its
// proposals; the draft model stays fed with features whichever drafts.
#include "spec/auto_drafter.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace moeserve::spec {
namespace {

// A draft model stand-in: drafts the reference continuation, `right` tokens
// of it then a wrong one; counts its calls and the feature rows it was handed.
class FakeModel : public runtime::Drafter {
 public:
  FakeModel(std::vector<int32_t> reference, int right) : reference_(std::move(reference)), right_(right) {}
  void draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
             runtime::DraftTree& out) override {
    ++calls;
    out.clear();
    int32_t parent = -1;
    for (int64_t i = 0; i < budget.max_depth && context.size() + size_t(i) < reference_.size(); ++i) {
      const int32_t t = reference_[context.size() + size_t(i)];
      parent = out.add(i < right_ ? t : t + 1, parent);
    }
  }
  std::span<const int32_t> feature_layers() const override { return layers_; }
  void observe_features(int64_t, std::span<const float>, int64_t n) override { rows += n; }
  void set_right(int right) { right_ = right; }
  int64_t calls = 0, rows = 0;

 private:
  std::vector<int32_t> reference_;
  int right_;
  std::vector<int32_t> layers_{0};
};

// Runs the verify loop greedily against `reference` from `start` tokens:
// each step keeps the draft's nodes that match, plus one token.
int64_t run(AutoDrafter& d, const std::vector<int32_t>& reference, size_t start, int steps) {
  size_t pos = start;
  int64_t tokens = 0;
  for (int s = 0; s < steps && pos + 1 < reference.size(); ++s) {
    runtime::DraftTree t;
    d.draft(std::span<const int32_t>(reference).first(pos), {.max_nodes = 6, .max_depth = 6}, t);
    int32_t node = -1;
    size_t kept = 0;
    while (pos + kept < reference.size()) {
      node = t.child(node, reference[pos + kept]);
      if (node < 0) break;
      ++kept;
    }
    pos += kept + 1;
    tokens += int64_t(kept) + 1;
  }
  return tokens;
}

TEST(AutoDrafter, FollowsTheSourceThatKeepsMore) {
  // Text that repeats (n-gram lookup finds matches), whose repeats diverge.
  std::vector<int32_t> ref;
  for (int rep = 0; rep < 40; ++rep) {
    for (int i = 0; i < 6; ++i) ref.push_back(100 + i);
    ref.push_back(200 + rep);  // a new token after each repeat
  }
  // The model knows the text well (5 right per proposal): it should win.
  auto model = std::make_unique<FakeModel>(ref, 5);
  FakeModel* m = model.get();
  AutoDrafter good(std::make_unique<NgramDrafter>(1, 4), std::move(model));
  run(good, ref, 8, 60);
  EXPECT_GT(good.kept_per_step(AutoDrafter::kModel), good.kept_per_step(AutoDrafter::kNgram));
  EXPECT_GT(good.steps(AutoDrafter::kModel), good.steps(AutoDrafter::kNgram));
  EXPECT_GT(m->calls, 0);
  // A model that is always wrong at once loses to the lookup wherever the
  // lookup proposes: it drafts only where the lookup has nothing (after each
  // new token) and on the exploring 16th contested step.
  auto bad_model = std::make_unique<FakeModel>(ref, 0);
  AutoDrafter bad(std::make_unique<NgramDrafter>(1, 4), std::move(bad_model));
  const int64_t tokens = run(bad, ref, 8, 60);
  EXPECT_LT(bad.kept_per_step(AutoDrafter::kModel), 0.5);
  EXPECT_GT(bad.kept_per_step(AutoDrafter::kNgram), 2.0);
  const int64_t steps = bad.steps(AutoDrafter::kNgram) + bad.steps(AutoDrafter::kModel);
  EXPECT_GT(tokens, 2 * steps) << "the lookup's steps keep several tokens each";
  // Features go to the model whichever source drafts.
  bad.observe_features(0, std::vector<float>(3), 3);
  EXPECT_EQ(bad.feature_layers().size(), 1u);
}

// A model that keeps nothing on text the lookup cannot predict (no token
// repeats) costs a forward a step for nothing: it is benched after a few
// steps, probes ever more rarely, wants no features between probes, and
// comes back at full rate once a probe finds it keeping tokens again.
TEST(AutoDrafter, BenchesADraftModelThatKeepsNothingAndProbesIt) {
  std::vector<int32_t> ref(2000);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = int32_t(1000 + i);  // nothing repeats
  auto model = std::make_unique<FakeModel>(ref, 0);
  FakeModel* m = model.get();
  AutoDrafter d(std::make_unique<NgramDrafter>(1, 4), std::move(model));
  EXPECT_TRUE(d.wants_features());
  run(d, ref, 8, 300);
  EXPECT_TRUE(d.model_benched());
  // 3 trials, then probes after 16, 32, 64 and 128 skipped steps.
  EXPECT_LE(m->calls, 3 + 4 + 1);
  EXPECT_GE(m->calls, 3 + 3);
  int wanted = 0;
  for (int s = 0; s < 100; ++s) {
    wanted += d.wants_features() ? 1 : 0;
    run(d, ref, 8 + size_t(300 + s), 1);
  }
  EXPECT_LE(wanted, 20) << "features only in the lead before a probe";
  // The model starts keeping 5 tokens a proposal: the next probe unbenches it.
  m->set_right(5);
  const int64_t before = m->calls;
  run(d, ref, 500, 400);
  EXPECT_FALSE(d.model_benched());
  EXPECT_GT(m->calls - before, 50) << "back to drafting every step";
  EXPECT_TRUE(d.wants_features());
  d.reset();
  EXPECT_FALSE(d.model_benched());
}

// Each source drafts within its own budget (DraftBudget::source_nodes, the
// policy's length for it): a model the policy keeps off is not called where
// the lookup has nothing (no draft then), nor does it contest the lookup; a
// lookup kept off leaves the step to the model; a shorter budget is kept.
TEST(AutoDrafter, EachSourceDraftsWithinItsOwnBudget) {
  std::vector<int32_t> ref(400);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = int32_t(1000 + i % 50);  // repeats every 50
  auto model = std::make_unique<FakeModel>(ref, 6);
  FakeModel* m = model.get();
  AutoDrafter d(std::make_unique<NgramDrafter>(1, 4), std::move(model));
  const std::span<const int32_t> fresh = std::span<const int32_t>(ref).first(20);    // nothing to look up
  const std::span<const int32_t> repeat = std::span<const int32_t>(ref).first(120);  // the lookup finds it
  runtime::DraftTree t;
  runtime::DraftBudget lookup_only{.max_nodes = 6, .max_depth = 6, .source_nodes = {6, 0}};
  d.draft(fresh, lookup_only, t);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(m->calls, 0);
  for (int i = 0; i < 40; ++i) {
    d.draft(repeat, lookup_only, t);
    EXPECT_EQ(d.last_source(), AutoDrafter::kNgram);
    EXPECT_FALSE(t.empty());
  }
  EXPECT_EQ(m->calls, 0) << "the model never contests a lookup while the policy keeps it off";
  runtime::DraftBudget model_only{.max_nodes = 6, .max_depth = 6, .source_nodes = {0, 3}};
  d.draft(repeat, model_only, t);
  EXPECT_EQ(d.last_source(), AutoDrafter::kModel);
  EXPECT_EQ(m->calls, 1);
  EXPECT_EQ(t.size(), 3) << "the model's own budget";
  runtime::DraftBudget short_lookup{.max_nodes = 6, .max_depth = 6, .source_nodes = {2, 0}};
  d.draft(repeat, short_lookup, t);
  EXPECT_EQ(d.last_source(), AutoDrafter::kNgram);
  EXPECT_EQ(t.size(), 2);
}

// Requests pass on what they learnt: the next request's drafter starts
// with the model benched (no fresh trials, each a draft and a verify), with
// the probe interval reached; a drafter without the shared record starts
// afresh; reset() between sequences keeps the bench too.
TEST(AutoDrafter, TheNextRequestStartsFromWhatEarlierOnesLearnt) {
  std::vector<int32_t> ref(2000);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = int32_t(1000 + i);
  auto record = std::make_shared<DraftModelRecord>();
  {
    AutoDrafter first(std::make_unique<NgramDrafter>(1, 4), std::make_unique<FakeModel>(ref, 0), record);
    run(first, ref, 8, 100);
    EXPECT_TRUE(first.model_benched());
  }
  EXPECT_LT(record->get().kept, AutoDrafter::kBenchBelow);
  EXPECT_GE(record->get().probe_every, 2 * AutoDrafter::kProbeEvery);
  auto model = std::make_unique<FakeModel>(ref, 0);
  FakeModel* m = model.get();
  AutoDrafter next(std::make_unique<NgramDrafter>(1, 4), std::move(model), record);
  EXPECT_TRUE(next.model_benched());
  EXPECT_FALSE(next.wants_features());
  run(next, ref, 8, 20);
  EXPECT_EQ(m->calls, 0) << "no trials: the first probe comes after the carried interval";
  next.reset();
  EXPECT_TRUE(next.model_benched());
  AutoDrafter fresh(std::make_unique<NgramDrafter>(1, 4), std::make_unique<FakeModel>(ref, 0));
  EXPECT_FALSE(fresh.model_benched());
}

}  // namespace
}  // namespace moeserve::spec
