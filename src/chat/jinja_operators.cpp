#include "chat/jinja_operators.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "chat/jinja_builtins.h"
#include "chat/jinja_interpreter.h"
#include "chat/jinja_strings.h"

namespace moeserve::chat::jinja {
namespace {

Status type_error(std::string_view op, const Value& a, const Value& b) {
  return make_error(StatusCode::kInvalidArgument, "unsupported operand types for {}: '{}' and '{}'", op,
                    a.type_name(), b.type_name());
}

Status overflow_error() {
  return Status(StatusCode::kOutOfRange, "integer overflow (values beyond 64 bits are not supported)");
}

bool both_ints(const Value& a, const Value& b) {
  return (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
}

Result<Value> repeat(Interpreter& interp, const Value& seq, int64_t times) {
  if (times < 0) times = 0;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    uint64_t bytes = static_cast<uint64_t>(s.size()) * static_cast<uint64_t>(times);
    if (!s.empty() && bytes / s.size() != static_cast<uint64_t>(times)) return overflow_error();
    MOESERVE_RETURN_IF_ERROR(interp.charge_string(static_cast<size_t>(std::min<uint64_t>(bytes, SIZE_MAX / 2))));
    std::string out;
    out.reserve(static_cast<size_t>(bytes));
    for (int64_t i = 0; i < times; ++i) out += s;
    return Value::string(std::move(out));
  }
  const ListData& list = seq.as_list();
  uint64_t items = static_cast<uint64_t>(list.items.size()) * static_cast<uint64_t>(times);
  MOESERVE_RETURN_IF_ERROR(interp.charge_list(static_cast<size_t>(std::min<uint64_t>(items, SIZE_MAX / 2))));
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(items));
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), list.items.begin(), list.items.end());
  return Value::list(std::move(out), list.is_tuple);
}

Result<Value> int_pow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) {
      if (__builtin_mul_overflow(result, base, &result)) return overflow_error();
    }
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) return overflow_error();
  }
  return Value::integer(result);
}

Result<Value> add(Interpreter& interp, const Value& a, const Value& b) {
  if (both_ints(a, b)) {
    int64_t r;
    if (__builtin_add_overflow(a.to_int(), b.to_int(), &r)) return overflow_error();
    return Value::integer(r);
  }
  if (a.is_number() && b.is_number()) return Value::number(a.to_double() + b.to_double());
  if (a.is_string() && b.is_string()) {
    MOESERVE_RETURN_IF_ERROR(interp.charge_string(a.as_string().size() + b.as_string().size()));
    return Value::string(a.as_string() + b.as_string());
  }
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    MOESERVE_RETURN_IF_ERROR(interp.charge_list(x.size() + y.size()));
    std::vector<Value> out(x);
    out.insert(out.end(), y.begin(), y.end());
    return Value::list(std::move(out), a.as_list().is_tuple && b.as_list().is_tuple);
  }
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  return type_error("+", a, b);
}

Result<Value> arithmetic(Interpreter& interp, BinaryOp op, const Value& a, const Value& b) {
  if (op == BinaryOp::kMul) {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(interp, a, b.to_int());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(interp, b, a.to_int());
  }
  if (op == BinaryOp::kMod && a.is_string()) {
    return Status(StatusCode::kUnsupported, "string formatting with '%' is not supported");
  }
  static const char* const kSymbols[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
  if (!a.is_number() || !b.is_number()) {
    if (a.is_undefined()) return undefined_error(a);
    if (b.is_undefined()) return undefined_error(b);
    return type_error(kSymbols[static_cast<int>(op)], a, b);
  }
  bool ints = both_ints(a, b);
  double x = a.to_double(), y = b.to_double();
  int64_t r = 0;
  switch (op) {
    case BinaryOp::kSub:
      if (!ints) return Value::number(x - y);
      if (__builtin_sub_overflow(a.to_int(), b.to_int(), &r)) return overflow_error();
      return Value::integer(r);
    case BinaryOp::kMul:
      if (!ints) return Value::number(x * y);
      if (__builtin_mul_overflow(a.to_int(), b.to_int(), &r)) return overflow_error();
      return Value::integer(r);
    case BinaryOp::kDiv:
      if (y == 0) return Status(StatusCode::kInvalidArgument, "division by zero");
      return Value::number(x / y);
    case BinaryOp::kFloorDiv:
    case BinaryOp::kMod: {
      if (y == 0) return Status(StatusCode::kInvalidArgument, "integer division or modulo by zero");
      if (ints) {
        int64_t n = a.to_int(), d = b.to_int();
        if (n == std::numeric_limits<int64_t>::min() && d == -1) return overflow_error();
        int64_t q = n / d, m = n % d;
        if (m != 0 && ((m < 0) != (d < 0))) {  // Python floors toward -inf
          --q;
          m += d;
        }
        return Value::integer(op == BinaryOp::kFloorDiv ? q : m);
      }
      if (op == BinaryOp::kFloorDiv) return Value::number(std::floor(x / y));
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::number(m);
    }
    case BinaryOp::kPow:
      if (ints && b.to_int() >= 0) return int_pow(a.to_int(), b.to_int());
      if (x == 0 && y < 0) return Status(StatusCode::kInvalidArgument, "zero cannot be raised to a negative power");
      return Value::number(std::pow(x, y));
    default:
      return Status(StatusCode::kInternal, "unexpected arithmetic operator");
  }
}

const char* object_description(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kDict: return "dict object";
    case Value::Kind::kList: return "list object";
    case Value::Kind::kString: return "str object";
    case Value::Kind::kNamespace: return "namespace";
    default: return v.type_name();
  }
}

