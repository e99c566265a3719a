// The f16 key/value cache of one sequence: per layer, K and V rows
// [capacity][n_head_kv * head_dim]; row p holds position p. Capacity is the
// context size, allocated up front so a long generation never reallocates.
#pragma once

#include <cstdint>
#include <vector>

#include "models/qwen3.h"

namespace moeserve::runtime {

class KvCache {
 public:
  KvCache(int64_t n_layer, int64_t kv_dim, int64_t capacity);

  int64_t capacity() const { return capacity_; }
  int64_t n_layer() const { return int64_t(k_.size()); }
  int64_t kv_dim() const { return kv_dim_; }
  size_t bytes() const { return size_t(2 * n_layer() * capacity_ * kv_dim_) * sizeof(uint16_t); }
  // Positions [0, used) hold valid rows.
  int64_t used() const { return used_; }
  void set_used(int64_t n) { used_ = n; }
  // Forget positions >= pos (rewind); rows past it are simply overwritten later.
  void truncate(int64_t pos);
  void clear() { used_ = 0; }

  // The view the model writes into.
  models::KvView view() const { return {views_, capacity_}; }

 private:
  int64_t kv_dim_, capacity_, used_ = 0;
  std::vector<std::vector<uint16_t>> k_, v_;
  std::vector<models::KvLayerView> views_;
};

}  // namespace moeserve::runtime
