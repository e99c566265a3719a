#include "runtime/grammar_constraint.h"

#include <algorithm>

namespace moeserve::runtime {

GrammarConstraint::GrammarConstraint(std::shared_ptr<const grammar::Grammar> grammar, TokenBytes bytes,
                                     std::vector<int32_t> end_ids,
                                     std::shared_ptr<const grammar::TokenTrie> trie,
                                     std::shared_ptr<grammar::MaskCache> cache)
    : bytes_(std::move(bytes)),
      end_ids_(std::move(end_ids)),
      trie_(std::move(trie)),
      cache_(std::move(cache)),
      state_(std::move(grammar)) {}

bool GrammarConstraint::is_end(int32_t token) const {
  return std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end();
}

bool GrammarConstraint::allows(int32_t token) const {
  if (is_end(token)) return state_.complete();
  if (!bytes_ || token < 0 || size_t(token) >= bytes_->size()) return false;
  const std::string& b = (*bytes_)[size_t(token)];
  if (b.empty()) return false;
  grammar::GrammarState next = state_;  // a scratch copy: no need for feed_all's all-or-nothing
  for (const char c : b) {
    if (!next.feed(uint8_t(c))) return false;
  }
  return true;
}

void GrammarConstraint::accept(int32_t token) {
  if (is_end(token) || !bytes_ || token < 0 || size_t(token) >= bytes_->size()) return;
  state_.feed_all((*bytes_)[size_t(token)]);
}

void GrammarConstraint::allowed_mask(int64_t n_vocab, std::vector<uint8_t>& allowed) const {
  if (!trie_) {
    TokenConstraint::allowed_mask(n_vocab, allowed);
    return;
  }
  allowed.assign(size_t(std::max<int64_t>(n_vocab, 0)), 0);
  std::shared_ptr<const grammar::TokenBitmask> bits =
      cache_ ? cache_->get(state_, *trie_)
             : std::make_shared<const grammar::TokenBitmask>(grammar::allowed_token_bits(state_, *trie_));
  const size_t words = std::min(bits->size(), (allowed.size() + 63) / 64);
  for (size_t w = 0; w < words; ++w) {
    for (uint64_t word = (*bits)[w]; word != 0; word &= word - 1) {
      const size_t id = w * 64 + size_t(__builtin_ctzll(word));
      if (id < allowed.size()) allowed[id] = 1;
    }
  }
  // An end token's text may also spell something the grammar accepts; what
  // decides for it is whether the output may end here.
  const uint8_t end_ok = state_.complete() ? 1 : 0;
  for (const int32_t id : end_ids_) {
    if (id >= 0 && size_t(id) < allowed.size()) allowed[size_t(id)] = end_ok;
  }
}

}  // namespace moeserve::runtime
