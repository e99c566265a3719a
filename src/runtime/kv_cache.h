// One sequence's cache, per layer in the memory of the device that computes
// the layer:
//  - an attention layer's f16 K and V rows [capacity][kv_dim]; row p holds
//    position p. Capacity is the context size, allocated up front (host
//    memory is zero pages until written, so an idle cache costs no resident
//    memory) so a long generation never reallocates. Or, with a block pool
//    (kv_pool.h, paged KV), blocks of rows taken from the pool as the
//    sequence grows (reserve()) and given back when it shrinks; capacity
//    then only caps the positions.
//  - a recurrent layer's fp32 state (Gated DeltaNet: conv + SSM state),
//    which holds the sequence as of its last position. It cannot be cut
//    back to an earlier position: truncate() below used() starts the
//    sequence over, unless a snapshot taken at that position is restored.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "models/language_model.h"
#include "runtime/kv_pool.h"

namespace moeserve::runtime {

// The recurrent states of a cache at one position (host copies), to return
// to later: a prefix cache entry, or speculative decoding's rollback point.
struct CacheSnapshot {
  int64_t position = 0;
  std::vector<float> states;  // every recurrent layer's state, in layer order
  size_t bytes() const { return states.size() * sizeof(float); }
};

class KvCache {
 public:
  KvCache() = default;
  // Host memory for every layer (tests, tools): all attention layers, or
  // the given layer kinds. An allocation failure leaves a cache of
  // capacity 0 (see status()).
  KvCache(int64_t n_layer, int64_t kv_dim, int64_t capacity);
  KvCache(std::span<const models::LayerCache> layers, int64_t kv_dim, int64_t capacity);
  // Each layer's rows or state on the device that computes it. Errors name the bytes.
  // With a pool, the attention layers' rows come from it (paged).
  static Result<KvCache> allocate(const models::Placement& placement, const models::ModelInfo& info,
                                  int64_t capacity, std::shared_ptr<KvBlockPool> pool = nullptr);

  const Status& status() const { return status_; }
  int64_t capacity() const { return capacity_; }
  int64_t n_layer() const { return int64_t(layers_.size()); }
  int64_t kv_dim() const { return kv_dim_; }
  // A layer keeps a recurrent state (see the file comment).
  bool recurrent() const { return state_floats_ > 0; }
  int64_t state_floats() const { return state_floats_; }  // every recurrent layer's, remote ones too
  static size_t bytes_for(const models::ModelInfo& info, int64_t capacity);
  size_t bytes() const;
  // Positions [0, used) hold valid rows.
  int64_t used() const { return used_; }
  // Paged KV: rows come from a block pool (null: one region of capacity rows).
  KvBlockPool* pool() const { return blocks_.pool(); }
  int64_t blocks_held() const { return blocks_.size(); }
  // Rows for positions [0, n) exist, taken from the pool if needed: call it
  // before a forward writes positions below n. kResourceExhausted when the
  // pool has too few free blocks (nothing taken), kOutOfRange past the
  // capacity. Without a pool only the capacity is checked.
  Status reserve(int64_t n);
  // Blocks reserve(n) would still take from the pool.
  int64_t blocks_needed(int64_t n) const;
  // The block table (paged; blocks_held() entries).
  std::span<const int32_t> block_table() const { return {blocks_.table(), size_t(blocks_.size())}; }
  // An empty paged cache starts with shared blocks (a reference to each
  // passed on to it; KvBlockTree::match): their rows are positions
  // [0, blocks * block_rows), and used() becomes that. Not with remote
  // layers (their rows are elsewhere); with recurrent layers the caller
  // restores their states at that position next (KvBlockTree::attach_state).
  Status adopt_prefix(std::span<const int32_t> blocks);
  // Preemption (paged only): the rows below used() go to host memory and
  // the blocks back to the pool; swap_in() takes blocks again and brings
  // the rows back (kResourceExhausted, still swapped out, when the pool is
  // short). The recurrent states stay where they are. While swapped out
  // the cache must not be used otherwise.
  Status swap_out();
  Status swap_in();
  bool swapped_out() const { return swapped_; }
  size_t swapped_bytes() const { return swap_k_.size() * 2 * sizeof(uint16_t); }
  void set_used(int64_t n) { used_ = n; }
  // Forget positions >= pos (rewind); rows past it are simply overwritten
  // later. A recurrent cache cut below used() starts over (its states
  // zeroed). Returns the positions kept.
  int64_t truncate(int64_t pos);
  void clear() { (void)truncate(0); }

  // The view the model writes into (device pointers). Handing it out marks
  // the recurrent states as possibly written (a forward may not set_used).
  models::KvView view() const {
    states_written_ = true;
    models::KvView v{views_, capacity_, remote_.id()};
    if (pool() != nullptr) {
      v.block_table = blocks_.table();
      v.block_shift = pool()->block_shift();
    }
    return v;
  }
  // Layer l's layout: K/V rows or a state.
  const models::LayerCache& layer(int64_t l) const { return layers_[size_t(l)]; }
  // Rows [0, n) of attention layer l to or from host memory (the prefix cache).
  Status read_rows(int64_t layer, int64_t n, uint16_t* k, uint16_t* v) const;
  Status write_rows(int64_t layer, int64_t n, const uint16_t* k, const uint16_t* v);
  // The recurrent states at used() (no state: an empty snapshot); with
  // kLocal, only those of this process's layers (not of remote ranges).
  enum class Scope { kAll, kLocal };
  Result<CacheSnapshot> snapshot(Scope scope = Scope::kAll) const;
  // Back to a snapshot taken of this cache (with the same scope): the
  // states are copied back and used() becomes its position. The K/V rows
  // below it must not have been rewritten since (Sequence::restore checks
  // the tokens).
  Status restore(const CacheSnapshot& snapshot, Scope scope = Scope::kAll);

