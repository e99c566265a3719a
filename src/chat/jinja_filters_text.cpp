// Filters on strings and numbers, plus length/default/tojson. Semantics follow
// Jinja2's builtin filters; `tojson` is transformers' override (no HTML
// escaping, ensure_ascii=False by default).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "chat/jinja_builtins.h"
#include "chat/jinja_interpreter.h"
#include "chat/jinja_json.h"
#include "chat/jinja_operators.h"
#include "chat/jinja_strings.h"

namespace moeserve::chat::jinja {
namespace {

Result<std::vector<Value>> bind(std::string_view name, CallArgs& args, const std::vector<std::string_view>& params) {
  return bind_arguments(name, args, params);
}

Result<Value> text_result(Interpreter& interp, std::string s) {
  MOESERVE_RETURN_IF_ERROR(interp.charge_string(s.size()));
  return Value::string(std::move(s));
}

Result<std::optional<std::string>> optional_string(const Value& v, std::string_view what) {
  if (v.is_undefined() || v.is_none()) return std::optional<std::string>();
  if (!v.is_string()) {
    return make_error(StatusCode::kInvalidArgument, "{} must be a string, not '{}'", what, v.type_name());
  }
  return std::optional<std::string>(v.as_string());
}

Result<Value> filter_length(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("length", args, {}));
  switch (v.kind()) {
    case Value::Kind::kString: return Value::integer(static_cast<int64_t>(utf8_length(v.as_string())));
    case Value::Kind::kList: return Value::integer(static_cast<int64_t>(v.as_list().items.size()));
    case Value::Kind::kDict: return Value::integer(static_cast<int64_t>(v.as_dict().size()));
    case Value::Kind::kUndefined: return Value::integer(0);
    default: return make_error(StatusCode::kInvalidArgument, "object of type '{}' has no len()", v.type_name());
  }
}

template <std::string (*Transform)(std::string_view)>
Result<Value> string_transform(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("string filter", args, {}));
  return text_result(interp, Transform(to_display_string(v)));
}

Result<Value> filter_trim(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("trim", args, {"chars"}));
  MOESERVE_ASSIGN_OR_RETURN(auto chars, optional_string(bound[0], "trim chars"));
  return text_result(interp, py_strip(to_display_string(v), chars, true, true));
}

Result<Value> filter_replace(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("replace", args, {"old", "new", "count"}));
  int64_t count = -1;
  if (bound[2].is_int()) count = bound[2].as_int();
  std::string out = py_replace(to_display_string(v), to_display_string(bound[0]), to_display_string(bound[1]), count);
  return text_result(interp, std::move(out));
}

Result<Value> filter_string(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("string", args, {}));
  if (v.is_string()) return v;
  return text_result(interp, to_display_string(v));
}

Result<Value> filter_escape(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("escape", args, {}));
  std::string out;
  for (char c : to_display_string(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return text_result(interp, std::move(out));
}

Result<Value> filter_indent(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("indent", args, {"width", "first", "blank"}));
  std::string indentation;
  if (bound[0].is_string()) {
    indentation = bound[0].as_string();
  } else if (bound[0].is_int()) {
    indentation.assign(static_cast<size_t>(std::clamp<int64_t>(bound[0].as_int(), 0, 1024)), ' ');
  } else if (bound[0].is_undefined()) {
    indentation = "    ";
  } else {
    return Status(StatusCode::kInvalidArgument, "width must be an integer or a string");
  }
  bool first = bound[1].truthy(), blank = bound[2].truthy();
  std::vector<std::string> lines = py_split(to_display_string(v) + "\n", std::string("\n"), -1);
  lines.pop_back();  // the piece after the appended newline
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out.push_back('\n');
      if (blank || !lines[i].empty()) out += indentation;
    }
    out += lines[i];
  }
  if (first) out = indentation + out;
  return text_result(interp, std::move(out));
}

Result<Value> filter_wordcount(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("wordcount", args, {}));
  int64_t words = 0;
  bool in_word = false;
  for (char c : to_display_string(v)) {
    unsigned char u = static_cast<unsigned char>(c);
    bool word_char = std::isalnum(u) || c == '_' || u >= 0x80;  // \w, with any non-ASCII as a letter
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value::integer(words);
}

Result<Value> filter_default(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("default", args, {"default_value", "boolean"}));
  bool use_default = v.is_undefined() || (bound[1].truthy() && !v.truthy());
  if (!use_default) return v;
  return bound[0].is_undefined() ? Value::string("") : bound[0];
}

// Python's int() of a string: optional sign, digits, underscores between
// digits, surrounding whitespace.
std::optional<int64_t> parse_python_int(const std::string& text) {
  std::string s = py_strip(text, std::nullopt, true, true);
  std::string digits;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) digits.push_back(s[i++]);
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    if (s[i] >= '0' && s[i] <= '9') {
      digits.push_back(s[i]);
      prev_digit = true;
    } else if (s[i] == '_' && prev_digit && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') {
      prev_digit = false;
    } else {
      return std::nullopt;
    }
  }
  if (digits.empty() || digits == "+" || digits == "-") return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long r = std::strtoll(digits.c_str(), &end, 10);
  if (errno == ERANGE) return std::nullopt;
  return static_cast<int64_t>(r);
}

