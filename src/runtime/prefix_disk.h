// The prefix cache's disk tier (`serve --kv-cache-dir DIR`): entries the
// RAM cache evicts, and every RAM entry at shutdown, kept as one file each
// (prefix_file.h) so that they outlive the process: a restarted server
// finds its earlier conversations' prefixes instead of recomputing them.
//
// At open the folder is scanned: only headers and tokens are read, into an
// in-memory index (front: most recently used, by the files' mtimes). A
// file that cannot serve this model is skipped with one warning and never
// loaded: another model's (its fingerprint differs, see kv_fingerprint.h)
// or of another format version is left alone — several servers may share
// the folder — while a file of ours that is damaged (sizes that do not add
// up, a checksum that fails on load) is deleted, since nothing can ever
// use it. Oldest files go first to stay under the byte budget.
//
// Every failure (IO, a damaged file) is a miss or a skipped save with a
// warning, never an error to the request. Thread-safe (one mutex): the RAM
// cache saves evicted entries from its writer thread while the engine
// looks up and loads.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/prefix_file.h"

namespace moeserve::runtime {

inline constexpr uint64_t kDefaultPrefixDiskBytes = uint64_t(8) << 30;

struct PrefixDiskOptions {
  std::string dir;  // created when missing
  uint64_t max_bytes = kDefaultPrefixDiskBytes;
  uint64_t fingerprint = 0;  // kv_fingerprint() of the model file
  int64_t kv_dim = 0;        // KvCache::kv_dim()
  bool recurrent = false;    // KvCache::recurrent(): entries carry states and are reused whole
};

struct PrefixDiskMatch {
  std::string name;  // the file (in the folder); empty: no match
  int64_t n = 0;     // tokens it restores
};

class PrefixDiskTier {
 public:
  // Creates the folder when missing and indexes it. kIoError naming the
  // folder when it cannot be created, is not a folder or is not writable.
  static Result<std::unique_ptr<PrefixDiskTier>> open(const PrefixDiskOptions& options);
  // The folder part of open() alone (the CLI checks the flag before it
  // loads the model).
  static Status prepare_dir(const std::string& dir);
  PrefixDiskTier(const PrefixDiskTier&) = delete;
  PrefixDiskTier& operator=(const PrefixDiskTier&) = delete;

  const PrefixDiskOptions& options() const { return options_; }

  // The entry with the longest common prefix with `tokens`, capped at
  // `max_tokens`, if longer than `longer_than` (recurrent: whole entries
  // only, as in the RAM cache).
  PrefixDiskMatch find(std::span<const int32_t> tokens, int64_t max_tokens, int64_t longer_than) const;
  // Reads the entry and verifies it. A failure drops it (with a warning;
  // a damaged file is deleted) and returns nothing: the caller recomputes.
  std::optional<PrefixFileEntry> load(const std::string& name);
  // Writes an entry (its layout must be the options' kv_dim/recurrent). One
  // already on disk is only marked used; a non-recurrent entry replaces
  // those that are its prefixes. Failures skip it with a warning.
  void save(std::span<const int32_t> tokens, std::span<const uint16_t> rows, const CacheSnapshot& states);

  uint64_t bytes() const;
  size_t entries() const;

 private:
  struct Item {
    std::string name;
    std::vector<int32_t> tokens;
    uint64_t bytes = 0;  // the file's
  };
  explicit PrefixDiskTier(PrefixDiskOptions options) : options_(std::move(options)) {}
  void scan();
  // The index entry for one file, or nothing (with a warning) when it cannot serve.
  std::optional<Item> index_file(const std::string& name, int64_t* mtime);
  // A header of this model with sizes that do not add up: empty when fine.
  std::string layout_problem(const PrefixFileHeader& h, uint64_t file_bytes) const;
  std::string path(const std::string& name) const;
  // Drops an item (and its file when `remove_file`).
  std::list<Item>::iterator forget(std::list<Item>::iterator it, bool remove_file);
  void evict_to(uint64_t budget);

  PrefixDiskOptions options_;
  mutable std::mutex mu_;
  std::list<Item> items_;  // front: most recently used
  uint64_t bytes_ = 0;
};

}  // namespace moeserve::runtime
