// Shared prompt prefixes on paged KV: a radix tree whose edges are whole
// blocks of tokens. Each node holds the pool block with that block's K/V
// rows, computed after the tokens of its ancestors; a sequence whose
// prompt starts with the same blocks of tokens takes those blocks into its
// own block table (one more reference each) instead of computing them.
// Blocks go in as sequences fill them, so concurrent requests with a
// common system prompt share it while they run, and finished ones leave
// theirs for the next.
//
// A shared block is never written: a sequence only writes at or past its
// position, and its shared blocks lie wholly below (KvCache copies a
// shared block before rewinding into it).
//
// When the pool runs short, the least recently used leaves that no
// sequence holds give their blocks back (the pool's reclaimer), before
// any running sequence is preempted.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/kv_cache.h"
#include "runtime/kv_pool.h"

namespace moeserve::runtime {

struct KvBlockTreeStats {
  int64_t blocks = 0;          // nodes (each holds one block)
  int64_t hits = 0;            // lookups that shared at least one block
  int64_t shared_tokens = 0;   // positions taken from the tree instead of computed
  int64_t evicted_blocks = 0;  // given back to the pool under pressure
  int64_t states = 0;          // recurrent state snapshots held (attach_state)
  size_t state_bytes = 0;
};

class KvBlockTree {
 public:
  // Installs itself as the pool's reclaimer (removed again when destroyed).
  explicit KvBlockTree(std::shared_ptr<KvBlockPool> pool);
  ~KvBlockTree();
  KvBlockTree(const KvBlockTree&) = delete;
  KvBlockTree& operator=(const KvBlockTree&) = delete;

  // The blocks that hold the longest run of whole blocks of `tokens` (at
  // most max_blocks), in order, each with a reference for the caller.
  // With `state` (models with recurrent layers): only as far as the
  // deepest of those blocks that has a state snapshot, which goes there
  // (none: no blocks).
  std::vector<int32_t> match(std::span<const int32_t> tokens, int64_t max_blocks,
                             std::shared_ptr<const CacheSnapshot>* state = nullptr);
  // The recurrent states after the first n whole blocks of `tokens` (which
  // the tree holds: insert() them first), kept with the n-th block; the
  // least recently used snapshots go when they pass the state budget.
  void attach_state(std::span<const int32_t> tokens, int64_t n, std::shared_ptr<const CacheSnapshot> state);
  void set_state_budget(size_t bytes);
  // blocks[i] holds positions [i * rows, (i + 1) * rows) of `tokens` (the
  // whole blocks of it that `blocks` covers): adds the ones the tree lacks
  // (taking a reference), and marks the path as used now.
  void insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks);
  // Drops up to n least recently used leaves that only the tree holds;
  // returns the blocks freed. Each goes through the spill first (if set).
  int64_t evict(int64_t n);
  // Called (under the tree's lock, before the block is given back) for
  // each evicted block: its path key (path_keys), its tokens, the block.
  using Spill = std::function<void(uint64_t path, std::span<const int32_t> tokens, int32_t block)>;
  void set_spill(Spill spill);
  // Passes every block the tree holds through the spill, keeping them (a
  // server's shutdown: the disk tier keeps them for the next start);
  // returns how many.
  int64_t spill_all();
  // Block i's path key for the first n whole blocks of `tokens`: a hash of
  // every token up to the block's end, the same in every process (the key
  // a copy of the block is found by in a lower tier).
  static std::vector<uint64_t> path_keys(std::span<const int32_t> tokens, int64_t block_rows, int64_t n);
  // Blocks evict() could free now (held by the tree alone).
  int64_t reclaimable() const;
  KvBlockTreeStats stats() const;
  void count_hit(int64_t tokens);

 private:
  struct Node {
    int64_t parent = -1;  // -1: under the root
    int32_t block = -1;
    int32_t children = 0;
    uint64_t used = 0;  // tick of the last match or insert through it
    uint64_t key = 0;
    uint64_t path = 0;                           // path_keys' key of the block
    std::vector<int32_t> tokens;                 // the block's tokens
    std::shared_ptr<const CacheSnapshot> state;  // recurrent states after this block (null: none)
    bool alive = false;
  };
  static uint64_t key_of(int64_t parent, std::span<const int32_t> tokens);
  // The child of `parent` for these tokens, or -1. Under mu_.
  int64_t find(int64_t parent, std::span<const int32_t> tokens) const;
  void remove(int64_t node);  // a leaf; under mu_
  void drop_state(Node& n);   // under mu_

  std::shared_ptr<KvBlockPool> pool_;
  int64_t rows_ = 0;
  mutable std::mutex mu_;
  std::vector<Node> nodes_;
  std::vector<int64_t> free_nodes_;
  std::unordered_multimap<uint64_t, int64_t> by_key_;
  uint64_t tick_ = 0;
  KvBlockTreeStats stats_;
  Spill spill_;
  size_t state_budget_ = 0;
};

}  // namespace moeserve::runtime
