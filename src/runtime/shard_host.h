// The serving side of a remote layer range: a model loaded for layers
// [first, end) only (ModelLoadOptions::first_layer/end_layer), the caches
// its parent opened (by the parent's numbers), and each RemoteLayers
// operation carried out on them. A shard process (`moeserve shard`) runs
// one behind a socket; tests use one in-process, as the parent's
// RemoteLayers directly, to check the split without a transport.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backend/remote_layers.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"

namespace moeserve::runtime {

struct ShardHostOptions {
  // Caches one parent may keep open at once (each costs its capacity's K/V
  // on this shard's device): a bound against a parent that never closes.
  int64_t max_caches = 4096;
  // Prefix-cache entries kept at once (the parent's cache evicts and drops
  // them; this bounds one that does not).
  int64_t max_entries = 4096;
  std::string name = "shard";
};

class ShardHost final : public backend::RemoteLayers {
 public:
  // `model` was loaded with a layer range; not owned.
  ShardHost(Model& model, ShardHostOptions options = {});
  ~ShardHost() override;

  int64_t first_layer() const { return first_; }
  int64_t end_layer() const { return end_; }
  Model& model() { return model_; }
  // Every cache closed (a new parent connection starts clean).
  void reset();
  int64_t open_caches() const;
  // Forwards run so far (logs, tests).
  int64_t forwards() const {
    std::lock_guard lock(mu_);
    return forwards_;
  }

  std::string name() const override { return options_.name; }
  Status forward(const backend::RemoteForward& f) override;
  Status open_cache(uint64_t cache, int64_t capacity) override;
  void close_cache(uint64_t cache) override;
  Status truncate(uint64_t cache, int64_t used, int64_t pos) override;
  Status read_rows(uint64_t cache, int64_t layer, int64_t n, uint16_t* k, uint16_t* v) override;
  Status write_rows(uint64_t cache, int64_t layer, int64_t n, const uint16_t* k, const uint16_t* v) override;
  Status read_states(uint64_t cache, float* states) override;
  Status write_states(uint64_t cache, const float* states) override;
  int64_t state_floats() const override { return state_floats_; }
  Status reserve_tree_nodes(uint64_t cache, int64_t n) override;
  Status accept_tree(uint64_t cache, int64_t used, std::span<const int32_t> path) override;
  bool keeps_entries() const override { return true; }
  Status save_entry(uint64_t cache, uint64_t entry, int64_t n) override;
  Status restore_entry(uint64_t cache, uint64_t entry, int64_t n) override;
  void drop_entry(uint64_t entry) override;
  // Prefix-cache entries kept here, and their bytes (tests, logs).
  int64_t entries() const {
    std::lock_guard lock(mu_);
    return int64_t(entries_.size());
  }

 private:
  // A prefix-cache entry of this shard's layers, in host memory.
  struct Entry {
    int64_t n = 0;
    std::vector<uint16_t> rows;  // per attention layer: K rows [n][kv_dim], then V rows
    CacheSnapshot states;        // the recurrent layers' at n (none: empty)
  };
  Result<KvCache*> find(uint64_t cache);
  Status check_layer(int64_t layer, int64_t n, const KvCache& kv) const;

  Model& model_;
  ShardHostOptions options_;
  int64_t first_ = 0, end_ = 0, state_floats_ = 0;
  mutable std::mutex mu_;
  std::map<uint64_t, std::unique_ptr<KvCache>> caches_;
  std::map<uint64_t, Entry> entries_;
  std::unique_ptr<models::Workspace> ws_;
  int64_t forwards_ = 0;
};

}  // namespace moeserve::runtime
