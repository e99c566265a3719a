// One conversation's state: the tokens so far (prompt + generated) and the
// KV cache holding their keys and values. tokens().size() == position().
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/kv_cache.h"

namespace moeserve::runtime {

class Sequence {
 public:
  Sequence() = default;
  // A host-memory cache (tests, tools).
  Sequence(int64_t n_layer, int64_t kv_dim, int64_t n_ctx) : kv_(n_layer, kv_dim, n_ctx) {}
  explicit Sequence(KvCache kv) : kv_(std::move(kv)) {}

  int64_t position() const { return int64_t(tokens_.size()); }
  int64_t capacity() const { return kv_.capacity(); }
  int64_t remaining() const { return capacity() - position(); }
  std::span<const int32_t> tokens() const { return tokens_; }
  KvCache& kv() { return kv_; }
  const KvCache& kv() const { return kv_; }

  // Called after the model has written these tokens' K/V at position().
  void append(std::span<const int32_t> tokens);
  // Back to `pos` tokens (e.g. to reuse a shared prompt prefix). A
  // recurrent model's cache cannot go back without a snapshot: it starts
  // over at 0 (position() says where it is).
  void rewind(int64_t pos);
  void clear() { rewind(0); }

  // A point to return to (speculative decoding's rollback: take one, feed
  // draft tokens, restore it): the tokens and the recurrent states.
  struct Snapshot {
    std::vector<int32_t> tokens;
    CacheSnapshot cache;
  };
  Result<Snapshot> snapshot() const;
  // Back to the snapshot's position. kInvalidArgument (nothing changed)
  // unless this sequence still starts with the snapshot's tokens, i.e. its
  // K/V rows below that position are the ones the snapshot saw.
  Status restore(const Snapshot& snapshot);
  // After a draft-tree forward at position(): keeps `rows` of the tree (root
  // first; KvCache::accept_tree) with their `tokens`.
  Status accept_tree(std::span<const int32_t> rows, std::span<const int32_t> tokens);

 private:
  std::vector<int32_t> tokens_;
  KvCache kv_;
};

}  // namespace moeserve::runtime
