#include "runtime/grammar/token_mask.h"

#include <algorithm>
#include <array>
#include <atomic>

namespace moeserve::runtime::grammar {
namespace {

std::atomic<uint64_t> g_next_trie_id{1};

constexpr int32_t kUnknown = -3;
constexpr int32_t kOverflow = -2;  // too many states: the walk goes on unmemoized
constexpr int32_t kDead = -1;
// Dense transition rows (1 KiB each) for the first states, a hash map after.
constexpr size_t kDenseStates = 4096;

// The GrammarStates one walk reaches, numbered, with their transitions
// filled in as the walk needs them: a lazily built DFA of the grammar
// restricted to the bytes of this vocabulary.
class StateTable {
 public:
  StateTable(const GrammarState& start, size_t max_states) : max_states_(std::max<size_t>(max_states, 1)) {
    intern(GrammarState(start));
  }

  const GrammarState& state(int32_t id) const { return states_[size_t(id)]; }
  // The bytes (as in TokenTrie::bytes_below) on which state `id` stays
  // itself, once it has been seen looping often enough to be worth the 256
  // transitions this costs; null before.
  const std::array<uint64_t, 2>* self_loops(int32_t id) {
    Loop& l = loops_[size_t(id)];
    if (l.seen < kLoopsBeforeMask && ++l.seen == kLoopsBeforeMask) {
      std::array<uint64_t, 2> mask{0, 0};
      bool high = true;  // every byte from 0x7F up
      for (int b = 0; b < 256; ++b) {
        const bool stays = next(id, uint8_t(b)) == id;
        if (b < 127 && stays) mask[size_t(b) >> 6] |= uint64_t(1) << (b & 63);
        if (b >= 127) high = high && stays;
      }
      if (high) mask[1] |= uint64_t(1) << 63;
      loops_[size_t(id)].mask = mask;  // (next() may have grown loops_)
    }
    return loops_[size_t(id)].seen >= kLoopsBeforeMask ? &loops_[size_t(id)].mask : nullptr;
  }
  // The dense rows: kDense * 256 entries for the states below kDenseStates,
  // kUnknown where next() must be asked (it may grow the table).
  const int32_t* dense() const { return dense_.data(); }

  int32_t next(int32_t id, uint8_t b) {
    if (!live_[size_t(id)].test(b)) return kDead;
    if (size_t(id) < kDenseStates) {
      const int32_t known = dense_[size_t(id) * 256 + b];
      if (known != kUnknown) return known;
    } else if (auto it = sparse_.find(uint64_t(id) << 8 | b); it != sparse_.end()) {
      return it->second;
    }
    GrammarState s = states_[size_t(id)];
    const int32_t to = s.feed(b) ? intern(std::move(s)) : kDead;
    if (size_t(id) < kDenseStates) {
      dense_[size_t(id) * 256 + b] = to;  // (intern may have grown dense_)
    } else {
      sparse_.emplace(uint64_t(id) << 8 | b, to);
    }
    return to;
  }

 private:
  int32_t intern(GrammarState s) {
    const uint64_t print = s.fingerprint();
    const auto [lo, hi] = by_print_.equal_range(print);
    for (auto it = lo; it != hi; ++it) {
      if (states_[size_t(it->second)] == s) return it->second;
    }
    if (states_.size() >= max_states_) return kOverflow;
    const int32_t id = int32_t(states_.size());
    live_.push_back(s.next_bytes());
    loops_.push_back({});
    states_.push_back(std::move(s));
    if (size_t(id) < kDenseStates) {
      // Bytes the state refuses outright are known dead from the start.
      dense_.resize(dense_.size() + 256, kDead);
      int32_t* row = dense_.data() + size_t(id) * 256;
      for (int b = 0; b < 256; ++b) {
        if (live_.back().test(uint8_t(b))) row[b] = kUnknown;
      }
    }
    by_print_.emplace(print, id);
    return id;
  }

  static constexpr uint32_t kLoopsBeforeMask = 16;
  struct Loop {
    uint32_t seen = 0;
    std::array<uint64_t, 2> mask{0, 0};
  };

