// Speculative decoding, the target's side: a sequence feeds its next token
// followed by drafted tokens in ONE forward, and every row's output is
// checked against the draft (greedy: the arg-max equals the draft; sampling:
// Sampler::sample_against_draft), so a step yields every accepted draft
// token plus one token of the target's own — never a different token than
// plain decoding would give (rows of a forward equal one-row decode steps:
// see BatchEngine and the lossless tests).
//
// Where the drafts come from is not this layer's business: a `Drafter`
// (spec/: n-gram lookup, later the DFlash draft model) is created per
// request by the factory the caller installs, because spec/ stacks on the
// runtime and the runtime must not depend on it.
//
// Rollback. Rejected rows have written K/V past the accepted ones; an
// attention cache simply forgets them (its position says which rows are
// valid). A recurrent cache (Gated DeltaNet) has folded every row into its
// state, so before a step with a draft the sequence takes a snapshot, and
// when a draft token is rejected it goes back to it and re-feeds the
// accepted tokens at the front of its next step, which carries no draft
// (`SpecSequence::replay`): two forwards for a + 2 tokens, never fewer
// tokens per forward than plain decoding.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/sequence.h"

namespace moeserve::runtime {

enum class SpecMode {
  kNone,    // plain decoding
  kNgram,   // prompt lookup: drafts copied from the prompt and the text so far
  kDflash,  // a block-diffusion draft model (--draft FILE)
  kAuto,    // the engine's choice per request, from measured acceptance and cost
};
const char* spec_mode_name(SpecMode mode);
// "none" | "ngram" | "dflash" | "auto"; kInvalidArgument naming the choices.
Result<SpecMode> parse_spec_mode(std::string_view text);

// Limits of the knobs, for flags and request fields alike.
inline constexpr int kSpecMaxDraftLimit = 64;
inline constexpr int kSpecNgramLimit = 16;

struct SpecConfig {
  SpecMode mode = SpecMode::kNone;
  int max_draft = 8;   // tokens drafted per step at most (1..kSpecMaxDraftLimit)
  int tree_nodes = 0;  // DDTree node budget; 0: a chain
  int ngram_min = 2;   // n-gram lookup: the shortest suffix that may match
  int ngram_max = 4;   // ... and the longest tried first
  bool enabled() const { return mode != SpecMode::kNone; }
};
// Checks the ranges and the combinations this build can run; errors say
// which knob and what is allowed ("--spec-max" style names, `flag_prefix`
// "--spec" or a request's "speculative." prefix).
Status validate_spec_config(const SpecConfig& config, std::string_view flag_prefix = "--spec");

// Proposes the tokens that will likely follow `context` (the sequence so
// far, its next token included). May return fewer than `max_tokens`, or none.
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual void draft(std::span<const int32_t> context, int64_t max_tokens, std::vector<int32_t>& out) = 0;
};
// Makes a request's drafter (null: this mode has none here).
using DrafterFactory = std::function<std::unique_ptr<Drafter>(const SpecConfig&)>;

// What speculation did for a request or an engine.
struct SpecCounters {
  int64_t steps = 0;     // forwards that carried a draft
  int64_t drafted = 0;   // draft tokens verified
  int64_t accepted = 0;  // ... of them accepted
  int64_t replays = 0;   // rollbacks of a recurrent state (snapshot restored, tokens fed again)
  double draft_seconds = 0.0;
  double verify_seconds = 0.0;  // the share of the forwards' time that was draft rows
  // Tokens a step yields on average: the accepted ones plus the target's own.
  double mean_acceptance_length() const { return steps > 0 ? 1.0 + double(accepted) / double(steps) : 0.0; }
  SpecCounters& operator+=(const SpecCounters& o);
};

// A forward's wall time by its row count, learned as the engine runs
// (exponential averages per row count), so the draft policy can weigh a
// verify of n rows against a one-row decode step on this machine and
// placement: with cold experts on the CPU, more rows select more experts
// and a verify costs far more than on a GPU.
class StepCostModel {
 public:
  static constexpr int64_t kMaxRows = 128;
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
// tokens for cost(rows + n) seconds — against plain decoding's 1 token for
// cost(rows). When no length beats plain decoding it drafts nothing, and
// probes again with a short draft every `probe_every` steps, so a prompt
// whose drafts start to hit gets them back.
class DraftLengthPolicy {
 public:
  explicit DraftLengthPolicy(int max_draft = 8) : max_draft_(max_draft) {}
  // base_rows: the step's rows without this draft; limit: what fits
  // (context, max_tokens left, the step's row budget).
  int64_t choose(const StepCostModel& cost, int64_t base_rows, int64_t limit);
  // After a verify of `drafted` tokens of which `accepted` were kept.
  void observe(int64_t drafted, int64_t accepted);
  double acceptance() const { return acceptance_; }

 private:
  int max_draft_;
  double acceptance_ = 0.6;  // prior: optimistic enough to try
  int64_t idle_steps_ = 0;
  static constexpr int64_t kProbeEvery = 16;
};

// One sequence's speculative step: what to feed, and what to keep after.
class SpecSequence {
 public:
  // Tokens already accepted but not in the cache (after a recurrent
  // rollback): they go in front of the next step's rows.
  std::span<const int32_t> replay() const { return replay_; }
  std::span<const int32_t> draft() const { return draft_; }
  // The sequence as the sampler and the drafter see it: the cache's
  // tokens, then the replayed ones.
  void history(const Sequence& seq, std::vector<int32_t>& out) const;

  // Starts a step: the rows are replay + [pending] + draft. `draft` is
  // dropped when tokens wait for replay (a recurrent state can only be
  // snapshotted between forwards). Takes the snapshot a recurrent cache
  // needs. Returns the rows to feed.
  Result<std::vector<int32_t>> begin(Sequence& seq, int32_t pending, std::vector<int32_t> draft);
  // Ends the step: `accepted` draft tokens were kept (<= draft().size()).
  // The cache keeps replay + [pending] + the accepted drafts, or (recurrent,
  // some rejected) goes back to the snapshot with those tokens to replay.
  Status commit(Sequence& seq, int64_t accepted, SpecCounters* counters);
  void reset();

 private:
  std::vector<int32_t> replay_, draft_, rows_;
  std::optional<Sequence::Snapshot> snapshot_;
};

}  // namespace moeserve::runtime
