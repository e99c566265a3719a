#include "runtime/prefix_cache.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "core/log.h"

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
  bool from_disk = false;
  if (disk_) {
    int64_t n = 0;
    if (auto it = load_from_disk(tokens, max_tokens, best_n, kv, &n); it != lru_.end()) {
      best = it, best_n = n, from_disk = true;
    }
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
  if (from_disk) ++stats_.disk_hits;
  stats_.reused_tokens += best_n;
  return best_n;
}

std::list<PrefixCache::Entry>::iterator PrefixCache::load_from_disk(std::span<const int32_t> tokens,
                                                                    int64_t max_tokens, int64_t longer_than,
                                                                    const KvCache& kv, int64_t* n) {
  const PrefixDiskOptions& o = disk_->options();
  if (o.kv_dim != kv.kv_dim() || o.recurrent != kv.recurrent()) return lru_.end();
  const PrefixDiskMatch match = disk_->find(tokens, max_tokens, longer_than);
  if (match.name.empty()) return lru_.end();
  std::optional<PrefixFileEntry> file = disk_->load(match.name);
  if (!file) return lru_.end();
  Entry e;
  e.tokens = std::move(file->tokens);
  e.kv_dim = kv.kv_dim();
  e.recurrent = kv.recurrent();
  e.rows = std::move(file->rows);
  e.states = std::move(file->states);
  // The fingerprint makes these hold; a cache of other layers (a changed
  // split) would read past the rows.
  const auto [here, there] = attention_layers(kv);
  const int64_t len = int64_t(e.tokens.size());
  if (e.rows.size() != size_t(2 * (here + there) * len * kv.kv_dim()) ||
      (kv.recurrent() && e.states.states.size() != size_t(kv.state_floats()))) {
    MOESERVE_LOG_WARN("prefix cache: a disk entry of {} tokens does not fit this cache's layers; recomputing",
                      len);
    return lru_.end();
  }
  if (e.bytes() > max_bytes_) return lru_.end();  // only when the RAM budget shrank since it was written
  evict_to(max_bytes_ - e.bytes());
  bytes_ += e.bytes();
  lru_.push_front(std::move(e));
  *n = match.n;
  return lru_.begin();
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
  while (bytes_ > budget && !lru_.empty()) {
    std::list<Entry> last;  // out of the LRU, its rows handed to the writer
    last.splice(last.begin(), lru_, std::prev(lru_.end()));
    bytes_ -= last.front().bytes();
    for (backend::RemoteLayers* h : last.front().holders) h->drop_entry(last.front().remote_id);
    spill(std::move(last.front()));
  }
}

void PrefixCache::spill(Entry&& e) {
  // An entry with a remote part has only this process's rows.
  if (!disk_ || e.remote_id != 0) return;
  if (e.kv_dim != disk_->options().kv_dim || e.recurrent != disk_->options().recurrent) return;
  const size_t bytes = e.bytes();
  if (spill_queued_ + bytes > std::max(max_bytes_, bytes)) {
    if (spills_dropped_++ == 0)
      MOESERVE_LOG_WARN(
          "prefix cache: the disk is slower than evictions; entries are dropped instead of kept on disk");
    return;
  }
  spill_queued_ += bytes;
  auto entry = std::make_shared<Entry>(std::move(e));
  writer_->run([this, entry, bytes] {
    disk_->save(entry->tokens, entry->rows, entry->states);  // the tier locks itself
    std::lock_guard lock(mu_);
    spill_queued_ -= bytes;
  });
}

void PrefixCache::attach_disk(std::unique_ptr<PrefixDiskTier> disk) {
  std::lock_guard lock(mu_);
  disk_ = std::move(disk);
  if (disk_ && !writer_) writer_ = std::make_unique<SerialWorker>();
}

void PrefixCache::flush() {
  wait_for_disk();
  std::lock_guard lock(mu_);
  if (!disk_) return;
  // Here and now (a shutdown): no queue limit, nothing dropped.
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    if (it->remote_id == 0) disk_->save(it->tokens, it->rows, it->states);
  }
}

void PrefixCache::wait_for_disk() {
  SerialWorker* writer = nullptr;
  {
    std::lock_guard lock(mu_);
    writer = writer_.get();
  }
  if (writer != nullptr) writer->wait();  // outside the lock: the jobs take it
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard lock(mu_);
  PrefixCacheStats s = stats_;
  s.bytes = bytes_;
  s.entries = lru_.size();
  if (disk_) {
    s.disk_bytes = disk_->bytes();
    s.disk_entries = disk_->entries();
  }
  return s;
}

void PrefixCache::clear() {
  std::lock_guard lock(mu_);
  while (!lru_.empty()) forget(lru_.begin());
  bytes_ = 0;
}

}  // namespace moeserve::runtime
