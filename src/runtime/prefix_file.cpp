#include "runtime/prefix_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace moeserve::runtime {
namespace {

constexpr uint64_t kMul = 0x9e3779b97f4a7c15ULL;

uint64_t mix(uint64_t h, uint64_t w) {
  h = (h ^ w) * kMul;
  return h ^ (h >> 29);
}

// An open file descriptor, closed when it goes.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports a failed close (a write the OS could not finish).
  bool close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0;
  }

 private:
  int fd_;
};

Status errno_error(std::string_view what, const std::string& path) {
  return make_error(StatusCode::kIoError, "{} {}: {}", what, path, std::strerror(errno));
}

Status write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return errno_error("cannot write", path);
    p += n;
    bytes -= size_t(n);
  }
  return Status::ok();
}

Status read_at(int fd, void* data, size_t bytes, uint64_t offset, const std::string& path) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_error("cannot read", path);
    if (n == 0) return make_error(StatusCode::kInvalidFormat, "{}: the file ends early (truncated)", path);
    p += n;
    bytes -= size_t(n);
    offset += uint64_t(n);
  }
  return Status::ok();
}

Result<uint64_t> file_size(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_error("cannot stat", path);
  return uint64_t(st.st_size);
}

}  // namespace

uint64_t hash64(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = seed;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = mix(h, w);
  }
  uint64_t tail = 0;
  if (bytes > 0) std::memcpy(&tail, p, bytes);  // (p may be null when empty)
  h = mix(h, tail);
  return mix(h, bytes);  // so that trailing zero bytes count
}

uint64_t prefix_file_checksum(std::span<const int32_t> tokens, std::span<const uint16_t> rows,
                              std::span<const float> states) {
  uint64_t h = hash64(tokens.data(), tokens.size_bytes());
  h = hash64(rows.data(), rows.size_bytes(), h);
  return hash64(states.data(), states.size_bytes(), h);
}

std::string prefix_file_name(std::span<const int32_t> tokens) {
  return fmt::format("{:016x}{}", hash64(tokens.data(), tokens.size_bytes()), kPrefixFileSuffix);
}

uint64_t prefix_file_bytes(const PrefixFileHeader& h) {
  // Each count is bounded first, so the sum cannot wrap.
  constexpr uint64_t kLimit = uint64_t(1) << 56;
  if (h.n_tokens < 0 || uint64_t(h.n_tokens) > kLimit || h.n_rows > kLimit || h.n_states > kLimit) return 0;
  return sizeof(PrefixFileHeader) + uint64_t(h.n_tokens) * 4 + h.n_rows * 2 + h.n_states * 4;
}

Status write_prefix_file(const std::string& path, const PrefixFileWrite& w) {
  static std::atomic<uint64_t> counter{0};
  const std::span<const float> states =
      w.states != nullptr ? std::span<const float>(w.states->states) : std::span<const float>();
  PrefixFileHeader h;
  std::memcpy(h.magic, kPrefixFileMagic, sizeof(h.magic));
  h.version = kPrefixFileVersion;
  h.flags = w.recurrent ? kPrefixFileRecurrent : 0;
  h.fingerprint = w.fingerprint;
  h.kv_dim = w.kv_dim;
  h.n_tokens = int64_t(w.tokens.size());
  h.n_rows = w.rows.size();
  h.n_states = states.size();
  h.state_position = w.states != nullptr ? w.states->position : 0;
  h.checksum = prefix_file_checksum(w.tokens, w.rows, states);
  // Not a name the scan reads (no .kvpc suffix): a crash leaves it unread.
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter.fetch_add(1));
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return errno_error("cannot create", tmp);
  Status st = write_all(fd.get(), &h, sizeof(h), tmp);
  if (st.is_ok()) st = write_all(fd.get(), w.tokens.data(), w.tokens.size_bytes(), tmp);
  if (st.is_ok()) st = write_all(fd.get(), w.rows.data(), w.rows.size_bytes(), tmp);
  if (st.is_ok()) st = write_all(fd.get(), states.data(), states.size_bytes(), tmp);
  // No fsync: a file torn by a power loss fails its checksum and is dropped,
  // which costs only a recompute; a clean restart finds every file whole.
  if (st.is_ok() && !fd.close()) st = errno_error("cannot write", tmp);
  if (st.is_ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = errno_error("cannot rename into", path);
  if (!st.is_ok()) ::unlink(tmp.c_str());
  return st;
}

