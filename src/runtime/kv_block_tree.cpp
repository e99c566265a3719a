#include "runtime/kv_block_tree.h"

#include <algorithm>
#include <queue>

namespace moeserve::runtime {

KvBlockTree::KvBlockTree(std::shared_ptr<KvBlockPool> pool)
    : pool_(std::move(pool)), rows_(pool_->block_rows()) {
  pool_->set_reclaimer([this](int64_t n) { return evict(n); });
}

KvBlockTree::~KvBlockTree() {
  pool_->set_reclaimer(nullptr);
  std::vector<int32_t> held;
  for (const Node& n : nodes_) {
    if (n.alive) held.push_back(n.block);
  }
  pool_->release(held);
}

namespace {

// FNV-1a over `seed` and the token ids.
uint64_t fnv(uint64_t seed, std::span<const int32_t> tokens) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(seed);
  for (int32_t t : tokens) mix(uint64_t(uint32_t(t)));
  return h;
}

}  // namespace

uint64_t KvBlockTree::key_of(int64_t parent, std::span<const int32_t> tokens) {
  return fnv(uint64_t(parent), tokens);
}

namespace {
constexpr uint64_t kRootPath = 0x6d6f657365727665ull;  // the root's path key
}  // namespace

std::vector<uint64_t> KvBlockTree::path_keys(std::span<const int32_t> tokens, int64_t block_rows, int64_t n) {
  std::vector<uint64_t> keys;
  uint64_t path = kRootPath;
  for (int64_t b = 0; b < n && (b + 1) * block_rows <= int64_t(tokens.size()); ++b) {
    path = fnv(path, tokens.subspan(size_t(b * block_rows), size_t(block_rows)));
    keys.push_back(path);
  }
  return keys;
}

void KvBlockTree::set_spill(Spill spill) {
  std::lock_guard lock(mu_);
  spill_ = std::move(spill);
}

int64_t KvBlockTree::find(int64_t parent, std::span<const int32_t> tokens) const {
  const uint64_t key = key_of(parent, tokens);
  auto [lo, hi] = by_key_.equal_range(key);
  for (auto it = lo; it != hi; ++it) {
    const Node& n = nodes_[size_t(it->second)];
    if (n.parent == parent && std::equal(n.tokens.begin(), n.tokens.end(), tokens.begin(), tokens.end())) {
      return it->second;
    }
  }
  return -1;
}

std::vector<int32_t> KvBlockTree::match(std::span<const int32_t> tokens, int64_t max_blocks,
                                        std::shared_ptr<const CacheSnapshot>* state) {
  std::lock_guard lock(mu_);
  std::vector<int32_t> out;
  const uint64_t now = ++tick_;
  int64_t parent = -1;
  size_t with_state = 0;
  for (int64_t b = 0; b < max_blocks && (b + 1) * rows_ <= int64_t(tokens.size()); ++b) {
    const int64_t node = find(parent, tokens.subspan(size_t(b * rows_), size_t(rows_)));
    if (node < 0) break;
    Node& n = nodes_[size_t(node)];
    n.used = now;
    out.push_back(n.block);
    if (state != nullptr && n.state != nullptr) {
      with_state = out.size();
      *state = n.state;
    }
    parent = node;
  }
  if (state != nullptr) out.resize(with_state);
  pool_->add_ref(out);
  return out;
}

void KvBlockTree::attach_state(std::span<const int32_t> tokens, int64_t n,
                               std::shared_ptr<const CacheSnapshot> state) {
  std::lock_guard lock(mu_);
  int64_t node = -1;
  for (int64_t b = 0; b < n && (b + 1) * rows_ <= int64_t(tokens.size()); ++b) {
    node = find(node, tokens.subspan(size_t(b * rows_), size_t(rows_)));
    if (node < 0) return;  // not in the tree (evicted meanwhile)
  }
  if (node < 0 || state == nullptr || state->bytes() > state_budget_) return;
  Node& target = nodes_[size_t(node)];
  drop_state(target);
  // The least recently used snapshots make room (a linear scan: few nodes hold one).
  while (stats_.state_bytes + state->bytes() > state_budget_) {
    Node* oldest = nullptr;
    for (Node& x : nodes_) {
      if (x.alive && x.state != nullptr && (oldest == nullptr || x.used < oldest->used)) oldest = &x;
    }
    if (oldest == nullptr) break;
    drop_state(*oldest);
  }
  stats_.state_bytes += state->bytes();
  ++stats_.states;
  target.state = std::move(state);
}

void KvBlockTree::set_state_budget(size_t bytes) {
  std::lock_guard lock(mu_);
  state_budget_ = bytes;
}

void KvBlockTree::drop_state(Node& n) {
  if (n.state == nullptr) return;
  stats_.state_bytes -= n.state->bytes();
  --stats_.states;
  n.state.reset();
}

