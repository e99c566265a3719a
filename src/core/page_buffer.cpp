#include "core/page_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace moeserve {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

Result<PageBuffer> PageBuffer::allocate(size_t bytes) {
  PageBuffer b;
  if (bytes == 0) return b;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t want = round_up(bytes, page);
  // Map a huge page more than needed, then trim both ends so the buffer
  // starts on a 2 MiB boundary (the kernel backs only aligned ranges with
  // huge pages).
  const size_t span = want + kHugePage;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    return make_error(StatusCode::kResourceExhausted, "could not allocate {:.1f} MiB: {}",
                      double(bytes) / (1 << 20), std::strerror(errno));
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = round_up(start, kHugePage);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t tail = aligned + want, end = start + span;
  if (end > tail) munmap(reinterpret_cast<void*>(tail), end - tail);
#ifdef MADV_HUGEPAGE
  madvise(reinterpret_cast<void*>(aligned), want, MADV_HUGEPAGE);  // a hint: failure is harmless
#endif
  b.data_ = reinterpret_cast<uint8_t*>(aligned);
  b.size_ = bytes;
  b.mapped_ = want;
  return b;
}

PageBuffer::~PageBuffer() { reset(); }

PageBuffer::PageBuffer(PageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

PageBuffer& PageBuffer::operator=(PageBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

void PageBuffer::reset() {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
  size_ = mapped_ = 0;
}

}  // namespace moeserve
