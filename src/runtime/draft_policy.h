// How much to draft: the measured cost of a forward by its row count, and
// per sequence the draft length that gives the most tokens per second —
// for each draft source apart (--spec auto's n-gram lookup and its draft
// model) — with the acceptance new requests start from.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace moeserve::runtime {

// A forward's wall time by its row count, learned as the engine runs
// (exponential averages per row count), so the draft policy can weigh a
// verify of n rows against a one-row decode step on this machine and
// placement: with cold experts on the CPU, more rows select more experts
// and a verify costs far more than on a GPU.
class StepCostModel {
 public:
  static constexpr int64_t kMaxRows = 128;
  // Samples of a row count taken as its warm-up: the fastest one counts.
  static constexpr int32_t kWarmUpSamples = 3;
  void record(int64_t rows, double seconds);
  // Seconds for `rows`: interpolated between measured counts, extended
  // along the last two past them (0 when nothing was measured yet).
  double estimate(int64_t rows) const;
  bool measured(int64_t rows) const;

 private:
  std::vector<double> seconds_ = std::vector<double>(kMaxRows + 1, 0.0);
  std::vector<int32_t> samples_ = std::vector<int32_t>(kMaxRows + 1, 0);
};

// Per sequence: how many tokens to draft this step. Keeps the measured
// rate at which draft tokens are accepted and picks the draft length with
// the most expected tokens per second — E(n) = (1 - a^(n+1)) / (1 - a)
// tokens for cost(rows + n) + the draft's own time seconds — against plain
// decoding's 1 token for cost(rows). When no length beats plain decoding
// it drafts nothing, and probes again with a short draft now and then
// (less often while probes keep missing, and never so often that the
// probes' drafts and extra verify rows take more than 2% of plain
// decoding's time), so a prompt whose drafts start to hit gets them back.
//
// A drafter with two sources (--spec auto: source 0 the free n-gram lookup,
// source 1 a draft model; Drafter::sources) has each one decided apart:
// its own acceptance, draft time, probes, and the length it may draft this
// step (chosen(s), which the drafter receives as DraftBudget::source_nodes).
// So a draft model's misses and forward time do not talk the policy out of
// the lookup's cheap hits, and the lookup's record does not send the model
// drafting where its own record says it does not pay.
class DraftLengthPolicy {
 public:
  static constexpr int kSources = 2;
  // `prior`: the per-token acceptance to start from (what earlier requests
  // measured; kPriorAcceptance without any).
  static constexpr double kPriorAcceptance = 0.6;
  explicit DraftLengthPolicy(int max_draft = 8, double prior = kPriorAcceptance, int sources = 1)
      : max_draft_(max_draft), n_sources_(std::clamp(sources, 1, kSources)) {
    for (Source& s : sources_) s.acceptance = prior;
  }
  int sources() const { return n_sources_; }
  // base_rows: the step's rows without this draft; limit: what fits
  // (context, max_tokens left, the step's row budget). Returns the most
  // nodes any source may draft (0: no draft this step).
  int64_t choose(const StepCostModel& cost, int64_t base_rows, int64_t limit);
  // What the last choose() allows `source` (0: it does not draft this step).
  int64_t chosen(int source) const { return sources_[clamp_source(source)].chosen; }
  // After a verify of `drafted` tokens of which `accepted` were kept, from
  // `source` (0 for single-source drafters).
  void observe(int64_t drafted, int64_t accepted, int source = 0);
  // The time a draft took (a draft model's forward: the price of a step
  // with a draft on top of its verify rows; n-gram lookup's is ~0). As a
  // forward's cost (StepCostModel), the first kWarmUpDrafts samples keep the
  // fastest: a process's first draft pays one-time set-up (CUDA graph
  // capture, workspaces growing), 4x its steady time on the tiny CPU draft.
  void observe_draft_time(double seconds, int source = 0);
  static constexpr int32_t kWarmUpDrafts = 3;
  double draft_seconds(int source = 0) const { return sources_[clamp_source(source)].draft_seconds; }
  // Drafts timed so far (up to kWarmUpDrafts: past it the time is settled).
  int32_t draft_samples(int source = 0) const { return sources_[clamp_source(source)].draft_samples; }
  // A draft time from earlier requests, with how many drafts it rests on.
  void set_draft_time(double seconds, int32_t samples, int source = 0);
  double acceptance(int source = 0) const { return sources_[clamp_source(source)].acceptance; }
  // Whether `source` drafted in this policy's request (or a prior's).
  bool source_used(int source) const { return sources_[clamp_source(source)].timed; }
  void set_acceptance(double a, int source) { sources_[clamp_source(source)].acceptance = a; }
  // Steps between `source`'s probes while it is off (AcceptancePrior
  // carries it to the next request; 0 or less keeps the default).
  int64_t probe_every(int source = 0) const { return sources_[clamp_source(source)].probe_every; }
  void set_probe_every(int64_t steps, int source = 0) {
    if (steps > 0)
      sources_[clamp_source(source)].probe_every = std::clamp(steps, kProbeEvery, kProbeEveryMax);
  }
  // Whether observe() has seen a verify of `source` (the estimate is a measurement).
  bool measured(int source = 0) const { return sources_[clamp_source(source)].observed; }
  // Whether this step's forward should capture the target's features for
  // the source that reads them (DFlash; Drafter::feature_source), asked
  // after choose(): while that source drafts, and from `lead` steps before
  // its next probe, so the probe drafts from recent rows. Off in between:
  // the capture (a copy and a download in every forward) is part of what a
  // draft model costs, and plain decoding must not pay it while the draft
  // is not used. The draft's context then skips those rows. (The lead is
  // at most half the probe interval, so the capture pauses at least half
  // the time while the source is off.)
  bool wants_features(int64_t lead, int source = 0) const {
    const Source& s = sources_[clamp_source(source)];
    return s.idle_steps == 0 || s.idle_steps + std::min(lead, s.probe_every / 2) >= s.probe_every;
  }
  // The lead runtimes use: a DFlash block's worth of rows before a probe.
  static constexpr int64_t kFeatureLead = 16;
  // Tokens a probe drafts: 2 for a free source (the lookup); more for one
  // whose draft costs half a step or more (a model), whose forward is paid
  // anyway and proposes a whole block, so that one probe tells its
  // acceptance (observe() weighs a sample by its length) where two tokens
  // told little: a model whose drafts would pay came back only after many
  // probes, many requests later. Only where 8 verify rows cost at most a
  // step more than one: with cold experts on the CPU each row costs about
  // a step, and such probes would break the probes' 2% share.
  static constexpr int64_t kProbeDraft = 2, kCostlyProbeDraft = 8;

