#include "chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/jinja_strings.h"

namespace moeserve::chat::jinja {

// ---- DictData -----------------------------------------------------------------

size_t DictData::find_index(std::string_view key) const {
  if (!index_.empty()) {
    auto it = index_.find(std::string(key));
    return it == index_.end() ? entries_.size() : it->second;
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].first == key) return i;
  }
  return entries_.size();
}

const Value* DictData::find(std::string_view key) const {
  size_t i = find_index(key);
  return i < entries_.size() ? &entries_[i].second : nullptr;
}

Value* DictData::find(std::string_view key) {
  size_t i = find_index(key);
  return i < entries_.size() ? &entries_[i].second : nullptr;
}

Value& DictData::value_at(size_t index) { return entries_[index].second; }

void DictData::set(std::string key, Value value) {
  size_t i = find_index(key);
  if (i < entries_.size()) {
    entries_[i].second = std::move(value);
    return;
  }
  entries_.emplace_back(std::move(key), std::move(value));
  if (!index_.empty()) {
    index_.emplace(entries_.back().first, entries_.size() - 1);
  } else if (entries_.size() > kIndexThreshold) {
    // Large objects (hostile or not) must not make every insert O(n).
    for (size_t j = 0; j < entries_.size(); ++j) index_.emplace(entries_[j].first, j);
  }
}

// ---- Value --------------------------------------------------------------------

Value Value::list(std::vector<Value> items, bool is_tuple) {
  auto data = std::make_shared<ListData>();
  uint32_t deepest = 0;
  for (const Value& item : items) deepest = std::max(deepest, item.nesting());
  data->items = std::move(items);
  data->is_tuple = is_tuple;
  data->nesting = deepest + 1;
  return Value(std::move(data));
}

Value Value::dict(DictData data) {
  uint32_t deepest = 0;
  for (const auto& entry : data.entries()) deepest = std::max(deepest, entry.second.nesting());
  data.nesting = deepest + 1;
  return Value(std::make_shared<DictData>(std::move(data)));
}

uint32_t Value::nesting() const {
  switch (kind()) {
    case Kind::kList: return as_list().nesting;
    case Kind::kDict: return as_dict().nesting;
    case Kind::kNamespace: return 1;
    default: return 0;
  }
}

Value Value::new_namespace(DictData attrs) {
  auto ns = std::make_shared<NamespaceData>();
  ns->attrs = std::move(attrs);
  return Value(std::move(ns));
}

Value Value::callable(std::shared_ptr<const Callable> fn) { return Value(std::move(fn)); }

double Value::to_double() const {
  switch (kind()) {
    case Kind::kFloat: return as_float();
    case Kind::kInt: return static_cast<double>(as_int());
    case Kind::kBool: return as_bool() ? 1.0 : 0.0;
    default: return 0.0;
  }
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return as_bool();
    case Kind::kInt: return as_int() != 0;
    case Kind::kFloat: return as_float() != 0.0;
    case Kind::kString: return !as_string().empty();
    case Kind::kList: return !as_list().items.empty();
    case Kind::kDict: return !as_dict().empty();
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return as_list().is_tuple ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "?";
}

// ---- equality and ordering ----------------------------------------------------------

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    return a.to_int() == b.to_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const auto& x = a.as_list().items;
      const auto& y = b.as_list().items;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!values_equal(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const DictData& x = a.as_dict();
      const DictData& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x.entries()) {
        const Value* other = y.find(key);
        if (!other || !values_equal(value, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return &a.as_namespace() == &b.as_namespace();
    case Value::Kind::kCallable: return &a.as_callable() == &b.as_callable();
    default: return false;  // numbers handled above
  }
}

Result<int> compare_values(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.to_double(), y = b.to_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.to_int(), y = b.to_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code-point order, which is what Python compares.
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_equal(x[i], y[i])) continue;
      return compare_values(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return make_error(StatusCode::kInvalidArgument, "cannot compare '{}' with '{}'", a.type_name(),
                    b.type_name());
}

// ---- printing ------------------------------------------------------------------

std::string format_python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  // Shortest round-trip digits in scientific form, e.g. "1.2345e-05".
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  size_t pos = 0;
  if (sci[0] == '-') {
    out.push_back('-');
    pos = 1;
  }
  size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e_pos; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  int exp10 = std::atoi(sci.c_str() + e_pos + 1);
  // Python's repr switches to scientific notation outside 1e-4 <= |d| < 1e16.
  if (exp10 < -4 || exp10 >= 16) {
    out.push_back(digits[0]);
    if (digits.size() > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += exp_buf;
    return out;
  }
  if (exp10 < 0) {
    out += "0.";
    out.append(static_cast<size_t>(-exp10 - 1), '0');
    out += digits;
    return out;
  }
  size_t int_len = static_cast<size_t>(exp10) + 1;
  if (digits.size() <= int_len) {
    out += digits;
    out.append(int_len - digits.size(), '0');
    out += ".0";
  } else {
    out.append(digits, 0, int_len);
    out.push_back('.');
    out.append(digits, int_len, std::string::npos);
  }
  return out;
}

namespace {

void append_repr_string(const std::string& s, std::string& out) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  out.push_back(quote);
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      char ch = static_cast<char>(c);
      if (ch == '\\' || ch == quote) {
        out.push_back('\\');
        out.push_back(ch);
      } else if (ch == '\n') {
        out += "\\n";
      } else if (ch == '\r') {
        out += "\\r";
      } else if (ch == '\t') {
        out += "\\t";
      } else if (c < 0x20 || c == 0x7f) {
        out += fmt::format("\\x{:02x}", c);
      } else {
        out.push_back(ch);
      }
      ++i;
      continue;
    }
    size_t start = i;
    uint32_t cp = utf8_decode_at(s, i);  // advances i
    if (!python_is_printable(cp)) {
      if (cp <= 0xff) {
        out += fmt::format("\\x{:02x}", cp);
      } else if (cp <= 0xffff) {
        out += fmt::format("\\u{:04x}", cp);
      } else {
        out += fmt::format("\\U{:08x}", cp);
      }
    } else {
      out.append(s, start, i - start);
    }
  }
  out.push_back(quote);
}

