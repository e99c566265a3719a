// A read-only memory map of a whole file. Model weights are used in place
// (zero-copy); the map lives as long as anything viewing it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"

namespace moeserve {

class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

  // Hint the kernel to read [offset, offset+length) ahead; clamped to the file
  // (overflow-safe), a no-op on an empty range.
  void prefetch(size_t offset, size_t length) const;

  // Maps every page of `bytes` (a range of a mapping) into the process now,
  // so the first requests do not pay a page fault per 4 KiB of weights.
  // MADV_POPULATE_READ where the kernel has it (5.14+), else a read per page.
  static void populate(std::span<const uint8_t> bytes);
  // Asks the kernel to start reading the range in (MADV_WILLNEED), without
  // waiting: pages about to be read, e.g. a prefill chunk's cold experts.
  static void will_need(std::span<const uint8_t> bytes);

  // Drops the whole pages inside `bytes` (a range of a read-only mapping)
  // from this process (MADV_DONTNEED): they stop counting as resident and
  // are read back from the file if touched again. For weights that were
  // copied elsewhere (packed for the CPU kernels).
  static void release(std::span<const uint8_t> bytes);

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace moeserve
