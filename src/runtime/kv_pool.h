// Paged KV: one pool of fixed-size blocks per process, from which every
// sequence's cache takes blocks as it grows (KvCache with a pool), instead
// of each sequence reserving a whole context up front. A block holds
// `block_rows` consecutive positions of one sequence in every attention
// layer: block b of layer l is rows [b * block_rows, (b + 1) * block_rows)
// of that layer's K (and V) region on its device. A sequence's block table
// maps its positions to blocks (backend::KvView::block_table).
//
// The pool counts references per block so that a block can later be held
// by several sequences at once (shared prompt prefixes); a block goes back
// to the free list when its last holder lets go.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "models/language_model.h"

namespace moeserve::runtime {

struct KvPoolOptions {
  // K and V rows of every attention layer this process computes, together.
  size_t bytes = 0;
  int64_t block_rows = 32;  // positions per block: a power of two, 1..4096
};

class KvBlockPool {
 public:
  // The pool for the model's attention layers on this process's devices
  // (another process's layers keep their own caches). kUnsupported when
  // a layer's device cannot read a block table (Device::supports_paged_kv):
  // the caller keeps one region per sequence then. Other errors: bad
  // options, too little memory (named in bytes).
  static Result<std::shared_ptr<KvBlockPool>> create(const models::Placement& placement,
                                                     const models::ModelInfo& info,
                                                     const KvPoolOptions& options);

  int64_t block_rows() const { return block_rows_; }
  int block_shift() const { return block_shift_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t n_free() const;
  size_t block_bytes() const { return block_bytes_; }  // one block of every local attention layer
  // Positions the whole pool holds (one sequence alone at most this).
  int64_t capacity_rows() const { return n_blocks_ * block_rows_; }
  static int64_t blocks_for(int64_t positions, int64_t block_rows) {
    return (positions + block_rows - 1) / block_rows;
  }

  // Appends n free blocks (one reference each) to `out`, or none with
  // kResourceExhausted when fewer than n are free even after the reclaimer
  // gave back what it could.
  Status acquire(int64_t n, std::vector<int32_t>& out);
  // Called (without the pool's lock) when acquire() finds too few free
  // blocks: frees up to n blocks held only by a cache of blocks (the shared
  // prefix tree) and returns how many. Null: none.
  void set_reclaimer(std::function<int64_t(int64_t)> reclaimer);
  int refs(int32_t block) const;
  // Another holder of blocks already held (a shared prefix).
  void add_ref(std::span<const int32_t> blocks);
  // Drops one reference to each block; the last one frees it.
  void release(std::span<const int32_t> blocks);

  // Layer l's K and V regions ([n_blocks * block_rows][kv_dim] f16), null
  // for layers without K/V here.
  uint16_t* k(int64_t layer) const { return k_[size_t(layer)].as<uint16_t>(); }
  uint16_t* v(int64_t layer) const { return v_[size_t(layer)].as<uint16_t>(); }
  backend::Device* device(int64_t layer) const { return k_[size_t(layer)].device(); }

  // A block's rows of every local attention layer (K then V, layer by
  // layer: block_bytes()) to or from host memory (the host tier).
  Status read_block(int32_t block, std::span<uint16_t> out) const;
  Status write_block(int32_t block, std::span<const uint16_t> in);

 private:
  KvBlockPool() = default;

  // Visits each local attention layer's K and V rows of `block`:
  // f(device, k rows, v rows, offset in elements of a block_bytes() copy).
  template <typename F>
  Status each_block_region(int32_t block, F&& f) const;

  int64_t block_rows_ = 0, n_blocks_ = 0, kv_dim_ = 0;
  int block_shift_ = 0;
  size_t block_bytes_ = 0;
  std::vector<backend::DeviceMemory> k_, v_;  // per layer
  mutable std::mutex mu_;
  std::function<int64_t(int64_t)> reclaimer_;  // under mu_ (called without it)
  std::vector<int32_t> free_;                  // under mu_
  std::vector<uint16_t> refs_;                 // per block, under mu_
};

// The blocks one cache holds, in position order (its block table); given
// back to the pool when dropped.
class KvBlocks {
 public:
  KvBlocks() = default;
  explicit KvBlocks(std::shared_ptr<KvBlockPool> pool) : pool_(std::move(pool)) {}
  KvBlocks(KvBlocks&& o) noexcept : pool_(std::move(o.pool_)), table_(std::move(o.table_)) {
    o.table_.clear();
  }
  KvBlocks& operator=(KvBlocks&& o) noexcept;
  KvBlocks(const KvBlocks&) = delete;
  KvBlocks& operator=(const KvBlocks&) = delete;
  ~KvBlocks() { shrink_to(0); }

  KvBlockPool* pool() const { return pool_.get(); }
  int64_t size() const { return int64_t(table_.size()); }
  const int32_t* table() const { return table_.data(); }
  // Holds at least n blocks (kResourceExhausted, nothing taken, when the
  // pool has too few free).
  Status grow_to(int64_t n);
  // Holds at most n blocks.
  void shrink_to(int64_t n);
  // Room for a table of n blocks, so that growing up to n never moves the
  // table (views handed out keep pointing at it).
  void reserve_table(int64_t n) { table_.reserve(size_t(n)); }
  // Appends blocks the caller holds a reference to (passed on to this list).
  void adopt(std::span<const int32_t> blocks) { table_.insert(table_.end(), blocks.begin(), blocks.end()); }
  // Entry i becomes `block` (a reference passed on); the old one is released.
  void replace(int64_t i, int32_t block);

 private:
  std::shared_ptr<KvBlockPool> pool_;
  std::vector<int32_t> table_;
};

}  // namespace moeserve::runtime
