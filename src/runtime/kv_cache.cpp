#include "runtime/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <functional>

#include "backend/cpu/cpu_device.h"
#include "core/log.h"

namespace moeserve::runtime {
namespace {

std::vector<models::LayerCache> layer_list(const models::ModelInfo& info) {
  std::vector<models::LayerCache> out;
  for (int64_t l = 0; l < info.n_layer; ++l) out.push_back(info.layer_cache(l));
  return out;
}

}  // namespace

KvCache::KvCache(int64_t n_layer, int64_t kv_dim, int64_t capacity)
    : KvCache(std::vector<models::LayerCache>(size_t(n_layer)), kv_dim, capacity) {}

KvCache::KvCache(std::span<const models::LayerCache> layers, int64_t kv_dim, int64_t capacity)
    : kv_dim_(kv_dim), capacity_(capacity), layers_(layers.begin(), layers.end()) {
  status_ = allocate_layers(std::vector<backend::Device*>(layers.size(), &backend::host_device()), nullptr);
  if (!status_.is_ok()) capacity_ = 0;
}

Result<KvCache> KvCache::allocate(const models::Placement& placement, const models::ModelInfo& info,
                                  int64_t capacity, std::shared_ptr<KvBlockPool> pool) {
  KvCache kv;
  kv.kv_dim_ = info.kv_dim;
  kv.capacity_ = capacity;
  kv.layers_ = layer_list(info);
  std::vector<backend::Device*> devices;
  for (int64_t l = 0; l < info.n_layer; ++l) devices.push_back(placement.layer(l));
  KvBlockPool* p = pool.get();
  kv.blocks_ = KvBlocks(std::move(pool));
  if (p != nullptr) kv.blocks_.reserve_table(KvBlockPool::blocks_for(capacity, p->block_rows()));
  MOESERVE_RETURN_IF_ERROR(kv.allocate_layers(devices, p));
  MOESERVE_RETURN_IF_ERROR(kv.remote_.open(placement.remote, capacity));
  for (const backend::RemoteRange& r : placement.remote) kv.state_floats_ += r.layers->state_floats();
  return kv;
}

namespace {
std::atomic<uint64_t> next_remote_id{1};
}  // namespace

KvCache::RemoteParts& KvCache::RemoteParts::operator=(RemoteParts&& o) noexcept {
  if (this != &o) {
    close();
    id_ = std::exchange(o.id_, 0);
    ranges_ = std::move(o.ranges_);
  }
  return *this;
}

Status KvCache::RemoteParts::open(std::span<const backend::RemoteRange> ranges, int64_t capacity) {
  if (ranges.empty()) return Status::ok();
  id_ = next_remote_id.fetch_add(1);
  for (const backend::RemoteRange& r : ranges) {
    MOESERVE_RETURN_IF_ERROR(r.layers->open_cache(id_, capacity));
    ranges_.push_back(r);  // (closed with the others if a later one fails)
  }
  return Status::ok();
}

void KvCache::RemoteParts::close() {
  for (const backend::RemoteRange& r : ranges_) r.layers->close_cache(id_);
  ranges_.clear();
  id_ = 0;
}

const backend::RemoteRange* KvCache::RemoteParts::find(int64_t l) const {
  for (const backend::RemoteRange& r : ranges_) {
    if (l >= r.begin && l < r.end) return &r;
  }
  return nullptr;
}

size_t KvCache::bytes_for(const models::ModelInfo& info, int64_t capacity) {
  size_t bytes = 0;
  for (int64_t l = 0; l < info.n_layer; ++l) {
    const models::LayerCache c = info.layer_cache(l);
    if (c.kv) bytes += size_t(2 * capacity * info.kv_dim) * sizeof(uint16_t);
    bytes += size_t(c.state_floats) * sizeof(float);
  }
  return bytes;
}

size_t KvCache::bytes() const {
  size_t bytes = pool() != nullptr ? size_t(blocks_.size()) * pool()->block_bytes() : 0;
  for (const models::LayerCache& c : layers_) {
    if (c.kv && pool() == nullptr) bytes += size_t(2 * capacity_ * kv_dim_) * sizeof(uint16_t);
    bytes += size_t(c.state_floats) * sizeof(float);
  }
  return bytes;
}

Status KvCache::allocate_layers(const std::vector<backend::Device*>& devices, KvBlockPool* pool) {
  const size_t row_bytes = size_t(capacity_ * kv_dim_) * sizeof(uint16_t);
  for (size_t l = 0; l < devices.size(); ++l) {
    backend::Device* d = devices[l];
    const models::LayerCache& c = layers_[l];
    backend::KvLayerView view;
    backend::DeviceMemory k, v, state;
    if (d == nullptr) {  // another process's layer (Placement::remote, or outside a shard's range)
    } else if (c.kv && pool != nullptr) {
      if (pool->device(int64_t(l)) != d) {
        return make_error(StatusCode::kInternal, "KV pool: layer {} is not on {}", l, d->name());
      }
      view.k = pool->k(int64_t(l));
      view.v = pool->v(int64_t(l));
    } else if (c.kv) {
      MOESERVE_ASSIGN_OR_RETURN(k, d->allocate(row_bytes, "KV cache"));
      MOESERVE_ASSIGN_OR_RETURN(v, d->allocate(row_bytes, "KV cache"));
      view.k = k.as<uint16_t>();
      view.v = v.as<uint16_t>();
    }
    if (d != nullptr && c.state_floats > 0) {
      const size_t bytes = size_t(c.state_floats) * sizeof(float);
      MOESERVE_ASSIGN_OR_RETURN(state, d->allocate(bytes, "recurrent state"));
      MOESERVE_RETURN_IF_ERROR(d->fill_zero(state.data(), bytes));
      view.state = state.as<float>();
      state_floats_ += c.state_floats;
    }
    views_.push_back(view);
    k_.push_back(std::move(k));
    v_.push_back(std::move(v));
    state_.push_back(std::move(state));
  }
  return Status::ok();
}

Status KvCache::zero_states() {
  for (backend::DeviceMemory& s : state_) {
    if (s.data() != nullptr) MOESERVE_RETURN_IF_ERROR(s.device()->fill_zero(s.data(), s.bytes()));
  }
  states_written_ = false;
  return Status::ok();
}

backend::Device* KvCache::kv_device(size_t l) const {
  return pool() != nullptr ? pool()->device(int64_t(l)) : k_[l].device();
}

int64_t KvCache::blocks_needed(int64_t n) const {
  if (pool() == nullptr) return 0;
  return std::max<int64_t>(0, KvBlockPool::blocks_for(n, pool()->block_rows()) - blocks_.size());
}

Status KvCache::reserve(int64_t n) {
  if (n > capacity_) {
    return make_error(StatusCode::kOutOfRange, "KV cache: {} positions, the context holds {}", n, capacity_);
  }
  if (pool() == nullptr) return Status::ok();
  if (swapped_) return make_error(StatusCode::kInternal, "KV cache: used while swapped out");
  return blocks_.grow_to(KvBlockPool::blocks_for(n, pool()->block_rows()));
}

// Positions [from, from + n) as runs that are consecutive rows of the
// layer regions (a whole region without a pool, a block's share with one):
// f(first row, offset of the run in positions from `from`, run length).
Status KvCache::for_each_row_run(int64_t from, int64_t n,
                                 const std::function<Status(int64_t, int64_t, int64_t)>& f) const {
  const int64_t block = pool() != nullptr ? pool()->block_rows() : std::max<int64_t>(n, 1);
  for (int64_t p = from; p < from + n;) {
    const int64_t run = std::min(from + n - p, block - p % block);
    MOESERVE_RETURN_IF_ERROR(f(cache_row(p), p - from, run));
    p += run;
  }
  return Status::ok();
}

Status KvCache::copy_rows_to_host(size_t l, int64_t from, int64_t n, uint16_t* k, uint16_t* v) const {
  backend::Device* d = kv_device(l);
  if (d == nullptr) return make_error(StatusCode::kInvalidArgument, "KV cache: layer {} is not here", l);
  return for_each_row_run(from, n, [&](int64_t row, int64_t at, int64_t run) {
    const size_t src = size_t(row * kv_dim_), dst = size_t(at * kv_dim_);
    const size_t bytes = size_t(run * kv_dim_) * sizeof(uint16_t);
    MOESERVE_RETURN_IF_ERROR(d->copy_to_host(k + dst, k_base(l) + src, bytes));
    return d->copy_to_host(v + dst, v_base(l) + src, bytes);
  });
}

Status KvCache::copy_rows_to_device(size_t l, int64_t from, int64_t n, const uint16_t* k, const uint16_t* v) {
  backend::Device* d = kv_device(l);
  if (d == nullptr) return make_error(StatusCode::kInvalidArgument, "KV cache: layer {} is not here", l);
  return for_each_row_run(from, n, [&](int64_t row, int64_t at, int64_t run) {
    const size_t dst = size_t(row * kv_dim_), src = size_t(at * kv_dim_);
    const size_t bytes = size_t(run * kv_dim_) * sizeof(uint16_t);
    MOESERVE_RETURN_IF_ERROR(d->copy_to_device(k_base(l) + dst, k + src, bytes));
    return d->copy_to_device(v_base(l) + dst, v + src, bytes);
  });
}

// Rows only move down (to < from); runs within one block of each side.
Status KvCache::move_rows(size_t l, int64_t to, int64_t from, int64_t n) {
  backend::Device* d = kv_device(l);
  const int64_t block = pool() != nullptr ? pool()->block_rows() : std::max<int64_t>(n, 1);
  const size_t row_bytes = size_t(kv_dim_) * sizeof(uint16_t);
  for (int64_t i = 0; i < n;) {
    const int64_t run = std::min({n - i, block - (to + i) % block, block - (from + i) % block});
    const size_t dst = size_t(cache_row(to + i)) * row_bytes, src = size_t(cache_row(from + i)) * row_bytes;
    const auto* kb = reinterpret_cast<uint8_t*>(k_base(l));
    const auto* vb = reinterpret_cast<uint8_t*>(v_base(l));
    MOESERVE_RETURN_IF_ERROR(
        d->copy_within(const_cast<uint8_t*>(kb) + dst, kb + src, size_t(run) * row_bytes));
    MOESERVE_RETURN_IF_ERROR(
        d->copy_within(const_cast<uint8_t*>(vb) + dst, vb + src, size_t(run) * row_bytes));
    i += run;
  }
  return Status::ok();
}

Status KvCache::adopt_prefix(std::span<const int32_t> blocks) {
  if (pool() == nullptr || used_ != 0 || blocks_.size() != 0 || !remote_.ranges().empty()) {
    if (pool() != nullptr) pool()->release(blocks);
    return make_error(StatusCode::kInternal,
                      "KV cache: shared blocks need an empty paged cache of local layers");
  }
  const int64_t n = int64_t(blocks.size()) * pool()->block_rows();
  if (n > capacity_) {
    pool()->release(blocks);
    return make_error(StatusCode::kOutOfRange, "KV cache: {} shared positions, the context holds {}", n,
                      capacity_);
  }
  blocks_.adopt(blocks);
  used_ = n;
  states_written_ = true;
  return Status::ok();
}

bool KvCache::unshare_block_at(int64_t pos) {
  const int64_t rows = pool()->block_rows(), i = pos / rows;
  if (pos % rows == 0 || i >= blocks_.size()) return true;  // nothing of the block is kept
  const int32_t old = blocks_.table()[i];
  if (pool()->refs(old) <= 1) return true;
  std::vector<int32_t> fresh;
  if (!pool()->acquire(1, fresh).is_ok()) return false;
  const size_t row_bytes = size_t(kv_dim_) * sizeof(uint16_t);
  const size_t from = size_t(int64_t(old) * rows) * row_bytes,
               to = size_t(int64_t(fresh[0]) * rows) * row_bytes;
  const size_t bytes = size_t(pos % rows) * row_bytes;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!layers_[l].kv || k_base(l) == nullptr) continue;
    auto* k = reinterpret_cast<uint8_t*>(k_base(l));
    auto* v = reinterpret_cast<uint8_t*>(v_base(l));
    if (!kv_device(l)->copy_within(k + to, k + from, bytes).is_ok() ||
        !kv_device(l)->copy_within(v + to, v + from, bytes).is_ok()) {
      pool()->release(fresh);
      return false;
    }
  }
  blocks_.replace(i, fresh[0]);
  return true;
}

