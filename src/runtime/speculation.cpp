#include "runtime/speculation.h"

#include <algorithm>
#include <cmath>

namespace moeserve::runtime {

const char* spec_mode_name(SpecMode mode) {
  switch (mode) {
    case SpecMode::kNone:
      return "none";
    case SpecMode::kNgram:
      return "ngram";
    case SpecMode::kDflash:
      return "dflash";
    case SpecMode::kAuto:
      return "auto";
  }
  return "?";
}

Result<SpecMode> parse_spec_mode(std::string_view text) {
  for (SpecMode m : {SpecMode::kNone, SpecMode::kNgram, SpecMode::kDflash, SpecMode::kAuto}) {
    if (text == spec_mode_name(m)) return m;
  }
  return make_error(StatusCode::kInvalidArgument,
                    "unknown speculative mode '{}': use none, ngram, dflash or auto", text);
}

Status validate_spec_config(const SpecConfig& c, std::string_view prefix) {
  const bool flag = prefix.starts_with("--");
  auto name = [&](std::string_view knob) {
    return flag ? fmt::format("{}-{}", prefix, knob) : fmt::format("{}.{}", prefix, knob);
  };
  if (c.max_draft < 1 || c.max_draft > kSpecMaxDraftLimit) {
    return make_error(StatusCode::kInvalidArgument, "{} must be 1..{}, got {}", name("max"),
                      kSpecMaxDraftLimit, c.max_draft);
  }
  if (c.tree_nodes < 0 || c.tree_nodes > kSpecMaxDraftLimit) {
    return make_error(StatusCode::kInvalidArgument, "{} must be 0 (a chain) to {} (draft-tree nodes), got {}",
                      name("tree"), kSpecMaxDraftLimit, c.tree_nodes);
  }
  if (c.ngram_min < 1 || c.ngram_max < c.ngram_min || c.ngram_max > kSpecNgramLimit) {
    return make_error(StatusCode::kInvalidArgument,
                      "{} and {} must satisfy 1 <= min <= max <= {}, got {} and {}", name("ngram-min"),
                      name("ngram-max"), kSpecNgramLimit, c.ngram_min, c.ngram_max);
  }
  return Status::ok();
}

SpecCounters& SpecCounters::operator+=(const SpecCounters& o) {
  steps += o.steps;
  drafted += o.drafted;
  accepted += o.accepted;
  replays += o.replays;
  draft_seconds += o.draft_seconds;
  verify_seconds += o.verify_seconds;
  return *this;
}

void StepCostModel::record(int64_t rows, double seconds) {
  if (rows < 1 || rows > kMaxRows || !(seconds >= 0.0)) return;
  double& s = seconds_[size_t(rows)];
  int32_t& n = samples_[size_t(rows)];
  // The first samples average plainly; later ones move it by 1/8, so the
  // model follows a machine whose speed drifts (other load, placement swaps).
  const double w = n < 8 ? 1.0 / double(n + 1) : 0.125;
  s += w * (seconds - s);
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
    t += s.draft_seconds;
    const double rate = expected / t;
    if (rate > best_rate) best_rate = rate, best = n;
  }
  return {best, best_rate};
}

