#include "runtime/prefix_cache.h"

#include <algorithm>
#include <cstring>

namespace moeserve::runtime {
namespace {

int64_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return int64_t(i);
}

}  // namespace

int64_t PrefixCache::restore(std::span<const int32_t> tokens, int64_t max_tokens, KvCache& kv) {
  std::lock_guard lock(mu_);
  auto best = lru_.end();
  int64_t best_n = 0;
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->kv_dim != kv.kv_dim()) continue;
    const int64_t n = std::min(common_prefix(it->tokens, tokens), max_tokens);
    if (n > best_n) best_n = n, best = it;
  }
  best_n = std::min(best_n, kv.capacity());
  if (best == lru_.end() || best_n <= 0) {
    ++stats_.misses;
    return 0;
  }
  const int64_t n_cached = int64_t(best->tokens.size()), dim = kv.kv_dim();
  for (int64_t l = 0; l < kv.n_layer(); ++l) {
    const uint16_t* k_rows = best->rows.data() + size_t(2 * l * n_cached * dim);
    const uint16_t* v_rows = k_rows + size_t(n_cached * dim);
    if (!kv.write_rows(l, best_n, k_rows, v_rows).is_ok()) {  // a device error: recompute instead
      ++stats_.misses;
      return 0;
    }
  }
  lru_.splice(lru_.begin(), lru_, best);
  ++stats_.hits;
  stats_.reused_tokens += best_n;
  return best_n;
}

void PrefixCache::store(std::span<const int32_t> tokens, const KvCache& kv) {
  if (tokens.empty() || int64_t(tokens.size()) > kv.capacity()) return;
  const int64_t n = int64_t(tokens.size()), dim = kv.kv_dim(), n_layer = kv.n_layer();
  const size_t need = size_t(2 * n_layer * n * dim) * sizeof(uint16_t) + tokens.size() * sizeof(int32_t);
  std::lock_guard lock(mu_);
  if (need > max_bytes_) return;
  for (auto it = lru_.begin(); it != lru_.end();) {
    const int64_t common = common_prefix(it->tokens, tokens);
    if (it->kv_dim == dim && common == n) {  // already covered by a longer (or equal) entry
      lru_.splice(lru_.begin(), lru_, it);
      return;
    }
    if (it->kv_dim == dim && common == int64_t(it->tokens.size())) {  // an entry we extend: drop it
      bytes_ -= it->bytes();
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
  evict_to(max_bytes_ - need);
  Entry e;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.kv_dim = dim;
  e.rows.resize(size_t(2 * n_layer * n * dim));
  for (int64_t l = 0; l < n_layer; ++l) {
    uint16_t* k_rows = e.rows.data() + size_t(2 * l * n * dim);
    if (!kv.read_rows(l, n, k_rows, k_rows + size_t(n * dim)).is_ok()) return;  // a device error: keep nothing
  }
  bytes_ += e.bytes();
  lru_.push_front(std::move(e));
}

void PrefixCache::evict_to(size_t budget) {
  while (bytes_ > budget && !lru_.empty()) {
    bytes_ -= lru_.back().bytes();
    lru_.pop_back();
  }
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard lock(mu_);
  PrefixCacheStats s = stats_;
  s.bytes = bytes_;
  s.entries = lru_.size();
  return s;
}

void PrefixCache::clear() {
  std::lock_guard lock(mu_);
  lru_.clear();
  bytes_ = 0;
}

}  // namespace moeserve::runtime