Status KvCache::swap_out() {
  if (pool() == nullptr || swapped_) return Status::ok();
  size_t rows = 0;
  for (size_t l = 0; l < layers_.size(); ++l)
    rows += layers_[l].kv && k_base(l) != nullptr ? size_t(used_) : 0;
  swap_k_.resize(rows * size_t(kv_dim_));
  swap_v_.resize(rows * size_t(kv_dim_));
  size_t at = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!layers_[l].kv || k_base(l) == nullptr) continue;
    MOESERVE_RETURN_IF_ERROR(copy_rows_to_host(l, 0, used_, swap_k_.data() + at, swap_v_.data() + at));
    at += size_t(used_ * kv_dim_);
  }
  blocks_.shrink_to(0);
  swapped_ = true;
  return Status::ok();
}

Status KvCache::swap_in() {
  if (!swapped_) return Status::ok();
  MOESERVE_RETURN_IF_ERROR(blocks_.grow_to(KvBlockPool::blocks_for(used_, pool()->block_rows())));
  size_t at = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!layers_[l].kv || k_base(l) == nullptr) continue;
    MOESERVE_RETURN_IF_ERROR(copy_rows_to_device(l, 0, used_, swap_k_.data() + at, swap_v_.data() + at));
    at += size_t(used_ * kv_dim_);
  }
  swapped_ = false;
  std::vector<uint16_t>().swap(swap_k_);
  std::vector<uint16_t>().swap(swap_v_);
  return Status::ok();
}

