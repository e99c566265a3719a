// Safetensors parsing and validation; see safetensors.h for the layout.
#include "format/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_set>

namespace moeserve {

using nlohmann::json;

namespace {

Status format_error(std::string_view file, std::string_view what) {
  return Status(StatusCode::kInvalidFormat, fmt::format("{}: {}", file, what));
}

Status tensor_error(std::string_view file, std::string_view tensor, std::string_view what) {
  return Status(StatusCode::kInvalidFormat, fmt::format("{}: tensor '{}': {}", file, tensor, what));
}

struct DTypeName {
  const char* name;
  DType type;
};
constexpr DTypeName kSupportedDTypes[] = {{"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}};
// Known safetensors dtypes we do not convert: named so the error is precise.
constexpr const char* kKnownOtherDTypes[] = {"F64", "I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64",
                                             "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"};

const char* safetensors_dtype_name(DType t) {
  for (const DTypeName& d : kSupportedDTypes) {
    if (d.type == t) return d.name;
  }
  return nullptr;
}

// Deepest [ / { nesting allowed in a header (real ones nest 3 deep). Checked
// before parsing, so a hostile "[[[[..." cannot exhaust the stack.
constexpr int kMaxJsonDepth = 32;

bool json_depth_ok(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Non-negative integer that fits int64 (JSON numbers may be floats or huge).
bool json_to_count(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return out <= uint64_t(INT64_MAX);
  }
  if (v.is_number_integer()) {
    const int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    out = uint64_t(s);
    return true;
  }
  return false;
}

}  // namespace

int64_t SafetensorsTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated not to overflow at parse time
  return n;
}

std::string SafetensorsTensor::shape_string() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

class SafetensorsParser {
 public:
  SafetensorsParser(std::span<const uint8_t> bytes, std::string name) : bytes_(bytes), name_(std::move(name)) {}

  Result<SafetensorsFile> parse() {
    if (bytes_.size() < 8) return format_error(name_, fmt::format("file is {} bytes, too short for the header length", bytes_.size()));
    const uint64_t header_len = read_u64_le(bytes_.data());
    if (header_len > kSafetensorsMaxHeaderBytes) {
      return format_error(name_, fmt::format("header length {} is larger than the {} byte limit", header_len, kSafetensorsMaxHeaderBytes));
    }
    if (header_len > bytes_.size() - 8) {
      return format_error(name_, fmt::format("header length {} runs past the end of the file ({} bytes)", header_len, bytes_.size()));
    }
    data_begin_ = 8 + header_len;
    data_size_ = bytes_.size() - data_begin_;
    const std::string_view text(reinterpret_cast<const char*>(bytes_.data() + 8), header_len);
    MOESERVE_ASSIGN_OR_RETURN(json root, parse_json(text));
    SafetensorsFile file;
    file.name_ = name_;
    for (auto it = root.begin(); it != root.end(); ++it) {
      if (it.key() == "__metadata__") {
        MOESERVE_RETURN_IF_ERROR(read_metadata(it.value(), file));
        continue;
      }
      MOESERVE_ASSIGN_OR_RETURN(SafetensorsTensor tensor, read_tensor(it.key(), it.value()));
      file.tensors_.push_back(std::move(tensor));
    }
    MOESERVE_RETURN_IF_ERROR(check_overlaps(file));
    // nlohmann sorts object keys; restore the data order, which is the order
    // the writer chose (and the one a reader streams best in).
    std::stable_sort(file.tensors_.begin(), file.tensors_.end(),
                     [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.data < b.data; });
    for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_.emplace(file.tensors_[i].name, i);
    return file;
  }

 private:
  Result<json> parse_json(std::string_view text) {
    // nlohmann keeps the last of duplicate keys silently; a callback sees
    // each top-level key as it is parsed, so duplicates can be refused.
    if (!json_depth_ok(text)) return format_error(name_, fmt::format("header JSON nests deeper than {} levels", kMaxJsonDepth));
    std::unordered_set<std::string> seen;
    std::string duplicate;
    json::parser_callback_t watch = [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
        if (!seen.insert(parsed.get<std::string>()).second && duplicate.empty()) duplicate = parsed.get<std::string>();
      }
      return true;
    };
    json root;
    try {
      root = json::parse(text, watch, /*allow_exceptions=*/false);
    } catch (const json::exception& e) {
      return format_error(name_, fmt::format("header is not valid JSON: {}", e.what()));
    }
    if (root.is_discarded()) return format_error(name_, "header is not valid JSON");
    if (!root.is_object()) return format_error(name_, "header is not a JSON object");
    if (!duplicate.empty()) return tensor_error(name_, duplicate, "name appears twice in the header");
    return root;
  }

  Status read_metadata(const json& meta, SafetensorsFile& file) {
    if (!meta.is_object()) return format_error(name_, "__metadata__ is not an object");
    for (auto it = meta.begin(); it != meta.end(); ++it) {
      if (!it.value().is_string()) return format_error(name_, fmt::format("__metadata__ '{}' is not a string", it.key()));
      file.metadata_[it.key()] = it.value().get<std::string>();
    }
    return Status::ok();
  }

