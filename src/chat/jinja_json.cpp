#include "chat/jinja_json.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "chat/jinja_strings.h"

namespace moeserve::chat::jinja {
namespace {

void append_json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
            out += fmt::format("\\u{:04x}", c);
          } else {
            out.push_back(static_cast<char>(c));
          }
      }
      continue;
    }
    size_t start = i;
    uint32_t cp = utf8_decode_at(s, i);
    if (!ensure_ascii) {
      out.append(s, start, i - start);
    } else if (cp < 0x10000) {
      out += fmt::format("\\u{:04x}", cp);
    } else {  // UTF-16 surrogate pair, as Python writes it
      uint32_t v = cp - 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    }
  }
  out.push_back('"');
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonDumpOptions& options)
      : options_(options),
        item_separator_(options.item_separator.value_or(options.indent ? "," : ", ")) {}

  Status write(const Value& v, int level, std::string& out) {
    switch (v.kind()) {
      case Value::Kind::kNone: out += "null"; return Status::ok();
      case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return Status::ok();
      case Value::Kind::kInt: out += std::to_string(v.as_int()); return Status::ok();
      case Value::Kind::kFloat: write_float(v.as_float(), out); return Status::ok();
      case Value::Kind::kString: append_json_string(v.as_string(), options_.ensure_ascii, out); return Status::ok();
      case Value::Kind::kList: return write_list(v.as_list(), level, out);
      case Value::Kind::kDict: return write_dict(v.as_dict(), level, out);
      case Value::Kind::kUndefined:
        return Status(StatusCode::kInvalidArgument, "Object of type Undefined is not JSON serializable");
      default:
        return make_error(StatusCode::kInvalidArgument, "Object of type {} is not JSON serializable", v.type_name());
    }
  }

 private:
  static void write_float(double d, std::string& out) {
    if (std::isnan(d)) {
      out += "NaN";
    } else if (std::isinf(d)) {
      out += d < 0 ? "-Infinity" : "Infinity";
    } else {
      out += format_python_float(d);
    }
  }

  void newline(int level, std::string& out) const {
    if (!options_.indent) return;
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += *options_.indent;
  }

  Status write_list(const ListData& list, int level, std::string& out) {
    if (list.items.empty()) {
      out += "[]";
      return Status::ok();
    }
    out.push_back('[');
    for (size_t i = 0; i < list.items.size(); ++i) {
      if (i) out += item_separator_;
      newline(level + 1, out);
      MOESERVE_RETURN_IF_ERROR(write(list.items[i], level + 1, out));
    }
    newline(level, out);
    out.push_back(']');
    return Status::ok();
  }

  Status write_dict(const DictData& dict, int level, std::string& out) {
    if (dict.empty()) {
      out += "{}";
      return Status::ok();
    }
    std::vector<const std::pair<std::string, Value>*> entries;
    for (const auto& entry : dict.entries()) entries.push_back(&entry);
    if (options_.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
    }
    out.push_back('{');
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i) out += item_separator_;
      newline(level + 1, out);
      append_json_string(entries[i]->first, options_.ensure_ascii, out);
      out += options_.key_separator;
      MOESERVE_RETURN_IF_ERROR(write(entries[i]->second, level + 1, out));
    }
    newline(level, out);
    out.push_back('}');
    return Status::ok();
  }

  const JsonDumpOptions& options_;
  std::string item_separator_;
};

Result<Value> convert(const nlohmann::ordered_json& json, uint32_t depth, uint32_t max_nesting) {
  using Type = nlohmann::ordered_json::value_t;
  switch (json.type()) {
    case Type::null: return Value::none();
    case Type::boolean: return Value::boolean(json.get<bool>());
    case Type::number_integer: return Value::integer(json.get<int64_t>());
    case Type::number_unsigned: {
      uint64_t u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case Type::number_float: return Value::number(json.get<double>());
    case Type::string: return Value::string(json.get<std::string>());
    case Type::array:
    case Type::object: {
      if (depth >= max_nesting) {
        return make_error(StatusCode::kInvalidArgument, "JSON input nests deeper than {} levels", max_nesting);
      }
      if (json.is_array()) {
        std::vector<Value> items;
        items.reserve(json.size());
        for (const auto& item : json) {
          MOESERVE_ASSIGN_OR_RETURN(Value v, convert(item, depth + 1, max_nesting));
          items.push_back(std::move(v));
        }
        return Value::list(std::move(items));
      }
      DictData dict;
      for (const auto& [key, item] : json.items()) {
        MOESERVE_ASSIGN_OR_RETURN(Value v, convert(item, depth + 1, max_nesting));
        dict.set(key, std::move(v));
      }
      return Value::dict(std::move(dict));
    }
    default:
      return Status(StatusCode::kInvalidArgument, "JSON input holds a value of unsupported type (binary)");
  }
}

}  // namespace

Result<std::string> dump_json(const Value& value, const JsonDumpOptions& options) {
  std::string out;
  JsonWriter writer(options);
  MOESERVE_RETURN_IF_ERROR(writer.write(value, 0, out));
  return out;
}

Result<Value> value_from_json(const nlohmann::ordered_json& json, uint32_t max_nesting) {
  return convert(json, 0, max_nesting);
}

}  // namespace moeserve::chat::jinja
