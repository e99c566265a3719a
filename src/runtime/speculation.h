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
// A draft is a tree (`DraftTree`; a chain is the tree with one child a
// node). A chain on an attention-only model is an ordinary causal chunk. A
// branching tree, or any draft on a model with recurrent layers, is fed as
// a draft tree where the device runs them (Device::supports_tree_verify):
// each row attends to its ancestors only and each recurrent layer keeps
// the state after every row, so after the walk the cache keeps the
// accepted path's rows and state (KvCache::accept_tree) at no extra cost.
// Elsewhere a branching tree is cut to its main chain, and a recurrent
// model rolls back by snapshot: before a step with a draft the sequence
// takes one, and when a draft token is rejected it goes back to it and
// re-feeds the accepted tokens at the front of its next step, which
// carries no draft (`SpecSequence::replay`): two forwards for a + 2
// tokens, never fewer tokens per forward than plain decoding.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "runtime/draft_policy.h"
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

// Limits of the knobs, for flags and request fields alike: a step's rows
// (the pending token and the draft) fit a 64-row draft tree.
inline constexpr int kSpecMaxDraftLimit = 63;
inline constexpr int kSpecNgramLimit = 16;

struct SpecConfig {
  SpecMode mode = SpecMode::kNone;
  int max_draft = 8;   // tokens drafted per step at most along one path (1..kSpecMaxDraftLimit)
  int tree_nodes = 0;  // draft-tree node budget (0..kSpecMaxDraftLimit); 0: a chain
  int ngram_min = 2;   // n-gram lookup: the shortest suffix that may match
  int ngram_max = 4;   // ... and the longest tried first
  bool enabled() const { return mode != SpecMode::kNone; }
};
// Checks the ranges and the combinations this build can run; errors say
// which knob and what is allowed ("--spec-max" style names, `flag_prefix`
// "--spec" or a request's "speculative." prefix).
Status validate_spec_config(const SpecConfig& config, std::string_view flag_prefix = "--spec");

// Drafted tokens as a tree: node i is `tokens[i]` following node
// `parents[i]` (-1: the sequence's pending token); a parent comes before its
// children, and siblings carry different tokens. A chain: parents -1, 0, 1, ...
struct DraftTree {
  std::vector<int32_t> tokens, parents;

  int64_t size() const { return int64_t(tokens.size()); }
  bool empty() const { return tokens.empty(); }
  void clear() { tokens.clear(), parents.clear(); }
  // Adds a node; returns its index.
  int32_t add(int32_t token, int32_t parent);
  // The child of `node` (-1: the root) carrying `token`, or -1.
  int32_t child(int32_t node, int32_t token) const;
  bool is_chain() const;
  // Nodes on the longest root path.
  int64_t depth() const;
  // Keeps only the first child at every level (what a device without tree
  // verify can check).
  void keep_main_chain();
  // Keeps the first n nodes (parents come first, so the rest is a tree).
  void truncate(int64_t n);
};

// How big a draft may be this step.
struct DraftBudget {
  int64_t max_nodes = 0;  // nodes in all
  int64_t max_depth = 0;  // nodes along one path
  // A drafter of two sources (Drafter::sources): the nodes each may draft
  // this step within the limits above (DraftLengthPolicy::chosen; 0: that
  // source drafts nothing; -1: no limit of its own).
  int64_t source_nodes[2] = {-1, -1};
  // The budget as source `s` sees it.
  DraftBudget for_source(int s) const {
    const int64_t n = source_nodes[s == 1 ? 1 : 0];
    if (n < 0) return {max_nodes, max_depth, {-1, -1}};
    return {std::min(max_nodes, n), std::min(max_depth, n), {-1, -1}};
  }
};

// Proposes the tokens that will likely follow `context` (the sequence so
// far, its next token included) within the budget; may return fewer, or none.
//
// A drafter that learns from the target's hidden states (DFlash) names the
// target layers it reads; the caller then captures them in every forward
// of the sequence (ForwardBatch::capture_layers) and hands over the rows
// the sequence's cache kept, in position order, as they are committed.
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual void draft(std::span<const int32_t> context, const DraftBudget& budget, DraftTree& out) = 0;
  // A new sequence starts (what was learnt of the last one is dropped).
  virtual void reset() {}
  virtual std::span<const int32_t> feature_layers() const { return {}; }
  // Whether the next steps' features are wanted now (a drafter that reads
  // them but is resting, as --spec auto's benched draft model, says no: the
  // capture costs every forward; the runtime then skips those rows, as
  // while DraftLengthPolicy::wants_features says no).
  virtual bool wants_features() const { return true; }
  // Its draft sources (DraftLengthPolicy decides for each apart): 1, or 2
  // for --spec auto (0: the n-gram lookup, 1: the draft model).
  virtual int sources() const { return 1; }
  // Which of its sources made the last draft: 0, or 1 for --spec auto's draft model.
  virtual int last_source() const { return 0; }
  // The source that reads feature_layers() (the features are captured
  // while the policy lets it draft or probe).
  virtual int feature_source() const { return 0; }
  // `n` committed rows from position `pos0` on: [n][feature_layers().size() * n_embd].
  virtual void observe_features(int64_t pos0, std::span<const float> rows, int64_t n) {
    (void)pos0, (void)rows, (void)n;
  }
  // What went wrong last, if anything (a draft model's device error): the
  // caller logs it; drafting stops, decoding goes on.
  virtual Status status() const { return Status::ok(); }
};

