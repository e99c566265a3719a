#include "ipc/shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ipc/frame.h"

namespace moeserve::ipc {

Result<ShmRegion> ShmRegion::create(uint64_t bytes) {
  if (bytes == 0) return make_error(StatusCode::kInvalidArgument, "shared ring of 0 bytes");
  Fd fd(::memfd_create("moeserve-expert-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return make_error(StatusCode::kIoError, "memfd_create: {}", std::strerror(errno));
  if (::ftruncate(fd.get(), off_t(bytes)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return make_error(StatusCode::kIoError, "shared ring of {} bytes: {}", bytes, std::strerror(errno));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED)
    return make_error(StatusCode::kIoError, "mmap of the shared ring: {}", std::strerror(errno));
  ShmRegion r;
  r.fd_ = std::move(fd);
  r.data_ = static_cast<uint8_t*>(p);
  r.size_ = bytes;
  return r;
}

Result<ShmRegion> ShmRegion::map(Fd fd, uint64_t bytes) {
  if (!fd.valid()) return make_error(StatusCode::kInvalidArgument, "no shared ring came with the hello");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || uint64_t(st.st_size) < bytes || bytes == 0) {
    return make_error(StatusCode::kInvalidArgument, "the shared ring is not a file of at least {} bytes",
                      bytes);
  }
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return make_error(StatusCode::kInvalidArgument, "the shared ring is not sealed against shrinking");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED)
    return make_error(StatusCode::kIoError, "mmap of the shared ring: {}", std::strerror(errno));
  ShmRegion r;
  r.fd_ = std::move(fd);
  r.data_ = static_cast<uint8_t*>(p);
  r.size_ = bytes;
  return r;
}

ShmRegion& ShmRegion::operator=(ShmRegion&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(data_, size_);
    fd_ = std::move(o.fd_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

ShmRegion::~ShmRegion() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

std::optional<uint64_t> RingAllocator::allocate(uint64_t bytes) {
  const uint64_t n = (bytes + kRingAlign - 1) / kRingAlign * kRingAlign;
  if (n == 0 || n > size_) return std::nullopt;
  uint64_t at = 0;
  if (live_.empty()) {
    at = 0;
  } else {
    const Range &oldest = live_.front(), &newest = live_.back();
    const bool wrapped = newest.offset < oldest.offset;  // the newest ranges start again at 0
    if (!wrapped && newest.end + n <= size_) {
      at = newest.end;
    } else if (!wrapped && n <= oldest.offset) {
      at = 0;
    } else if (wrapped && newest.end + n <= oldest.offset) {
      at = newest.end;
    } else {
      return std::nullopt;
    }
  }
  live_.push_back({at, at + n});
  return at;
}

void RingAllocator::free_oldest() {
  if (!live_.empty()) live_.pop_front();
}

void RingAllocator::free_newest() {
  if (!live_.empty()) live_.pop_back();
}

}  // namespace moeserve::ipc
