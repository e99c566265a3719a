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

void KvHostTier::attach_disk(std::unique_ptr<KvBlockDisk> disk) { disk_ = std::move(disk); }

void KvHostTier::store(uint64_t path, std::span<const int32_t> tokens, int32_t block) {
  const size_t bytes = pool_->block_bytes();
  std::vector<uint16_t> rows(bytes / sizeof(uint16_t));
  if (!pool_->read_block(block, rows).is_ok()) return;
  if (bytes > max_bytes_) {
    if (disk_ != nullptr)
      disk_->save(path, std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(rows));
    return;
  }
  std::vector<Entry> pushed_out;  // to the disk tier, after the lock
  {
    std::lock_guard lock(mu_);
    if (const auto old = by_path_.find(path); old != by_path_.end()) {  // a newer copy of the same block
      stats_.bytes -= old->second->rows.size() * sizeof(uint16_t);
      --stats_.blocks;
      lru_.erase(old->second);
      by_path_.erase(old);
    }
    while (stats_.bytes + bytes > max_bytes_ && !lru_.empty()) {
      Entry& last = lru_.back();
      stats_.bytes -= last.rows.size() * sizeof(uint16_t);
      --stats_.blocks;
      ++stats_.dropped;
      by_path_.erase(last.path);
      if (disk_ != nullptr) pushed_out.push_back(std::move(last));
      lru_.pop_back();
    }
    lru_.push_front({path, std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(rows)});
    by_path_[path] = lru_.begin();
    stats_.bytes += bytes;
    ++stats_.blocks;
    ++stats_.stored;
  }
  for (Entry& e : pushed_out) disk_->save(e.path, std::move(e.tokens), std::move(e.rows));
}

void KvHostTier::hold_disk_writes() {
  if (disk_ != nullptr) disk_->set_blocking(true);
}

void KvHostTier::flush_to_disk() {
  if (disk_ == nullptr) return;
  disk_->set_blocking(true);  // nothing dropped for a writer behind
  std::lock_guard lock(mu_);
  while (!lru_.empty()) {  // oldest first: the newest get the newest files
    Entry& e = lru_.back();
    disk_->save(e.path, std::move(e.tokens), std::move(e.rows));
    by_path_.erase(e.path);
    lru_.pop_back();
  }
  stats_.blocks = 0, stats_.bytes = 0;
  disk_->flush();
  disk_->set_blocking(false);
}

bool KvHostTier::contains(uint64_t path, std::span<const int32_t> tokens) const {
  {
    std::lock_guard lock(mu_);
    if (find(path, tokens) != lru_.end()) return true;
  }
  return disk_ != nullptr && disk_->contains(path, tokens);
}

bool KvHostTier::restore(uint64_t path, std::span<const int32_t> tokens, int32_t into) {
  {
    std::lock_guard lock(mu_);
    if (const auto it = find(path, tokens); it != lru_.end()) {
      if (!pool_->write_block(into, it->rows).is_ok()) return false;
      lru_.splice(lru_.begin(), lru_, it);  // used now
      ++stats_.restored;
      return true;
    }
  }
  std::vector<uint16_t> rows;
  if (disk_ == nullptr || !disk_->load(path, tokens, rows) || !pool_->write_block(into, rows).is_ok())
    return false;
  std::lock_guard lock(mu_);
  ++stats_.restored;
  ++stats_.restored_from_disk;
  return true;
}

KvHostTierStats KvHostTier::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace moeserve::runtime
