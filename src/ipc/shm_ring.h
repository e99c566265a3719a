// The shared-memory transport's payload area: one memfd both processes
// map, in which the parent places each call's input rows and the space for
// its output rows (control frames still go over the socket, which also
// orders the two processes' accesses). The parent alone allocates (a FIFO
// ring: calls finish in the order they were sent), and the worker checks
// every offset it is given against the region's size.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>

#include "core/status.h"
#include "ipc/socket.h"

namespace moeserve::ipc {

class ShmRegion {
 public:
  // A new region of `bytes` (parent), sealed against shrinking and growing
  // so the worker's reads can never run past the file.
  static Result<ShmRegion> create(uint64_t bytes);
  // Maps a region received from the parent (worker): it must be at least
  // `bytes` long and sealed against shrinking.
  static Result<ShmRegion> map(Fd fd, uint64_t bytes);

  ShmRegion() = default;
  ShmRegion(ShmRegion&& o) noexcept { *this = std::move(o); }
  ShmRegion& operator=(ShmRegion&& o) noexcept;
  ~ShmRegion();
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_.get(); }

 private:
  Fd fd_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Ranges of a ring of `size` bytes handed out in order and given back in
// the same order; offsets are multiples of kRingAlign (frame.h).
class RingAllocator {
 public:
  explicit RingAllocator(uint64_t size = 0) : size_(size) {}
  // The offset of `bytes` free bytes, or nothing until older ranges are freed.
  std::optional<uint64_t> allocate(uint64_t bytes);
  void free_oldest();
  void free_newest();  // takes back the last allocate()
  bool empty() const { return live_.empty(); }
  uint64_t size() const { return size_; }

 private:
  struct Range {
    uint64_t offset, end;
  };
  uint64_t size_ = 0;
  std::deque<Range> live_;
};

}  // namespace moeserve::ipc
