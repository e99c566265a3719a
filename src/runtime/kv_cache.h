// The f16 key/value cache of one sequence: per layer, K and V rows
// [capacity][kv_dim] in the memory of the device that computes the layer;
// row p holds position p. Capacity is the context size, allocated up front
// (host memory is zero pages until written, so an idle cache costs no
// resident memory) so a long generation never reallocates.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "models/language_model.h"

namespace moeserve::runtime {

class KvCache {
 public:
  KvCache() = default;
  // Host memory for every layer (tests, tools). An allocation failure
  // leaves a cache of capacity 0 (see status()).
  KvCache(int64_t n_layer, int64_t kv_dim, int64_t capacity);
  // Each layer's rows on the device that computes it. Errors name the bytes.
  static Result<KvCache> allocate(const models::Placement& placement, int64_t n_layer, int64_t kv_dim,
                                  int64_t capacity);

  const Status& status() const { return status_; }
  int64_t capacity() const { return capacity_; }
  int64_t n_layer() const { return int64_t(k_.size()); }
  int64_t kv_dim() const { return kv_dim_; }
  static size_t bytes_for(int64_t n_layer, int64_t kv_dim, int64_t capacity) {
    return size_t(2 * n_layer * capacity * kv_dim) * sizeof(uint16_t);
  }
  size_t bytes() const { return bytes_for(n_layer(), kv_dim_, capacity_); }
  // Positions [0, used) hold valid rows.
  int64_t used() const { return used_; }
  void set_used(int64_t n) { used_ = n; }
  // Forget positions >= pos (rewind); rows past it are simply overwritten later.
  void truncate(int64_t pos);
  void clear() { used_ = 0; }

  // The view the model writes into (device pointers).
  models::KvView view() const { return {views_, capacity_}; }
  // Rows [0, n) of layer l to or from host memory (the prefix cache).
  Status read_rows(int64_t layer, int64_t n, uint16_t* k, uint16_t* v) const;
  Status write_rows(int64_t layer, int64_t n, const uint16_t* k, const uint16_t* v);

 private:
  Status allocate_layers(const std::vector<backend::Device*>& devices);

  int64_t kv_dim_ = 0, capacity_ = 0, used_ = 0;
  Status status_;
  std::vector<backend::DeviceMemory> k_, v_;
  std::vector<backend::KvLayerView> views_;
};

}  // namespace moeserve::runtime
