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

// Attention layers here, and there (remote ranges).
std::pair<int64_t, int64_t> attention_layers(const KvCache& kv) {
  int64_t here = 0, there = 0;
  for (int64_t l = 0; l < kv.n_layer(); ++l) {
    if (!kv.layer(l).kv) continue;
    (kv.remote_layer(l) ? there : here) += 1;
  }
  return {here, there};
}

}  // namespace

int64_t PrefixCache::restore(std::span<const int32_t> tokens, int64_t max_tokens, KvCache& kv) {
  std::lock_guard lock(mu_);
  auto best = lru_.end();
  int64_t best_n = 0;
  max_tokens = std::min(max_tokens, kv.capacity());
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->kv_dim != kv.kv_dim() || it->recurrent != kv.recurrent()) continue;
    if (it->remote_id != 0 && it->holders != kv.remote_layers()) continue;
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
  const bool remote = best->remote_id != 0;
  const KvCache::Scope scope = remote ? KvCache::Scope::kLocal : KvCache::Scope::kAll;
  bool ok = !remote || kv.restore_remote_entry(best->remote_id, best_n).is_ok();
  if (ok && kv.recurrent()) ok = kv.restore(best->states, scope).is_ok();
  const uint16_t* k_rows = best->rows.data();
  for (int64_t l = 0; ok && l < kv.n_layer(); ++l) {
    if (!kv.layer(l).kv || (remote && kv.remote_layer(l))) continue;
    ok = kv.write_rows(l, best_n, k_rows, k_rows + size_t(n_cached * dim)).is_ok();
    k_rows += size_t(2 * n_cached * dim);
  }
  if (!ok) {  // a device error, or a shard that lost the entry (restarted): recompute instead
    kv.clear();
    if (remote) forget(best);
    ++stats_.misses;
    return 0;
  }
  lru_.splice(lru_.begin(), lru_, best);
  ++stats_.hits;
  stats_.reused_tokens += best_n;
  return best_n;
}

bool PrefixCache::copy_in(Entry& e, const KvCache& kv, int64_t n) {
  const int64_t dim = kv.kv_dim();
  const bool remote = e.remote_id != 0;
  if (remote && !kv.save_remote_entry(e.remote_id, n).is_ok()) return false;
  if (kv.recurrent()) {
    Result<CacheSnapshot> states = kv.snapshot(remote ? KvCache::Scope::kLocal : KvCache::Scope::kAll);
    if (!states.is_ok()) return false;
    e.states = std::move(states).value();
  }
  uint16_t* k_rows = e.rows.data();
  for (int64_t l = 0; l < kv.n_layer(); ++l) {
    if (!kv.layer(l).kv || (remote && kv.remote_layer(l))) continue;
    if (!kv.read_rows(l, n, k_rows, k_rows + size_t(n * dim)).is_ok()) return false;
    k_rows += size_t(2 * n * dim);
  }
  return true;
}

void PrefixCache::store(std::span<const int32_t> tokens, const KvCache& kv) {
  if (tokens.empty() || int64_t(tokens.size()) > kv.capacity()) return;
  if (kv.recurrent() && kv.used() != int64_t(tokens.size())) return;  // the states are not at its end
  const int64_t n = int64_t(tokens.size()), dim = kv.kv_dim();
  const auto [here, there] = attention_layers(kv);
  const bool remote = kv.remote_keeps_entries();
  const std::vector<backend::RemoteLayers*> holders =
      remote ? kv.remote_layers() : std::vector<backend::RemoteLayers*>{};
  std::lock_guard lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    const bool same_kind = it->kv_dim == dim && it->recurrent == kv.recurrent() &&
                           (it->remote_id == 0 || it->holders == kv.remote_layers());
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
      it = forget(it);
    } else {
      ++it;
    }
  }
  Entry e;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.kv_dim = dim;
  e.recurrent = kv.recurrent();
  const size_t row_bytes = size_t(2 * n * dim) * sizeof(uint16_t);
  e.rows.resize(size_t(2 * (remote ? here : here + there) * n * dim));
  if (remote) {
    e.remote_id = next_remote_id_++;
    e.holders = holders;
    e.remote_bytes = size_t(there) * row_bytes;  // (and their states: small next to the rows)
  }
  const size_t need = e.bytes() + size_t(std::max<int64_t>(kv.state_floats(), 0)) * sizeof(float);
  if (need > max_bytes_) return;
  evict_to(max_bytes_ - need);
  if (!copy_in(e, kv, n)) {  // a device error: keep nothing
    if (remote)
      for (backend::RemoteLayers* h : e.holders) h->drop_entry(e.remote_id);
    return;
  }
  bytes_ += e.bytes();
  lru_.push_front(std::move(e));
}

std::list<PrefixCache::Entry>::iterator PrefixCache::forget(std::list<Entry>::iterator it) {
  for (backend::RemoteLayers* h : it->holders) h->drop_entry(it->remote_id);
  bytes_ -= it->bytes();
  return lru_.erase(it);
}

void PrefixCache::evict_to(size_t budget) {
  while (bytes_ > budget && !lru_.empty()) forget(std::prev(lru_.end()));
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
  while (!lru_.empty()) forget(lru_.begin());
  bytes_ = 0;
}

}  // namespace moeserve::runtime
