// Prefix cache: KV rows of earlier sequences, kept so a new request whose
// prompt starts with the same tokens (a shared system prompt, the earlier
// turns of a chat) skips recomputing them.
//
// Entries are copies of a finished sequence's f16 K/V rows [0, n) for every
// attention layer, keyed by its tokens. A lookup takes the longest common
// prefix with any entry — any prefix of an entry is valid, since row p
// depends only on tokens 0..p. A model with recurrent layers (Gated
// DeltaNet) also keeps their states at n (a snapshot at the end of the
// entry); those hold position n only, so such an entry is reused whole or
// not at all (a chat's next turn starts with the whole previous exchange).
// Evicts least recently used entries to stay under a byte budget.
// Layers in other processes that keep entries themselves (a layer split's
// shards: RemoteLayers::keeps_entries) keep their part of an entry there,
// under the entry's number: their rows never cross to this process; the
// budget counts them all the same.
// With a disk tier attached (prefix_disk.h), entries evicted for the
// budget and, when the cache goes, every entry still here are written to
// disk (entries with a remote part stay out: their rows are not here), and
// a lookup that finds a longer usable prefix there loads it back.
// Thread-safe (one mutex; copies are memcpy-fast next to a forward).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "core/serial_worker.h"
#include "runtime/kv_cache.h"
#include "runtime/prefix_disk.h"

namespace moeserve::runtime {

struct PrefixCacheStats {
  int64_t hits = 0;  // lookups that reused at least one token (disk hits included)
  int64_t misses = 0;
  int64_t reused_tokens = 0;  // tokens restored instead of computed
  size_t bytes = 0;
  size_t entries = 0;
  // The disk tier (zeros without one): lookups served from an entry loaded
  // from disk, and the files kept there.
  int64_t disk_hits = 0;
  uint64_t disk_bytes = 0;
  size_t disk_entries = 0;
};

class PrefixCache {
 public:
  explicit PrefixCache(size_t max_bytes) : max_bytes_(max_bytes) {}
  // Writes the entries to the disk tier (flush()), then drops them, their
  // remote parts too (the remote layers outlive it).
  ~PrefixCache() {
    flush();
    clear();
  }
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Copies the K/V rows of the longest cached prefix of `tokens`, at most
  // `max_tokens` long, into rows [0, n) of `kv` and returns n (0: a miss).
  // The caller records those tokens in its sequence.
  int64_t restore(std::span<const int32_t> tokens, int64_t max_tokens, KvCache& kv);

  // Keeps rows [0, tokens.size()) of `kv`. An entry that is a prefix of
  // `tokens` is replaced; if `tokens` is a prefix of an entry nothing is
  // copied (that entry is refreshed). Sequences larger than the whole budget
  // are not kept.
  void store(std::span<const int32_t> tokens, const KvCache& kv);

  PrefixCacheStats stats() const;
  // Drops every entry here (not the disk tier's files: clear() is a reset,
  // not a shutdown).
  void clear();

  // Adds a disk tier under the cache (before its first use).
  void attach_disk(std::unique_ptr<PrefixDiskTier> disk);
  // Writes every entry the disk tier can keep to it (oldest first, so the
  // newest survive its budget), after the evicted ones still queued; the
  // entries stay here too. No tier: nothing.
  void flush();
  // Returns once the entries evicted so far are written (they go in the
  // background); for tests and shutdown.
  void wait_for_disk();

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    int64_t kv_dim = 0;
    bool recurrent = false;
    // Per attention layer here: K rows [n][kv_dim], then V rows [n][kv_dim].
    std::vector<uint16_t> rows;
    // Recurrent layers at n (none: empty); only this process's when
    // `holders` keep theirs.
    CacheSnapshot states;
    // Non-zero: the remote ranges `holders` keep the rest under this number.
    uint64_t remote_id = 0;
    std::vector<backend::RemoteLayers*> holders;
    size_t remote_bytes = 0;
    size_t bytes() const {
      return rows.size() * sizeof(uint16_t) + tokens.size() * sizeof(int32_t) + states.bytes() + remote_bytes;
    }
  };
  // Evicts least recently used entries until at most `budget` bytes are
  // left; with a disk tier they are written there (in the background).
  void evict_to(size_t budget);
  // Queues `e`'s rows for the disk tier if it can keep them: the writer
  // thread writes them while the engine goes on (a 30B-A3B entry of 2k
  // tokens is ~200 MB: a blocking write would stall every stream). At most
  // the RAM budget waits in the queue; past that an entry is not spilled.
  void spill(Entry&& e);
  // The disk tier's entry that restores more than `longer_than` tokens of
  // `tokens` (at most `max_tokens`) into `kv`, loaded to the front of the
  // LRU; end() when there is none (or it cannot be used).
  std::list<Entry>::iterator load_from_disk(std::span<const int32_t> tokens, int64_t max_tokens,
                                            int64_t longer_than, const KvCache& kv, int64_t* n);
  // Removes `it` (and its remote part); the next entry.
  std::list<Entry>::iterator forget(std::list<Entry>::iterator it);
  // Rows and states of `kv` into `e` (its remote layers' kept there when
  // they can); false on a device error.
  bool copy_in(Entry& e, const KvCache& kv, int64_t n);
  uint64_t next_remote_id_ = 1;

  size_t max_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front: most recently used
  size_t bytes_ = 0;
  PrefixCacheStats stats_;
  std::unique_ptr<PrefixDiskTier> disk_;
  size_t spill_queued_ = 0;  // bytes waiting for the writer (under mu_)
  int64_t spills_dropped_ = 0;
  // Declared last: destroyed (its queue written) before the tier it writes to.
  std::unique_ptr<SerialWorker> writer_;
};

}  // namespace moeserve::runtime
