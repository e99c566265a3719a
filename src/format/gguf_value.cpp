#include "format/gguf_value.h"

#include <fmt/format.h>

#include <limits>
#include <type_traits>

namespace moeserve {
namespace {

// Which storage vector each array element type uses.
template <typename T>
bool storage_holds(const GgufArrayStorage& s) {
  return std::holds_alternative<std::vector<T>>(s);
}

bool storage_matches(GgufType elem, const GgufArrayStorage& s) {
  switch (elem) {
    case GgufType::kU8:
    case GgufType::kBool:
      return storage_holds<uint8_t>(s);
    case GgufType::kI8:
      return storage_holds<int8_t>(s);
    case GgufType::kU16:
      return storage_holds<uint16_t>(s);
    case GgufType::kI16:
      return storage_holds<int16_t>(s);
    case GgufType::kU32:
      return storage_holds<uint32_t>(s);
    case GgufType::kI32:
      return storage_holds<int32_t>(s);
    case GgufType::kF32:
      return storage_holds<float>(s);
    case GgufType::kU64:
      return storage_holds<uint64_t>(s);
    case GgufType::kI64:
      return storage_holds<int64_t>(s);
    case GgufType::kF64:
      return storage_holds<double>(s);
    case GgufType::kString:
      return storage_holds<std::string>(s);
    case GgufType::kArray:
      return false;
  }
  return false;
}

std::string display_float(double v, bool is_f32) {
  // Shortest text that reads back to the same value at the stored width.
  return is_f32 ? fmt::format("{}", float(v)) : fmt::format("{}", v);
}

// One array element as text.
template <typename T>
std::string display_elem(const T& v, GgufType elem, const GgufDisplayOptions& options) {
  if constexpr (std::is_same_v<T, std::string>) {
    return gguf_escape(v, options.max_string_bytes);
  } else if constexpr (std::is_floating_point_v<T>) {
    return display_float(double(v), elem == GgufType::kF32);
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    if (elem == GgufType::kBool) return v ? "true" : "false";
    return fmt::format("{}", unsigned(v));
  } else {
    return fmt::format("{}", v);
  }
}

}  // namespace

std::optional<GgufType> gguf_type_from_id(uint32_t id) {
  if (id > uint32_t(GgufType::kF64)) return std::nullopt;
  return GgufType(id);
}

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::kU8:
      return "u8";
    case GgufType::kI8:
      return "i8";
    case GgufType::kU16:
      return "u16";
    case GgufType::kI16:
      return "i16";
    case GgufType::kU32:
      return "u32";
    case GgufType::kI32:
      return "i32";
    case GgufType::kF32:
      return "f32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kU64:
      return "u64";
    case GgufType::kI64:
      return "i64";
    case GgufType::kF64:
      return "f64";
  }
  return "unknown";
}

size_t gguf_fixed_size(GgufType type) {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

bool gguf_is_integer(GgufType type) {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
      return true;
    default:
      return false;
  }
}

GgufValue GgufValue::bool_array(const std::vector<bool>& v) {
  std::vector<uint8_t> bytes(v.begin(), v.end());
  return make_array(GgufType::kBool, std::move(bytes));
}

std::optional<GgufValue> GgufValue::from_storage(GgufType elem_type, GgufArrayStorage storage) {
  if (!storage_matches(elem_type, storage)) return std::nullopt;
  return make_array(elem_type, std::move(storage));
}

size_t GgufValue::array_size() const {
  const auto* storage = std::get_if<GgufArrayStorage>(&data_);
  if (storage == nullptr) return 0;
  return std::visit([](const auto& vec) { return vec.size(); }, *storage);
}

std::string GgufValue::type_name() const {
  if (!is_array()) return std::string(gguf_type_name(type_));
  return fmt::format("array[{}]", gguf_type_name(elem_type_));
}

std::optional<int64_t> GgufValue::as_int() const {
  if (!gguf_is_integer(type_)) return std::nullopt;
  if (const auto* s = std::get_if<int64_t>(&data_)) return *s;
  const uint64_t u = std::get<uint64_t>(data_);
  if (u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return int64_t(u);
}

std::optional<uint64_t> GgufValue::as_uint() const {
  if (!gguf_is_integer(type_)) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&data_)) return *u;
  const int64_t s = std::get<int64_t>(data_);
  if (s < 0) return std::nullopt;
  return uint64_t(s);
}

