// GGUF metadata values: the thirteen on-disk value types, and one value
// class that holds any of them (arrays included) with its exact type kept, so
// a file read and written back is byte-identical.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace moeserve {

// Values are the on-disk GGUF value type ids; do not renumber.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

std::optional<GgufType> gguf_type_from_id(uint32_t id);
std::string_view gguf_type_name(GgufType type);  // "u32", "string", "array", ...
// Bytes one value takes on disk; 0 for the variable-size string and array.
size_t gguf_fixed_size(GgufType type);
bool gguf_is_integer(GgufType type);  // u8..i64 (bool is not an integer)

// Element storage of an array. Bool arrays are kept as uint8_t 0/1.
using GgufArrayStorage =
    std::variant<std::vector<uint8_t>, std::vector<int8_t>, std::vector<uint16_t>, std::vector<int16_t>,
                 std::vector<uint32_t>, std::vector<int32_t>, std::vector<float>, std::vector<uint64_t>,
                 std::vector<int64_t>, std::vector<double>, std::vector<std::string>>;

// How much of a value to_display() shows.
struct GgufDisplayOptions {
  size_t max_array_elems = 8;    // longer arrays print as "[151936 strings]"
  size_t max_string_bytes = 80;  // longer strings are cut with "... (N bytes)"
};

class GgufValue {
 public:
  // Scalars.
  static GgufValue u8(uint8_t v) { return {GgufType::kU8, Scalar(uint64_t(v))}; }
  static GgufValue i8(int8_t v) { return {GgufType::kI8, Scalar(int64_t(v))}; }
  static GgufValue u16(uint16_t v) { return {GgufType::kU16, Scalar(uint64_t(v))}; }
  static GgufValue i16(int16_t v) { return {GgufType::kI16, Scalar(int64_t(v))}; }
  static GgufValue u32(uint32_t v) { return {GgufType::kU32, Scalar(uint64_t(v))}; }
  static GgufValue i32(int32_t v) { return {GgufType::kI32, Scalar(int64_t(v))}; }
  static GgufValue u64(uint64_t v) { return {GgufType::kU64, Scalar(v)}; }
  static GgufValue i64(int64_t v) { return {GgufType::kI64, Scalar(v)}; }
  static GgufValue f32(float v) { return {GgufType::kF32, Scalar(v)}; }
  static GgufValue f64(double v) { return {GgufType::kF64, Scalar(v)}; }
  static GgufValue boolean(bool v) { return {GgufType::kBool, Scalar(v)}; }
  static GgufValue string(std::string v) { return {GgufType::kString, Scalar(std::move(v))}; }

  // Arrays; the element type follows from the vector's type.
  static GgufValue array(std::vector<uint8_t> v) { return make_array(GgufType::kU8, std::move(v)); }
  static GgufValue array(std::vector<int8_t> v) { return make_array(GgufType::kI8, std::move(v)); }
  static GgufValue array(std::vector<uint16_t> v) { return make_array(GgufType::kU16, std::move(v)); }
  static GgufValue array(std::vector<int16_t> v) { return make_array(GgufType::kI16, std::move(v)); }
  static GgufValue array(std::vector<uint32_t> v) { return make_array(GgufType::kU32, std::move(v)); }
  static GgufValue array(std::vector<int32_t> v) { return make_array(GgufType::kI32, std::move(v)); }
  static GgufValue array(std::vector<float> v) { return make_array(GgufType::kF32, std::move(v)); }
  static GgufValue array(std::vector<uint64_t> v) { return make_array(GgufType::kU64, std::move(v)); }
  static GgufValue array(std::vector<int64_t> v) { return make_array(GgufType::kI64, std::move(v)); }
  static GgufValue array(std::vector<double> v) { return make_array(GgufType::kF64, std::move(v)); }
  static GgufValue array(std::vector<std::string> v) { return make_array(GgufType::kString, std::move(v)); }
  static GgufValue bool_array(const std::vector<bool>& v);
  // An array of `elem_type` from its storage; nullopt when they do not match
  // (or elem_type is kArray: GGUF has no nested arrays). Used by the reader.
  static std::optional<GgufValue> from_storage(GgufType elem_type, GgufArrayStorage storage);

  GgufType type() const { return type_; }
  bool is_array() const { return type_ == GgufType::kArray; }
  // Element type of an array (meaningless for scalars).
  GgufType elem_type() const { return elem_type_; }
  size_t array_size() const;  // 0 for scalars
  // "u32", "string", "array[i32]".
  std::string type_name() const;

  // Scalar reads. nullopt when the type does not fit the request:
  // as_int: any integer type whose value fits int64 (not bool);
  // as_uint: any integer type whose value is >= 0;
  // as_float: f32 or f64 only.
  std::optional<int64_t> as_int() const;
  std::optional<uint64_t> as_uint() const;
  std::optional<double> as_float() const;
  std::optional<float> as_f32() const;  // the exact stored f32 (type f32 only)
  std::optional<bool> as_bool() const;
  const std::string* as_string() const;

  // Arrays. array_data<T>() is the exact storage (nullptr when this is not an
  // array stored as std::vector<T>); as_int_array / as_float_array convert.
  template <typename T>
  const std::vector<T>* array_data() const {
    const auto* storage = std::get_if<GgufArrayStorage>(&data_);
    return storage ? std::get_if<std::vector<T>>(storage) : nullptr;
  }
  const std::vector<std::string>* as_string_array() const { return array_data<std::string>(); }
  std::optional<std::vector<int64_t>> as_int_array() const;  // integer elems that fit int64
  std::optional<std::vector<double>> as_float_array() const;  // f32/f64 elems
  std::optional<std::vector<bool>> as_bool_array() const;     // bool elems

  // Human-readable value: 151643, 1e-06, "qwen3moe", [11, 11, 10, 0],
  // "[151936 strings]". Control characters in strings are escaped.
  std::string to_display(const GgufDisplayOptions& options = {}) const;

  bool operator==(const GgufValue& other) const = default;

 private:
  using Scalar = std::variant<uint64_t, int64_t, float, double, bool, std::string, GgufArrayStorage>;
  GgufValue(GgufType type, Scalar data) : type_(type), data_(std::move(data)) {}
  template <typename Vec>
  static GgufValue make_array(GgufType elem, Vec v) {
    GgufValue out(GgufType::kArray, Scalar(GgufArrayStorage(std::move(v))));
    out.elem_type_ = elem;
    return out;
  }

  GgufType type_;
  GgufType elem_type_ = GgufType::kU8;
  // Unsigned integers live in uint64_t, signed in int64_t (type_ keeps the
  // width for writing back); f32 stays a float so its bits (NaN payloads
  // included) are written back unchanged.
  Scalar data_;
};

// Quote and escape a string for messages and displays: control bytes become
// \n, \t or \xNN, the quote char is backslashed, and text past max_bytes is
// cut (on a UTF-8 boundary) with "... (N bytes)" after the closing quote.
std::string gguf_escape(std::string_view text, size_t max_bytes = 80, char quote = '"');

}  // namespace moeserve