int64_t KvCache::truncate(int64_t pos) {
  pos = std::clamp<int64_t>(pos, 0, used_);
  if (swapped_) {  // (a preempted sequence ends or starts over: its rows are not needed)
    swapped_ = false;
    std::vector<uint16_t>().swap(swap_k_);
    std::vector<uint16_t>().swap(swap_v_);
    pos = 0;
  }
  // (At 0 whenever a forward may have run without set_used.)
  if (recurrent() && (pos < used_ || (pos == 0 && states_written_))) {
    // A failure to clear leaves states that do not match position 0: the
    // cache is unusable from here on (status()).
    if (Status s = zero_states(); !s.is_ok()) status_ = s, capacity_ = 0;
    pos = 0;
  }
  // A remote range that cannot truncate now (its process died) keeps its
  // own account of the sequence: the next forward there says what is wrong,
  // and this cache stays usable for when it is back.
  for (const backend::RemoteRange& r : remote_.ranges()) {
    if (Status s = r.layers->truncate(remote_.id(), used_, pos); !s.is_ok())
      MOESERVE_LOG_WARN("KV cache: {}", s.message());
  }
  if (pool() != nullptr) {
    // Rows from pos on will be written: a block shared with another holder
    // becomes this cache's own first (or, with no block to spare, is let
    // go at its start).
    if (!unshare_block_at(pos)) pos -= pos % pool()->block_rows();
    blocks_.shrink_to(KvBlockPool::blocks_for(pos, pool()->block_rows()));
  }
  used_ = pos;
  return pos;
}

