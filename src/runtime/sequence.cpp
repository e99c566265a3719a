#include "runtime/sequence.h"

#include <algorithm>

namespace moeserve::runtime {

void Sequence::append(std::span<const int32_t> tokens) {
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  kv_.set_used(position());
}

void Sequence::rewind(int64_t pos) {
  pos = std::clamp<int64_t>(pos, 0, position());
  tokens_.resize(size_t(kv_.truncate(pos)));
}

Result<Sequence::Snapshot> Sequence::snapshot() const {
  Snapshot s;
  s.tokens = tokens_;
  MOESERVE_ASSIGN_OR_RETURN(s.cache, kv_.snapshot());
  return s;
}

Status Sequence::restore(const Snapshot& s) {
  const size_t n = s.tokens.size();
  if (int64_t(n) != s.cache.position || n > tokens_.size() ||
      !std::equal(s.tokens.begin(), s.tokens.end(), tokens_.begin())) {
    return make_error(StatusCode::kInvalidArgument,
                      "sequence snapshot of {} tokens: this sequence ({} tokens) no longer starts with them", n,
                      tokens_.size());
  }
  MOESERVE_RETURN_IF_ERROR(kv_.restore(s.cache));
  tokens_.resize(n);
  return Status::ok();
}

Status Sequence::accept_tree(std::span<const int32_t> rows, std::span<const int32_t> tokens) {
  if (rows.size() != tokens.size()) {
    return make_error(StatusCode::kInvalidArgument, "accept_tree: {} rows, {} tokens", rows.size(),
                      tokens.size());
  }
  MOESERVE_RETURN_IF_ERROR(kv_.accept_tree(rows));
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  return Status::ok();
}

}  // namespace moeserve::runtime
