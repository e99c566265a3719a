#include "runtime/kv_cache.h"

#include <algorithm>

namespace moeserve::runtime {

KvCache::KvCache(int64_t n_layer, int64_t kv_dim, int64_t capacity)
    : kv_dim_(kv_dim), capacity_(capacity), k_(size_t(n_layer)), v_(size_t(n_layer)) {
  for (int64_t l = 0; l < n_layer; ++l) {
    k_[size_t(l)].assign(size_t(capacity * kv_dim), 0);
    v_[size_t(l)].assign(size_t(capacity * kv_dim), 0);
    views_.push_back({k_[size_t(l)].data(), v_[size_t(l)].data()});
  }
}

void KvCache::truncate(int64_t pos) { used_ = std::clamp<int64_t>(pos, 0, used_); }

}  // namespace moeserve::runtime