Status KvCache::read_rows(int64_t layer, int64_t n, uint16_t* k, uint16_t* v) const {
  if (const backend::RemoteRange* r = remote_.find(layer))
    return r->layers->read_rows(remote_.id(), layer, n, k, v);
  return copy_rows_to_host(size_t(layer), 0, n, k, v);
}

Status KvCache::write_rows(int64_t layer, int64_t n, const uint16_t* k, const uint16_t* v) {
  if (const backend::RemoteRange* r = remote_.find(layer))
    return r->layers->write_rows(remote_.id(), layer, n, k, v);
  MOESERVE_RETURN_IF_ERROR(reserve(n));
  return copy_rows_to_device(size_t(layer), 0, n, k, v);
}

namespace {

int64_t remote_state_floats(std::span<const backend::RemoteRange> ranges) {
  int64_t n = 0;
  for (const backend::RemoteRange& r : ranges) n += r.layers->state_floats();
  return n;
}

}  // namespace

bool KvCache::remote_keeps_entries() const {
  const auto& ranges = remote_.ranges();
  return !ranges.empty() &&
         std::all_of(ranges.begin(), ranges.end(), [](const auto& r) { return r.layers->keeps_entries(); });
}

Status KvCache::save_remote_entry(uint64_t entry, int64_t n) const {
  for (const backend::RemoteRange& r : remote_.ranges())
    MOESERVE_RETURN_IF_ERROR(r.layers->save_entry(remote_.id(), entry, n));
  return Status::ok();
}

