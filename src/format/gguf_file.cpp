// GgufFile accessors: typed lookups of metadata and tensors.
#include "format/gguf.h"

namespace moeserve {

std::string GgufTensorInfo::shape_string() const {
  std::string out = "[";
  for (uint32_t d = 0; d < n_dims; ++d) out += fmt::format("{}{}", d ? ", " : "", ne[d]);
  return out + "]";
}

std::string_view GgufFile::architecture() const {
  return get_string("general.architecture").value_or(std::string_view());
}

std::string GgufFile::arch_key(std::string_view suffix) const {
  return fmt::format("{}.{}", architecture(), suffix);
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->as_int() : std::nullopt;
}

std::optional<uint64_t> GgufFile::get_uint(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->as_uint() : std::nullopt;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->as_float() : std::nullopt;
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->as_bool() : std::nullopt;
}

std::optional<std::string_view> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  const std::string* s = v ? v->as_string() : nullptr;
  if (s == nullptr) return std::nullopt;
  return std::string_view(*s);
}

const std::vector<std::string>* GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->as_string_array() : nullptr;
}

std::optional<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->as_int_array() : std::nullopt;
}

std::optional<std::vector<bool>> GgufFile::get_bool_array(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->as_bool_array() : std::nullopt;
}

std::optional<std::vector<double>> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? v->as_float_array() : std::nullopt;
}

Status GgufFile::wrong_type(std::string_view key, const GgufValue& value, std::string_view expected) const {
  return make_error(StatusCode::kInvalidFormat, "{}: key '{}' has type {}, expected {}", name_, key,
                    value.type_name(), expected);
}

Result<const GgufValue*> GgufFile::require(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return make_error(StatusCode::kNotFound, "{}: key '{}' is missing", name_, key);
  return v;
}

Result<int64_t> GgufFile::require_int(std::string_view key) const {
  MOESERVE_ASSIGN_OR_RETURN(const GgufValue* v, require(key));
  if (auto i = v->as_int()) return *i;
  if (gguf_is_integer(v->type())) {
    return make_error(StatusCode::kOutOfRange, "{}: key '{}' = {} does not fit in int64", name_, key,
                      v->to_display());
  }
  return wrong_type(key, *v, "an integer");
}

Result<uint64_t> GgufFile::require_uint(std::string_view key) const {
  MOESERVE_ASSIGN_OR_RETURN(const GgufValue* v, require(key));
  if (auto u = v->as_uint()) return *u;
  if (gguf_is_integer(v->type())) {
    return make_error(StatusCode::kOutOfRange, "{}: key '{}' = {} is negative, expected an unsigned value",
                      name_, key, v->to_display());
  }
  return wrong_type(key, *v, "an unsigned integer");
}

Result<double> GgufFile::require_float(std::string_view key) const {
  MOESERVE_ASSIGN_OR_RETURN(const GgufValue* v, require(key));
  if (auto f = v->as_float()) return *f;
  return wrong_type(key, *v, "f32 or f64");
}

Result<bool> GgufFile::require_bool(std::string_view key) const {
  MOESERVE_ASSIGN_OR_RETURN(const GgufValue* v, require(key));
  if (auto b = v->as_bool()) return *b;
  return wrong_type(key, *v, "bool");
}

Result<std::string_view> GgufFile::require_string(std::string_view key) const {
  MOESERVE_ASSIGN_OR_RETURN(const GgufValue* v, require(key));
  if (const std::string* s = v->as_string()) return std::string_view(*s);
  return wrong_type(key, *v, "string");
}

Result<const std::vector<std::string>*> GgufFile::require_string_array(std::string_view key) const {
  MOESERVE_ASSIGN_OR_RETURN(const GgufValue* v, require(key));
  if (const auto* a = v->as_string_array()) return a;
  return wrong_type(key, *v, "array[string]");
}

Result<std::vector<int64_t>> GgufFile::require_int_array(std::string_view key) const {
  MOESERVE_ASSIGN_OR_RETURN(const GgufValue* v, require(key));
  if (auto a = v->as_int_array()) return std::move(*a);
  if (v->is_array() && gguf_is_integer(v->elem_type())) {
    return make_error(StatusCode::kOutOfRange, "{}: key '{}' has u64 elements that do not fit in int64",
                      name_, key);
  }
  return wrong_type(key, *v, "an integer array");
}

Result<std::vector<double>> GgufFile::require_float_array(std::string_view key) const {
  MOESERVE_ASSIGN_OR_RETURN(const GgufValue* v, require(key));
  if (auto a = v->as_float_array()) return std::move(*a);
  return wrong_type(key, *v, "array[f32] or array[f64]");
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<const GgufTensorInfo*> GgufFile::require_tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (t == nullptr) return make_error(StatusCode::kNotFound, "{}: tensor '{}' is missing", name_, name);
  return t;
}

}  // namespace moeserve
