#include "runtime/sequence.h"

#include <algorithm>

namespace moeserve::runtime {

void Sequence::append(std::span<const int32_t> tokens) {
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  kv_.set_used(position());
}

void Sequence::rewind(int64_t pos) {
  pos = std::clamp<int64_t>(pos, 0, position());
  tokens_.resize(size_t(pos));
  kv_.truncate(pos);
}

}  // namespace moeserve::runtime