Value missing_attribute(const Value& obj, std::string_view name) {
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_description(obj), name));
}

}  // namespace

Status undefined_error(const Value& v) {
  const std::string& what = v.undefined_name();
  return Status(StatusCode::kInvalidArgument, what.empty() ? "value is undefined" : what);
}

Result<std::vector<Value>> iterate_value(const Value& v) {
  std::vector<Value> items;
  switch (v.kind()) {
    case Value::Kind::kList: return v.as_list().items;
    case Value::Kind::kDict:
      for (const auto& entry : v.as_dict().entries()) items.push_back(Value::string(entry.first));
      return items;
    case Value::Kind::kString: {
      const std::string& s = v.as_string();
      for (size_t i = 0; i < s.size();) {
        size_t start = i;
        utf8_decode_at(s, i);
        items.push_back(Value::string(s.substr(start, i - start)));
      }
      return items;
    }
    case Value::Kind::kUndefined: return items;
    default:
      return make_error(StatusCode::kInvalidArgument, "'{}' object is not iterable", v.type_name());
  }
}

Result<Value> apply_binary(Interpreter& interp, BinaryOp op, const Value& a, const Value& b) {
  if (op == BinaryOp::kConcat) {
    // `~` converts both sides with str(), so undefined joins as "".
    std::string left = to_display_string(a);
    std::string right = to_display_string(b);
    MOESERVE_RETURN_IF_ERROR(interp.charge_string(left.size() + right.size()));
    return Value::string(left + right);
  }
  if (op == BinaryOp::kAdd) return add(interp, a, b);
  return arithmetic(interp, op, a, b);
}

Result<Value> apply_unary(UnaryOp op, const Value& v) {
  if (op == UnaryOp::kNot) return Value::boolean(!v.truthy());
  if (!v.is_number()) {
    if (v.is_undefined()) return undefined_error(v);
    return make_error(StatusCode::kInvalidArgument, "bad operand type for unary {}: '{}'",
                      op == UnaryOp::kNegate ? "-" : "+", v.type_name());
  }
  if (op == UnaryOp::kPlus) return v.is_bool() ? Value::integer(v.to_int()) : v;
  if (v.is_float()) return Value::number(-v.as_float());
  if (v.to_int() == std::numeric_limits<int64_t>::min()) return overflow_error();
  return Value::integer(-v.to_int());
}

