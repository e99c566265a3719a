// Paged KV's disk tier (serve --kv-cache-dir DIR, --kv-disk-mem SIZE): the
// blocks the host tier (kv_host_tier.h) pushes out, and at shutdown every
// block the tree and the host tier hold, kept one file each under
// DIR/blocks/ so that a restarted server finds its earlier prompts' prefix
// blocks instead of computing them again.
//
// A file: KvBlockFileHeader, the block's tokens (int32), its K/V values
// (uint16, KvBlockPool::read_block's layout). Named by the block's path key
// (KvBlockTree::path_keys: a hash of every token up to the block's end);
// the key, the block's own tokens, the model fingerprint (kv_fingerprint.h)
// and the layout are checked before a file is used, the checksum (hash64
// over tokens and values) when it is loaded. Another model's or another
// version's file is skipped with a warning and left alone (servers may
// share the folder); a file of ours that is damaged is deleted.
//
// Writes go through a writer thread (an eviction never waits for the disk)
// to a temporary name, then a rename. Every failure is a miss or a skipped
// save with a warning, never an error to a request. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace moeserve::runtime {

inline constexpr char kKvBlockFileMagic[8] = {'M', 'O', 'E', 'K', 'V', 'B', 'L', 'K'};
inline constexpr uint32_t kKvBlockFileVersion = 1;
inline constexpr const char* kKvBlockFileSuffix = ".kvblk";

struct KvBlockFileHeader {
  char magic[8] = {};
  uint32_t version = 0;
  uint32_t flags = 0;        // none yet
  uint64_t fingerprint = 0;  // kv_fingerprint() of the model that computed the values
  uint64_t path = 0;         // the block's path key
  int64_t n_tokens = 0;      // the block's rows
  uint64_t n_values = 0;     // uint16 values after the tokens
  uint64_t checksum = 0;     // hash64 over the tokens, then the values
};
static_assert(sizeof(KvBlockFileHeader) == 56, "the header is written as it is laid out");

struct KvBlockDiskOptions {
  std::string dir;  // the --kv-cache-dir folder; the files go to its blocks/ folder
  uint64_t max_bytes = 0;
  uint64_t fingerprint = 0;
  int64_t block_rows = 0;  // KvBlockPool::block_rows()
  size_t block_bytes = 0;  // KvBlockPool::block_bytes()
  // Bytes of blocks waiting for the writer; past it a save is dropped.
  size_t max_pending_bytes = size_t(256) << 20;
};

struct KvBlockDiskStats {
  int64_t files = 0;
  uint64_t bytes = 0;
  int64_t saved = 0;    // written since start
  int64_t loaded = 0;   // read back into the pool
  int64_t dropped = 0;  // saves skipped (writer behind, IO errors) and files removed for the budget
};

class KvBlockDisk {
 public:
  // Creates DIR/blocks when missing and indexes it (headers and tokens
  // only). kIoError naming the folder when it cannot be used.
  static Result<std::unique_ptr<KvBlockDisk>> open(const KvBlockDiskOptions& options);
  ~KvBlockDisk();  // writes what is pending first
  KvBlockDisk(const KvBlockDisk&) = delete;
  KvBlockDisk& operator=(const KvBlockDisk&) = delete;

  // Queues a block for writing (`values`: block_bytes of them, as uint16).
  // One already on disk is only marked used. With the writer behind by
  // max_pending_bytes the block is dropped, or (set_blocking) waits.
  void save(uint64_t path, std::vector<int32_t> tokens, std::vector<uint16_t> values);
  // Whether this block is on disk (or waiting to be written).
  bool contains(uint64_t path, std::span<const int32_t> tokens) const;
  // Its values, verified; false (and a damaged file deleted) otherwise.
  bool load(uint64_t path, std::span<const int32_t> tokens, std::vector<uint16_t>& values);
  // Waits until every queued block is written.
  void flush();
  // save() waits for the writer instead of dropping (a shutdown's saves).
  void set_blocking(bool blocking);
  KvBlockDiskStats stats() const;

 private:
  struct Item {
    std::vector<int32_t> tokens;
    uint64_t bytes = 0;  // the file's
    std::list<uint64_t>::iterator lru;
  };
  struct Job {
    uint64_t path = 0;
    std::vector<int32_t> tokens;
    std::vector<uint16_t> values;
  };
  explicit KvBlockDisk(KvBlockDiskOptions options);
  void scan();
  void write_loop();
  bool write_file(const Job& job);  // outside mu_
  std::string file_of(uint64_t path) const;
  uint64_t file_bytes() const;                   // a block file's size
  void forget(uint64_t path, bool remove_file);  // under mu_
  void evict_to(uint64_t budget);                // under mu_

  KvBlockDiskOptions options_;
  std::string folder_;
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::unordered_map<uint64_t, Item> items_;
  std::list<uint64_t> lru_;  // front: most recently used
  std::deque<Job> pending_;
  // The job being written (while writing_): still found by contains() and
  // load(), so that a block is never missing between the queue and its file.
  Job in_flight_;
  const Job* queued_or_writing(uint64_t path) const;  // under mu_
  size_t pending_bytes_ = 0;
  bool writing_ = false, stopping_ = false, blocking_ = false;
  KvBlockDiskStats stats_;
  std::thread writer_;
};

}  // namespace moeserve::runtime
