#include "format/gguf_writer.h"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>

#include <fmt/ranges.h>

#include "format/gguf.h"

namespace moeserve {
namespace {

static_assert(std::endian::native == std::endian::little, "the GGUF writer assumes a little-endian host");

uint64_t align_up(uint64_t n, uint64_t align) { return (n + align - 1) / align * align; }

// Where the encoded file goes.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual Status write(std::span<const uint8_t> bytes) = 0;
  Status write_zeros(size_t n) {
    static constexpr uint8_t kZeros[256] = {};
    while (n > 0) {
      const size_t chunk = n < sizeof kZeros ? n : sizeof kZeros;
      MOESERVE_RETURN_IF_ERROR(write({kZeros, chunk}));
      n -= chunk;
    }
    return Status::ok();
  }
};

class VectorSink final : public ByteSink {
 public:
  explicit VectorSink(std::vector<uint8_t>& out) : out_(out) {}
  Status write(std::span<const uint8_t> bytes) override {
    out_.insert(out_.end(), bytes.begin(), bytes.end());
    return Status::ok();
  }

 private:
  std::vector<uint8_t>& out_;
};

class FileSink final : public ByteSink {
 public:
  FileSink(std::FILE* f, const std::string& path) : f_(f), path_(path) {}
  Status write(std::span<const uint8_t> bytes) override {
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f_) != bytes.size()) {
      return make_error(StatusCode::kIoError, "{}: write failed: {}", path_, std::strerror(errno));
    }
    return Status::ok();
  }

 private:
  std::FILE* f_;
  const std::string& path_;
};

