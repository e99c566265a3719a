#include "runtime/kv_cache.h"

#include <algorithm>

#include "backend/cpu/cpu_device.h"

namespace moeserve::runtime {

KvCache::KvCache(int64_t n_layer, int64_t kv_dim, int64_t capacity) : kv_dim_(kv_dim), capacity_(capacity) {
  status_ = allocate_layers(std::vector<backend::Device*>(size_t(n_layer), &backend::host_device()));
  if (!status_.is_ok()) capacity_ = 0;
}

Result<KvCache> KvCache::allocate(const models::Placement& placement, int64_t n_layer, int64_t kv_dim,
                                  int64_t capacity) {
  KvCache kv;
  kv.kv_dim_ = kv_dim;
  kv.capacity_ = capacity;
  std::vector<backend::Device*> devices;
  for (int64_t l = 0; l < n_layer; ++l) devices.push_back(placement.layer(l));
  MOESERVE_RETURN_IF_ERROR(kv.allocate_layers(devices));
  return kv;
}

Status KvCache::allocate_layers(const std::vector<backend::Device*>& devices) {
  const size_t bytes = size_t(capacity_ * kv_dim_) * sizeof(uint16_t);
  for (backend::Device* d : devices) {
    MOESERVE_ASSIGN_OR_RETURN(backend::DeviceMemory k, d->allocate(bytes, "KV cache"));
    MOESERVE_ASSIGN_OR_RETURN(backend::DeviceMemory v, d->allocate(bytes, "KV cache"));
    views_.push_back({k.as<uint16_t>(), v.as<uint16_t>()});
    k_.push_back(std::move(k));
    v_.push_back(std::move(v));
  }
  return Status::ok();
}

void KvCache::truncate(int64_t pos) { used_ = std::clamp<int64_t>(pos, 0, used_); }

Status KvCache::read_rows(int64_t layer, int64_t n, uint16_t* k, uint16_t* v) const {
  const size_t bytes = size_t(n * kv_dim_) * sizeof(uint16_t);
  backend::Device* d = k_[size_t(layer)].device();
  MOESERVE_RETURN_IF_ERROR(d->copy_to_host(k, k_[size_t(layer)].data(), bytes));
  return d->copy_to_host(v, v_[size_t(layer)].data(), bytes);
}

Status KvCache::write_rows(int64_t layer, int64_t n, const uint16_t* k, const uint16_t* v) {
  const size_t bytes = size_t(n * kv_dim_) * sizeof(uint16_t);
  backend::Device* d = k_[size_t(layer)].device();
  MOESERVE_RETURN_IF_ERROR(d->copy_to_device(k_[size_t(layer)].data(), k, bytes));
  return d->copy_to_device(v_[size_t(layer)].data(), v, bytes);
}

}  // namespace moeserve::runtime
