// Anonymous memory for large, long-lived buffers (weights re-laid-out for the
// CPU kernels): page-aligned, zero-filled, 2 MiB aligned and advised as
// transparent huge pages, so streaming it costs fewer TLB misses than 4 KiB
// pages would. Move-only; unmapped on destruction.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace moeserve {

class PageBuffer {
 public:
  PageBuffer() = default;
  static Result<PageBuffer> allocate(size_t bytes);
  ~PageBuffer();
  PageBuffer(PageBuffer&& other) noexcept;
  PageBuffer& operator=(PageBuffer&& other) noexcept;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void reset();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // bytes mapped at data_ (size_ rounded up to pages)
};

}  // namespace moeserve