std::optional<double> GgufValue::as_float() const {
  if (type_ == GgufType::kF32) return double(std::get<float>(data_));
  if (type_ == GgufType::kF64) return std::get<double>(data_);
  return std::nullopt;
}

std::optional<float> GgufValue::as_f32() const {
  if (type_ != GgufType::kF32) return std::nullopt;
  return std::get<float>(data_);
}

std::optional<bool> GgufValue::as_bool() const {
  if (type_ != GgufType::kBool) return std::nullopt;
  return std::get<bool>(data_);
}

const std::string* GgufValue::as_string() const {
  if (type_ != GgufType::kString) return nullptr;
  return &std::get<std::string>(data_);
}

std::optional<std::vector<int64_t>> GgufValue::as_int_array() const {
  if (!is_array() || !gguf_is_integer(elem_type_)) return std::nullopt;
  std::optional<std::vector<int64_t>> out;
  std::visit(
      [&](const auto& vec) {
        using T = typename std::decay_t<decltype(vec)>::value_type;
        if constexpr (std::is_integral_v<T>) {
          std::vector<int64_t> ints;
          ints.reserve(vec.size());
          for (T v : vec) {
            if constexpr (std::is_same_v<T, uint64_t>) {
              if (v > uint64_t(std::numeric_limits<int64_t>::max())) return;  // does not fit
            }
            ints.push_back(int64_t(v));
          }
          out = std::move(ints);
        }
      },
      std::get<GgufArrayStorage>(data_));
  return out;
}

std::optional<std::vector<bool>> GgufValue::as_bool_array() const {
  if (!is_array() || elem_type_ != GgufType::kBool) return std::nullopt;
  const auto* b = array_data<uint8_t>();
  if (b == nullptr) return std::nullopt;
  return std::vector<bool>(b->begin(), b->end());
}

std::optional<std::vector<double>> GgufValue::as_float_array() const {
  if (!is_array()) return std::nullopt;
  if (const auto* f = array_data<float>()) return std::vector<double>(f->begin(), f->end());
  if (const auto* d = array_data<double>()) return *d;
  return std::nullopt;
}

std::string GgufValue::to_display(const GgufDisplayOptions& options) const {
  if (!is_array()) {
    switch (type_) {
      case GgufType::kString:
        return gguf_escape(*as_string(), options.max_string_bytes);
      case GgufType::kBool:
        return *as_bool() ? "true" : "false";
      case GgufType::kF32:
      case GgufType::kF64:
        return display_float(*as_float(), type_ == GgufType::kF32);
      default:
        break;
    }
    if (const auto* s = std::get_if<int64_t>(&data_)) return fmt::format("{}", *s);
    return fmt::format("{}", std::get<uint64_t>(data_));
  }
  const size_t n = array_size();
  if (n > options.max_array_elems) {
    if (elem_type_ == GgufType::kString) return fmt::format("[{} strings]", n);
    return fmt::format("[{} x {}]", n, gguf_type_name(elem_type_));
  }
  std::string out = "[";
  std::visit(
      [&](const auto& vec) {
        for (size_t i = 0; i < vec.size(); ++i) {
          if (i > 0) out += ", ";
          out += display_elem(vec[i], elem_type_, options);
        }
      },
      std::get<GgufArrayStorage>(data_));
  out += "]";
  return out;
}

std::string gguf_escape(std::string_view text, size_t max_bytes, char quote) {
  std::string out(1, quote);
  size_t shown = text.size() > max_bytes ? max_bytes : text.size();
  // Cut on a UTF-8 character boundary (not inside a multi-byte sequence).
  while (shown > 0 && shown < text.size() && (static_cast<unsigned char>(text[shown]) & 0xC0) == 0x80)
    --shown;
  for (size_t i = 0; i < shown; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (c == static_cast<unsigned char>(quote)) {
          out += '\\';
          out += quote;
        } else if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", unsigned(c));
        } else {
          out += char(c);  // UTF-8 bytes pass through unchanged
        }
    }
  }
  out += quote;
  if (shown < text.size()) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

}  // namespace moeserve
