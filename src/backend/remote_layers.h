// Layers another process computes: a `proc:` or `mpi:` shard of a layer
// split (issue 41). The forward hands such a range the batch as the host
// sees it (tokens, each sequence's cache and positions, the hidden rows
// when the range does not begin at layer 0) and gets back either the hidden
// rows after the range or, when the range is the model's last, the output
// head's logits and greedy ids. Each sequence's K/V rows and recurrent state
// for those layers stay in the other process: the caches below are named by
// a number the parent's KvCache chooses, and each of its operations that
// touches the range's layers goes there too.
//
// Data-only structs and one interface: the transport (a Unix socket to a
// child process, MPI) implements it elsewhere; the models and the cache
// see only this.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::backend {

// One sequence's rows of a remote forward: rows [row0, row0 + n_tokens) at
// positions pos0.. of cache `cache` (tree_parents as SequenceSlice's).
struct RemoteSlice {
  uint64_t cache = 0;
  int64_t row0 = 0, n_tokens = 0, pos0 = 0;
  std::span<const int32_t> tree_parents{};
};

struct RemoteForward {
  int64_t begin = 0, end = 0;           // the range's layers, [begin, end)
  std::span<const int32_t> tokens;      // every row's token
  std::span<const RemoteSlice> slices;  // cover the rows in order
  const float* hidden_in = nullptr;     // [rows][n_embd] when begin > 0 (the residual stream)
  float* hidden_out = nullptr;          // [rows][n_embd] when end < n_layer
  // When end == n_layer: the output head (ForwardBatch's meaning).
  std::span<const int64_t> logit_rows;
  float* logits = nullptr;
  int32_t* greedy = nullptr;
  // Layers of the range whose output rows are wanted ([k][rows][n_embd]).
  std::span<const int32_t> capture_layers;
  float* captured = nullptr;
  int64_t decode_rows = 0;
  // Not empty: hidden_in and hidden_out are in this device's memory
  // ("cuda:0", RemoteLayers::rows_device) and cross without the host.
  std::string_view rows_device;
};

// One sequence's cache in the other process (KvCache's operations, for the
// range's layers).
class RemoteLayers {
 public:
  virtual ~RemoteLayers() = default;
  // For errors and logs: "proc:cpu (pid 1234)".
  virtual std::string name() const = 0;
  virtual Status forward(const RemoteForward& f) = 0;
  // The device ("cuda:0") whose memory this range takes its hidden rows
  // from and gives them back to directly (NCCL between MPI ranks' GPUs);
  // empty: host rows only. A forward may still bring host rows.
  virtual std::string rows_device() const { return {}; }
  // Fewer bytes of rows than this go through the host even so (a decode
  // step's few KB: there the direct path's own launches cost more).
  virtual size_t rows_device_min_bytes() const { return 0; }

  virtual Status open_cache(uint64_t cache, int64_t capacity) = 0;
  virtual void close_cache(uint64_t cache) = 0;
  // Positions [0, pos) kept of `used`; a recurrent state cut below used
  // starts over (KvCache::truncate).
  virtual Status truncate(uint64_t cache, int64_t used, int64_t pos) = 0;
  // Attention layer `layer`'s rows [0, n) (f16 K and V, [n][kv_dim] each).
  virtual Status read_rows(uint64_t cache, int64_t layer, int64_t n, uint16_t* k, uint16_t* v) = 0;
  virtual Status write_rows(uint64_t cache, int64_t layer, int64_t n, const uint16_t* k,
                            const uint16_t* v) = 0;
  // The range's recurrent states in layer order (state_floats() floats).
  virtual Status read_states(uint64_t cache, float* states) = 0;
  virtual Status write_states(uint64_t cache, const float* states) = 0;
  virtual int64_t state_floats() const = 0;
  virtual Status reserve_tree_nodes(uint64_t cache, int64_t n) = 0;
  // KvCache::accept_tree at position `used`.
  virtual Status accept_tree(uint64_t cache, int64_t used, std::span<const int32_t> path) = 0;

  // Prefix-cache entries kept where the rows are (the prefix cache's
  // entry numbers): save_entry copies rows [0, n) of the cache's layers
  // (and, for recurrent layers, their states, which must be at n) into
  // entry `entry`, replacing one of that number; restore_entry copies rows
  // [0, n) of it back into a cache (the states too: n is then the entry's
  // whole length), drop_entry forgets it. Without them (keeps_entries()
  // false) the prefix cache reads the rows back instead.
  virtual bool keeps_entries() const { return false; }
  virtual Status save_entry(uint64_t cache, uint64_t entry, int64_t n) {
    return make_error(StatusCode::kUnsupported, "{} keeps no prefix-cache entries", name());
  }
  virtual Status restore_entry(uint64_t cache, uint64_t entry, int64_t n) {
    return make_error(StatusCode::kUnsupported, "{} keeps no prefix-cache entries", name());
  }
  virtual void drop_entry(uint64_t entry) {}
};

// Layers [begin, end) on `layers` (not owned; outlives the model).
struct RemoteRange {
  int64_t begin = 0, end = 0;
  RemoteLayers* layers = nullptr;
};

}  // namespace moeserve::backend