Result<PrefixFileHead> read_prefix_header(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return errno_error("cannot open", path);
  PrefixFileHead head;
  MOESERVE_ASSIGN_OR_RETURN(head.file_bytes, file_size(fd.get(), path));
  if (head.file_bytes < sizeof(PrefixFileHeader)) {
    return make_error(StatusCode::kInvalidFormat, "{}: {} bytes, shorter than a prefix-cache file header",
                      path, head.file_bytes);
  }
  MOESERVE_RETURN_IF_ERROR(read_at(fd.get(), &head.header, sizeof(head.header), 0, path));
  if (std::memcmp(head.header.magic, kPrefixFileMagic, sizeof(kPrefixFileMagic)) != 0)
    return make_error(StatusCode::kUnsupported, "{}: not a moeserve prefix-cache file", path);
  if (head.header.version != kPrefixFileVersion) {
    return make_error(StatusCode::kUnsupported, "{}: prefix-cache file version {} (this build reads {})",
                      path, head.header.version, kPrefixFileVersion);
  }
  return head;
}

Result<std::vector<int32_t>> read_prefix_tokens(const std::string& path, const PrefixFileHeader& h) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return errno_error("cannot open", path);
  std::vector<int32_t> tokens(size_t(std::max<int64_t>(h.n_tokens, 0)));
  MOESERVE_RETURN_IF_ERROR(read_at(fd.get(), tokens.data(), tokens.size() * 4, sizeof(h), path));
  return tokens;
}

Result<PrefixFileEntry> read_prefix_file(const std::string& path, PrefixFileHeader* header) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return errno_error("cannot open", path);
  MOESERVE_ASSIGN_OR_RETURN(const uint64_t size, file_size(fd.get(), path));
  PrefixFileHeader& h = *header;
  if (size < sizeof(h)) return make_error(StatusCode::kInvalidFormat, "{}: shorter than its header", path);
  MOESERVE_RETURN_IF_ERROR(read_at(fd.get(), &h, sizeof(h), 0, path));
  if (std::memcmp(h.magic, kPrefixFileMagic, sizeof(kPrefixFileMagic)) != 0 ||
      h.version != kPrefixFileVersion)
    return make_error(StatusCode::kUnsupported, "{}: not a prefix-cache file of this version", path);
  if (prefix_file_bytes(h) != size) {
    return make_error(StatusCode::kInvalidFormat, "{}: {} bytes, its header says {} (truncated?)", path, size,
                      prefix_file_bytes(h));
  }
  PrefixFileEntry e;
  e.tokens.resize(size_t(h.n_tokens));
  e.rows.resize(size_t(h.n_rows));
  e.states.states.resize(size_t(h.n_states));
  e.states.position = h.state_position;
  uint64_t off = sizeof(h);
  MOESERVE_RETURN_IF_ERROR(read_at(fd.get(), e.tokens.data(), e.tokens.size() * 4, off, path));
  off += e.tokens.size() * 4;
  MOESERVE_RETURN_IF_ERROR(read_at(fd.get(), e.rows.data(), e.rows.size() * 2, off, path));
  off += e.rows.size() * 2;
  MOESERVE_RETURN_IF_ERROR(read_at(fd.get(), e.states.states.data(), e.states.states.size() * 4, off, path));
  if (prefix_file_checksum(e.tokens, e.rows, e.states.states) != h.checksum)
    return make_error(StatusCode::kInvalidFormat, "{}: checksum mismatch (the contents are damaged)", path);
  return e;
}

}  // namespace moeserve::runtime