// Where requests' DFlash drafters come from: a draft model loaded in this
// process (spec::DflashModel) or one another process runs
// (ipc::DraftProcess, `--device-draft proc:DEVICE`).
class DraftSource {
 public:
  virtual ~DraftSource() = default;
  virtual std::unique_ptr<Drafter> make_drafter() = 0;
  // Device memory of this process a request's draft context takes per
  // token (memory plans; 0 when the draft runs elsewhere).
  virtual uint64_t context_bytes_per_token() const = 0;
  // A line for start-up logs.
  virtual std::string description() const = 0;
};

// A forward's captured hidden rows ([layers][rows][n_embd], the layout of
// ForwardBatch::captured), and the rows a drafter is handed from them.
struct CapturedRows {
  std::vector<int32_t> layers;
  std::vector<float> data;
  int64_t rows = 0, n_embd = 0;
  // Sizes `data` for a forward of `rows` rows (no layers: nothing captured).
  float* prepare(std::span<const int32_t> wanted, int64_t forward_rows, int64_t width);
  bool empty() const { return layers.empty(); }
  // Rows row0 + picks[i] as [picks.size()][layers * n_embd].
  void gather(int64_t row0, std::span<const int32_t> picks, std::vector<float>& out) const;
};
// Makes a request's drafter (null: this mode has none here).
using DrafterFactory = std::function<std::unique_ptr<Drafter>(const SpecConfig&)>;

// What speculation did for a request or an engine.
struct SpecCounters {
  int64_t steps = 0;       // forwards that carried a draft
  int64_t drafted = 0;     // draft tokens verified (tree nodes)
  int64_t accepted = 0;    // ... of them accepted
  int64_t replays = 0;     // rollbacks of a recurrent state (snapshot restored, tokens fed again)
  int64_t tree_steps = 0;  // steps verified as a draft tree (rows see their ancestors only)
  double draft_seconds = 0.0;
  double verify_seconds = 0.0;  // the share of the forwards' time that was draft rows
  // Tokens a step yields on average: the accepted ones plus the target's own.
  double mean_acceptance_length() const { return steps > 0 ? 1.0 + double(accepted) / double(steps) : 0.0; }
  SpecCounters& operator+=(const SpecCounters& o);
};

// Walks a verified draft tree: from the root (the pending token's row),
// each row's token either is one of the current node's children (accepted:
// the walk moves there) or ends the walk.
class TreeWalk {
 public:
  explicit TreeWalk(const DraftTree& tree) : tree_(tree) {}
  // The row whose output decides the next token: 0 for the pending token,
  // 1 + node for a draft node (rows relative to the pending token's).
  int64_t row() const { return node_ + 1; }
  // The current node's children's tokens (the candidates for the next token).
  std::span<const int32_t> candidates();
  // The next token is `token`: moves to the child carrying it and returns
  // true, or returns false (the walk ends).
  bool advance(int32_t token);
  // The accepted nodes, root's child first.
  std::span<const int32_t> path() const { return path_; }

 private:
  const DraftTree& tree_;
  int32_t node_ = -1;
  std::vector<int32_t> path_, candidates_;
};

// One sequence's speculative step: what to feed, and what to keep after.
class SpecSequence {
 public:
  // Tokens already accepted but not in the cache (after a snapshot
  // rollback): they go in front of the next step's rows.
  std::span<const int32_t> replay() const { return replay_; }
  const DraftTree& draft() const { return draft_; }
  // The slice's draft-tree parents for this step (empty: a causal chunk).
  std::span<const int32_t> tree_parents() const { return tree_parents_; }
  // The sequence as the sampler and the drafter see it: the cache's
  // tokens, then the replayed ones.
  void history(const Sequence& seq, std::vector<int32_t>& out) const;

  // Starts a step: the rows are replay + [pending] + the draft's nodes.
  // `tree_verify`: the device runs draft trees (else a branching draft is
  // cut to its main chain, and a recurrent cache is snapshotted). A draft
  // is dropped while tokens wait for replay. Returns the rows to feed.
  Result<std::vector<int32_t>> begin(Sequence& seq, int32_t pending, DraftTree draft, bool tree_verify);
  // Ends the step: the nodes of `path` (a TreeWalk's, root's child first)
  // were accepted. The cache keeps replay + [pending] + the path's tokens,
  // or (snapshot rollback, some rejected) goes back to the snapshot with
  // those tokens to replay.
  Status commit(Sequence& seq, std::span<const int32_t> path, SpecCounters* counters);
  void reset();
  // After commit: the step's rows that entered the cache, in position order
  // from `committed_pos0()` (empty when the step went back to its snapshot).
  std::span<const int32_t> committed_rows() const { return committed_; }
  int64_t committed_pos0() const { return committed_pos0_; }

 private:
  std::vector<int32_t> replay_, rows_, tree_parents_, kept_rows_, committed_;
  int64_t committed_pos0_ = 0;
  DraftTree draft_;
  std::optional<Sequence::Snapshot> snapshot_;
};

}  // namespace moeserve::runtime
