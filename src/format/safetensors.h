// Safetensors reader (Hugging Face weights): a validated, zero-copy view.
//
// Layout: u64 little-endian header length N, N bytes of JSON
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "BF16", "shape": [o, i],
//    "data_offsets": [begin, end]}, ...}
// then the data area; offsets are relative to its start (8 + N).
//
// Everything is checked at parse time (JSON shape, dtypes, shapes, offsets
// against the data area and against shape x element size, overlaps, duplicate
// names), so a SafetensorsFile that exists is safe to read. Only the float
// types the converter needs (F32, F16, BF16) are accepted; any other dtype is
// a kUnsupported error naming the tensor. Data pointers may be unaligned (the
// header length is arbitrary): read them with memcpy.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "tensor/dtype.h"

namespace moeserve {

// Headers past this are refused before parsing (real ones are < 1 MiB).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100u << 20;

struct SafetensorsTensor {
  std::string name;
  DType type = DType::F32;      // F32, F16 or BF16
  std::vector<int64_t> shape;   // PyTorch order: shape.back() is contiguous
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;             // file it lives in (for messages)
  int64_t n_elements() const;
  // "[151936, 2048]" in PyTorch order.
  std::string shape_string() const;
};

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);
  static Result<SafetensorsFile> parse(std::shared_ptr<const MappedFile> file);
  // Bytes in memory (fuzzer, tests); `bytes` must outlive the result.
  static Result<SafetensorsFile> parse_bytes(std::span<const uint8_t> bytes, std::string name);

  const std::string& name() const { return name_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // header order
  const SafetensorsTensor* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  friend class SafetensorsParser;
  std::shared_ptr<const MappedFile> map_;
  std::string name_;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// All weights of a Hugging Face model directory, over one or more files:
//  1. model.safetensors.index.json ("weight_map": tensor -> file) when present:
//     every listed tensor must be in its file, and no file may hold a tensor
//     the index does not list;
//  2. else model.safetensors;
//  3. else every *.safetensors in the directory (sorted by name).
// A name found in two files is an error.
class SafetensorsModel {
 public:
  static Result<SafetensorsModel> open_dir(const std::string& dir);
  const std::vector<SafetensorsFile>& files() const { return files_; }
  const SafetensorsTensor* find(std::string_view name) const;
  // Every tensor, in file order then header order.
  std::vector<const SafetensorsTensor*> all_tensors() const;
  size_t tensor_count() const { return index_.size(); }

 private:
  std::vector<SafetensorsFile> files_;
  std::unordered_map<std::string, const SafetensorsTensor*> index_;
};

// A tensor to write with write_safetensors (tests, tools): raw little-endian
// bytes of `type` in PyTorch `shape` order.
struct SafetensorsWriteTensor {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// A complete safetensors file in memory (tensors packed in the given order).
Result<std::vector<uint8_t>> write_safetensors(const std::vector<SafetensorsWriteTensor>& tensors,
                                               const std::map<std::string, std::string>& metadata = {});

}  // namespace moeserve