  size_t max_states_;
  std::vector<Loop> loops_;
  std::vector<GrammarState> states_;
  std::vector<ByteSet> live_;  // the bytes each state accepts at all
  std::vector<int32_t> dense_;
  std::unordered_map<uint64_t, int32_t> sparse_;
  std::unordered_multimap<uint64_t, int32_t> by_print_;
};

void mark(const TokenTrie& trie, uint32_t node, TokenBitmask& bits) {
  for (uint32_t i = trie.first_token(node); i < trie.first_token(node + 1); ++i) {
    const uint32_t id = uint32_t(trie.token_at(i));
    bits[id >> 6] |= uint64_t(1) << (id & 63);
  }
}

// The subtree below `node` (which `start` has reached) with plain state
// copies, for walks that memoized as many states as they may.
// The matcher work one walk may do (kWalkStepBudget).
struct Budget {
  uint64_t start = closure_steps_on_this_thread();
  bool spent() const { return closure_steps_on_this_thread() - start > kWalkStepBudget; }
};

// False when the budget ran out.
bool walk_unmemoized(const GrammarState& start, uint32_t node, const TokenTrie& trie, TokenBitmask& bits,
                     const Budget& budget) {
  const uint32_t base = trie.depth(node);
  std::vector<GrammarState> at_depth(trie.max_depth() - base + 1, start);  // [d - base]
  for (uint32_t i = node + 1; i < trie.subtree_end(node);) {
    const uint32_t d = trie.depth(i) - base;
    GrammarState& s = at_depth[d];
    s = at_depth[d - 1];
    if (budget.spent()) return false;
    if (!s.feed(trie.byte(i))) {
      i = trie.subtree_end(i);
      continue;
    }
    mark(trie, i, bits);
    ++i;
  }
  return true;
}

}  // namespace

// Sorted, the tokens add their nodes in preorder: each adds one node per
// byte past the prefix it shares with the token before it.
TokenTrie::TokenTrie(const std::vector<std::string>& tokens)
    : vocab_size_(tokens.size()), id_(g_next_trie_id.fetch_add(1)) {
  std::vector<int32_t> order;
  order.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!tokens[id].empty()) order.push_back(int32_t(id));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return tokens[size_t(a)] < tokens[size_t(b)]; });
  byte_.push_back(0);
  depth_.push_back(0);
  first_token_.push_back(0);
  std::vector<uint32_t> path{0};  // path[d]: the node at depth d of the previous token
  std::string_view prev;
  for (const int32_t id : order) {
    const std::string_view t = tokens[size_t(id)];
    size_t common = 0;
    while (common < prev.size() && common < t.size() && prev[common] == t[common]) ++common;
    path.resize(common + 1);
    for (size_t k = common; k < t.size(); ++k) {
      path.push_back(uint32_t(byte_.size()));
      byte_.push_back(uint8_t(t[k]));
      depth_.push_back(uint32_t(k + 1));
      first_token_.push_back(uint32_t(tokens_.size()));
    }
    // Tokens attach to the newest node or (a duplicate) to the same one.
    tokens_.push_back(id);
    max_depth_ = std::max(max_depth_, uint32_t(t.size()));
    prev = t;
  }
  first_token_.push_back(uint32_t(tokens_.size()));
  // A subtree ends at the next node no deeper than its root; a node closed
  // there adds its bytes to its parent's (the node below it on the path).
  end_.assign(byte_.size(), uint32_t(byte_.size()));
  below_.assign(byte_.size(), {0, 0});
  std::vector<uint32_t> open;
  const auto close = [&](uint32_t at) {
    const uint32_t n = open.back();
    open.pop_back();
    end_[n] = at;
    if (open.empty()) return;
    auto& parent = below_[open.back()];
    const unsigned bit = std::min<unsigned>(byte_[n], 127);
    parent[0] |= below_[n][0];
    parent[1] |= below_[n][1];
    parent[bit >> 6] |= uint64_t(1) << (bit & 63);
  };
  for (uint32_t n = 0; n < byte_.size(); ++n) {
    while (!open.empty() && depth_[open.back()] >= depth_[n]) close(n);
    open.push_back(n);
  }
  while (!open.empty()) close(uint32_t(byte_.size()));
}

