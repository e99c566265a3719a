// GGUF parsing and validation. Every read is bounds-checked; every count from
// the file is checked against the bytes left before anything is allocated
// for it; every size computation is overflow-checked. Errors are
// kInvalidFormat "<file>: [key|tensor 'name': ]<reason>".
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>

#include "format/gguf.h"

namespace moeserve {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
// Smallest possible encodings, used to bound counts read from the file:
// a KV is key length (8) + value type (4) + a 1-byte value; a tensor info is
// name length (8) + n_dims (4) + one dimension (8) + type (4) + offset (8).
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
// Cap on what a count from the file may pre-reserve; the rest grows as
// elements are actually read (each costs file bytes).
constexpr uint64_t kMaxReserve = 1 << 16;

std::string quoted(std::string_view name) { return gguf_escape(name, 80, '\''); }

std::string supported_types_list() {
  std::string out;
  for (DType t : kAllDTypes) {
    if (!out.empty()) out += ", ";
    out += dtype_name(t);
  }
  return out;
}

}  // namespace

class GgufParser {
 public:
  GgufParser(std::span<const uint8_t> bytes, GgufFile& file) : bytes_(bytes), file_(file) {}

  Status run() {
    uint64_t n_tensors = 0, n_kv = 0;
    MOESERVE_RETURN_IF_ERROR(parse_header(n_tensors, n_kv));
    file_.kvs_.reserve(size_t(std::min(n_kv, kMaxReserve)));
    for (uint64_t i = 0; i < n_kv; ++i) MOESERVE_RETURN_IF_ERROR(parse_kv());
    MOESERVE_RETURN_IF_ERROR(parse_alignment());
    set_context(nullptr, {});
    if (n_tensors > remaining() / kMinTensorInfoBytes) {
      return fail(fmt::format("tensor count {} is more than the {} bytes after the metadata can hold (at most {}): "
                              "the file is truncated or corrupt",
                              n_tensors, remaining(), remaining() / kMinTensorInfoBytes));
    }
    file_.tensors_.reserve(size_t(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) MOESERVE_RETURN_IF_ERROR(parse_tensor_info());
    MOESERVE_RETURN_IF_ERROR(place_tensors());
    return check_overlaps();
  }

 private:
  size_t remaining() const { return bytes_.size() - pos_; }

  Status fail(std::string_view reason) const {
    if (context_kind_ == nullptr) return make_error(StatusCode::kInvalidFormat, "{}: {}", file_.name_, reason);
    return make_error(StatusCode::kInvalidFormat, "{}: {} {}: {}", file_.name_, context_kind_,
                      quoted(context_name_), reason);
  }
  Status truncated(uint64_t need, std::string_view what) const {
    return fail(fmt::format("truncated at offset {}: {} needs {} bytes, {} left", pos_, what, need, remaining()));
  }
  void set_context(const char* kind, std::string_view name) {
    context_kind_ = kind;
    context_name_.assign(name);
  }

  template <typename T>
  Status read(T& out, std::string_view what) {
    if (remaining() < sizeof(T)) return truncated(sizeof(T), what);
    std::memcpy(&out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }

  Status read_string(std::string& out, std::string_view what, uint64_t max_len) {
    uint64_t len = 0;
    MOESERVE_RETURN_IF_ERROR(read(len, what));
    if (len > remaining()) return truncated(len, what);
    if (len > max_len) return fail(fmt::format("{} of {} bytes is longer than the limit of {}", what, len, max_len));
    out.assign(reinterpret_cast<const char*>(bytes_.data() + pos_), size_t(len));
    pos_ += size_t(len);
    return Status::ok();
  }

  Status parse_header(uint64_t& n_tensors, uint64_t& n_kv) {
    if (remaining() < sizeof kMagic) return truncated(sizeof kMagic, "the magic");
    if (std::memcmp(bytes_.data(), kMagic, sizeof kMagic) != 0) {
      return fail(fmt::format("bad magic {} (not a GGUF file)",
                              quoted(std::string_view(reinterpret_cast<const char*>(bytes_.data()), 4))));
    }
    pos_ = sizeof kMagic;
    uint32_t version = 0;
    MOESERVE_RETURN_IF_ERROR(read(version, "the version"));
    if (version != 2 && version != 3) {
      const uint32_t swapped = __builtin_bswap32(version);
      const char* hint = (swapped == 2 || swapped == 3) ? " (a big-endian file?)" : "";
      return fail(fmt::format("GGUF version {} is not supported{}; this reader handles versions 2 and 3",
                              version, hint));
    }
    file_.version_ = version;
    MOESERVE_RETURN_IF_ERROR(read(n_tensors, "the tensor count"));
    MOESERVE_RETURN_IF_ERROR(read(n_kv, "the kv count"));
    if (n_kv > remaining() / kMinKvBytes) {
      return fail(fmt::format("kv count {} is more than the {} bytes left can hold (at most {}): "
                              "the file is truncated or corrupt",
                              n_kv, remaining(), remaining() / kMinKvBytes));
    }
    // Both counts are now small enough that these products cannot overflow.
    if (n_tensors > remaining() / kMinTensorInfoBytes ||
        n_kv * kMinKvBytes + n_tensors * kMinTensorInfoBytes > remaining()) {
      return fail(fmt::format("tensor count {} (with {} kvs) is more than the {} bytes left can hold: "
                              "the file is truncated or corrupt",
                              n_tensors, n_kv, remaining()));
    }
    return Status::ok();
  }

  Status parse_kv() {
    set_context(nullptr, {});
    std::string key;
    const size_t key_pos = pos_;
    MOESERVE_RETURN_IF_ERROR(read_string(key, "key", kGgufMaxNameBytes));
    if (key.empty()) return fail(fmt::format("empty key at offset {}", key_pos));
    set_context("key", key);
    if (file_.kv_index_.contains(key)) return fail("duplicate key");
    uint32_t type_id = 0;
    MOESERVE_RETURN_IF_ERROR(read(type_id, "value type"));
    const std::optional<GgufType> type = gguf_type_from_id(type_id);
    if (!type) return fail(fmt::format("unknown value type {}", type_id));
    MOESERVE_ASSIGN_OR_RETURN(GgufValue value, parse_value(*type));
    file_.kv_index_.emplace(key, file_.kvs_.size());
    file_.kvs_.push_back(GgufKV{std::move(key), std::move(value)});
    return Status::ok();
  }

  Result<GgufValue> parse_value(GgufType type) {
    switch (type) {
      case GgufType::kU8: return read_scalar<uint8_t>(&GgufValue::u8);
      case GgufType::kI8: return read_scalar<int8_t>(&GgufValue::i8);
      case GgufType::kU16: return read_scalar<uint16_t>(&GgufValue::u16);
      case GgufType::kI16: return read_scalar<int16_t>(&GgufValue::i16);
      case GgufType::kU32: return read_scalar<uint32_t>(&GgufValue::u32);
      case GgufType::kI32: return read_scalar<int32_t>(&GgufValue::i32);
      case GgufType::kU64: return read_scalar<uint64_t>(&GgufValue::u64);
      case GgufType::kI64: return read_scalar<int64_t>(&GgufValue::i64);
      case GgufType::kF32: return read_scalar<float>(&GgufValue::f32);
      case GgufType::kF64: return read_scalar<double>(&GgufValue::f64);
      case GgufType::kBool: {
        uint8_t b = 0;
        MOESERVE_RETURN_IF_ERROR(read(b, "bool value"));
        if (b > 1) return fail(fmt::format("bool value is {} (must be 0 or 1)", unsigned(b)));
        return GgufValue::boolean(b != 0);
      }
      case GgufType::kString: {
        std::string s;
        MOESERVE_RETURN_IF_ERROR(read_string(s, "string value", std::numeric_limits<uint64_t>::max()));
        return GgufValue::string(std::move(s));
      }
      case GgufType::kArray: return parse_array();
    }
    return fail("unknown value type");  // unreachable: type came from gguf_type_from_id
  }

  template <typename T, typename Make>
  Result<GgufValue> read_scalar(Make make) {
    T v{};
    MOESERVE_RETURN_IF_ERROR(read(v, "value"));
    return make(v);
  }

  Result<GgufValue> parse_array() {
    uint32_t elem_id = 0;
    MOESERVE_RETURN_IF_ERROR(read(elem_id, "array element type"));
    const std::optional<GgufType> elem = gguf_type_from_id(elem_id);
    if (!elem) return fail(fmt::format("unknown array element type {}", elem_id));
    if (*elem == GgufType::kArray) return fail("nested arrays (array of array) are not supported");
    uint64_t n = 0;
    MOESERVE_RETURN_IF_ERROR(read(n, "array length"));
    // Each element takes at least its fixed size (strings: their u64 length).
    const size_t min_elem_bytes = *elem == GgufType::kString ? sizeof(uint64_t) : gguf_fixed_size(*elem);
    if (n > remaining() / min_elem_bytes) {
      return fail(fmt::format("array of {} {} elements does not fit in the {} bytes left", n,
                              gguf_type_name(*elem), remaining()));
    }
    GgufArrayStorage storage;
    switch (*elem) {
      case GgufType::kU8: storage = read_pod_array<uint8_t>(n); break;
      case GgufType::kBool: {
        auto bytes = read_pod_array<uint8_t>(n);
        for (size_t i = 0; i < bytes.size(); ++i) {
          if (bytes[i] > 1) return fail(fmt::format("bool element {} is {} (must be 0 or 1)", i, unsigned(bytes[i])));
        }
        storage = std::move(bytes);
        break;
      }
      case GgufType::kI8: storage = read_pod_array<int8_t>(n); break;
      case GgufType::kU16: storage = read_pod_array<uint16_t>(n); break;
      case GgufType::kI16: storage = read_pod_array<int16_t>(n); break;
      case GgufType::kU32: storage = read_pod_array<uint32_t>(n); break;
      case GgufType::kI32: storage = read_pod_array<int32_t>(n); break;
      case GgufType::kF32: storage = read_pod_array<float>(n); break;
      case GgufType::kU64: storage = read_pod_array<uint64_t>(n); break;
      case GgufType::kI64: storage = read_pod_array<int64_t>(n); break;
      case GgufType::kF64: storage = read_pod_array<double>(n); break;
      case GgufType::kString: {
        std::vector<std::string> strings;
        strings.reserve(size_t(std::min(n, kMaxReserve)));
        for (uint64_t i = 0; i < n; ++i) {
          MOESERVE_RETURN_IF_ERROR(read_string(strings.emplace_back(), "array string", std::numeric_limits<uint64_t>::max()));
        }
        storage = std::move(strings);
        break;
      }
      case GgufType::kArray: break;  // rejected above
    }
    std::optional<GgufValue> value = GgufValue::from_storage(*elem, std::move(storage));
    if (!value) return make_error(StatusCode::kInternal, "{}: array storage mismatch", file_.name_);
    return std::move(*value);
  }

  // n was checked to fit in the bytes left.
  template <typename T>
  std::vector<T> read_pod_array(uint64_t n) {
    std::vector<T> out(static_cast<size_t>(n));
    if (n > 0) std::memcpy(out.data(), bytes_.data() + pos_, size_t(n) * sizeof(T));
    pos_ += size_t(n) * sizeof(T);
    return out;
  }

  Status parse_alignment() {
    set_context("key", "general.alignment");
    auto it = file_.kv_index_.find(std::string_view("general.alignment"));
    if (it == file_.kv_index_.end()) return Status::ok();
    const GgufValue& v = file_.kvs_[it->second].value;
    if (v.type() != GgufType::kU32) return fail(fmt::format("has type {}, expected u32", v.type_name()));
    const uint64_t a = *v.as_uint();
    if (a == 0 || !std::has_single_bit(a)) return fail(fmt::format("alignment {} is not a power of two", a));
    file_.alignment_ = uint32_t(a);
    return Status::ok();
  }

  Status parse_tensor_info() {
    set_context(nullptr, {});
    GgufTensorInfo t;
    const size_t name_pos = pos_;
    MOESERVE_RETURN_IF_ERROR(read_string(t.name, "tensor name", kGgufMaxNameBytes));
    if (t.name.empty()) return fail(fmt::format("empty tensor name at offset {}", name_pos));
    set_context("tensor", t.name);
    if (file_.tensor_index_.contains(t.name)) return fail("duplicate tensor name");
    if (t.name.size() > kGgufLlamaNameLimit) {
      file_.warnings_.push_back(fmt::format("tensor {}: name of {} bytes is longer than llama.cpp's limit of {}",
                                            quoted(t.name), t.name.size(), kGgufLlamaNameLimit));
    }
    MOESERVE_RETURN_IF_ERROR(read(t.n_dims, "n_dims"));
    if (t.n_dims == 0 || t.n_dims > kGgufMaxDims) {
      return fail(fmt::format("n_dims is {} (must be 1..{})", t.n_dims, kGgufMaxDims));
    }
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      MOESERVE_RETURN_IF_ERROR(read(t.ne[d], "dimension"));
      if (t.ne[d] <= 0) return fail(fmt::format("dimension {} is {} (must be > 0)", d, t.ne[d]));
    }
    uint32_t type_id = 0;
    MOESERVE_RETURN_IF_ERROR(read(type_id, "tensor type"));
    const std::optional<DType> type = dtype_from_gguf_id(type_id);
    if (!type) {
      return fail(fmt::format("tensor type {} (id {}) is not supported; supported: {}", dtype_id_name(type_id),
                              type_id, supported_types_list()));
    }
    t.type = *type;
    MOESERVE_RETURN_IF_ERROR(read(t.offset, "tensor data offset"));  // relative until place_tensors()
    MOESERVE_RETURN_IF_ERROR(compute_nbytes(t));
    file_.tensor_index_.emplace(t.name, file_.tensors_.size());
    file_.tensors_.push_back(std::move(t));
    return Status::ok();
  }

  Status compute_nbytes(GgufTensorInfo& t) const {
    const DTypeTraits& traits = dtype_traits(t.type);
    if (t.ne[0] % traits.block_elems != 0) {
      return fail(fmt::format("ne[0] = {} is not a multiple of the {} block size {}", t.ne[0], traits.name,
                              traits.block_elems));
    }
    int64_t elements = 1;
    for (int64_t d : t.ne) {
      if (__builtin_mul_overflow(elements, d, &elements)) {
        return fail(fmt::format("element count of shape {} overflows", t.shape_string()));
      }
    }
    uint64_t row_bytes = 0, nbytes = 0;
    if (__builtin_mul_overflow(uint64_t(t.ne[0] / traits.block_elems), uint64_t(traits.block_bytes), &row_bytes) ||
        __builtin_mul_overflow(row_bytes, uint64_t(elements / t.ne[0]), &nbytes) ||
        nbytes > std::numeric_limits<size_t>::max()) {
      return fail(fmt::format("byte size of a {} tensor of shape {} overflows", traits.name, t.shape_string()));
    }
    t.nbytes = size_t(nbytes);
    return Status::ok();
  }

  // The data section starts at the first aligned offset after the tensor
  // infos; tensor offsets are relative to it.
  Status place_tensors() {
    set_context(nullptr, {});
    const uint64_t align = file_.alignment_;
    file_.data_offset_ = (uint64_t(pos_) + align - 1) / align * align;  // pos_ <= size, no overflow
    const uint64_t size = bytes_.size();
    for (GgufTensorInfo& t : file_.tensors_) {
      set_context("tensor", t.name);
      const uint64_t rel = t.offset;
      if (rel % align != 0) {
        return fail(fmt::format("data offset {} is not aligned to {} bytes", rel, align));
      }
      if (rel > size || file_.data_offset_ > size - rel || t.nbytes > size - (file_.data_offset_ + rel)) {
        return fail(fmt::format("data (offset {} + {} bytes, data section at {}) runs past the end of the file ({} bytes)",
                                rel, t.nbytes, file_.data_offset_, size));
      }
      t.offset = file_.data_offset_ + rel;
      t.data = bytes_.data() + t.offset;
      // Kernels read weights as their element or block fields (floats,
      // f16 scales): a file whose alignment leaves them misaligned would be
      // read with unaligned loads (undefined behaviour) — refuse it.
      const size_t need = required_alignment(t.type);
      if (reinterpret_cast<uintptr_t>(t.data) % need != 0) {
        return fail(fmt::format("data at file offset {} is not aligned to the {} bytes a {} tensor needs "
                                "(general.alignment is {}); re-write the file with general.alignment 32",
                                t.offset, need, dtype_name(t.type), align));
      }
    }
    return Status::ok();
  }

  // The alignment a tensor's first byte needs: its element (f32: 4, f16 and
  // bf16: 2) or the widest field of its blocks (f16 scales: 2).
  static size_t required_alignment(DType type) {
    switch (type) {
      case DType::F32:
      case DType::Q8_K: return 4;
      default: return 2;
    }
  }

  Status check_overlaps() {
    set_context(nullptr, {});
    const auto& ts = file_.tensors_;
    std::vector<size_t> order(ts.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ts[a].offset < ts[b].offset; });
    for (size_t i = 1; i < order.size(); ++i) {
      const GgufTensorInfo& prev = ts[order[i - 1]];
      const GgufTensorInfo& next = ts[order[i]];
      if (prev.offset + prev.nbytes > next.offset) {
        return fail(fmt::format("tensors {} and {} overlap (bytes {}..{} and {}..)", quoted(prev.name),
                                quoted(next.name), prev.offset, prev.offset + prev.nbytes, next.offset));
      }
    }
    return Status::ok();
  }

  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  GgufFile& file_;
  const char* context_kind_ = nullptr;  // "key" / "tensor" / none, for messages
  std::string context_name_;
};

Result<GgufFile> GgufFile::parse_bytes(std::span<const uint8_t> bytes, std::string name) {
  GgufFile file;
  file.bytes_ = bytes;
  file.name_ = std::move(name);
  try {
    GgufParser parser(bytes, file);
    MOESERVE_RETURN_IF_ERROR(parser.run());
  } catch (const std::bad_alloc&) {
    return make_error(StatusCode::kOutOfRange, "{}: out of memory while reading the metadata", file.name_);
  }
  return file;
}

Result<GgufFile> GgufFile::parse(std::shared_ptr<const MappedFile> map) {
  if (!map) return make_error(StatusCode::kInvalidArgument, "GgufFile::parse: no file");
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, parse_bytes(map->bytes(), map->path()));
  file.map_ = std::move(map);
  return file;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  MOESERVE_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> map, MappedFile::open(path));
  return parse(std::move(map));
}

}  // namespace moeserve
