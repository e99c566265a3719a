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

int64_t attention_layers(const KvCache& kv) {
  int64_t n = 0;
  for (int64_t l = 0; l < kv.n_layer(); ++l) n += kv.layer(l).kv ? 1 : 0;
  return n;
}

}  // namespace

int64_t PrefixCache::restore(std::span<const int32_t> tokens, int64_t max_tokens, KvCache& kv) {
  std::lock_guard lock(mu_);
  auto best = lru_.end();
  int64_t best_n = 0;
  max_tokens = std::min(max_tokens, kv.capacity());
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->kv_dim != kv.kv_dim() || it->states.states.empty() == kv.recurrent()) continue;
    const int64_t n = std::min(common_prefix(it->tokens, tokens), max_tokens);
    // Recurrent states hold the entry's last position only.
    if (kv.recurrent() && n != int64_t(it->tokens.size())) continue;
    if (n > best_n) best_n = n, best = it;
  }
  if (best == lru_.end() || best_n <= 0) {
    ++stats_.misses;
    return 0;
  }
  const int64_t n_cached = int64_t(best->tokens.size()), dim = kv.kv_dim();
  const uint16_t* k_rows = best->rows.data();
  bool ok = !kv.recurrent() || kv.restore(best->states).is_ok();
  for (int64_t l = 0; ok && l < kv.n_layer(); ++l) {
    if (!kv.layer(l).kv) continue;
    ok = kv.write_rows(l, best_n, k_rows, k_rows + size_t(n_cached * dim)).is_ok();
    k_rows += size_t(2 * n_cached * dim);
  }
  if (!ok) {  // a device error: recompute instead
    kv.clear();
    ++stats_.misses;
    return 0;
  }
  lru_.splice(lru_.begin(), lru_, best);
  ++stats_.hits;
  stats_.reused_tokens += best_n;
  return best_n;
}

void PrefixCache::store(std::span<const int32_t> tokens, const KvCache& kv) {
  if (tokens.empty() || int64_t(tokens.size()) > kv.capacity()) return;
  if (kv.recurrent() && kv.used() != int64_t(tokens.size())) return;  // the states are not at its end
  const int64_t n = int64_t(tokens.size()), dim = kv.kv_dim(), n_attn = attention_layers(kv);
  std::lock_guard lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    const bool same_kind = it->kv_dim == dim && it->states.states.empty() != kv.recurrent();
    const int64_t common = common_prefix(it->tokens, tokens), entry_n = int64_t(it->tokens.size());
    // Already covered by a longer (or equal) entry; with recurrent states
    // only an equal one covers it.
    if (same_kind && common == n && (!kv.recurrent() || entry_n == n)) {
      lru_.splice(lru_.begin(), lru_, it);
      return;
    }
    // An entry we extend: drop it (a recurrent one stays: the new entry's
    // states cannot serve its shorter prefix).
    if (same_kind && common == entry_n && !kv.recurrent()) {
      bytes_ -= it->bytes();
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
  Entry e;
  if (kv.recurrent()) {
    Result<CacheSnapshot> states = kv.snapshot();
    if (!states.is_ok()) return;  // a device error: keep nothing
    e.states = std::move(states).value();
  }
  const size_t need = size_t(2 * n_attn * n * dim) * sizeof(uint16_t) + tokens.size() * sizeof(int32_t) +
                      e.states.bytes();
  if (need > max_bytes_) return;
  evict_to(max_bytes_ - need);
  e.tokens.assign(tokens.begin(), tokens.end());
  e.kv_dim = dim;
  e.rows.resize(size_t(2 * n_attn * n * dim));
  uint16_t* k_rows = e.rows.data();
  for (int64_t l = 0; l < kv.n_layer(); ++l) {
    if (!kv.layer(l).kv) continue;
    if (!kv.read_rows(l, n, k_rows, k_rows + size_t(n * dim)).is_ok()) return;  // a device error: keep nothing
    k_rows += size_t(2 * n * dim);
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
