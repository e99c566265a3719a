// Structured output from a grammar (GBNF, runtime/grammar/gbnf.h): the
// TokenConstraint a request with a `grammar` gets. A token is allowed when
// the grammar accepts all of its bytes from the current state; an
// end-of-sequence token when the output so far is a complete sentence.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "runtime/grammar/matcher.h"
#include "runtime/grammar/token_mask.h"
#include "runtime/token_constraint.h"

namespace moeserve::runtime {

class GrammarConstraint final : public TokenConstraint {
 public:
  // `trie` must hold the same tokens as `bytes` (built once per model, like
  // them); `cache` may be null (masks are then always computed) and is
  // usually shared by every request of a model.
  GrammarConstraint(std::shared_ptr<const grammar::Grammar> grammar, TokenBytes bytes,
                    std::vector<int32_t> end_ids, std::shared_ptr<const grammar::TokenTrie> trie,
                    std::shared_ptr<grammar::MaskCache> cache);

  bool allows(int32_t token) const override;
  void accept(int32_t token) override;
  // The trie walk (through the cache) instead of one allows() per id.
  void allowed_mask(int64_t n_vocab, std::vector<uint8_t>& allowed) const override;

  // Text that did not come as one token (the rest of a token that opened
  // the grammar's part of the output): every byte or none.
  bool accept_bytes(std::string_view bytes) { return state_.feed_all(bytes); }

  const grammar::GrammarState& state() const { return state_; }

 private:
  bool is_end(int32_t token) const;

  TokenBytes bytes_;
  std::vector<int32_t> end_ids_;
  std::shared_ptr<const grammar::TokenTrie> trie_;
  std::shared_ptr<grammar::MaskCache> cache_;
  grammar::GrammarState state_;
};

}  // namespace moeserve::runtime