Result<bool> value_in(const Value& needle, const Value& haystack) {
  switch (haystack.kind()) {
    case Value::Kind::kString:
      if (!needle.is_string()) {
        return make_error(StatusCode::kInvalidArgument, "'in <string>' requires a string as left operand, not '{}'",
                          needle.type_name());
      }
      return haystack.as_string().find(needle.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& item : haystack.as_list().items) {
        if (values_equal(item, needle)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return needle.is_string() && haystack.as_dict().find(needle.as_string()) != nullptr;
    case Value::Kind::kUndefined:
      return false;  // Jinja2's Undefined iterates as empty
    default:
      return make_error(StatusCode::kInvalidArgument, "argument of type '{}' is not iterable",
                        haystack.type_name());
  }
}

namespace {

// Python's slice.indices(): clamps bounds for a sequence of length n.
Status slice_indices(const Value& start_v, const Value& stop_v, const Value& step_v, int64_t n, int64_t& start,
                     int64_t& stop, int64_t& step) {
  auto as_index = [](const Value& v, const char* what) -> Result<std::optional<int64_t>> {
    if (v.is_none() || v.is_undefined()) return std::optional<int64_t>();
    if (v.is_int() || v.is_bool()) return std::optional<int64_t>(v.to_int());
    return make_error(StatusCode::kInvalidArgument, "slice {} must be an integer or none, not '{}'", what,
                      v.type_name());
  };
  MOESERVE_ASSIGN_OR_RETURN(auto st, as_index(step_v, "step"));
  step = st.value_or(1);
  if (step == 0) return Status(StatusCode::kInvalidArgument, "slice step cannot be zero");
  MOESERVE_ASSIGN_OR_RETURN(auto b, as_index(start_v, "start"));
  MOESERVE_ASSIGN_OR_RETURN(auto e, as_index(stop_v, "stop"));
  auto clamp = [&](std::optional<int64_t> idx, int64_t dflt) {
    if (!idx) return dflt;
    int64_t i = *idx;
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  start = clamp(b, step > 0 ? 0 : n - 1);
  stop = clamp(e, step > 0 ? n : -1);
  return Status::ok();
}

}  // namespace

Result<Value> slice_value(Interpreter& interp, const Value& obj, const Value& start_v, const Value& stop_v,
                          const Value& step_v) {
  if (obj.is_undefined()) return undefined_error(obj);
  if (!obj.is_string() && !obj.is_list()) {
    return make_error(StatusCode::kInvalidArgument, "'{}' object cannot be sliced", obj.type_name());
  }
  std::vector<size_t> offsets;
  int64_t n;
  if (obj.is_string()) {
    offsets = utf8_offsets(obj.as_string());
    n = static_cast<int64_t>(offsets.size()) - 1;
  } else {
    n = static_cast<int64_t>(obj.as_list().items.size());
  }
  int64_t start = 0, stop = 0, step = 1;
  MOESERVE_RETURN_IF_ERROR(slice_indices(start_v, stop_v, step_v, n, start, stop, step));
  // Count first in 128 bits: a huge step must not overflow the index.
  __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
  __int128 abs_step = step > 0 ? static_cast<__int128>(step) : -static_cast<__int128>(step);
  int64_t count = span <= 0 ? 0 : static_cast<int64_t>((span + abs_step - 1) / abs_step);
  std::vector<int64_t> picked;
  picked.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) picked.push_back(static_cast<int64_t>(start + static_cast<__int128>(k) * step));
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    std::string out;
    for (int64_t i : picked) {
      size_t k = static_cast<size_t>(i);
      out.append(s, offsets[k], offsets[k + 1] - offsets[k]);
    }
    MOESERVE_RETURN_IF_ERROR(interp.charge_string(out.size()));
    return Value::string(std::move(out));
  }
  MOESERVE_RETURN_IF_ERROR(interp.charge_list(picked.size()));
  std::vector<Value> out;
  out.reserve(picked.size());
  for (int64_t i : picked) out.push_back(obj.as_list().items[static_cast<size_t>(i)]);
  return Value::list(std::move(out), obj.as_list().is_tuple);
}

Result<Value> access_attribute(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) return undefined_error(obj);
  if (std::optional<Value> method = bind_method(obj, name)) return *method;
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(name)) return *v;
  } else if (obj.is_namespace()) {
    if (const Value* v = obj.as_namespace().attrs.find(name)) return *v;
  }
  return missing_attribute(obj, name);
}

Result<Value> access_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return undefined_error(obj);
  if ((key.is_int() || key.is_bool()) && (obj.is_list() || obj.is_string())) {
    int64_t i = key.to_int();
    if (obj.is_list()) {
      const auto& items = obj.as_list().items;
      int64_t n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(fmt::format("list index {} out of range", key.to_int()));
      return items[static_cast<size_t>(i)];
    }
    const std::string& s = obj.as_string();
    std::vector<size_t> offsets = utf8_offsets(s);
    int64_t n = static_cast<int64_t>(offsets.size()) - 1;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined(fmt::format("string index {} out of range", key.to_int()));
    size_t k = static_cast<size_t>(i);
    return Value::string(s.substr(offsets[k], offsets[k + 1] - offsets[k]));
  }
  if (key.is_string()) {
    if (obj.is_dict()) {
      if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
    } else if (obj.is_namespace()) {
      if (const Value* v = obj.as_namespace().attrs.find(key.as_string())) return *v;
    }
    if (std::optional<Value> method = bind_method(obj, key.as_string())) return *method;
    return missing_attribute(obj, key.as_string());
  }
  return Value::undefined(fmt::format("'{}' has no item {}", object_description(obj), to_repr(key)));
}

}  // namespace moeserve::chat::jinja