Status KvCache::restore_remote_entry(uint64_t entry, int64_t n) {
  states_written_ = true;
  for (const backend::RemoteRange& r : remote_.ranges())
    MOESERVE_RETURN_IF_ERROR(r.layers->restore_entry(remote_.id(), entry, n));
  return Status::ok();
}

std::vector<backend::RemoteLayers*> KvCache::remote_layers() const {
  std::vector<backend::RemoteLayers*> out;
  for (const backend::RemoteRange& r : remote_.ranges()) out.push_back(r.layers);
  return out;
}

Result<CacheSnapshot> KvCache::snapshot(Scope scope) const {
  const bool all = scope == Scope::kAll;
  CacheSnapshot snap;
  snap.position = used_;
  snap.states.resize(size_t(state_floats_ - (all ? 0 : remote_state_floats(remote_.ranges()))));
  float* out = snap.states.data();
  for (size_t l = 0; l < state_.size(); ++l) {
    const backend::DeviceMemory& s = state_[l];
    if (const backend::RemoteRange* r = remote_.find(int64_t(l));
        all && r != nullptr && r->begin == int64_t(l)) {
      MOESERVE_RETURN_IF_ERROR(r->layers->read_states(remote_.id(), out));
      out += r->layers->state_floats();
    }
    if (s.data() == nullptr) continue;
    MOESERVE_RETURN_IF_ERROR(s.device()->copy_to_host(out, s.data(), s.bytes()));
    out += s.bytes() / sizeof(float);
  }
  return snap;
}

Status KvCache::restore(const CacheSnapshot& snap, Scope scope) {
  const bool all = scope == Scope::kAll;
  const int64_t floats = state_floats_ - (all ? 0 : remote_state_floats(remote_.ranges()));
  if (snap.states.size() != size_t(floats) || snap.position < 0 || snap.position > capacity_) {
    return make_error(StatusCode::kInvalidArgument,
                      "cache snapshot of {} state floats at position {} does not fit this cache ({} floats, "
                      "capacity {})",
                      snap.states.size(), snap.position, floats, capacity_);
  }
  const float* in = snap.states.data();
  states_written_ = true;
  for (size_t l = 0; l < state_.size(); ++l) {
    backend::DeviceMemory& s = state_[l];
    if (const backend::RemoteRange* r = remote_.find(int64_t(l));
        all && r != nullptr && r->begin == int64_t(l)) {
      MOESERVE_RETURN_IF_ERROR(r->layers->write_states(remote_.id(), in));
      in += r->layers->state_floats();
    }
    if (s.data() == nullptr) continue;
    MOESERVE_RETURN_IF_ERROR(s.device()->copy_to_device(s.data(), in, s.bytes()));
    in += s.bytes() / sizeof(float);
  }
  used_ = snap.position;
  return Status::ok();
}