int64_t DraftLengthPolicy::choose(const StepCostModel& cost, int64_t base_rows, int64_t limit) {
  probing_ = false;  // a probe the drafter found nothing for tells nothing
  limit = std::min<int64_t>(limit, max_draft_);
  if (limit <= 0) return 0;
  const double plain = cost.estimate(base_rows);
  if (plain <= 0.0) return limit;  // nothing measured yet: try, and measure
  // Source 0 always; the second only once it has drafted (--spec auto's
  // model): a step drafts when either would pay.
  auto [best, best_rate] = best_length(sources_[0], cost, base_rows, limit);
  double cheapest_draft = sources_[0].draft_seconds;
  if (sources_[1].timed) {
    const auto [n1, rate1] = best_length(sources_[1], cost, base_rows, limit);
    if (rate1 > best_rate) best = n1, best_rate = rate1;
    cheapest_draft = std::min(cheapest_draft, sources_[1].draft_seconds);
  }
  // A draft must beat plain decoding by a margin: the estimates are noisy,
  // and a tie is better served by plain decoding's lower latency per token.
  if (best_rate <= 1.05 / plain) best = 0;
  if (best > 0) {
    idle_steps_ = 0;
    probe_every_ = kProbeEvery;
    return best;
  }
  // Off: probe now and then with a short draft, to notice when drafts start
  // to hit. A probe costs a draft and the verify of its rows on top of a
  // step: the interval keeps that share of plain decoding's time at most
  // kProbeShare (a DFlash draft as slow as a step probes every 50 steps or
  // more; n-gram's, ~free, every kProbeEvery on a GPU, where two more rows
  // cost little, but rarely where they cost as much as a step each: cold
  // experts on the CPU).
  const double probe_rows = std::max(0.0, cost.estimate(base_rows + kProbeDraft) - plain);
  const double steps_per_probe = (cheapest_draft + probe_rows) / plain;
  const int64_t cost_floor = int64_t(std::ceil(steps_per_probe / kProbeShare));
  probe_every_ = std::clamp(std::max(probe_every_, cost_floor), kProbeEvery, kProbeEveryMax);
  if (++idle_steps_ >= probe_every_) {
    idle_steps_ = 0;
    probing_ = true;
    return std::min<int64_t>(limit, kProbeDraft);
  }
  return 0;
}

void DraftLengthPolicy::observe_draft_time(double seconds, int source) {
  if (!(seconds >= 0.0)) return;
  Source& s = sources_[clamp_source(source)];
  s.draft_seconds = s.timed ? s.draft_seconds + 0.25 * (seconds - s.draft_seconds) : seconds;
  s.timed = true;
}

void DraftLengthPolicy::observe(int64_t drafted, int64_t accepted, int source) {
  if (drafted <= 0) return;
  Source& s = sources_[clamp_source(source)];
  s.observed = true;
  if (probing_) probe_every_ = accepted > 0 ? kProbeEvery : std::min(2 * probe_every_, kProbeEveryMax);
  probing_ = false;
  // The per-token acceptance a of a chain that kept `accepted` of
  // `drafted`: each token is kept with probability a until the first miss;
  // estimate it as kept / (kept + misses), misses being 1 unless all were kept.
  const double misses = accepted < drafted ? 1.0 : 0.0;
  const double sample = double(accepted) / (double(accepted) + misses);
  const double w = std::min(1.0, 0.25 * double(drafted) / 4.0);
  s.acceptance += w * (sample - s.acceptance);
}

int32_t DraftTree::add(int32_t token, int32_t parent) {
  tokens.push_back(token);
  parents.push_back(parent);
  return int32_t(tokens.size()) - 1;
}

int32_t DraftTree::child(int32_t node, int32_t token) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (parents[i] == node && tokens[i] == token) return int32_t(i);
  }
  return -1;
}

bool DraftTree::is_chain() const {
  for (size_t i = 0; i < parents.size(); ++i) {
    if (parents[i] != int32_t(i) - 1) return false;
  }
  return true;
}

int64_t DraftTree::depth() const {
  std::vector<int64_t> d(tokens.size(), 0);
  int64_t best = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    d[i] = 1 + (parents[i] < 0 ? 0 : d[size_t(parents[i])]);
    best = std::max(best, d[i]);
  }
  return best;
}

void DraftTree::keep_main_chain() {
  DraftTree chain;
  int32_t at = -1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (parents[i] != at) continue;
    chain.add(tokens[i], int32_t(chain.size()) - 1);
    at = int32_t(i);
  }
  *this = std::move(chain);
}

void DraftTree::truncate(int64_t n) {
  if (n < size()) tokens.resize(size_t(n)), parents.resize(size_t(n));
}

std::span<const int32_t> TreeWalk::candidates() {
  candidates_.clear();
  for (size_t i = 0; i < tree_.tokens.size(); ++i) {
    if (tree_.parents[i] == node_) candidates_.push_back(tree_.tokens[i]);
  }
  return candidates_;
}

bool TreeWalk::advance(int32_t token) {
  const int32_t next = tree_.child(node_, token);
  if (next < 0) return false;
  node_ = next;
  path_.push_back(next);
  return true;
}

void SpecSequence::history(const Sequence& seq, std::vector<int32_t>& out) const {
  out.assign(seq.tokens().begin(), seq.tokens().end());
  out.insert(out.end(), replay_.begin(), replay_.end());
}

