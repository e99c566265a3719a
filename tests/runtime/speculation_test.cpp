// The target side of speculative decoding: verifying a drafted token keeps
// the sampling distribution (chi-square over many draws), the step cost
// model and the draft-length policy, and the rollback of a recurrent state
// (after accepting k of n drafted tokens the Gated DeltaNet state equals
// plain decoding's, bit for bit on the CPU).
#include "runtime/speculation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "runtime/generator.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "test_device.h"

namespace moeserve::runtime {
namespace {

// Sampling over every token (no top-k, top-p or min-p) at a temperature.
SamplerOptions unfiltered(float temperature, uint64_t seed) {
  SamplerOptions so;
  so.temperature = temperature;
  so.top_k = 0;
  so.top_p = 1.0f;
  so.min_p = 0.0f;
  so.seed = seed;
  return so;
}

// Draws with a fixed draft token must follow the sampler's distribution:
// P(x) = p(d)[x = d] + (1 - p(d)) p(x) / (1 - p(d)) for x != d.
void expect_distribution_kept(const SamplerOptions& so, int32_t draft) {
  std::vector<float> logits = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 3.0f};
  const std::vector<int32_t> history = {1, 1, 2};
  Sampler reference(so);
  const std::vector<TokenProb> dist = reference.distribution(logits, history);
  Sampler s(so);
  const int kDraws = 60000;
  std::map<int32_t, int> seen;
  int hits = 0;
  for (int i = 0; i < kDraws; ++i) {
    bool hit = false;
    const int32_t t = s.sample_against_draft(logits, history, draft, &hit);
    if (hit) {
      ++hits;
      ASSERT_EQ(t, draft);
    } else {
      ASSERT_NE(t, draft) << "a rejected draft must not come back";
    }
    ++seen[t];
  }
  double chi2 = 0.0;
  int used = 0;
  for (const TokenProb& tp : dist) {
    const double expected = double(tp.p) * kDraws;
    if (expected < 5.0) continue;
    const double diff = seen[tp.id] - expected;
    chi2 += diff * diff / expected;
    ++used;
  }
  for (const auto& [id, count] : seen) {
    bool in = false;
    for (const TokenProb& tp : dist) in = in || tp.id == id;
    EXPECT_TRUE(in) << "token " << id << " is outside the distribution";
  }
  // 99.9% quantile of chi-square with up to 7 degrees of freedom: 24.3.
  EXPECT_LT(chi2, 24.3) << "over " << used << " tokens";
  double p_draft = 0.0;
  for (const TokenProb& tp : dist) p_draft += tp.id == draft ? tp.p : 0.0;
  EXPECT_NEAR(double(hits) / kDraws, p_draft, 0.015);
}

TEST(SampleAgainstDraft, KeepsTheDistribution) {
  SamplerOptions so = unfiltered(0.9f, 7);
  expect_distribution_kept(so, 0);  // a likely draft
  expect_distribution_kept(so, 5);  // an unlikely one
  so.repeat_penalty = 1.3f;         // penalties and filters change the distribution: still kept
  so.top_k = 5;
  expect_distribution_kept(so, 1);
  expect_distribution_kept(so, 6);  // outside the top-k: never accepted
}

TEST(SampleAgainstDraft, GreedyAcceptsTheArgMaxOnly) {
  SamplerOptions so;
  so.temperature = 0.0f;
  Sampler s(so);
  const std::vector<float> logits = {0.1f, 0.9f, 0.3f};
  bool hit = false;
  EXPECT_EQ(s.sample_against_draft(logits, {}, 1, &hit), 1);
  EXPECT_TRUE(hit);
  EXPECT_EQ(s.sample_against_draft(logits, {}, 2, &hit), 1);
  EXPECT_FALSE(hit);
}

TEST(StepCostModel, InterpolatesAndExtrapolatesAlongTheLastTwo) {
  StepCostModel c;
  EXPECT_EQ(c.estimate(4), 0.0);
  c.record(1, 0.010);
  c.record(5, 0.014);
  EXPECT_NEAR(c.estimate(3), 0.012, 1e-9);
  EXPECT_NEAR(c.estimate(10), 0.019, 1e-9);    // the line through 1 and 5, past the last measurement
  EXPECT_NEAR(c.estimate(0), 0.010, 1e-9);     // clamped to one row
  c.record(0, 1.0);                            // ignored
  c.record(StepCostModel::kMaxRows + 1, 1.0);  // ignored
  EXPECT_NEAR(c.estimate(1), 0.010, 1e-12);
}

// A GPU's first forwards of a shape run eagerly and then capture its graph
// (slower than a replay): the estimate keeps the fastest of them, and a
// later one-off (a recapture) moves it at most as far as twice the estimate.
TEST(StepCostModel, WarmUpKeepsTheFastestAndOneOffsMoveItLittle) {
  StepCostModel c;
  c.record(2, 0.0020);  // eager
  c.record(2, 0.0090);  // capture + instantiation
  c.record(2, 0.0012);  // replay
  EXPECT_NEAR(c.estimate(2), 0.0012, 1e-12);
  c.record(2, 0.0014);  // steady: averaged with the warm-up's best
  EXPECT_NEAR(c.estimate(2), 0.0013, 1e-12);
  for (int i = 0; i < 20; ++i) c.record(2, 0.0013);
  c.record(2, 0.0500);  // a recapture: clamped to twice the estimate, then weighted 1/8
  EXPECT_NEAR(c.estimate(2), 0.0013 + 0.125 * 0.0013, 1e-9);
  for (int i = 0; i < 40; ++i) c.record(2, 0.0040);  // a machine that really slowed down
  EXPECT_NEAR(c.estimate(2), 0.0040, 1e-4);
}

TEST(DraftLengthPolicy, DraftsWhenCheapAndStopsWhenDraftsMiss) {
  StepCostModel flat;  // a GPU-like machine: rows cost almost nothing
  for (int r = 1; r <= 17; ++r) flat.record(r, 0.010 + 0.0001 * r);
  DraftLengthPolicy p(8);
  EXPECT_GE(p.choose(flat, 1, 8), 6);
  for (int i = 0; i < 20; ++i) p.observe(8, 0);  // every draft misses at once
  EXPECT_LT(p.acceptance(), 0.05);
  int64_t drafted = 0;
  for (int i = 0; i < 32; ++i) drafted += p.choose(flat, 1, 8);
  EXPECT_LE(drafted, 2 * 2) << "only the periodic probes may draft";
  // Probes that miss come less often: 16 steps, then 32, 64, ...
  int64_t probes = 0;
  for (int i = 0; i < 16 + 32 + 64; ++i) {
    if (const int64_t n = p.choose(flat, 1, 8); n > 0) {
      ++probes;
      p.observe(n, 0);
    }
  }
  EXPECT_EQ(probes, 3);
  for (int i = 0; i < 20; ++i) p.observe(8, 8);  // drafts hit again
  EXPECT_GT(p.choose(flat, 1, 8), 4);

  StepCostModel steep;  // a CPU-like machine: each row costs as much as the first
  for (int r = 1; r <= 17; ++r) steep.record(r, 0.010 * r);
  DraftLengthPolicy q(8);
  for (int i = 0; i < 20; ++i) q.observe(8, 4);  // about half the drafts kept
  EXPECT_EQ(q.choose(steep, 1, 8), 0) << "a verify that costs its rows never pays";
  EXPECT_EQ(q.choose(flat, 1, 0), 0) << "no room: no draft";
}

TEST(DraftLengthPolicy, ADraftModelsOwnTimeCounts) {
  StepCostModel flat;  // verify rows almost free
  for (int r = 1; r <= 17; ++r) flat.record(r, 0.010 + 0.0001 * r);
  DraftLengthPolicy p(8);
  for (int i = 0; i < 20; ++i) p.observe(8, 4);  // 4 of 8 then a miss: a = 0.8, E(8) = 4.3 tokens
  EXPECT_GT(p.choose(flat, 1, 8), 0);
  // A draft that costs five decode steps cannot pay for 4.3 tokens.
  for (int i = 0; i < 8; ++i) p.observe_draft_time(0.050);
  EXPECT_NEAR(p.draft_seconds(), 0.050, 1e-12);
  EXPECT_EQ(p.choose(flat, 1, 8), 0);
  // A cheap one does.
  for (int i = 0; i < 40; ++i) p.observe_draft_time(0.001);
  EXPECT_LT(p.draft_seconds(), 0.002);
  EXPECT_GT(p.choose(flat, 1, 8), 0);
}

// --spec auto: the lookup (source 0) keeps 4 of 8 for free while the draft
// model (source 1) keeps nothing at five steps a draft. Pooled, the model's
// misses and time would turn drafting off; kept apart, the lookup still
// drafts, and the prior carries both records to the next request.
TEST(DraftLengthPolicy, TwoSourcesKeepTheirOwnRecords) {
  StepCostModel flat;
  for (int r = 1; r <= 17; ++r) flat.record(r, 0.010 + 0.0001 * r);
  DraftLengthPolicy p(8, DraftLengthPolicy::kPriorAcceptance, 2);
  for (int i = 0; i < 20; ++i) {
    p.observe_draft_time(0.00001, 0);
    p.observe(8, 4, 0);
    p.observe_draft_time(0.050, 1);
    p.observe(8, 0, 1);
  }
  EXPECT_NEAR(p.acceptance(0), 0.8, 0.01);
  EXPECT_LT(p.acceptance(1), 0.05);
  EXPECT_NEAR(p.draft_seconds(1), 0.050, 1e-9);
  EXPECT_TRUE(p.source_used(1));
  EXPECT_GT(p.choose(flat, 1, 8), 4) << "the lookup's record pays";
  EXPECT_GT(p.chosen(0), 4);
  EXPECT_EQ(p.chosen(1), 0) << "the model's does not";
  AcceptancePrior prior;
  prior.add(p);
  EXPECT_NEAR(prior.value(0), 0.6 + 0.25 * (p.acceptance(0) - 0.6), 1e-9);
  EXPECT_LT(prior.value(1), 0.6);
  DraftLengthPolicy next = prior.policy(8, 2);
  EXPECT_NEAR(next.draft_seconds(1), 0.050, 1e-9);
  EXPECT_GT(next.choose(flat, 1, 8), 4);
  // A single-source drafter never consults source 1's optimistic start.
  DraftLengthPolicy single(8, 0.0);
  single.observe_draft_time(0.050);
  EXPECT_FALSE(single.source_used(1));
  EXPECT_EQ(single.choose(flat, 1, 8), 0);
}

// --spec auto where the lookup rarely finds anything: its record stays the
// optimistic prior, while the draft model's measured record does not pay.
// The model must not draft on the lookup's record (it did: the policy said
// "draft" and the drafter sent the model), only in its own probes; the
// lookup keeps its budget.
TEST(DraftLengthPolicy, EachSourceDraftsOnItsOwnRecord) {
  StepCostModel gpu;  // a 16-row verify costs 3 steps, as on the H200's trained target
  for (int r = 1; r <= 17; ++r) gpu.record(r, 0.00035 + 0.000045 * (r - 1));
  DraftLengthPolicy p(15, DraftLengthPolicy::kPriorAcceptance, 2);
  for (int i = 0; i < 20; ++i) {
    p.observe_draft_time(0.00035, 1);  // a draft forward: a decode step
    p.observe(15, 1, 1);               // keeps about one token of 15
  }
  int64_t model_steps = 0, lookup_steps = 0;
  for (int i = 0; i < 400; ++i) {
    p.choose(gpu, 1, 15);
    lookup_steps += p.chosen(0) > 0 ? 1 : 0;
    if (p.chosen(1) > 0) {
      ++model_steps;
      EXPECT_LE(p.chosen(1), 8) << "only a probe's tokens (a model's: a few of its block)";
      p.observe(p.chosen(1), 0, 1);
    }
  }
  EXPECT_EQ(lookup_steps, 400) << "the lookup's budget stands (it drafts where it finds a match)";
  EXPECT_LE(model_steps, 400 / 50 + 1) << "the model's probes: at most every 50 steps";
  EXPECT_GE(model_steps, 1);
  EXPECT_TRUE(p.wants_features(DraftLengthPolicy::kFeatureLead, 0));
  int wanted = 0;
  for (int i = 0; i < 200; ++i) {
    p.choose(gpu, 1, 15);
    wanted += p.wants_features(DraftLengthPolicy::kFeatureLead, 1) ? 1 : 0;
  }
  EXPECT_LE(wanted, 60) << "the model's features only before its probes";
  // A single-source policy never decides for a second source.
  DraftLengthPolicy single(8);
  single.choose(gpu, 1, 8);
  EXPECT_EQ(single.chosen(1), 0);
  EXPECT_GT(single.chosen(0), 0);
}

// A probe costs a draft: a draft model as slow as a decode step probes at
// most every 50 steps (2% of plain decoding's time), a free one every 16;
// the interval a request reached carries over to the next one.
TEST(DraftLengthPolicy, ProbesOfACostlyDraftAreRare) {
  StepCostModel flat;
  for (int r = 1; r <= 17; ++r) flat.record(r, 0.010 + 0.0001 * r);
  DraftLengthPolicy p(8, 0.0);
  p.observe_draft_time(0.010);  // one decode step
  int64_t first_probe = -1;
  for (int i = 0; i < 200 && first_probe < 0; ++i) {
    if (p.choose(flat, 1, 8) > 0) first_probe = i;
  }
  EXPECT_GE(first_probe, 49) << "a probe every 16 steps would cost 6% of the time";
  EXPECT_GE(p.probe_every(), 50);
  p.observe(2, 0);  // it missed: the next one is further still
  EXPECT_GE(p.probe_every(), 100);
  AcceptancePrior prior;
  prior.add(p);
  EXPECT_GE(prior.policy(8).probe_every(), 100);
  DraftLengthPolicy free_draft(8, 0.0);
  int64_t probes = 0;
  for (int i = 0; i < 48; ++i) probes += free_draft.choose(flat, 1, 8) > 0 ? 1 : 0;
  EXPECT_EQ(probes, 3) << "n-gram lookup costs nothing: a probe every 16 steps";
}

// A process's first draft pays set-up (graph capture, workspaces): on the
// H200's trained target it cost many steps while later ones cost about one.
// Taken as the draft's time, it turned a good draft model off for good: off,
// the model drafted only in probes spaced for that cost (none in a 128-token
// request), so its time was never measured again and the prior carried the
// set-up to every later request. Until three drafts are timed, the fastest
// counts and a draft is taken to cost at most a decode step.
TEST(DraftLengthPolicy, ASlowFirstDraftDoesNotTurnTheSourceOff) {
  StepCostModel gpu;  // a 16-row verify costs about 2 steps
  for (int r = 1; r <= 17; ++r) gpu.record(r, 0.00036 + 0.000026 * (r - 1));
  DraftLengthPolicy p(15, 0.85);
  p.observe_draft_time(0.020);  // the first draft: 55 steps of set-up
  EXPECT_EQ(p.draft_samples(), 1);
  EXPECT_GT(p.choose(gpu, 1, 15), 4) << "a draft keeping 85% pays at one step a draft";
  p.observe_draft_time(0.0003);
  p.observe_draft_time(0.0004);
  EXPECT_NEAR(p.draft_seconds(), 0.0003, 1e-12) << "the fastest of the first three";
  EXPECT_EQ(p.draft_samples(), DraftLengthPolicy::kWarmUpDrafts);
  EXPECT_GT(p.choose(gpu, 1, 15), 4);
  // Settled, the time follows the drafts: a slow draft model stops paying.
  for (int i = 0; i < 30; ++i) p.observe_draft_time(0.005);
  EXPECT_EQ(p.choose(gpu, 1, 15), 0);

  // The prior: a request that timed only its set-up draft hands on a bound,
  // a settled request's time replaces it, and a later set-up draft does not
  // undo the settled time.
  AcceptancePrior prior;
  DraftLengthPolicy first(15, 0.85);
  first.observe_draft_time(0.020);
  prior.add(first);
  DraftLengthPolicy second = prior.policy(15);
  second.set_acceptance(0.85, 0);  // as `first`'s (it drafted nothing it could observe)
  EXPECT_EQ(second.draft_samples(), 1);
  EXPECT_GT(second.choose(gpu, 1, 15), 4) << "one set-up draft does not carry over as the price";
  for (int i = 0; i < 3; ++i) second.observe_draft_time(0.0003);
  prior.add(second);
  EXPECT_NEAR(prior.draft_seconds(), 0.0003, 1e-12);
  DraftLengthPolicy third = prior.policy(15);
  EXPECT_EQ(third.draft_samples(), DraftLengthPolicy::kWarmUpDrafts);
  DraftLengthPolicy cold(15, 0.85);
  cold.observe_draft_time(0.020);
  prior.add(cold);
  EXPECT_NEAR(prior.draft_seconds(), 0.0003, 1e-12);
}

// A draft model that is off probes with a few tokens of its block, not two:
// its forward costs the same, and a probe that kept 8 of 8 moves its
// acceptance far enough that drafting resumes within a request or two (with
// 2-token probes, a good model starting from the 0.6 prior stayed off for
// the whole of a 128-token request).
TEST(DraftLengthPolicy, ACostlyDraftsProbeTellsItsAcceptance) {
  StepCostModel gpu;
  for (int r = 1; r <= 17; ++r) gpu.record(r, 0.00036 + 0.000026 * (r - 1));
  // The 0.6 prior.
  DraftLengthPolicy p(15);
  for (int i = 0; i < 3; ++i) p.observe_draft_time(0.00036);  // a draft forward: one step
  int64_t probes = 0, first_draft = -1;
  for (int i = 0; i < 400 && first_draft < 0; ++i) {
    const int64_t n = p.choose(gpu, 1, 15);
    if (n == 0) continue;
    if (n > DraftLengthPolicy::kCostlyProbeDraft) {
      first_draft = i;
      break;
    }
    EXPECT_EQ(n, DraftLengthPolicy::kCostlyProbeDraft) << "a probe: 8 tokens of the block";
    ++probes;
    p.observe(n, n);  // the probe kept all of them
  }
  EXPECT_GE(first_draft, 0) << "drafting resumed";
  EXPECT_LE(probes, 2);
  // Where each verify row costs a step (cold experts on the CPU), the
  // probe stays at two tokens.
  StepCostModel steep;
  for (int r = 1; r <= 17; ++r) steep.record(r, 0.010 * r);
  DraftLengthPolicy q(15, 0.0);
  for (int i = 0; i < 3; ++i) q.observe_draft_time(0.010);
  int64_t probe = 0;
  for (int i = 0; i < 400 && probe == 0; ++i) probe = q.choose(steep, 1, 15);
  EXPECT_EQ(probe, DraftLengthPolicy::kProbeDraft);
}

// A probe's verify rows count too: where each row costs as much as a step
// (cold experts on the CPU), a free lookup's 2-token probe costs 2 steps,
// so it comes at most every 100 steps, not every 16.
TEST(DraftLengthPolicy, ProbesWhoseVerifyIsCostlyAreRare) {
  StepCostModel steep;
  for (int r = 1; r <= 17; ++r) steep.record(r, 0.010 * r);
  DraftLengthPolicy p(8, 0.0);
  p.observe_draft_time(0.0);
  int64_t first_probe = -1;
  for (int i = 0; i < 300 && first_probe < 0; ++i) {
    if (p.choose(steep, 1, 8) > 0) first_probe = i;
  }
  EXPECT_GE(first_probe, 99) << "a probe every 16 steps would cost 12% of the time";
  EXPECT_GE(p.probe_every(), 100);
}

TEST(AcceptancePrior, FollowsFinishedRequestsThatMeasured) {
  AcceptancePrior prior;
  EXPECT_EQ(prior.value(), DraftLengthPolicy::kPriorAcceptance);
  DraftLengthPolicy unmeasured(8, prior.value());
  prior.add(unmeasured);  // drafted nothing: tells nothing
  EXPECT_EQ(prior.value(), DraftLengthPolicy::kPriorAcceptance);
  for (int r = 0; r < 8; ++r) {
    DraftLengthPolicy missing(8, prior.value());
    for (int i = 0; i < 4; ++i) missing.observe(8, 0);
    prior.add(missing);
  }
  EXPECT_LT(prior.value(), 0.1);
  // A request starting from that prior drafts nothing on a machine where rows cost.
  StepCostModel steep;
  for (int rows = 1; rows <= 9; ++rows) steep.record(rows, 0.001 * (1.0 + 0.5 * rows));
  DraftLengthPolicy next(8, prior.value());
  EXPECT_EQ(next.choose(steep, 1, 8), 0);
  // The draft time a finished request measured carries over too.
  AcceptancePrior timed;
  EXPECT_EQ(timed.draft_seconds(), 0.0);
  DraftLengthPolicy slow(8);
  slow.observe_draft_time(0.05);
  timed.add(slow);
  EXPECT_NEAR(timed.draft_seconds(), 0.05, 1e-12);
  EXPECT_NEAR(timed.policy(8).draft_seconds(), 0.05, 1e-12);
}

TEST(SpecConfig, ValidationNamesTheKnob) {
  SpecConfig c;
  c.mode = SpecMode::kNgram;
  EXPECT_TRUE(validate_spec_config(c).is_ok());
  c.max_draft = 0;
  EXPECT_NE(validate_spec_config(c).message().find("--spec-max"), std::string::npos);
  c.max_draft = 8;
  c.tree_nodes = -1;
  EXPECT_NE(validate_spec_config(c, "speculative").message().find("speculative.tree"), std::string::npos);
  c.tree_nodes = 0;
  c.ngram_min = 5;
  c.ngram_max = 3;
  EXPECT_FALSE(validate_spec_config(c).is_ok());
  EXPECT_FALSE(parse_spec_mode("fast").is_ok());
  EXPECT_EQ(parse_spec_mode("auto").value(), SpecMode::kAuto);
}

const std::string kHybridModel = std::string(MOESERVE_TEST_DATA_DIR) + "/models/qwen35moe-tiny.bf16.gguf";

std::vector<float> states_of(Sequence& seq) {
  auto snap = seq.kv().snapshot();
  EXPECT_TRUE(snap.is_ok());
  return snap.is_ok() ? snap->states : std::vector<float>{};
}

// After a verify of [pending, d1, d2, d3] that keeps d1 only, the state
// equals one-token decode steps of the same tokens: by snapshot + replay
// (the next step feeds [pending, d1] again before its own token), or, where
// the device runs draft trees, by taking the state kept after d1's row.
TEST(SpecSequence, RecurrentRollbackEqualsPlainDecoding) {
  auto model = Model::load(kHybridModel, {.n_threads = 2, .device = testing::test_device()});
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const std::vector<int32_t> prompt = (*model)->tokenizer().encode("def fib(n):\n    return");
  for (bool tree : {false, true}) {
    if (tree && !(*model)->tree_verify()) continue;
    SCOPED_TRACE(tree ? "draft tree" : "snapshot + replay");
    Generator plain(**model, 64), spec_gen(**model, 64);
    int32_t first = 0, spec_first = 0;
    ASSERT_TRUE(plain.prefill_greedy(prompt, 512, &first).is_ok());
    ASSERT_TRUE(spec_gen.prefill_greedy(prompt, 512, &spec_first).is_ok());
    ASSERT_EQ(first, spec_first);
    // Plain: first and its successors t1, t2, t3 one step at a time.
    std::vector<int32_t> plain_tokens = {first};
    std::vector<std::vector<float>> plain_states;  // after feeding first, t1, t2
    for (int i = 0; i < 3; ++i) {
      int32_t next = 0;
      ASSERT_TRUE(plain.decode_greedy(plain_tokens.back(), &next).is_ok());
      plain_tokens.push_back(next);
      plain_states.push_back(states_of(plain.sequence()));
    }
    Sequence& seq = spec_gen.sequence();
    SpecSequence sp;
    const int32_t wrong = (plain_tokens[2] + 1) % int32_t((*model)->info().n_vocab);
    DraftTree draft;
    draft.add(plain_tokens[1], -1);
    draft.add(wrong, 0);
    draft.add(5, 1);
    auto rows = sp.begin(seq, first, draft, tree);
    ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
    EXPECT_EQ(sp.tree_parents().empty(), !tree);
    std::vector<int32_t> greedy(4);
    ASSERT_TRUE(spec_gen.verify(*rows, 0, nullptr, greedy.data(), sp.tree_parents()).is_ok());
    EXPECT_EQ(greedy[0], plain_tokens[1]);
    EXPECT_EQ(greedy[1], plain_tokens[2]);
    SpecCounters counters;
    const int32_t kept[] = {0};
    ASSERT_TRUE(sp.commit(seq, kept, &counters).is_ok());
    if (tree) {
      // The path's state is the sequence's now: first and t1 fed.
      EXPECT_EQ(counters.replays, 0);
      EXPECT_EQ(counters.tree_steps, 1);
      EXPECT_EQ(seq.position(), int64_t(prompt.size()) + 2);
      const std::vector<float> s = states_of(seq);
      ASSERT_EQ(s.size(), plain_states[1].size());
      if (testing::test_device() == "cpu") {
        EXPECT_EQ(s, plain_states[1]) << "bit-equal on the CPU";
      }
    } else {
      EXPECT_EQ(counters.replays, 1);
      EXPECT_EQ(seq.position(), int64_t(prompt.size()));
      ASSERT_EQ(sp.replay().size(), 2u);
    }
    // The next step: t2 (after the replayed [first, t1] without a tree); no draft allowed while replaying.
    DraftTree ignored;
    ignored.add(99, -1);
    auto next_rows = sp.begin(seq, plain_tokens[2], tree ? DraftTree{} : ignored, tree);
    ASSERT_TRUE(next_rows.is_ok());
    if (!tree) {
      EXPECT_EQ(*next_rows, (std::vector<int32_t>{first, plain_tokens[1], plain_tokens[2]}));
    }
    std::vector<int32_t> g(1);
    ASSERT_TRUE(spec_gen.verify(*next_rows, int64_t(next_rows->size()) - 1, nullptr, g.data()).is_ok());
    EXPECT_EQ(g[0], plain_tokens[3]);
    ASSERT_TRUE(sp.commit(seq, {}, &counters).is_ok());
    EXPECT_EQ(seq.position(), plain.sequence().position());
    const std::vector<float> spec_state = states_of(seq);
    ASSERT_EQ(spec_state.size(), plain_states[2].size());
    if (testing::test_device() == "cpu") {
      EXPECT_EQ(spec_state, plain_states[2]) << "bit-equal on the CPU";
    } else {
      for (size_t i = 0; i < spec_state.size(); ++i)
        ASSERT_NEAR(spec_state[i], plain_states[2][i], 1e-4) << i;
    }
  }
}

TEST(DraftTree, ChainsTreesAndTheWalk) {
  DraftTree t;
  EXPECT_TRUE(t.is_chain());
  const int32_t a = t.add(10, -1), b = t.add(11, a), c = t.add(12, -1), d = t.add(13, c);
  EXPECT_FALSE(t.is_chain());
  EXPECT_EQ(t.depth(), 2);
  EXPECT_EQ(t.child(-1, 12), c);
  EXPECT_EQ(t.child(c, 11), -1);
  TreeWalk w(t);
  EXPECT_EQ(w.row(), 0);
  EXPECT_EQ(std::vector<int32_t>(w.candidates().begin(), w.candidates().end()),
            (std::vector<int32_t>{10, 12}));
  EXPECT_TRUE(w.advance(12));
  EXPECT_EQ(w.row(), 1 + c);
  EXPECT_TRUE(w.advance(13));
  EXPECT_FALSE(w.advance(1));
  EXPECT_EQ(std::vector<int32_t>(w.path().begin(), w.path().end()), (std::vector<int32_t>{c, d}));
  DraftTree main = t;
  main.keep_main_chain();
  EXPECT_TRUE(main.is_chain());
  EXPECT_EQ(main.tokens, (std::vector<int32_t>{10, 11}));
  (void)b;
  t.truncate(3);
  EXPECT_EQ(t.size(), 3);
}

TEST(SampleAgainstDrafts, SeveralCandidatesKeepTheDistribution) {
  const SamplerOptions so = unfiltered(1.0f, 3);
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, 1.5f, -1.0f};
  Sampler reference(so), s(so);
  const std::vector<TokenProb> dist = reference.distribution(logits, {});
  const std::vector<int32_t> drafts = {1, 3, 4};
  const int kDraws = 60000;
  std::map<int32_t, int> seen;
  for (int i = 0; i < kDraws; ++i) {
    int index = -1;
    const int32_t t = s.sample_against_drafts(logits, {}, drafts, &index);
    if (index >= 0) {
      ASSERT_EQ(t, drafts[size_t(index)]);
    } else {
      ASSERT_TRUE(t != 1 && t != 3 && t != 4) << "a refused draft came back";
    }
    ++seen[t];
  }
  double chi2 = 0.0;
  for (const TokenProb& tp : dist) {
    const double expected = double(tp.p) * kDraws;
    chi2 += (seen[tp.id] - expected) * (seen[tp.id] - expected) / expected;
  }
  EXPECT_LT(chi2, 18.5);  // 99.9% quantile with 4 degrees of freedom
}

}  // namespace
}  // namespace moeserve::runtime
