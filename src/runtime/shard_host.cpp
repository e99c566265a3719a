#include "runtime/shard_host.h"

#include <vector>

namespace moeserve::runtime {

ShardHost::ShardHost(Model& model, ShardHostOptions options) : model_(model), options_(std::move(options)) {
  const models::Placement& p = model_.net().placement();
  const models::ModelInfo& info = model_.info();
  first_ = p.first_layer;
  end_ = p.local_end(info.n_layer);
  for (int64_t l = first_; l < end_; ++l) state_floats_ += info.layer_cache(l).state_floats;
}

ShardHost::~ShardHost() = default;

void ShardHost::reset() {
  std::lock_guard lock(mu_);
  caches_.clear();
  entries_.clear();
}

int64_t ShardHost::open_caches() const {
  std::lock_guard lock(mu_);
  return int64_t(caches_.size());
}

Result<KvCache*> ShardHost::find(uint64_t cache) {
  auto it = caches_.find(cache);
  if (it == caches_.end()) {
    return make_error(StatusCode::kNotFound, "{}: no cache {} is open here (the parent must open it first)",
                      options_.name, cache);
  }
  return it->second.get();
}

Status ShardHost::check_layer(int64_t layer, int64_t n, const KvCache& kv) const {
  if (layer < first_ || layer >= end_ || !kv.layer(layer).kv || n < 0 || n > kv.capacity()) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: rows 0:{} of layer {}: this shard keeps K/V rows of its attention layers {}:{} "
                      "(capacity {})",
                      options_.name, n, layer, first_, end_, kv.capacity());
  }
  return Status::ok();
}

Status ShardHost::forward(const backend::RemoteForward& f) {
  std::lock_guard lock(mu_);
  const int64_t n_layer = model_.info().n_layer;
  if (f.begin != first_ || f.end != end_) {
    return make_error(StatusCode::kInvalidArgument, "{}: asked for layers {}:{}, this shard runs {}:{}",
                      options_.name, f.begin, f.end, first_, end_);
  }
  if ((first_ > 0 && f.hidden_in == nullptr) || (end_ < n_layer && f.hidden_out == nullptr)) {
    return make_error(StatusCode::kInvalidArgument, "{}: a forward without its hidden rows", options_.name);
  }
  std::vector<backend::SequenceSlice> slices;
  slices.reserve(f.slices.size());
  for (const backend::RemoteSlice& q : f.slices) {
    MOESERVE_ASSIGN_OR_RETURN(KvCache * kv, find(q.cache));
    slices.push_back({q.row0, q.n_tokens, q.pos0, kv->view(), q.tree_parents});
  }
  if (slices.empty())
    return make_error(StatusCode::kInvalidArgument, "{}: a forward of no sequence", options_.name);
  if (ws_ == nullptr) {
    MOESERVE_ASSIGN_OR_RETURN(ws_, model_.new_workspace(int64_t(f.tokens.size())));
  }
  models::ForwardBatch b;
  b.tokens = f.tokens;
  b.sequences = slices;
  b.hidden_in = first_ > 0 ? f.hidden_in : nullptr;
  b.hidden_out = end_ < n_layer ? f.hidden_out : nullptr;
  b.logit_rows = f.logit_rows;
  b.logits = f.logits;
  b.greedy = f.greedy;
  b.capture_layers = f.capture_layers;
  b.captured = f.captured;
  b.decode_rows = f.decode_rows;
  b.hidden_device = f.rows_device;
  ++forwards_;
  return model_.net().forward(b, *ws_);
}

Status ShardHost::open_cache(uint64_t cache, int64_t capacity) {
  std::lock_guard lock(mu_);
  if (cache == 0 || caches_.count(cache) != 0) {
    return make_error(StatusCode::kInvalidArgument, "{}: cache {} is already open", options_.name, cache);
  }
  if (int64_t(caches_.size()) >= options_.max_caches) {
    return make_error(StatusCode::kResourceExhausted, "{}: {} caches are open, the most it keeps",
                      options_.name, caches_.size());
  }
  if (capacity <= 0 || capacity > std::max<int64_t>(model_.info().n_ctx_train, 1) * 64) {
    return make_error(StatusCode::kInvalidArgument, "{}: a cache of {} positions", options_.name, capacity);
  }
  MOESERVE_ASSIGN_OR_RETURN(KvCache kv, model_.new_kv_cache(capacity));
  caches_.emplace(cache, std::make_unique<KvCache>(std::move(kv)));
  return Status::ok();
}

void ShardHost::close_cache(uint64_t cache) {
  std::lock_guard lock(mu_);
  caches_.erase(cache);
}

Status ShardHost::truncate(uint64_t cache, int64_t used, int64_t pos) {
  std::lock_guard lock(mu_);
  MOESERVE_ASSIGN_OR_RETURN(KvCache * kv, find(cache));
  if (used < 0 || used > kv->capacity() || pos < 0) {
    return make_error(StatusCode::kInvalidArgument, "{}: truncate to {} of {} (capacity {})", options_.name,
                      pos, used, kv->capacity());
  }
  kv->set_used(used);
  (void)kv->truncate(pos);
  return kv->status();
}

