// Test helpers: a raw GGUF byte builder independent of GgufWriter (so the
// reader is not only tested against our own writer), and temp paths.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

namespace moeserve::testing {

// Appends little-endian GGUF pieces; each helper returns *this to chain.
class RawGguf {
 public:
  std::vector<uint8_t> bytes;

  template <typename T>
  RawGguf& pod(T v) {
    const size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
    return *this;
  }
  RawGguf& u8(uint8_t v) { return pod(v); }
  RawGguf& u32(uint32_t v) { return pod(v); }
  RawGguf& u64(uint64_t v) { return pod(v); }
  RawGguf& i64(int64_t v) { return pod(v); }
  RawGguf& str(std::string_view s) {
    u64(s.size());
    return raw(s);
  }
  // resize + memcpy rather than insert: GCC 12 -O3 warns (falsely) on
  // vector::insert of a string range here.
  RawGguf& raw(std::string_view s) {
    const size_t at = bytes.size();
    bytes.resize(at + s.size());
    if (!s.empty()) std::memcpy(bytes.data() + at, s.data(), s.size());
    return *this;
  }
  RawGguf& zeros(size_t n) {
    bytes.resize(bytes.size() + n, 0);
    return *this;
  }
  RawGguf& pad_to(size_t align) { return zeros((align - bytes.size() % align) % align); }

  RawGguf& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
  }
  RawGguf& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  RawGguf& kv_string(std::string_view key, std::string_view v) { return str(key).u32(8).str(v); }
  // A tensor info: ne in ne order, a raw GGUF type id and a relative offset.
  RawGguf& tensor(std::string_view name, std::initializer_list<int64_t> ne, uint32_t type_id, uint64_t offset) {
    str(name).u32(uint32_t(ne.size()));
    for (int64_t d : ne) i64(d);
    return u32(type_id).u64(offset);
  }
};

// A unique path under the gtest temp dir, removed (with .tmp) on destruction.
class TempPath {
 public:
  explicit TempPath(std::string_view stem) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(::testing::TempDir()) /
            (std::string(stem) + "_" + (info ? info->name() : "x") + "_" + std::to_string(::getpid()) + ".gguf");
    cleanup();
  }
  ~TempPath() { cleanup(); }
  const std::string& str() const { return path_str_ = path_.string(); }

 private:
  void cleanup() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    std::filesystem::remove(path_.string() + ".tmp", ec);
  }
  std::filesystem::path path_;
  mutable std::string path_str_;
};

}  // namespace moeserve::testing
