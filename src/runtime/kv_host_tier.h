// Paged KV's host tier (serve --kv-host-mem): blocks of shared prompt
// prefixes that the block tree gives back under pressure are copied to
// host memory first, and a later prompt that starts with the same tokens
// gets them copied back into fresh pool blocks instead of computing them.
// Keyed by the block's path key (KvBlockTree::path_keys: every token up to
// the block's end), checked against the block's own tokens; least recently
// used entries go first when the tier is full: to the disk tier when there
// is one (kv_block_disk.h), else they are dropped.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/kv_block_disk.h"
#include "runtime/kv_pool.h"

namespace moeserve::runtime {

struct KvHostTierStats {
  int64_t blocks = 0;    // held now
  size_t bytes = 0;      // ... their K/V bytes
  int64_t stored = 0;    // since start
  int64_t restored = 0;  // copied back into the pool
  int64_t dropped = 0;   // pushed out by newer ones (to the disk tier when there is one)
  int64_t restored_from_disk = 0;
};

class KvHostTier {
 public:
  KvHostTier(std::shared_ptr<KvBlockPool> pool, size_t max_bytes);

  // Entries pushed out go there, and contains/restore look there too.
  void attach_disk(std::unique_ptr<KvBlockDisk> disk);
  const KvBlockDisk* disk() const { return disk_.get(); }
  // A server's shutdown: from now on saves to the disk tier wait for its
  // writer instead of being dropped when it is behind (call before the
  // tree spills its blocks here), then flush_to_disk moves every entry
  // there and waits for the writes.
  void hold_disk_writes();
  void flush_to_disk();

  // Keeps a copy of pool block `block` (the block of `tokens` at path key
  // `path`); the least recently used copies make room. A failed copy keeps
  // nothing; a tier too small for one block passes it to the disk tier.
  void store(uint64_t path, std::span<const int32_t> tokens, int32_t block);
  // Whether a copy of this block is here (or in the disk tier).
  bool contains(uint64_t path, std::span<const int32_t> tokens) const;
  // Copies it into pool block `into` (a fresh block the caller holds);
  // false when it is not here or the copy failed.
  bool restore(uint64_t path, std::span<const int32_t> tokens, int32_t into);
  KvHostTierStats stats() const;

 private:
  struct Entry {
    uint64_t path = 0;
    std::vector<int32_t> tokens;
    std::vector<uint16_t> rows;  // KvBlockPool::read_block's layout
  };
  using Lru = std::list<Entry>;                                              // most recently used first
  Lru::iterator find(uint64_t path, std::span<const int32_t> tokens) const;  // under mu_

  std::shared_ptr<KvBlockPool> pool_;
  size_t max_bytes_ = 0;
  mutable std::mutex mu_;
  mutable Lru lru_;
  std::unordered_map<uint64_t, Lru::iterator> by_path_;
  KvHostTierStats stats_;
  std::unique_ptr<KvBlockDisk> disk_;  // set before use (attach_disk)
};

}  // namespace moeserve::runtime
