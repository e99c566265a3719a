#include "runtime/kv_pool.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace moeserve::runtime {

Result<std::shared_ptr<KvBlockPool>> KvBlockPool::create(const models::Placement& placement,
                                                         const models::ModelInfo& info,
                                                         const KvPoolOptions& options) {
  const int64_t rows = options.block_rows;
  if (rows < 1 || rows > 4096 || !std::has_single_bit(uint64_t(rows))) {
    return make_error(StatusCode::kInvalidArgument, "KV block size {}: use a power of two from 1 to 4096",
                      rows);
  }
  std::shared_ptr<KvBlockPool> pool(new KvBlockPool());
  pool->block_rows_ = rows;
  pool->kv_dim_ = info.kv_dim;
  pool->block_shift_ = std::countr_zero(uint64_t(rows));
  const size_t row_bytes = size_t(info.kv_dim) * sizeof(uint16_t);
  int64_t kv_layers = 0;
  for (int64_t l = 0; l < info.n_layer; ++l) {
    backend::Device* d = placement.layer(l);
    if (d == nullptr || !info.layer_cache(l).kv) continue;
    if (!d->supports_paged_kv()) {
      return make_error(StatusCode::kUnsupported, "paged KV is not available on {} yet", d->name());
    }
    ++kv_layers;
  }
  pool->block_bytes_ = size_t(kv_layers) * 2 * size_t(rows) * row_bytes;
  if (pool->block_bytes_ == 0) {
    return make_error(StatusCode::kUnsupported, "this process computes no attention layer: nothing to page");
  }
  const size_t n = options.bytes / pool->block_bytes_;
  if (n < 1 || n > size_t(std::numeric_limits<int32_t>::max())) {
    return make_error(StatusCode::kInvalidArgument,
                      "KV pool of {:.1f} MiB: one block of {} positions takes {:.2f} MiB (every attention "
                      "layer's K and V); give --kv-mem at least that",
                      double(options.bytes) / double(1 << 20), rows,
                      double(pool->block_bytes_) / double(1 << 20));
  }
  pool->n_blocks_ = int64_t(n);
  const size_t layer_bytes = n * size_t(rows) * row_bytes;
  for (int64_t l = 0; l < info.n_layer; ++l) {
    backend::Device* d = placement.layer(l);
    backend::DeviceMemory k, v;
    if (d != nullptr && info.layer_cache(l).kv) {
      MOESERVE_ASSIGN_OR_RETURN(k, d->allocate(layer_bytes, "KV block pool"));
      MOESERVE_ASSIGN_OR_RETURN(v, d->allocate(layer_bytes, "KV block pool"));
    }
    pool->k_.push_back(std::move(k));
    pool->v_.push_back(std::move(v));
  }
  // Taken from the back: block 0 first, so a lone sequence's blocks ascend.
  pool->free_.resize(n);
  for (size_t i = 0; i < n; ++i) pool->free_[i] = int32_t(n - 1 - i);
  pool->refs_.assign(n, 0);
  return pool;
}

int64_t KvBlockPool::n_free() const {
  std::lock_guard lock(mu_);
  return int64_t(free_.size());
}

void KvBlockPool::set_reclaimer(std::function<int64_t(int64_t)> reclaimer) {
  std::lock_guard lock(mu_);
  reclaimer_ = std::move(reclaimer);
}

int KvBlockPool::refs(int32_t block) const {
  std::lock_guard lock(mu_);
  return refs_[size_t(block)];
}

Status KvBlockPool::acquire(int64_t n, std::vector<int32_t>& out) {
  std::function<int64_t(int64_t)> reclaim;
  int64_t short_of = 0;
  {
    std::lock_guard lock(mu_);
    short_of = n - int64_t(free_.size());
    if (short_of > 0) reclaim = reclaimer_;
  }
  if (reclaim) reclaim(short_of);
  std::lock_guard lock(mu_);
  if (n > int64_t(free_.size())) {
    return make_error(StatusCode::kResourceExhausted,
                      "the KV pool has {} free blocks of {} positions, {} needed", free_.size(), block_rows_,
                      n);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    refs_[size_t(b)] = 1;
    out.push_back(b);
  }
  return Status::ok();
}

