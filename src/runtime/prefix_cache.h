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
// Thread-safe (one mutex; copies are memcpy-fast next to a forward).
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <vector>

#include "runtime/kv_cache.h"

namespace moeserve::runtime {

struct PrefixCacheStats {
  int64_t hits = 0;  // lookups that reused at least one token
  int64_t misses = 0;
  int64_t reused_tokens = 0;  // tokens restored instead of computed
  size_t bytes = 0;
  size_t entries = 0;
};

class PrefixCache {
 public:
  explicit PrefixCache(size_t max_bytes) : max_bytes_(max_bytes) {}
  // Drops the entries' remote parts too (the remote layers outlive it).
  ~PrefixCache() { clear(); }
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
  void clear();

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
  void evict_to(size_t budget);
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
};

}  // namespace moeserve::runtime