Status KvCache::reserve_tree_nodes(int64_t n) {
  if (n <= tree_nodes_ || state_floats_ == 0) return Status::ok();  // attention rows need no room
  for (const backend::RemoteRange& r : remote_.ranges())
    MOESERVE_RETURN_IF_ERROR(r.layers->reserve_tree_nodes(remote_.id(), n));
  node_states_.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int64_t floats = layers_[l].state_floats;
    if (floats <= 0 || state_[l].data() == nullptr) continue;
    backend::Device* d = state_[l].device();
    backend::DeviceMemory m;
    MOESERVE_ASSIGN_OR_RETURN(m, d->allocate(size_t(n * floats) * sizeof(float), "draft-tree states"));
    node_states_[l] = std::move(m);
    views_[l].node_states = node_states_[l].as<float>();
    views_[l].max_nodes = n;
  }
  tree_nodes_ = n;
  return Status::ok();
}

Status KvCache::accept_tree(std::span<const int32_t> path) {
  const int64_t n = int64_t(path.size());
  if (n < 1 || used_ + n > capacity_ || path[0] != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "accept_tree: a path of {} rows at position {} (capacity {})", n, used_, capacity_);
  }
  for (int64_t i = 1; i < n; ++i) {
    if (path[size_t(i)] <= path[size_t(i - 1)] || used_ + path[size_t(i)] >= capacity_) {
      return make_error(StatusCode::kInvalidArgument, "accept_tree: row {} of the path is {}", i,
                        path[size_t(i)]);
    }
  }
  for (const backend::RemoteRange& r : remote_.ranges())
    MOESERVE_RETURN_IF_ERROR(r.layers->accept_tree(remote_.id(), used_, path));
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (views_[l].k == nullptr && views_[l].state == nullptr) continue;  // another process's layer
    if (layers_[l].kv) {
      // Rows only move down (path[i] >= i), in order: no source is overwritten
      // before it is read. A branch's rows are consecutive, so runs of them
      // move in one copy each (a device copy is a call, on a GPU a sync),
      // cut short where source and destination would overlap.
      for (int64_t i = 1; i < n;) {
        const int64_t shift = path[size_t(i)] - i;
        int64_t run = 1;
        while (i + run < n && path[size_t(i + run)] - (i + run) == shift && run < shift) ++run;
        if (shift > 0) MOESERVE_RETURN_IF_ERROR(move_rows(l, used_ + i, used_ + i + shift, run));
        i += shift > 0 ? run : 1;
      }
    }
    if (layers_[l].state_floats > 0) {
      const int64_t node = path[size_t(n - 1)];
      if (node >= tree_nodes_ || l >= node_states_.size() || node_states_[l].data() == nullptr) {
        return make_error(StatusCode::kInternal, "accept_tree: no draft-tree state {} on layer {}", node, l);
      }
      const size_t bytes = size_t(layers_[l].state_floats) * sizeof(float);
      MOESERVE_RETURN_IF_ERROR(state_[l].device()->copy_within(
          state_[l].data(), node_states_[l].as<uint8_t>() + size_t(node) * bytes, bytes));
    }
  }
  states_written_ = true;
  used_ += n;
  return Status::ok();
}

}  // namespace moeserve::runtime