  Result<DType> read_dtype(const std::string& name, const json& entry) {
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) return tensor_error(name_, name, "'dtype' is missing or not a string");
    const std::string dtype = entry["dtype"].get<std::string>();
    for (const DTypeName& d : kSupportedDTypes) {
      if (dtype == d.name) return d.type;
    }
    const bool known = std::any_of(std::begin(kKnownOtherDTypes), std::end(kKnownOtherDTypes),
                                   [&](const char* k) { return dtype == k; });
    if (!known) return tensor_error(name_, name, fmt::format("unknown dtype '{}'", dtype));
    return make_error(StatusCode::kUnsupported, "{}: tensor '{}': dtype {} is not supported (supported: F32, F16, BF16)",
                      name_, name, dtype);
  }

  Result<SafetensorsTensor> read_tensor(const std::string& name, const json& entry) {
    if (name.empty()) return format_error(name_, "a tensor has an empty name");
    if (!entry.is_object()) return tensor_error(name_, name, "entry is not an object");
    SafetensorsTensor t;
    t.name = name;
    t.file = name_;
    MOESERVE_ASSIGN_OR_RETURN(t.type, read_dtype(name, entry));
    if (!entry.contains("shape") || !entry["shape"].is_array()) return tensor_error(name_, name, "'shape' is missing or not an array");
    const json& shape = entry["shape"];
    if (shape.size() > 8) return tensor_error(name_, name, fmt::format("{} dimensions (at most 8)", shape.size()));
    uint64_t elements = 1;
    for (const json& d : shape) {
      uint64_t dim = 0;
      if (!json_to_count(d, dim)) return tensor_error(name_, name, fmt::format("dimension {} is not a non-negative integer", d.dump()));
      if (dim != 0 && elements > uint64_t(INT64_MAX) / dim) return tensor_error(name_, name, "element count overflows");
      elements *= dim;
      t.shape.push_back(int64_t(dim));
    }
    const uint64_t elem_bytes = dtype_traits(t.type).block_bytes;
    if (elements > uint64_t(INT64_MAX) / elem_bytes) return tensor_error(name_, name, "byte size overflows");
    const json* offsets = entry.contains("data_offsets") ? &entry["data_offsets"] : nullptr;
    if (offsets == nullptr || !offsets->is_array() || offsets->size() != 2) {
      return tensor_error(name_, name, "'data_offsets' is missing or not [begin, end]");
    }
    uint64_t begin = 0, end = 0;
    if (!json_to_count((*offsets)[0], begin) || !json_to_count((*offsets)[1], end)) {
      return tensor_error(name_, name, "data_offsets are not non-negative integers");
    }
    if (begin > end) return tensor_error(name_, name, fmt::format("data_offsets [{}, {}] end before they begin", begin, end));
    if (end > data_size_) {
      return tensor_error(name_, name, fmt::format("data_offsets [{}, {}] run past the data area ({} bytes)", begin, end, data_size_));
    }
    if (end - begin != elements * elem_bytes) {
      return tensor_error(name_, name, fmt::format("data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}", begin, end,
                                                   end - begin, t.shape_string(), safetensors_dtype_name(t.type),
                                                   elements * elem_bytes));
    }
    t.data = bytes_.data() + data_begin_ + begin;
    t.nbytes = size_t(end - begin);
    return t;
  }

  Status check_overlaps(const SafetensorsFile& file) {
    std::vector<const SafetensorsTensor*> sorted;
    for (const SafetensorsTensor& t : file.tensors_) {
      if (t.nbytes > 0) sorted.push_back(&t);
    }
    std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->data < b->data; });
    for (size_t i = 1; i < sorted.size(); ++i) {
      if (sorted[i]->data < sorted[i - 1]->data + sorted[i - 1]->nbytes) {
        return tensor_error(name_, sorted[i]->name, fmt::format("data overlaps tensor '{}'", sorted[i - 1]->name));
      }
    }
    return Status::ok();
  }

  std::span<const uint8_t> bytes_;
  std::string name_;
  uint64_t data_begin_ = 0;
  uint64_t data_size_ = 0;
};

Result<SafetensorsFile> SafetensorsFile::parse_bytes(std::span<const uint8_t> bytes, std::string name) {
  return SafetensorsParser(bytes, std::move(name)).parse();
}

Result<SafetensorsFile> SafetensorsFile::parse(std::shared_ptr<const MappedFile> map) {
  MOESERVE_ASSIGN_OR_RETURN(SafetensorsFile file, parse_bytes(map->bytes(), map->path()));
  file.map_ = std::move(map);
  return file;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  MOESERVE_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> map, MappedFile::open(path));
  return parse(std::move(map));
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---- multi-file models ----------------------------------------------------------

