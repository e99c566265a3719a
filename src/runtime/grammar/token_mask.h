// Which tokens of the vocabulary may come next under a grammar: the masking
// step of constrained decoding.
//
// TokenTrie holds every token's bytes once per model. allowed_tokens() walks
// the trie depth-first from a GrammarState, one byte per edge, and prunes a
// branch as soon as the grammar refuses its byte. The walk memoizes the
// states it reaches (GrammarState is canonical, so equal states are found
// by fingerprint) together with their transitions: inside a JSON string, say,
// nearly every token is allowed, and the walk becomes a table lookup per
// trie edge instead of a matcher step, and a whole subtree is taken at once
// where the state stays itself on every byte below it. MaskCache keeps whole
// masks of states that come back (the same string state, token after token).
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/grammar/matcher.h"

namespace moeserve::runtime::grammar {

// Bit `id` set: token `id` is allowed.
using TokenBitmask = std::vector<uint64_t>;

class TokenTrie {
 public:
  // tokens[id] = the bytes of token id; tokens with no bytes are never in the
  // trie, so no mask allows them.
  explicit TokenTrie(const std::vector<std::string>& tokens);

  size_t vocab_size() const { return vocab_size_; }
  size_t node_count() const { return byte_.size(); }
  // Unique per trie in this process (MaskCache keys on it).
  uint64_t id() const { return id_; }

  // Nodes in depth-first preorder (node 0 the root), so a walk reads the
  // arrays front to back and skips a refused subtree in one jump: node n is
  // reached by byte(n) from the nearest node before it with depth(n) - 1,
  // its subtree is n .. subtree_end(n) - 1, and the tokens whose bytes end
  // at n are token_at(first_token(n) .. first_token(n + 1) - 1).
  uint8_t byte(uint32_t node) const { return byte_[node]; }
  uint32_t depth(uint32_t node) const { return depth_[node]; }
  uint32_t subtree_end(uint32_t node) const { return end_[node]; }
  uint32_t first_token(uint32_t node) const { return first_token_[node]; }
  int32_t token_at(uint32_t i) const { return tokens_[i]; }
  uint32_t max_depth() const { return max_depth_; }
  // The bytes below node n (not n's own), as a 128-bit set: bit b for an
  // ASCII byte b < 127, bit 127 for any byte from 0x7F up. A walk whose state
  // loops back to itself on every one of them takes the subtree whole.
  const std::array<uint64_t, 2>& bytes_below(uint32_t node) const { return below_[node]; }

  // The same arrays as raw pointers, for the hot loop of the walk.
  struct View {
    const uint8_t* byte;
    const uint32_t* depth;
    const uint32_t* end;
    const uint32_t* first_token;
    const int32_t* tokens;
    const std::array<uint64_t, 2>* below;
    uint32_t nodes;
  };
  View view() const {
    return {byte_.data(),   depth_.data(), end_.data(),           first_token_.data(),
            tokens_.data(), below_.data(), uint32_t(byte_.size())};
  }

 private:
  size_t vocab_size_ = 0;
  uint64_t id_ = 0;
  uint32_t max_depth_ = 0;
  std::vector<uint8_t> byte_;
  std::vector<uint32_t> depth_;
  std::vector<uint32_t> end_;
  std::vector<uint32_t> first_token_;  // one more than nodes
  std::vector<int32_t> tokens_;
  std::vector<std::array<uint64_t, 2>> below_;
};

// The tokens whose every byte `state` accepts, one after the other. The walk
// memoizes at most `max_memo_states` states (a hostile grammar could make
// every trie node a new one); past that it goes on with plain state copies.
// A walk whose matcher work passes kWalkStepBudget closure steps (hundreds
// of milliseconds; a JSON grammar needs well under 1% of it) stops there:
// the mask then holds only the tokens found so far, never a refused one.
inline constexpr size_t kDefaultMemoStates = size_t(1) << 16;
inline constexpr uint64_t kWalkStepBudget = uint64_t(1) << 24;
TokenBitmask allowed_token_bits(const GrammarState& state, const TokenTrie& trie,
                                size_t max_memo_states = kDefaultMemoStates);
// The same as bytes: `allowed` becomes trie.vocab_size() long, 1 for each
// allowed token and 0 for the others.
void allowed_tokens(const GrammarState& state, const TokenTrie& trie, std::vector<uint8_t>& allowed);

// Thread-safe LRU of masks, keyed by (grammar, trie, canonical state): a
// state that repeats reuses its mask. Masks are computed outside the lock,
// so requests masking different states do not wait for each other.
class MaskCache {
 public:
  explicit MaskCache(size_t capacity = 256) : capacity_(capacity == 0 ? 1 : capacity) {}

  std::shared_ptr<const TokenBitmask> get(const GrammarState& state, const TokenTrie& trie);

  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;
    size_t entries = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    uint64_t key;
    uint64_t trie_id;
    GrammarState state;
    std::shared_ptr<const TokenBitmask> mask;
  };

  mutable std::mutex mu_;
  size_t capacity_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<uint64_t, std::list<Entry>::iterator> index_;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

}  // namespace moeserve::runtime::grammar
