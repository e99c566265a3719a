// Little-endian fields of the IPC frames (frame.h, shard_frames.h),
// whatever the host's order: writers append to a byte vector; the reader
// takes fields in order and, read past the end, yields zeros and sets
// failed() (decoders check the sizes first, or failed() once at the end).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace moeserve::ipc::wire {

// `bytes` (at most 8) little-endian bytes of v.
inline void put(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes && i < 8; ++i) out.push_back(uint8_t(v >> (8 * i)));
}
// `n` reserved zero bytes.
inline void put_zeros(std::vector<uint8_t>& out, size_t n) { out.insert(out.end(), n, uint8_t{0}); }
inline void put_u8(std::vector<uint8_t>& out, uint8_t v) { out.push_back(v); }
inline void put_u16(std::vector<uint8_t>& out, uint16_t v) { put(out, v, 2); }
inline void put_u32(std::vector<uint8_t>& out, uint32_t v) { put(out, v, 4); }
inline void put_u64(std::vector<uint8_t>& out, uint64_t v) { put(out, v, 8); }
inline void put_i64(std::vector<uint8_t>& out, int64_t v) { put(out, uint64_t(v), 8); }

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  uint8_t u8() { return uint8_t(get(1)); }
  uint16_t u16() { return uint16_t(get(2)); }
  uint32_t u32() { return uint32_t(get(4)); }
  uint64_t u64() { return get(8); }
  int32_t i32() { return int32_t(uint32_t(get(4))); }
  int64_t i64() { return int64_t(get(8)); }
  // The next n bytes (empty and failed() when fewer are left).
  std::span<const uint8_t> bytes(uint64_t n) {
    if (n > b_.size() - at_) {
      failed_ = true;
      at_ = b_.size();
      return {};
    }
    const std::span<const uint8_t> s = b_.subspan(at_, size_t(n));
    at_ += size_t(n);
    return s;
  }
  size_t at() const { return at_; }
  size_t left() const { return b_.size() - at_; }
  bool failed() const { return failed_; }

 private:
  uint64_t get(int n) {
    if (size_t(n) > b_.size() - at_) {
      failed_ = true;
      at_ = b_.size();
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(b_[at_ + size_t(i)]) << (8 * i);
    at_ += size_t(n);
    return v;
  }
  std::span<const uint8_t> b_;
  size_t at_ = 0;
  bool failed_ = false;
};

}  // namespace moeserve::ipc::wire