Status ShardHost::read_rows(uint64_t cache, int64_t layer, int64_t n, uint16_t* k, uint16_t* v) {
  std::lock_guard lock(mu_);
  MOESERVE_ASSIGN_OR_RETURN(KvCache * kv, find(cache));
  MOESERVE_RETURN_IF_ERROR(check_layer(layer, n, *kv));
  return kv->read_rows(layer, n, k, v);
}

Status ShardHost::write_rows(uint64_t cache, int64_t layer, int64_t n, const uint16_t* k, const uint16_t* v) {
  std::lock_guard lock(mu_);
  MOESERVE_ASSIGN_OR_RETURN(KvCache * kv, find(cache));
  MOESERVE_RETURN_IF_ERROR(check_layer(layer, n, *kv));
  return kv->write_rows(layer, n, k, v);
}

Status ShardHost::read_states(uint64_t cache, float* states) {
  std::lock_guard lock(mu_);
  MOESERVE_ASSIGN_OR_RETURN(KvCache * kv, find(cache));
  MOESERVE_ASSIGN_OR_RETURN(CacheSnapshot snap, kv->snapshot());
  std::copy(snap.states.begin(), snap.states.end(), states);
  return Status::ok();
}

Status ShardHost::write_states(uint64_t cache, const float* states) {
  std::lock_guard lock(mu_);
  MOESERVE_ASSIGN_OR_RETURN(KvCache * kv, find(cache));
  CacheSnapshot snap;
  snap.position = kv->used();
  snap.states.assign(states, states + state_floats_);
  return kv->restore(snap);
}

Status ShardHost::save_entry(uint64_t cache, uint64_t entry, int64_t n) {
  std::lock_guard lock(mu_);
  MOESERVE_ASSIGN_OR_RETURN(KvCache * kv, find(cache));
  // (The parent checks that recurrent states are at n: it keeps the position.)
  if (n < 1 || n > kv->capacity()) {
    return make_error(StatusCode::kInvalidArgument, "{}: an entry of {} rows of a cache of capacity {}",
                      options_.name, n, kv->capacity());
  }
  if (entries_.count(entry) == 0 && int64_t(entries_.size()) >= options_.max_entries) {
    return make_error(StatusCode::kResourceExhausted, "{}: {} prefix-cache entries kept, the most it keeps",
                      options_.name, entries_.size());
  }
  Entry e;
  e.n = n;
  const int64_t dim = kv->kv_dim();
  for (int64_t l = first_; l < end_; ++l) {
    if (!kv->layer(l).kv) continue;
    const size_t at = e.rows.size();
    e.rows.resize(at + size_t(2 * n * dim));
    MOESERVE_RETURN_IF_ERROR(kv->read_rows(l, n, e.rows.data() + at, e.rows.data() + at + size_t(n * dim)));
  }
  if (kv->recurrent()) {
    MOESERVE_ASSIGN_OR_RETURN(e.states, kv->snapshot());
  }
  entries_[entry] = std::move(e);
  return Status::ok();
}

Status ShardHost::restore_entry(uint64_t cache, uint64_t entry, int64_t n) {
  std::lock_guard lock(mu_);
  MOESERVE_ASSIGN_OR_RETURN(KvCache * kv, find(cache));
  const auto it = entries_.find(entry);
  if (it == entries_.end())
    return make_error(StatusCode::kNotFound, "{}: no prefix-cache entry {}", options_.name, entry);
  const Entry& e = it->second;
  if (n < 1 || n > e.n || n > kv->capacity() || (kv->recurrent() && n != e.n)) {
    return make_error(StatusCode::kInvalidArgument, "{}: {} rows of an entry of {}", options_.name, n, e.n);
  }
  const int64_t dim = kv->kv_dim();
  const uint16_t* k = e.rows.data();
  for (int64_t l = first_; l < end_; ++l) {
    if (!kv->layer(l).kv) continue;
    MOESERVE_RETURN_IF_ERROR(kv->write_rows(l, n, k, k + size_t(e.n * dim)));
    k += size_t(2 * e.n * dim);
  }
  if (!kv->recurrent()) return Status::ok();
  // As write_states: the parent sets the position (truncate) itself.
  CacheSnapshot snap = e.states;
  snap.position = kv->used();
  return kv->restore(snap);
}

void ShardHost::drop_entry(uint64_t entry) {
  std::lock_guard lock(mu_);
  entries_.erase(entry);
}

Status ShardHost::reserve_tree_nodes(uint64_t cache, int64_t n) {
  std::lock_guard lock(mu_);
  MOESERVE_ASSIGN_OR_RETURN(KvCache * kv, find(cache));
  return kv->reserve_tree_nodes(n);
}

Status ShardHost::accept_tree(uint64_t cache, int64_t used, std::span<const int32_t> path) {
  std::lock_guard lock(mu_);
  MOESERVE_ASSIGN_OR_RETURN(KvCache * kv, find(cache));
  if (used < 0 || used > kv->capacity())
    return make_error(StatusCode::kInvalidArgument, "{}: accept_tree at {}", options_.name, used);
  kv->set_used(used);
  return kv->accept_tree(path);
}

}  // namespace moeserve::runtime