Result<std::vector<int32_t>> SpecSequence::begin(Sequence& seq, int32_t pending, DraftTree draft,
                                                 bool tree_verify) {
  if (!replay_.empty()) draft.clear();
  if (!tree_verify && !draft.is_chain()) draft.keep_main_chain();
  snapshot_.reset();
  tree_parents_.clear();
  const bool recurrent = seq.kv().recurrent();
  // A draft tree needs room for each row's recurrent state; where the
  // device has none to spare, the draft's main chain goes the snapshot way.
  if (!draft.empty() && tree_verify && (recurrent || !draft.is_chain()) &&
      !seq.kv().reserve_tree_nodes(draft.size() + 1).is_ok()) {
    tree_verify = false;
    draft.keep_main_chain();
  }
  if (!draft.empty() && tree_verify && (recurrent || !draft.is_chain())) {
    // A draft tree: row 0 the pending token, row 1 + i node i.
    tree_parents_.push_back(-1);
    for (int32_t p : draft.parents) tree_parents_.push_back(p + 1);
  } else if (!draft.empty() && recurrent) {
    MOESERVE_ASSIGN_OR_RETURN(Sequence::Snapshot snap, seq.snapshot());
    snapshot_ = std::move(snap);
  }
  draft_ = std::move(draft);
  rows_.assign(replay_.begin(), replay_.end());
  rows_.push_back(pending);
  rows_.insert(rows_.end(), draft_.tokens.begin(), draft_.tokens.end());
  return rows_;
}

Status SpecSequence::commit(Sequence& seq, std::span<const int32_t> path, SpecCounters* counters) {
  const int64_t accepted = int64_t(path.size());
  if (counters != nullptr && !draft_.empty()) {
    ++counters->steps;
    counters->drafted += draft_.size();
    counters->accepted += accepted;
    if (!tree_parents_.empty()) ++counters->tree_steps;
  }
  // The rows to keep: the replayed ones, the pending token, the path's nodes.
  kept_rows_.clear();
  for (size_t i = 0; i <= replay_.size(); ++i) kept_rows_.push_back(int32_t(i));
  for (int32_t node : path) kept_rows_.push_back(int32_t(replay_.size()) + 1 + node);
  std::vector<int32_t> tokens;
  for (int32_t r : kept_rows_) tokens.push_back(rows_[size_t(r)]);
  Status st = Status::ok();
  committed_pos0_ = seq.position();
  committed_ = kept_rows_;
  if (!tree_parents_.empty()) {
    st = seq.accept_tree(kept_rows_, tokens);
    replay_.clear();
  } else if (snapshot_ && accepted < draft_.size()) {
    committed_.clear();
    // The state has seen the rejected rows: back to the snapshot, and the
    // kept rows go again in front of the next step.
    st = seq.restore(*snapshot_);
    replay_ = std::move(tokens);
    if (counters != nullptr) ++counters->replays;
  } else {
    // A causal chunk: the path is the draft's first nodes, in row order.
    seq.append(tokens);
    replay_.clear();
  }
  snapshot_.reset();
  draft_.clear();
  rows_.clear();
  tree_parents_.clear();
  return st;
}

void SpecSequence::reset() {
  committed_.clear();
  replay_.clear();
  draft_.clear();
  rows_.clear();
  tree_parents_.clear();
  snapshot_.reset();
}

float* CapturedRows::prepare(std::span<const int32_t> wanted, int64_t forward_rows, int64_t width) {
  layers.assign(wanted.begin(), wanted.end());
  rows = forward_rows;
  n_embd = width;
  if (layers.empty()) return nullptr;
  data.resize(layers.size() * size_t(rows * n_embd));
  return data.data();
}

void CapturedRows::gather(int64_t row0, std::span<const int32_t> picks, std::vector<float>& out) const {
  const size_t L = layers.size(), H = size_t(n_embd);
  out.resize(picks.size() * L * H);
  for (size_t i = 0; i < picks.size(); ++i) {
    const size_t row = size_t(row0 + picks[i]);
    for (size_t l = 0; l < L; ++l) {
      const float* src = data.data() + (l * size_t(rows) + row) * H;
      std::copy(src, src + H, out.data() + (i * L + l) * H);
    }
  }
}

}  // namespace moeserve::runtime