namespace {

namespace fs = std::filesystem;

Result<std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kIoError, "{}: cannot open", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// weight_map of model.safetensors.index.json: tensor name -> file name.
Result<std::map<std::string, std::string>> read_weight_map(const fs::path& index_path) {
  MOESERVE_ASSIGN_OR_RETURN(std::string text, read_text(index_path));
  const std::string name = index_path.string();
  json root = json::parse(text, nullptr, false);
  if (root.is_discarded() || !root.is_object()) return format_error(name, "not a JSON object");
  if (!root.contains("weight_map") || !root["weight_map"].is_object()) return format_error(name, "'weight_map' is missing or not an object");
  std::map<std::string, std::string> map;
  for (auto it = root["weight_map"].begin(); it != root["weight_map"].end(); ++it) {
    if (!it.value().is_string()) return format_error(name, fmt::format("weight_map['{}'] is not a string", it.key()));
    const std::string file = it.value().get<std::string>();
    // The file must be a plain name in the same directory (no ../ escapes).
    if (file.empty() || file.find('/') != std::string::npos || file.find('\\') != std::string::npos || file == "." || file == "..") {
      return format_error(name, fmt::format("weight_map['{}'] = '{}' is not a file name in the model directory", it.key(), file));
    }
    map[it.key()] = file;
  }
  if (map.empty()) return format_error(name, "weight_map is empty");
  return map;
}

}  // namespace

Result<SafetensorsModel> SafetensorsModel::open_dir(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return make_error(StatusCode::kNotFound, "{}: not a directory", dir);
  std::vector<std::string> file_names;
  std::map<std::string, std::string> weight_map;
  const fs::path index_path = root / "model.safetensors.index.json";
  if (fs::is_regular_file(index_path, ec)) {
    MOESERVE_ASSIGN_OR_RETURN(weight_map, read_weight_map(index_path));
    std::set<std::string> unique;
    for (const auto& [tensor, file] : weight_map) unique.insert(file);
    file_names.assign(unique.begin(), unique.end());
  } else if (fs::is_regular_file(root / "model.safetensors", ec)) {
    file_names.push_back("model.safetensors");
  } else {
    for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
      if (e.is_regular_file() && e.path().extension() == ".safetensors") file_names.push_back(e.path().filename().string());
    }
    std::sort(file_names.begin(), file_names.end());
  }
  if (file_names.empty()) return make_error(StatusCode::kNotFound, "{}: no *.safetensors files", dir);

  SafetensorsModel model;
  model.files_.reserve(file_names.size());  // index_ points into files_
  for (const std::string& name : file_names) {
    MOESERVE_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open((root / name).string()));
    model.files_.push_back(std::move(file));
  }
  for (size_t f = 0; f < model.files_.size(); ++f) {
    for (const SafetensorsTensor& t : model.files_[f].tensors()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(t.name);
        if (it == weight_map.end() || it->second != file_names[f]) {
          return format_error(t.file, fmt::format("tensor '{}' is not listed for this file in {}", t.name, index_path.string()));
        }
      }
      if (!model.index_.emplace(t.name, &t).second) {
        return format_error(t.file, fmt::format("tensor '{}' is also in {}", t.name, model.index_[t.name]->file));
      }
    }
  }
  for (const auto& [tensor, file] : weight_map) {
    if (!model.index_.count(tensor)) {
      return make_error(StatusCode::kNotFound, "{}: tensor '{}' listed in the index is not in {}", index_path.string(), tensor, file);
    }
  }
  return model;
}

const SafetensorsTensor* SafetensorsModel::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : it->second;
}

std::vector<const SafetensorsTensor*> SafetensorsModel::all_tensors() const {
  std::vector<const SafetensorsTensor*> out;
  for (const SafetensorsFile& f : files_) {
    for (const SafetensorsTensor& t : f.tensors()) out.push_back(&t);
  }
  return out;
}

// ---- writer -------------------------------------------------------------------------

Result<std::vector<uint8_t>> write_safetensors(const std::vector<SafetensorsWriteTensor>& tensors,
                                               const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsWriteTensor& t : tensors) {
    const char* dtype = safetensors_dtype_name(t.type);
    if (dtype == nullptr) return make_error(StatusCode::kUnsupported, "write_safetensors: tensor '{}': type {}", t.name, dtype_name(t.type));
    uint64_t elements = 1;
    for (int64_t d : t.shape) elements *= uint64_t(d);
    if (t.data.size() != elements * dtype_traits(t.type).block_bytes) {
      return make_error(StatusCode::kInvalidArgument, "write_safetensors: tensor '{}': {} bytes for {} elements", t.name, t.data.size(), elements);
    }
    if (header.contains(t.name)) return make_error(StatusCode::kInvalidArgument, "write_safetensors: duplicate tensor '{}'", t.name);
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // the reference writer pads with spaces
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  out.insert(out.end(), text.begin(), text.end());
  for (const SafetensorsWriteTensor& t : tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

}  // namespace moeserve