template <typename F>
Status KvBlockPool::each_block_region(int32_t block, F&& f) const {
  if (block < 0 || block >= n_blocks_) {
    return make_error(StatusCode::kInvalidArgument, "KV block {} outside the pool's {}", block, n_blocks_);
  }
  const size_t elems = size_t(block_rows_ * kv_dim_), at = size_t(block) * elems;
  size_t offset = 0;
  for (size_t l = 0; l < k_.size(); ++l) {
    if (k_[l].data() == nullptr) continue;
    MOESERVE_RETURN_IF_ERROR(
        f(k_[l].device(), k_[l].as<uint16_t>() + at, v_[l].as<uint16_t>() + at, offset, elems));
    offset += 2 * elems;
  }
  return Status::ok();
}

Status KvBlockPool::read_block(int32_t block, std::span<uint16_t> out) const {
  if (out.size_bytes() != block_bytes_) {
    return make_error(StatusCode::kInvalidArgument, "KV block copy of {} bytes, a block has {}",
                      out.size_bytes(), block_bytes_);
  }
  return each_block_region(
      block,
      [&](backend::Device* d, const uint16_t* k, const uint16_t* v, size_t offset, size_t elems) -> Status {
        MOESERVE_RETURN_IF_ERROR(d->copy_to_host(out.data() + offset, k, elems * sizeof(uint16_t)));
        return d->copy_to_host(out.data() + offset + elems, v, elems * sizeof(uint16_t));
      });
}

Status KvBlockPool::write_block(int32_t block, std::span<const uint16_t> in) {
  if (in.size_bytes() != block_bytes_) {
    return make_error(StatusCode::kInvalidArgument, "KV block copy of {} bytes, a block has {}",
                      in.size_bytes(), block_bytes_);
  }
  return each_block_region(
      block, [&](backend::Device* d, uint16_t* k, uint16_t* v, size_t offset, size_t elems) -> Status {
        MOESERVE_RETURN_IF_ERROR(d->copy_to_device(k, in.data() + offset, elems * sizeof(uint16_t)));
        return d->copy_to_device(v, in.data() + offset + elems, elems * sizeof(uint16_t));
      });
}

void KvBlockPool::add_ref(std::span<const int32_t> blocks) {
  std::lock_guard lock(mu_);
  for (int32_t b : blocks) ++refs_[size_t(b)];
}

void KvBlockPool::release(std::span<const int32_t> blocks) {
  std::lock_guard lock(mu_);
  for (int32_t b : blocks) {
    if (--refs_[size_t(b)] == 0) free_.push_back(b);
  }
}

KvBlocks& KvBlocks::operator=(KvBlocks&& o) noexcept {
  if (this != &o) {
    shrink_to(0);
    pool_ = std::move(o.pool_);
    table_ = std::move(o.table_);
    o.table_.clear();
  }
  return *this;
}

Status KvBlocks::grow_to(int64_t n) {
  if (n <= size()) return Status::ok();
  if (pool_ == nullptr) return make_error(StatusCode::kInternal, "KV blocks without a pool");
  return pool_->acquire(n - size(), table_);
}

void KvBlocks::replace(int64_t i, int32_t block) {
  const int32_t old = table_[size_t(i)];
  table_[size_t(i)] = block;
  pool_->release(std::span<const int32_t>(&old, 1));
}

void KvBlocks::shrink_to(int64_t n) {
  if (pool_ == nullptr || n >= size()) return;
  pool_->release(std::span<const int32_t>(table_).subspan(size_t(std::max<int64_t>(n, 0))));
  table_.resize(size_t(std::max<int64_t>(n, 0)));
}

}  // namespace moeserve::runtime
