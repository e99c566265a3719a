// GGUF (v2/v3) reader: a validated, zero-copy view of a model file.
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor_count, u64 kv_count,
// the key/value metadata, the tensor infos, padding to the alignment, then
// the tensor data. See docs in /work/shared/design/model-and-format-specs.md §1.
//
// Everything is checked at parse time (sizes, shapes, types, offsets, bounds),
// so a GgufFile that exists is safe to use: every tensor's data lies inside
// the file, has the byte size its type and shape imply and is aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "format/gguf_value.h"
#include "tensor/dtype.h"

namespace moeserve {

inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr uint32_t kGgufMaxDims = 4;
// llama.cpp keeps tensor names in 64-byte buffers (63 bytes + NUL); longer
// names are accepted with a warning, names past kGgufMaxNameBytes rejected.
inline constexpr size_t kGgufLlamaNameLimit = 63;
inline constexpr size_t kGgufMaxNameBytes = 1024;

struct GgufKV {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  DType type = DType::F32;
  uint32_t n_dims = 0;
  int64_t ne[kGgufMaxDims] = {1, 1, 1, 1};  // ne[0] is the contiguous row; unused dims are 1
  uint64_t offset = 0;                      // absolute file offset of the data
  size_t nbytes = 0;
  const uint8_t* data = nullptr;            // points into the file's bytes

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }  // validated not to overflow
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  size_t row_bytes() const { return dtype_row_bytes(type, ne[0]); }
  std::span<const uint8_t> bytes() const { return {data, nbytes}; }
  // "[2048, 768, 128]" in ne order.
  std::string shape_string() const;
};

// Hashing that lets maps keyed by std::string be searched with a string_view.
struct GgufStringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using GgufNameIndex = std::unordered_map<std::string, size_t, GgufStringHash, std::equal_to<>>;

class GgufFile {
 public:
  // Map the file and parse it (tensor data is not read, only located).
  static Result<GgufFile> open(const std::string& path);
  // Parse an existing map; the GgufFile keeps it alive.
  static Result<GgufFile> parse(std::shared_ptr<const MappedFile> file);
  // Parse bytes in memory (fuzzer, tests). The GgufFile does NOT own them:
  // `bytes` must outlive it and everything taken from it (tensor data
  // pointers point into them). `name` is used in error messages.
  static Result<GgufFile> parse_bytes(std::span<const uint8_t> bytes, std::string name);

  const std::string& name() const { return name_; }  // the path, or parse_bytes' name
  // Backed by a file mapping (open/parse), not by caller-owned bytes.
  bool file_backed() const { return map_ != nullptr; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the (aligned) data section
  std::span<const uint8_t> bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }
  // general.architecture ("qwen3moe"), or "" when absent or not a string.
  std::string_view architecture() const;
  // "{architecture}.{suffix}", e.g. arch_key("block_count").
  std::string arch_key(std::string_view suffix) const;
  // Oddities that did not stop the parse (e.g. names llama.cpp would reject).
  const std::vector<std::string>& warnings() const { return warnings_; }

  // ---- metadata --------------------------------------------------------------
  const std::vector<GgufKV>& kvs() const { return kvs_; }  // file order
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // nullopt when the key is absent or has another type (see GgufValue::as_*).
  std::optional<int64_t> get_int(std::string_view key) const;     // any integer type
  std::optional<uint64_t> get_uint(std::string_view key) const;   // any integer type, value >= 0
  std::optional<double> get_float(std::string_view key) const;    // f32 or f64
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string_view> get_string(std::string_view key) const;
  // No copy: points into the file object (valid while it lives).
  const std::vector<std::string>* get_string_array(std::string_view key) const;
  std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const;
  std::optional<std::vector<double>> get_float_array(std::string_view key) const;
  std::optional<std::vector<bool>> get_bool_array(std::string_view key) const;

  // Like get_*, but say why: kNotFound "file: key 'k' is missing", or
  // kInvalidFormat "file: key 'k' has type string, expected an integer".
  Result<const GgufValue*> require(std::string_view key) const;
  Result<int64_t> require_int(std::string_view key) const;
  Result<uint64_t> require_uint(std::string_view key) const;
  Result<double> require_float(std::string_view key) const;
  Result<bool> require_bool(std::string_view key) const;
  Result<std::string_view> require_string(std::string_view key) const;
  Result<const std::vector<std::string>*> require_string_array(std::string_view key) const;
  Result<std::vector<int64_t>> require_int_array(std::string_view key) const;
  Result<std::vector<double>> require_float_array(std::string_view key) const;

  // ---- tensors ---------------------------------------------------------------
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // file order
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  Result<const GgufTensorInfo*> require_tensor(std::string_view name) const;

 private:
  friend class GgufParser;
  GgufFile() = default;
  Status wrong_type(std::string_view key, const GgufValue& value, std::string_view expected) const;

  std::shared_ptr<const MappedFile> map_;  // null for parse_bytes
  std::span<const uint8_t> bytes_;
  std::string name_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufKV> kvs_;
  GgufNameIndex kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  GgufNameIndex tensor_index_;
  std::vector<std::string> warnings_;
};

}  // namespace moeserve
