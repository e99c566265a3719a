// Runs a compiled Grammar over bytes: the state is a set of pushdown stacks
// (an Earley-like recogniser without left recursion, which compiling has
// refused). A stack is the list of grammar positions still to be matched,
// bottom first; its top is always a byte-set element, reached by expanding
// rule references down to terminals ("closure") after every byte, and a
// stack that has run empty means the root rule has ended. Ambiguity keeps
// several stacks alive at once; identical ones are merged.
//
// A state is a plain value (one vector of 32-bit positions plus the shared
// grammar), so copying it to try a token costs one allocation, and its
// canonical form (stacks sorted and deduplicated) makes fingerprint() and
// operator== usable as a cache key (token_mask.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "runtime/grammar/grammar.h"

namespace moeserve::runtime::grammar {

// Closure steps this thread has run (every GrammarState operation adds its
// own): a work meter for callers that must bound their total work, like the
// vocabulary walk of token_mask.h.
uint64_t closure_steps_on_this_thread();

class GrammarState {
 public:
  // Bounds that keep a hostile or very ambiguous grammar from costing
  // unbounded memory or time per byte: a byte whose closure would pass any
  // of them is refused (as if the grammar did not allow it).
  static constexpr size_t kMaxStacks = 4096;
  static constexpr size_t kMaxStackDepth = 4096;
  static constexpr size_t kMaxClosureSteps = size_t(1) << 16;
  static constexpr size_t kMaxClosureWords = size_t(1) << 22;

  // At the start of the root rule (no stacks at all when the start already
  // passes the bounds above: nothing is accepted).
  explicit GrammarState(std::shared_ptr<const Grammar> grammar);

  // Consumes one byte; false, and no change, when no stack accepts it.
  bool feed(uint8_t byte);
  // Every byte or none: false leaves the state as it was.
  bool feed_all(std::string_view bytes);
  // The bytes so far are a complete sentence of the root rule.
  bool complete() const { return !stacks_.empty() && stacks_[0] == 0; }
  // Some byte may come next.
  bool can_continue() const { return stacks_.size() > (complete() ? 1u : 0u); }
  // The bytes some stack's top accepts (empty when !can_continue()); feed()
  // may still refuse one of them when its closure passes the bounds.
  ByteSet next_bytes() const;
  size_t stack_count() const;

  // Hash of the canonical stack set (equal states hash equally).
  uint64_t fingerprint() const;
  bool operator==(const GrammarState& o) const { return grammar_ == o.grammar_ && stacks_ == o.stacks_; }

  const std::shared_ptr<const Grammar>& grammar() const { return grammar_; }

 private:
  std::shared_ptr<const Grammar> grammar_;
  // The canonical stack set: each stack as its length then its positions,
  // bottom to top; stacks sorted by (length, positions), no duplicates. The
  // empty stack (the root has ended), if present, comes first.
  std::vector<uint32_t> stacks_;
};

}  // namespace moeserve::runtime::grammar