  // Layer l is another process's (Placement::remote).
  bool remote_layer(int64_t l) const { return remote_.find(l) != nullptr; }
  // Every remote range keeps prefix-cache entries itself
  // (RemoteLayers::keeps_entries); false without remote ranges.
  bool remote_keeps_entries() const;
  // The remote ranges' side of a prefix-cache entry (RemoteLayers::save_entry...).
  Status save_remote_entry(uint64_t entry, int64_t n) const;
  Status restore_remote_entry(uint64_t entry, int64_t n);
  // The layers that keep them (to drop an entry after the cache is gone).
  std::vector<backend::RemoteLayers*> remote_layers() const;

  // Speculative decoding's draft trees (backend::SequenceSlice::tree_parents).
  // Room for the states after each of up to n rows of a tree, on every
  // recurrent layer's device (kept once made; a cache without recurrent
  // layers needs none).
  Status reserve_tree_nodes(int64_t n);
  int64_t tree_nodes() const { return tree_nodes_; }
  // After a tree forward at used(): keeps the rows of `path` (rows of the
  // tree, root first, each a child of the one before) as positions used()..:
  // their K/V rows move down into place and each recurrent layer takes the
  // state after the path's last row. used() grows by path.size().
  Status accept_tree(std::span<const int32_t> path);

 private:
  // The cache's layers in other processes (Placement::remote): opened under
  // a number of their own, closed with the cache.
  class RemoteParts {
   public:
    RemoteParts() = default;
    RemoteParts(RemoteParts&& o) noexcept : id_(std::exchange(o.id_, 0)), ranges_(std::move(o.ranges_)) {}
    RemoteParts& operator=(RemoteParts&& o) noexcept;
    ~RemoteParts() { close(); }
    Status open(std::span<const backend::RemoteRange> ranges, int64_t capacity);
    void close();
    uint64_t id() const { return id_; }
    const std::vector<backend::RemoteRange>& ranges() const { return ranges_; }
    // The range that holds layer l, or null.
    const backend::RemoteRange* find(int64_t l) const;

   private:
    uint64_t id_ = 0;
    std::vector<backend::RemoteRange> ranges_;
  };

  Status allocate_layers(const std::vector<backend::Device*>& devices, KvBlockPool* pool);
  Status zero_states();
  // Layer l's K and V base (a region of its own or the pool's) and device.
  uint16_t* k_base(size_t l) const { return views_[l].k; }
  uint16_t* v_base(size_t l) const { return views_[l].v; }
  backend::Device* kv_device(size_t l) const;
  // The row of layer regions that holds position p.
  int64_t cache_row(int64_t p) const {
    if (pool() == nullptr) return p;
    const int shift = pool()->block_shift();
    return (int64_t(blocks_.table()[p >> shift]) << shift) | (p & ((int64_t(1) << shift) - 1));
  }
  // Copies rows [from, from + n) of positions to or from host memory,
  // block by block in a paged cache.
  Status for_each_row_run(int64_t from, int64_t n,
                          const std::function<Status(int64_t, int64_t, int64_t)>& f) const;
  Status copy_rows_to_host(size_t l, int64_t from, int64_t n, uint16_t* k, uint16_t* v) const;
  Status copy_rows_to_device(size_t l, int64_t from, int64_t n, const uint16_t* k, const uint16_t* v);
  Status move_rows(size_t l, int64_t to, int64_t from, int64_t n);
  // Paged: the block holding position pos becomes this cache's own (a copy
  // of its rows below pos) if another holder shares it, so that positions
  // from pos on can be written. False when the pool has no block for it.
  bool unshare_block_at(int64_t pos);

  int64_t kv_dim_ = 0, capacity_ = 0, used_ = 0, state_floats_ = 0;
  // The states may differ from zeros (a view was handed out or a snapshot
  // restored since they were last zeroed): clearing a cleared cache twice,
  // as a request's finish and the next admission do, zeroes them once.
  mutable bool states_written_ = false;
  Status status_;
  std::vector<models::LayerCache> layers_;
  std::vector<backend::DeviceMemory> k_, v_, state_, node_states_;
  KvBlocks blocks_;  // paged: the blocks held, in position order
  // Paged and preempted: the local attention layers' rows below used_, in
  // layer order (swap_out).
  std::vector<uint16_t> swap_k_, swap_v_;
  bool swapped_ = false;
  int64_t tree_nodes_ = 0;
  std::vector<backend::KvLayerView> views_;
  RemoteParts remote_;
};

}  // namespace moeserve::runtime