TokenBitmask allowed_token_bits(const GrammarState& state, const TokenTrie& trie, size_t max_memo_states) {
  TokenBitmask bits((trie.vocab_size() + 63) / 64, 0);
  if (!state.can_continue()) return bits;
  const Budget budget;
  StateTable table(state, max_memo_states);
  const TokenTrie::View t = trie.view();
  uint64_t* out = bits.data();
  std::vector<int32_t> at_depth(trie.max_depth() + 1, 0);  // the state at each depth of the path
  int32_t* path = at_depth.data();
  const int32_t* dense = table.dense();
  // Preorder: a node's parent state is at_depth[depth - 1]; a refused byte
  // skips the node's whole subtree. The common step is one table read.
  for (uint32_t i = 1; i < t.nodes;) {
    const uint32_t d = t.depth[i];
    const int32_t from = path[d - 1];
    int32_t to = size_t(from) < kDenseStates ? dense[size_t(from) * 256 + t.byte[i]] : kUnknown;
    if (to == kUnknown) {
      if (budget.spent()) break;
      to = table.next(from, t.byte[i]);
      dense = table.dense();
    }
    if (to == kDead) {
      i = t.end[i];
      continue;
    }
    // A state that stays itself on every byte below this node (the body of
    // a string, free text) allows the whole subtree: no step per node.
    uint32_t last = i + 1;
    if (to == from) {
      const std::array<uint64_t, 2>* loops = table.self_loops(from);
      if (loops != nullptr && (t.below[i][0] & ~(*loops)[0]) == 0 && (t.below[i][1] & ~(*loops)[1]) == 0) {
        last = t.end[i];
      }
      dense = table.dense();
    }
    for (uint32_t k = t.first_token[i]; k < t.first_token[last]; ++k) {
      const uint32_t id = uint32_t(t.tokens[k]);
      out[id >> 6] |= uint64_t(1) << (id & 63);
    }
    if (last != i + 1) {
      i = last;
      continue;
    }
    if (to == kOverflow) {
      GrammarState fed = table.state(from);
      fed.feed(t.byte[i]);
      if (!walk_unmemoized(fed, i, trie, bits, budget)) break;
      i = t.end[i];
      continue;
    }
    path[d] = to;
    ++i;
  }
  return bits;
}

void allowed_tokens(const GrammarState& state, const TokenTrie& trie, std::vector<uint8_t>& allowed) {
  const TokenBitmask bits = allowed_token_bits(state, trie);
  allowed.assign(trie.vocab_size(), 0);
  for (size_t w = 0; w < bits.size(); ++w) {
    for (uint64_t word = bits[w]; word != 0; word &= word - 1) {
      allowed[w * 64 + size_t(__builtin_ctzll(word))] = 1;
    }
  }
}

std::shared_ptr<const TokenBitmask> MaskCache::get(const GrammarState& state, const TokenTrie& trie) {
  const uint64_t grammar_id = state.grammar() ? state.grammar()->id() : 0;
  const uint64_t key =
      state.fingerprint() ^ (grammar_id * 0x9E3779B97F4A7C15ull) ^ (trie.id() * 0xC2B2AE3D27D4EB4Full);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      const Entry& e = *it->second;
      if (e.trie_id == trie.id() && e.state == state) {  // == compares the grammar too
        lru_.splice(lru_.begin(), lru_, it->second);
        ++hits_;
        return e.mask;
      }
    }
    ++misses_;
  }
  auto mask = std::make_shared<const TokenBitmask>(allowed_token_bits(state, trie));
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) {  // another thread's, or a colliding state
    lru_.erase(it->second);
    index_.erase(it);
  }
  lru_.push_front(Entry{key, trie.id(), state, mask});
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
  return mask;
}

MaskCache::Stats MaskCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {hits_, misses_, lru_.size()};
}

}  // namespace moeserve::runtime::grammar
