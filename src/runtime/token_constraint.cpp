#include "runtime/token_constraint.h"

#include <algorithm>
#include <span>

#include "tokenizer/tokenizer.h"

namespace moeserve::runtime {

TokenBytes token_byte_table(const tok::Tokenizer& tokenizer, int64_t n_vocab) {
  auto table = std::make_shared<std::vector<std::string>>(size_t(std::max<int64_t>(n_vocab, 0)));
  const int64_t known = std::min<int64_t>(n_vocab, tokenizer.vocab_size());
  for (int64_t id = 0; id < known; ++id) {
    const int32_t t = int32_t(id);
    (*table)[size_t(id)] = tokenizer.decode(std::span<const int32_t>(&t, 1));
  }
  return table;
}

void TokenConstraint::allowed_mask(int64_t n_vocab, std::vector<uint8_t>& allowed) const {
  allowed.assign(size_t(std::max<int64_t>(n_vocab, 0)), 0);
  for (size_t id = 0; id < allowed.size(); ++id) allowed[id] = allows(int32_t(id)) ? 1 : 0;
}

JsonConstraint::JsonConstraint(TokenBytes bytes, std::vector<int32_t> end_ids, bool object_only)
    : bytes_(std::move(bytes)), end_ids_(std::move(end_ids)), state_(object_only) {}

bool JsonConstraint::is_end(int32_t token) const {
  return std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end();
}

bool JsonConstraint::allows(int32_t token) const {
  if (is_end(token)) return state_.complete();
  if (token < 0 || size_t(token) >= bytes_->size() || state_.complete()) return false;
  const std::string& b = (*bytes_)[size_t(token)];
  if (b.empty()) return false;
  JsonPrefix next = state_;
  return next.feed_all(b);
}

void JsonConstraint::accept(int32_t token) {
  if (is_end(token) || token < 0 || size_t(token) >= bytes_->size()) return;
  state_.feed_all((*bytes_)[size_t(token)]);
}

}  // namespace moeserve::runtime