void KvBlockTree::insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks) {
  std::lock_guard lock(mu_);
  const uint64_t now = ++tick_;
  int64_t parent = -1;
  for (size_t b = 0; b < blocks.size() && int64_t(b + 1) * rows_ <= int64_t(tokens.size()); ++b) {
    const std::span<const int32_t> part = tokens.subspan(b * size_t(rows_), size_t(rows_));
    int64_t node = find(parent, part);
    if (node < 0) {
      if (free_nodes_.empty()) {
        free_nodes_.push_back(int64_t(nodes_.size()));
        nodes_.emplace_back();
      }
      node = free_nodes_.back();
      free_nodes_.pop_back();
      Node& n = nodes_[size_t(node)];
      n.parent = parent;
      n.block = blocks[b];
      n.children = 0;
      n.key = key_of(parent, part);
      // path_keys' chain, from the parent's key: no rehash of the prefix.
      n.path = fnv(parent >= 0 ? nodes_[size_t(parent)].path : kRootPath, part);
      n.tokens.assign(part.begin(), part.end());
      n.alive = true;
      by_key_.emplace(n.key, node);
      if (parent >= 0) ++nodes_[size_t(parent)].children;
      pool_->add_ref(std::span<const int32_t>(&blocks[b], 1));
      ++stats_.blocks;
    }
    nodes_[size_t(node)].used = now;
    parent = node;
  }
}

void KvBlockTree::remove(int64_t node) {
  Node& n = nodes_[size_t(node)];
  auto [lo, hi] = by_key_.equal_range(n.key);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == node) {
      by_key_.erase(it);
      break;
    }
  }
  if (n.parent >= 0) --nodes_[size_t(n.parent)].children;
  drop_state(n);
  pool_->release(std::span<const int32_t>(&n.block, 1));
  n.alive = false;
  n.tokens.clear();
  free_nodes_.push_back(node);
  --stats_.blocks;
}

int64_t KvBlockTree::spill_all() {
  std::lock_guard lock(mu_);
  if (!spill_) return 0;
  // Oldest first, so that the most recently used are the last (and the
  // newest) copies in the tiers below.
  std::vector<std::pair<uint64_t, size_t>> order;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].alive) order.emplace_back(nodes_[i].used, i);
  }
  std::sort(order.begin(), order.end());
  for (const auto& [used, i] : order) spill_(nodes_[i].path, nodes_[i].tokens, nodes_[i].block);
  return int64_t(order.size());
}

int64_t KvBlockTree::evict(int64_t n) {
  std::lock_guard lock(mu_);
  // Least recently used first among the leaves only the tree holds; a
  // parent whose last child goes becomes a candidate (a path's nodes are
  // touched together, so a parent is never older than its children).
  using Entry = std::pair<uint64_t, int64_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  auto candidate = [&](int64_t i) {
    const Node& x = nodes_[size_t(i)];
    return x.alive && x.children == 0 && pool_->refs(x.block) == 1;
  };
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (candidate(int64_t(i))) heap.emplace(nodes_[i].used, int64_t(i));
  }
  int64_t freed = 0;
  while (freed < n && !heap.empty()) {
    const int64_t i = heap.top().second;
    heap.pop();
    const int64_t parent = nodes_[size_t(i)].parent;
    if (spill_) spill_(nodes_[size_t(i)].path, nodes_[size_t(i)].tokens, nodes_[size_t(i)].block);
    remove(i);
    ++freed;
    ++stats_.evicted_blocks;
    if (parent >= 0 && candidate(parent)) heap.emplace(nodes_[size_t(parent)].used, parent);
  }
  return freed;
}

int64_t KvBlockTree::reclaimable() const {
  std::lock_guard lock(mu_);
  // A node only the tree holds whose subtree is held by the tree alone can
  // go, leaves first: count the nodes held by the tree alone whose
  // descendants are all such (bottom-up over the children counts).
  std::vector<int32_t> pending(nodes_.size(), 0);
  std::vector<int64_t> ready;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!nodes_[i].alive) continue;
    pending[i] = nodes_[i].children;
    if (pending[i] == 0) ready.push_back(int64_t(i));
  }
  int64_t count = 0;
  while (!ready.empty()) {
    const int64_t i = ready.back();
    ready.pop_back();
    const Node& x = nodes_[size_t(i)];
    if (pool_->refs(x.block) != 1) continue;  // held by a sequence: it and its ancestors stay
    ++count;
    if (x.parent >= 0 && --pending[size_t(x.parent)] == 0) ready.push_back(x.parent);
  }
  return count;
}

KvBlockTreeStats KvBlockTree::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void KvBlockTree::count_hit(int64_t tokens) {
  std::lock_guard lock(mu_);
  ++stats_.hits;
  stats_.shared_tokens += tokens;
}

}  // namespace moeserve::runtime
