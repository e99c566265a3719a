#include "runtime/kv_host_tier.h"

#include <algorithm>

namespace moeserve::runtime {

KvHostTier::KvHostTier(std::shared_ptr<KvBlockPool> pool, size_t max_bytes)
    : pool_(std::move(pool)), max_bytes_(max_bytes) {}

KvHostTier::Lru::iterator KvHostTier::find(uint64_t path, std::span<const int32_t> tokens) const {
  const auto it = by_path_.find(path);
  if (it == by_path_.end()) return lru_.end();
  const Entry& e = *it->second;
  if (!std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end())) return lru_.end();
  return it->second;
}

void KvHostTier::store(uint64_t path, std::span<const int32_t> tokens, int32_t block) {
  const size_t bytes = pool_->block_bytes();
  if (bytes > max_bytes_) return;
  std::vector<uint16_t> rows(bytes / sizeof(uint16_t));
  if (!pool_->read_block(block, rows).is_ok()) return;
  std::lock_guard lock(mu_);
  if (const auto old = by_path_.find(path); old != by_path_.end()) {  // a newer copy of the same block
    stats_.bytes -= old->second->rows.size() * sizeof(uint16_t);
    --stats_.blocks;
    lru_.erase(old->second);
    by_path_.erase(old);
  }
  while (stats_.bytes + bytes > max_bytes_ && !lru_.empty()) {
    const Entry& last = lru_.back();
    stats_.bytes -= last.rows.size() * sizeof(uint16_t);
    --stats_.blocks;
    ++stats_.dropped;
    by_path_.erase(last.path);
    lru_.pop_back();
  }
  lru_.push_front({path, std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(rows)});
  by_path_[path] = lru_.begin();
  stats_.bytes += bytes;
  ++stats_.blocks;
  ++stats_.stored;
}

bool KvHostTier::contains(uint64_t path, std::span<const int32_t> tokens) const {
  std::lock_guard lock(mu_);
  return find(path, tokens) != lru_.end();
}

bool KvHostTier::restore(uint64_t path, std::span<const int32_t> tokens, int32_t into) {
  std::lock_guard lock(mu_);
  const auto it = find(path, tokens);
  if (it == lru_.end() || !pool_->write_block(into, it->rows).is_ok()) return false;
  lru_.splice(lru_.begin(), lru_, it);  // used now
  ++stats_.restored;
  return true;
}

KvHostTierStats KvHostTier::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace moeserve::runtime
