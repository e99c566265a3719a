#include "runtime/draft_policy.h"

#include <cmath>

namespace moeserve::runtime {

void StepCostModel::record(int64_t rows, double seconds) {
  if (rows < 1 || rows > kMaxRows || !(seconds >= 0.0)) return;
  double& s = seconds_[size_t(rows)];
  int32_t& n = samples_[size_t(rows)];
  if (n < kWarmUpSamples) {
    // A GPU runs a new shape eagerly, maybe twice (a workspace that grew
    // drops every recorded graph), then captures it, which costs more than
    // the forward: the fastest of these is the closest to what the shape
    // costs from then on.
    s = n == 0 ? seconds : std::min(s, seconds);
  } else {
    // Then an average: plain for the next samples, by 1/8 after, so the
    // model follows a machine whose speed drifts (other load, placement
    // swaps). One sample moves it at most as far as twice the estimate
    // would: a recapture (graphs dropped for a new request's buffers) is
    // a one-off, not the shape's cost.
    const int32_t steady = n - kWarmUpSamples;
    const double w = steady < 8 ? 1.0 / double(steady + 2) : 0.125;
    s += w * (std::min(seconds, 2.0 * s) - s);
  }
  n = std::min(n + 1, 1 << 20);
}

bool StepCostModel::measured(int64_t rows) const {
  return rows >= 1 && rows <= kMaxRows && samples_[size_t(rows)] > 0;
}

double StepCostModel::estimate(int64_t rows) const {
  rows = std::clamp<int64_t>(rows, 1, kMaxRows);
  if (measured(rows)) return seconds_[size_t(rows)];
  int64_t lo = rows - 1, hi = rows + 1;
  while (lo >= 1 && !measured(lo)) --lo;
  while (hi <= kMaxRows && !measured(hi)) ++hi;
  const bool has_lo = lo >= 1, has_hi = hi <= kMaxRows;
  if (has_lo && has_hi) {
    const double t = double(rows - lo) / double(hi - lo);
    return seconds_[size_t(lo)] + t * (seconds_[size_t(hi)] - seconds_[size_t(lo)]);
  }
  // Past the measured counts: the line through the two largest measured
  // counts (never falling), or flat from a single one. Optimistic on
  // purpose: a draft length is tried, then its cost is known — a policy
  // that guessed high would never try a longer draft and never learn.
  if (has_lo) {
    int64_t lo2 = lo - 1;
    while (lo2 >= 1 && !measured(lo2)) --lo2;
    if (lo2 < 1) return seconds_[size_t(lo)];
    const double slope = std::max(0.0, (seconds_[size_t(lo)] - seconds_[size_t(lo2)]) / double(lo - lo2));
    return seconds_[size_t(lo)] + slope * double(rows - lo);
  }
  if (has_hi) return seconds_[size_t(hi)];
  return 0.0;
}

std::pair<int64_t, double> DraftLengthPolicy::best_length(const Source& s, const StepCostModel& cost,
                                                          int64_t base_rows, int64_t limit) const {
  const double plain = cost.estimate(base_rows);
  const double a = std::clamp(s.acceptance, 0.0, 0.999);
  double best_rate = 0.0;
  int64_t best = 0;
  for (int64_t n = 1; n <= limit; ++n) {
    const double expected = (1.0 - std::pow(a, double(n + 1))) / (1.0 - a);
    double t = cost.estimate(base_rows + n);
    if (t <= 0.0) t = plain;
    t += draft_cost(s, plain);
    const double rate = expected / t;
    if (rate > best_rate) best_rate = rate, best = n;
  }
  return {best, best_rate};
}

int64_t DraftLengthPolicy::choose(const StepCostModel& cost, int64_t base_rows, int64_t limit) {
  // A probe the drafter found nothing for tells nothing.
  for (Source& s : sources_) s.probing = false, s.chosen = 0;
  limit = std::min<int64_t>(limit, max_draft_);
  if (limit <= 0) return 0;
  const double plain = cost.estimate(base_rows);
  if (plain <= 0.0) {  // nothing measured yet: try, and measure
    for (int i = 0; i < n_sources_; ++i) sources_[i].chosen = limit;
    return limit;
  }
  int64_t most = 0;
  for (int i = 0; i < n_sources_; ++i)
    most = std::max(most, choose_source(sources_[i], cost, base_rows, limit, plain));
  return most;
}

int64_t DraftLengthPolicy::choose_source(Source& s, const StepCostModel& cost, int64_t base_rows,
                                         int64_t limit, double plain) {
  auto [best, best_rate] = best_length(s, cost, base_rows, limit);
  // A draft must beat plain decoding by a margin: the estimates are noisy,
  // and a tie is better served by plain decoding's lower latency per token.
  if (best_rate <= 1.05 / plain) best = 0;
  if (best > 0) {
    s.idle_steps = 0;
    s.probe_every = kProbeEvery;
    s.chosen = best;
    return best;
  }
  // Off: probe now and then with a short draft, to notice when drafts start
  // to hit. A probe costs a draft and the verify of its rows on top of a
  // step: the interval keeps that share of plain decoding's time at most
  // kProbeShare (a DFlash draft as slow as a step probes every 50 steps or
  // more, further apart as its 8 rows cost more; n-gram's, ~free, every
  // kProbeEvery on a GPU, where two more rows cost little, but rarely where
  // they cost as much as a step each: cold experts on the CPU). A costly
  // draft probes with 8 tokens only where those rows cost at most a step
  // more (kCostlyProbeDraft).
  const double draft = draft_cost(s, plain);
  const bool rows_cheap = cost.estimate(base_rows + kCostlyProbeDraft) - plain <= plain;
  const int64_t probe_draft =
      std::min(limit, draft >= 0.5 * plain && rows_cheap ? kCostlyProbeDraft : kProbeDraft);
  const double probe_rows = std::max(0.0, cost.estimate(base_rows + probe_draft) - plain);
  const double steps_per_probe = (draft + probe_rows) / plain;
  const int64_t cost_floor = int64_t(std::ceil(steps_per_probe / kProbeShare));
  s.probe_every = std::clamp(std::max(s.probe_every, cost_floor), kProbeEvery, kProbeEveryMax);
  if (++s.idle_steps < s.probe_every) return 0;
  s.idle_steps = 0;
  s.probing = true;
  s.chosen = probe_draft;
  return s.chosen;
}

double DraftLengthPolicy::draft_cost(const Source& s, double plain) {
  return s.draft_samples >= kWarmUpDrafts ? s.draft_seconds : std::min(s.draft_seconds, plain);
}

void DraftLengthPolicy::observe_draft_time(double seconds, int source) {
  if (!(seconds >= 0.0)) return;
  Source& s = sources_[clamp_source(source)];
  if (s.draft_samples < kWarmUpDrafts) {
    s.draft_seconds = s.draft_samples == 0 ? seconds : std::min(s.draft_seconds, seconds);
    ++s.draft_samples;
  } else {
    s.draft_seconds += 0.25 * (seconds - s.draft_seconds);
  }
  s.timed = true;
}

void DraftLengthPolicy::set_draft_time(double seconds, int32_t samples, int source) {
  if (!(seconds >= 0.0) || samples <= 0) return;
  Source& s = sources_[clamp_source(source)];
  s.draft_seconds = seconds;
  s.draft_samples = std::min(samples, kWarmUpDrafts);
  s.timed = true;
}

void DraftLengthPolicy::observe(int64_t drafted, int64_t accepted, int source) {
  if (drafted <= 0) return;
  Source& s = sources_[clamp_source(source)];
  s.observed = true;
  if (s.probing) s.probe_every = accepted > 0 ? kProbeEvery : std::min(2 * s.probe_every, kProbeEveryMax);
  s.probing = false;
  // The per-token acceptance a of a chain that kept `accepted` of
  // `drafted`: each token is kept with probability a until the first miss;
  // estimate it as kept / (kept + misses), misses being 1 unless all were kept.
  const double misses = accepted < drafted ? 1.0 : 0.0;
  const double sample = double(accepted) / (double(accepted) + misses);
  const double w = std::min(1.0, 0.25 * double(drafted) / 4.0);
  s.acceptance += w * (sample - s.acceptance);
}

void AcceptancePrior::add(const DraftLengthPolicy& finished) {
  for (int s = 0; s < finished.sources(); ++s) {
    if (finished.measured(s)) value_[s] += 0.25 * (finished.acceptance(s) - value_[s]);
    const double t = finished.draft_seconds(s);
    const int32_t samples = finished.draft_samples(s);
    if (finished.source_used(s) && t >= 0.0) {
      // A settled time moves the prior by a quarter; an unsettled one (a
      // request with one or two drafts, the first of a process among them)
      // only while no settled one is known, and then as a bound from above.
      const bool settled = samples >= DraftLengthPolicy::kWarmUpDrafts;
      const bool prior_settled = draft_samples_[s] >= DraftLengthPolicy::kWarmUpDrafts;
      if (!timed_[s]) {
        draft_seconds_[s] = t;
      } else if (settled && prior_settled) {
        draft_seconds_[s] += 0.25 * (t - draft_seconds_[s]);
      } else if (settled || !prior_settled) {
        draft_seconds_[s] = settled ? t : std::min(draft_seconds_[s], t);
      }
      draft_samples_[s] = std::max(draft_samples_[s], std::min(samples, DraftLengthPolicy::kWarmUpDrafts));
      timed_[s] = true;
    }
    probe_every_[s] = finished.probe_every(s);
  }
}

DraftLengthPolicy AcceptancePrior::policy(int max_draft, int sources) const {
  DraftLengthPolicy p(max_draft, value_[0], sources);
  for (int s = 0; s < DraftLengthPolicy::kSources; ++s) {
    p.set_acceptance(value_[s], s);
    if (timed_[s]) p.set_draft_time(draft_seconds_[s], draft_samples_[s], s);
    p.set_probe_every(probe_every_[s], s);
  }
  return p;
}

}  // namespace moeserve::runtime