void append_repr(const Value& v, std::string& out);

void append_sequence(const ListData& list, std::string& out) {
  out.push_back(list.is_tuple ? '(' : '[');
  for (size_t i = 0; i < list.items.size(); ++i) {
    if (i) out += ", ";
    append_repr(list.items[i], out);
  }
  if (list.is_tuple && list.items.size() == 1) out.push_back(',');
  out.push_back(list.is_tuple ? ')' : ']');
}

void append_mapping(const DictData& dict, std::string& out) {
  out.push_back('{');
  bool first = true;
  for (const auto& [key, value] : dict.entries()) {
    if (!first) out += ", ";
    first = false;
    append_repr_string(key, out);
    out += ": ";
    append_repr(value, out);
  }
  out.push_back('}');
}

void append_repr(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: out += "Undefined"; return;
    case Value::Kind::kString: append_repr_string(v.as_string(), out); return;
    case Value::Kind::kList: append_sequence(v.as_list(), out); return;
    case Value::Kind::kDict: append_mapping(v.as_dict(), out); return;
    default: out += to_display_string(v); return;
  }
}

}  // namespace

std::string to_repr(const Value& v) {
  std::string out;
  append_repr(v, out);
  return out;
}

std::string to_display_string(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.as_int());
    case Value::Kind::kFloat: return format_python_float(v.as_float());
    case Value::Kind::kString: return v.as_string();
    case Value::Kind::kList:
    case Value::Kind::kDict: return to_repr(v);
    case Value::Kind::kNamespace: {
      // Attribute values print flat: a namespace may (through a list) contain
      // itself, and printing must terminate.
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [key, value] : v.as_namespace().attrs.entries()) {
        if (!first) out += ", ";
        first = false;
        append_repr_string(key, out);
        out += ": ";
        out += value.is_namespace() || value.is_list() || value.is_dict() ? std::string("<") + value.type_name() + ">"
                                                                            : to_repr(value);
      }
      out += "}>";
      return out;
    }
    case Value::Kind::kCallable: return "<function " + v.as_callable().name() + ">";
  }
  return "";
}

// ---- argument binding -----------------------------------------------------------

Result<std::vector<Value>> bind_arguments(std::string_view function_name, CallArgs& args,
                                          const std::vector<std::string_view>& params) {
  std::vector<Value> bound(params.size());
  std::vector<bool> seen(params.size(), false);
  if (args.positional.size() > params.size()) {
    return make_error(StatusCode::kInvalidArgument, "{}() takes at most {} argument(s), {} given",
                      function_name, params.size(), args.positional.size());
  }
  for (size_t i = 0; i < args.positional.size(); ++i) {
    bound[i] = std::move(args.positional[i]);
    seen[i] = true;
  }
  for (auto& [name, value] : args.keyword) {
    size_t idx = 0;
    while (idx < params.size() && params[idx] != name) ++idx;
    if (idx == params.size()) {
      return make_error(StatusCode::kInvalidArgument, "{}() got an unexpected keyword argument '{}'",
                        function_name, name);
    }
    if (seen[idx]) {
      return make_error(StatusCode::kInvalidArgument, "{}() got multiple values for argument '{}'",
                        function_name, name);
    }
    bound[idx] = std::move(value);
    seen[idx] = true;
  }
  return bound;
}

}  // namespace moeserve::chat::jinja