// Little-endian encoding of the header, metadata and tensor infos.
class Encoder {
 public:
  template <typename T>
  void pod(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  void string(std::string_view s) {
    pod<uint64_t>(s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  void value(const GgufValue& v) {
    switch (v.type()) {
      case GgufType::kU8: return pod(uint8_t(*v.as_uint()));
      case GgufType::kI8: return pod(int8_t(*v.as_int()));
      case GgufType::kU16: return pod(uint16_t(*v.as_uint()));
      case GgufType::kI16: return pod(int16_t(*v.as_int()));
      case GgufType::kU32: return pod(uint32_t(*v.as_uint()));
      case GgufType::kI32: return pod(int32_t(*v.as_int()));
      case GgufType::kU64: return pod(uint64_t(*v.as_uint()));
      case GgufType::kI64: return pod(int64_t(*v.as_int()));
      case GgufType::kF32: return pod(*v.as_f32());
      case GgufType::kF64: return pod(double(*v.as_float()));
      case GgufType::kBool: return pod(uint8_t(*v.as_bool() ? 1 : 0));
      case GgufType::kString: return string(*v.as_string());
      case GgufType::kArray: return array(v);
    }
  }
  std::vector<uint8_t> out;

 private:
  template <typename T>
  void pod_elems(const GgufValue& v) {
    if (const std::vector<T>* elems = v.array_data<T>()) {
      const auto* p = reinterpret_cast<const uint8_t*>(elems->data());
      out.insert(out.end(), p, p + elems->size() * sizeof(T));
    }
  }
  void array(const GgufValue& v) {
    pod<uint32_t>(uint32_t(v.elem_type()));
    pod<uint64_t>(v.array_size());
    if (const auto* strings = v.as_string_array()) {
      for (const std::string& s : *strings) string(s);
      return;
    }
    pod_elems<uint8_t>(v);  // u8 and bool
    pod_elems<int8_t>(v);
    pod_elems<uint16_t>(v);
    pod_elems<int16_t>(v);
    pod_elems<uint32_t>(v);
    pod_elems<int32_t>(v);
    pod_elems<float>(v);
    pod_elems<uint64_t>(v);
    pod_elems<int64_t>(v);
    pod_elems<double>(v);
  }
};

}  // namespace

// Lays out and streams a GgufWriter's contents into a sink.
class GgufEmitter {
 public:
  static Status emit(const GgufWriter& w, ByteSink& sink) {
    MOESERVE_ASSIGN_OR_RETURN(const uint32_t align, w.alignment());
    Encoder enc;
    enc.out.reserve(1 << 16);
    enc.out.insert(enc.out.end(), {'G', 'G', 'U', 'F'});
    enc.pod<uint32_t>(w.version_);
    enc.pod<uint64_t>(w.tensors_.size());
    enc.pod<uint64_t>(w.kvs_.size());
    for (const auto& [key, value] : w.kvs_) {
      if (key.empty() || key.size() > kGgufMaxNameBytes) {
        return make_error(StatusCode::kInvalidArgument, "gguf writer: key of {} bytes (must be 1..{})", key.size(),
                          kGgufMaxNameBytes);
      }
      enc.string(key);
      enc.pod<uint32_t>(uint32_t(value.type()));
      enc.value(value);
    }
    uint64_t rel = 0;  // offsets are relative to the data section
    for (const auto& t : w.tensors_) {
      enc.string(t.name);
      enc.pod<uint32_t>(uint32_t(t.shape.size()));
      for (int64_t d : t.shape) enc.pod<int64_t>(d);
      enc.pod<uint32_t>(uint32_t(t.type));
      enc.pod<uint64_t>(rel);
      rel = align_up(rel + t.nbytes, align);
    }
    MOESERVE_RETURN_IF_ERROR(sink.write(enc.out));
    MOESERVE_RETURN_IF_ERROR(sink.write_zeros(size_t(align_up(enc.out.size(), align) - enc.out.size())));
    return emit_tensor_data(w, align, sink);
  }

 private:
  static Status emit_tensor_data(const GgufWriter& w, uint32_t align, ByteSink& sink) {
    std::vector<uint8_t> scratch;  // reused by deferred tensors
    for (const auto& t : w.tensors_) {
      std::span<const uint8_t> data = t.data;
      if (t.fill) {
        scratch.resize(t.nbytes);
        std::span<uint8_t> out(scratch.data(), t.nbytes);
        Status st = t.fill(out);
        if (!st) return Status(st.code(), fmt::format("tensor '{}': {}", t.name, st.message()));
        data = out;
      }
      MOESERVE_RETURN_IF_ERROR(sink.write(data));
      MOESERVE_RETURN_IF_ERROR(sink.write_zeros(size_t(align_up(t.nbytes, align) - t.nbytes)));
    }
    return Status::ok();
  }
};

void GgufWriter::set(std::string_view key, GgufValue value) {
  for (auto& [k, v] : kvs_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  kvs_.emplace_back(std::string(key), std::move(value));
}

bool GgufWriter::erase(std::string_view key) {
  for (auto it = kvs_.begin(); it != kvs_.end(); ++it) {
    if (it->first == key) {
      kvs_.erase(it);
      return true;
    }
  }
  return false;
}

const GgufValue* GgufWriter::find(std::string_view key) const {
  for (const auto& [k, v] : kvs_) {
    if (k == key) return &v;
  }
  return nullptr;
}

Result<uint32_t> GgufWriter::alignment() const {
  const GgufValue* v = find("general.alignment");
  if (v == nullptr) return kGgufDefaultAlignment;
  const std::optional<uint64_t> a = v->as_uint();
  if (v->type() != GgufType::kU32 || !a || *a == 0 || !std::has_single_bit(*a) || *a > kGgufWriterMaxAlignment) {
    return make_error(StatusCode::kInvalidArgument,
                      "gguf writer: general.alignment must be a u32 power of two up to {}, got {} {}",
                      kGgufWriterMaxAlignment, v->type_name(), v->to_display());
  }
  return uint32_t(*a);
}

Result<size_t> GgufWriter::check_tensor(std::string_view name, DType type, const std::vector<int64_t>& shape) const {
  auto bad = [&](std::string reason) {
    return make_error(StatusCode::kInvalidArgument, "gguf writer: tensor '{}': {}", name, reason);
  };
  if (name.empty() || name.size() > kGgufLlamaNameLimit) {
    return bad(fmt::format("name of {} bytes (must be 1..{})", name.size(), kGgufLlamaNameLimit));
  }
  for (const auto& t : tensors_) {
    if (t.name == name) return bad("duplicate tensor name");
  }
  if (shape.empty() || shape.size() > kGgufMaxDims) return bad(fmt::format("{} dims (must be 1..4)", shape.size()));
  const DTypeTraits& traits = dtype_traits(type);
  int64_t elements = 1;
  for (int64_t d : shape) {
    if (d <= 0) return bad(fmt::format("dimension {} (must be > 0)", d));
    if (__builtin_mul_overflow(elements, d, &elements)) return bad("element count overflows");
  }
  if (shape[0] % traits.block_elems != 0) {
    return bad(fmt::format("ne[0] = {} is not a multiple of the {} block size {}", shape[0], traits.name,
                           traits.block_elems));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(uint64_t(elements / traits.block_elems), uint64_t(traits.block_bytes), &nbytes) ||
      nbytes > uint64_t(std::numeric_limits<int64_t>::max())) {
    return bad("byte size overflows");
  }
  return size_t(nbytes);
}

Status GgufWriter::add_tensor(std::string name, DType type, const std::vector<int64_t>& shape,
                              std::span<const uint8_t> data) {
  MOESERVE_ASSIGN_OR_RETURN(const size_t nbytes, check_tensor(name, type, shape));
  if (data.size() != nbytes) {
    return make_error(StatusCode::kInvalidArgument, "gguf writer: tensor '{}': {} bytes given, {} {} needs {}", name,
                      data.size(), dtype_name(type), fmt::format("[{}]", fmt::join(shape, ", ")), nbytes);
  }
  tensors_.push_back(PendingTensor{std::move(name), type, shape, nbytes, {data.begin(), data.end()}, nullptr});
  return Status::ok();
}

Status GgufWriter::add_tensor_deferred(std::string name, DType type, const std::vector<int64_t>& shape,
                                       GgufTensorFill fill) {
  MOESERVE_ASSIGN_OR_RETURN(const size_t nbytes, check_tensor(name, type, shape));
  if (!fill) return make_error(StatusCode::kInvalidArgument, "gguf writer: tensor '{}': no fill function", name);
  tensors_.push_back(PendingTensor{std::move(name), type, shape, nbytes, {}, std::move(fill)});
  return Status::ok();
}

Result<std::vector<uint8_t>> GgufWriter::write_to_buffer() const {
  std::vector<uint8_t> out;
  VectorSink sink(out);
  MOESERVE_RETURN_IF_ERROR(GgufEmitter::emit(*this, sink));
  return out;
}

Status GgufWriter::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return make_error(StatusCode::kIoError, "{}: cannot create: {}", tmp, std::strerror(errno));
  std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
  FileSink sink(f, tmp);
  Status st = GgufEmitter::emit(*this, sink);
  if (st && (std::fflush(f) != 0 || ::fsync(fileno(f)) != 0)) {
    st = make_error(StatusCode::kIoError, "{}: flush failed: {}", tmp, std::strerror(errno));
  }
  if (std::fclose(f) != 0 && st) {
    st = make_error(StatusCode::kIoError, "{}: close failed: {}", tmp, std::strerror(errno));
  }
  if (st && std::rename(tmp.c_str(), path.c_str()) != 0) {
    st = make_error(StatusCode::kIoError, "{}: cannot rename to {}: {}", tmp, path, std::strerror(errno));
  }
  if (!st) std::remove(tmp.c_str());
  return st;
}

}  // namespace moeserve