std::optional<double> parse_python_float(const std::string& text) {
  std::string s = py_strip(text, std::nullopt, true, true);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}

Result<Value> filter_int(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("int", args, {"default", "base"}));
  Value fallback = bound[0].is_undefined() ? Value::integer(0) : bound[0];
  if (v.is_int() || v.is_bool()) return Value::integer(v.to_int());
  if (v.is_float()) {
    double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
    return Value::integer(static_cast<int64_t>(d));  // truncates toward zero, like int()
  }
  if (v.is_string()) {
    if (auto i = parse_python_int(v.as_string())) return Value::integer(*i);
    if (auto d = parse_python_float(v.as_string()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18) {
      return Value::integer(static_cast<int64_t>(*d));
    }
  }
  return fallback;
}

Result<Value> filter_float(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("float", args, {"default"}));
  if (v.is_number()) return Value::number(v.to_double());
  if (v.is_string()) {
    if (auto d = parse_python_float(v.as_string())) return Value::number(*d);
  }
  return bound[0].is_undefined() ? Value::number(0.0) : bound[0];
}

Result<Value> filter_abs(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("abs", args, {}));
  if (v.is_float()) return Value::number(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    if (v.to_int() == INT64_MIN) return Status(StatusCode::kOutOfRange, "integer overflow");
    return Value::integer(v.to_int() < 0 ? -v.to_int() : v.to_int());
  }
  return make_error(StatusCode::kInvalidArgument, "bad operand type for abs(): '{}'", v.type_name());
}

Result<Value> filter_round(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("round", args, {"precision", "method"}));
  int64_t precision = bound[0].is_int() ? bound[0].as_int() : 0;
  precision = std::clamp<int64_t>(precision, -300, 300);
  std::string method = bound[1].is_string() ? bound[1].as_string() : "common";
  if (!v.is_number()) {
    return make_error(StatusCode::kInvalidArgument, "round needs a number, not '{}'", v.type_name());
  }
  if (method == "common") {
    if (!v.is_float()) return Value::integer(v.to_int());  // Python's round() keeps ints
    double d = v.as_float();
    if (precision <= 0 || !std::isfinite(d)) {
      double scale = std::pow(10.0, static_cast<double>(-precision));
      return Value::number(std::nearbyint(d / scale) * scale);  // ties to even, like Python
    }
    // Correctly rounded decimal, as Python's round() gives for precision > 0.
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), d);
    return Value::number(std::strtod(buf, nullptr));
  }
  if (method != "ceil" && method != "floor") {
    return Status(StatusCode::kInvalidArgument, "method must be 'common', 'ceil' or 'floor'");
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double scaled = v.to_double() * scale;
  return Value::number((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

Result<Value> filter_tojson(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonDumpOptions options;
  options.ensure_ascii = bound[0].truthy();
  if (bound[1].is_int()) {
    options.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(bound[1].as_int(), 0, 64)), ' ');
  } else if (bound[1].is_string()) {
    options.indent = bound[1].as_string();
  } else if (!bound[1].is_none() && !bound[1].is_undefined()) {
    return Status(StatusCode::kInvalidArgument, "indent must be an integer, a string or none");
  }
  if (bound[2].is_list()) {
    const auto& seps = bound[2].as_list().items;
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      return Status(StatusCode::kInvalidArgument, "separators must be a pair of strings");
    }
    options.item_separator = seps[0].as_string();
    options.key_separator = seps[1].as_string();
  }
  options.sort_keys = bound[3].truthy();
  MOESERVE_ASSIGN_OR_RETURN(std::string text, dump_json(v, options));
  return text_result(interp, std::move(text));
}

Result<Value> filter_safe(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("safe", args, {}));
  if (v.is_string()) return v;  // autoescape is off, as in transformers: nothing to mark
  return text_result(interp, to_display_string(v));
}

}  // namespace

const std::vector<FilterEntry>& text_filters() {
  static const std::vector<FilterEntry> kFilters = {
      {"length", filter_length},
      {"count", filter_length},
      {"lower", string_transform<ascii_lower>},
      {"upper", string_transform<ascii_upper>},
      {"title", string_transform<jinja_title_filter>},
      {"capitalize", string_transform<py_capitalize>},
      {"trim", filter_trim},
      {"replace", filter_replace},
      {"string", filter_string},
      {"escape", filter_escape},
      {"e", filter_escape},
      {"indent", filter_indent},
      {"wordcount", filter_wordcount},
      {"default", filter_default},
      {"d", filter_default},
      {"int", filter_int},
      {"float", filter_float},
      {"abs", filter_abs},
      {"round", filter_round},
      {"tojson", filter_tojson},
      {"safe", filter_safe},
  };
  return kFilters;
}

FilterFn find_filter(std::string_view name) {
  for (const auto* table : {&text_filters(), &collection_filters()}) {
    for (const FilterEntry& entry : *table) {
      if (entry.name == name) return entry.fn;
    }
  }
  return nullptr;
}

}  // namespace moeserve::chat::jinja
