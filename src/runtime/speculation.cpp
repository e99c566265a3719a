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