 private:
  // Steps between probes while a source is off: doubles after a probe that
  // kept nothing (up to kProbeEveryMax), back to kProbeEvery once drafting
  // pays again — a prompt that never repeats costs ever fewer probes.
  static constexpr int64_t kProbeEvery = 16, kProbeEveryMax = 256;
  static constexpr double kProbeShare = 0.02;
  struct Source {
    double acceptance = kPriorAcceptance;
    bool observed = false;
    double draft_seconds = 0.0;  // moving average of observe_draft_time
    int32_t draft_samples = 0;   // capped at kWarmUpDrafts
    bool timed = false;
    int64_t idle_steps = 0;  // steps since it last drafted
    int64_t probe_every = kProbeEvery;
    bool probing = false;  // the last choose() gave it a probe
    int64_t chosen = 0;    // the last choose()'s nodes for it
  };
  static int clamp_source(int s) { return s == 1 ? 1 : 0; }
  // What a draft of `s` is taken to cost: its measured time once settled;
  // before that at most a decode step (`plain`), so that a slow first
  // draft (set-up) does not turn the source off for good — off, it would
  // draft only in rare probes and its time would never be measured again.
  static double draft_cost(const Source& s, double plain);
  // The best draft length with source `s`'s estimates and its rate.
  std::pair<int64_t, double> best_length(const Source& s, const StepCostModel& cost, int64_t base_rows,
                                         int64_t limit) const;
  // choose() for one source: the length that pays, a probe, or 0.
  int64_t choose_source(Source& s, const StepCostModel& cost, int64_t base_rows, int64_t limit, double plain);

  int max_draft_;
  int n_sources_;
  Source sources_[kSources];
};

// The acceptance and draft time new requests start from: averages over the
// requests that measured them, so a stream of prompts whose drafts miss (or
// a draft model too slow to pay) stops paying for an optimistic start on
// each (a probe still finds a prompt that hits). Kept per speculative mode
// by the runtimes (source 0 is the lookup in one mode and the draft model
// in another).
class AcceptancePrior {
 public:
  double value(int source = 0) const { return value_[source == 1 ? 1 : 0]; }
  // What a draft took in the requests that timed one (0: none did yet).
  double draft_seconds(int source = 0) const { return draft_seconds_[source == 1 ? 1 : 0]; }
  void add(const DraftLengthPolicy& finished);
  // A new request's policy: earlier requests' acceptance, draft time and
  // probe intervals (a stream of prompts whose probes keep missing probes
  // ever less often, across requests too).
  DraftLengthPolicy policy(int max_draft, int sources = 1) const;

 private:
  double value_[DraftLengthPolicy::kSources] = {DraftLengthPolicy::kPriorAcceptance,
                                                DraftLengthPolicy::kPriorAcceptance};
  double draft_seconds_[DraftLengthPolicy::kSources] = {0.0, 0.0};
  bool timed_[DraftLengthPolicy::kSources] = {false, false};
  int32_t draft_samples_[DraftLengthPolicy::kSources] = {0, 0};  // the most any request timed
  int64_t probe_every_[DraftLengthPolicy::kSources] = {0, 0};    // the last finished request's (0: none yet)
};

}  // namespace moeserve::runtime
