#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <span>
#include <cstring>

namespace moeserve {

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return make_error(StatusCode::kIoError, "{}: cannot open: {}", path, std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(StatusCode::kIoError, "{}: not a regular file", path);
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = size_t(st.st_size);
  if (file->size_ > 0) {
    void* p = mmap(nullptr, file->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return make_error(StatusCode::kIoError, "{}: mmap failed: {}", path, std::strerror(err));
    }
    file->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::prefetch(size_t offset, size_t length) const {
  if (data_ == nullptr || offset >= size_ || length == 0) return;
  if (length > size_ - offset) length = size_ - offset;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t start = offset / page * page;
  madvise(const_cast<uint8_t*>(data_) + start, offset - start + length, MADV_WILLNEED);
}

void MappedFile::will_need(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(bytes.data()) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size();
  (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);  // advice only: failure is harmless
}

void MappedFile::populate(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(bytes.data()) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size();
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14 uapi value; older kernels answer EINVAL
#endif
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ) == 0) return;
  // One read in the first page (which may start before `bytes`), then one
  // at each following page boundary inside the range.
  volatile uint8_t sink = bytes[0];
  for (uintptr_t p = begin + page; p < end; p += page) sink = sink ^ *reinterpret_cast<const uint8_t*>(p);
  (void)sink;
}

void MappedFile::release(std::span<const uint8_t> bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(bytes.data()) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size()) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace moeserve
