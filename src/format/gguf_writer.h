// GGUF v3 writer: metadata in insertion order, tensors in insertion order,
// data aligned to general.alignment (default 32).
//
// Tensor data is either copied in (add_tensor) or produced at write time by
// a callback (add_tensor_deferred), so a conversion never needs to hold all
// of its output in memory at once.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "format/gguf_value.h"
#include "tensor/dtype.h"

namespace moeserve {

// The writer refuses larger alignments: every tensor is padded to it, so a
// stray 2^31 would write gigabytes of zeros. (The reader accepts any power of
// two, as llama.cpp does.)
inline constexpr uint64_t kGgufWriterMaxAlignment = 1 << 20;

// Fills exactly out.size() bytes (the tensor's byte size) with its data.
using GgufTensorFill = std::function<Status(std::span<uint8_t> out)>;

class GgufWriter {
 public:
  // Metadata. Setting an existing key replaces its value in place (the key
  // keeps its position).
  void set(std::string_view key, GgufValue value);
  void set_u8(std::string_view key, uint8_t v) { set(key, GgufValue::u8(v)); }
  void set_i8(std::string_view key, int8_t v) { set(key, GgufValue::i8(v)); }
  void set_u16(std::string_view key, uint16_t v) { set(key, GgufValue::u16(v)); }
  void set_i16(std::string_view key, int16_t v) { set(key, GgufValue::i16(v)); }
  void set_u32(std::string_view key, uint32_t v) { set(key, GgufValue::u32(v)); }
  void set_i32(std::string_view key, int32_t v) { set(key, GgufValue::i32(v)); }
  void set_u64(std::string_view key, uint64_t v) { set(key, GgufValue::u64(v)); }
  void set_i64(std::string_view key, int64_t v) { set(key, GgufValue::i64(v)); }
  void set_f32(std::string_view key, float v) { set(key, GgufValue::f32(v)); }
  void set_f64(std::string_view key, double v) { set(key, GgufValue::f64(v)); }
  void set_bool(std::string_view key, bool v) { set(key, GgufValue::boolean(v)); }
  void set_string(std::string_view key, std::string v) { set(key, GgufValue::string(std::move(v))); }
  void set_string_array(std::string_view key, std::vector<std::string> v) { set(key, GgufValue::array(std::move(v))); }
  void set_i32_array(std::string_view key, std::vector<int32_t> v) { set(key, GgufValue::array(std::move(v))); }
  void set_u32_array(std::string_view key, std::vector<uint32_t> v) { set(key, GgufValue::array(std::move(v))); }
  void set_i64_array(std::string_view key, std::vector<int64_t> v) { set(key, GgufValue::array(std::move(v))); }
  void set_f32_array(std::string_view key, std::vector<float> v) { set(key, GgufValue::array(std::move(v))); }
  void set_bool_array(std::string_view key, const std::vector<bool>& v) { set(key, GgufValue::bool_array(v)); }
  bool erase(std::string_view key);  // false when absent
  const GgufValue* find(std::string_view key) const;
  size_t kv_count() const { return kvs_.size(); }

  // Tensors. `shape` is in ne order (ne[0] = contiguous row), 1..4 dims, each
  // > 0, ne[0] a multiple of the type's block size. add_tensor copies `data`
  // and checks its size; add_tensor_deferred calls `fill` during write().
  // kInvalidArgument on a bad shape, a size mismatch or a duplicate name.
  Status add_tensor(std::string name, DType type, const std::vector<int64_t>& shape, std::span<const uint8_t> data);
  Status add_tensor_deferred(std::string name, DType type, const std::vector<int64_t>& shape, GgufTensorFill fill);
  size_t tensor_count() const { return tensors_.size(); }

  // Written as GGUF version 3 unless changed (2 has the same layout; tests).
  void set_version(uint32_t version) { version_ = version; }

  // Write to `path` via `path.tmp` + rename, so a failed write (an I/O error,
  // a fill callback's error) leaves no file behind and an old file intact.
  Status write(const std::string& path) const;
  // The whole file in memory (tests, fuzz seeds).
  Result<std::vector<uint8_t>> write_to_buffer() const;

 private:
  struct PendingTensor {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    size_t nbytes = 0;
    std::vector<uint8_t> data;  // empty when deferred
    GgufTensorFill fill;        // set when deferred
  };
  Result<size_t> check_tensor(std::string_view name, DType type, const std::vector<int64_t>& shape) const;
  Result<uint32_t> alignment() const;
  friend class GgufEmitter;

  uint32_t version_ = 3;
  std::vector<std::pair<std::string, GgufValue>> kvs_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace moeserve
