// Methods callable on values (str.startswith, dict.items, ...) and the global
// functions chat templates use (range, namespace, dict, raise_exception,
// strftime_now). Mutating methods such as list.append are absent on purpose:
// transformers renders in Jinja2's immutable sandbox, which forbids them.
#include <algorithm>
#include <ctime>

#include "chat/jinja_builtins.h"
#include "chat/jinja_interpreter.h"
#include "chat/jinja_strings.h"

namespace moeserve::chat::jinja {
namespace {

constexpr std::string_view kStringMethods[] = {
    "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "replace", "upper",
    "lower", "title", "capitalize", "find", "rfind", "count", "join", "isdigit", "isalpha",
    "isalnum", "isspace", "islower", "isupper", "splitlines",
};
constexpr std::string_view kDictMethods[] = {"items", "keys", "values", "get"};
// Not a type's method, but called as `loop.cycle(...)` (a key of the loop object).
constexpr std::string_view kOtherCallableAttributes[] = {"cycle"};

template <size_t N>
bool in_list(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

Result<std::optional<std::string>> optional_string_arg(const Value& v, std::string_view what) {
  if (v.is_undefined() || v.is_none()) return std::optional<std::string>();
  if (!v.is_string()) {
    return make_error(StatusCode::kInvalidArgument, "{} must be a string or none, not '{}'", what, v.type_name());
  }
  return std::optional<std::string>(v.as_string());
}

Result<int64_t> int_arg(const Value& v, int64_t fallback, std::string_view what) {
  if (v.is_undefined() || v.is_none()) return fallback;
  if (v.is_int() || v.is_bool()) return v.to_int();
  return make_error(StatusCode::kInvalidArgument, "{} must be an integer, not '{}'", what, v.type_name());
}

Value string_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& p : parts) items.push_back(Value::string(std::move(p)));
  return Value::list(std::move(items));
}

// startswith/endswith: prefix may be a tuple of alternatives.
Result<Value> affix_test(const std::string& s, const Value& affix, bool at_start) {
  std::vector<Value> options = affix.is_list() ? affix.as_list().items : std::vector<Value>{affix};
  for (const Value& option : options) {
    if (!option.is_string()) {
      return make_error(StatusCode::kInvalidArgument, "{}() argument must be str or a tuple of str, not '{}'",
                        at_start ? "startswith" : "endswith", option.type_name());
    }
    const std::string& a = option.as_string();
    bool hit = a.size() <= s.size() &&
               (at_start ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0);
    if (hit) return Value::boolean(true);
  }
  return Value::boolean(false);
}

template <bool (*Pred)(unsigned char)>
Value char_class(const std::string& s) {
  if (s.empty()) return Value::boolean(false);
  return Value::boolean(std::all_of(s.begin(), s.end(), [](char c) { return Pred(static_cast<unsigned char>(c)); }));
}
bool is_digit_char(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_alpha_char(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80; }
bool is_alnum_char(unsigned char c) { return is_digit_char(c) || is_alpha_char(c); }

Result<Value> call_string_method(Interpreter& interp, const std::string& s, std::string_view name, CallArgs& args) {
  auto bind = [&](std::vector<std::string_view> params) { return bind_arguments(name, args, params); };
  if (name == "startswith" || name == "endswith") {
    MOESERVE_ASSIGN_OR_RETURN(auto a, bind({"prefix"}));
    return affix_test(s, a[0], name == "startswith");
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    MOESERVE_ASSIGN_OR_RETURN(auto a, bind({"chars"}));
    MOESERVE_ASSIGN_OR_RETURN(auto chars, optional_string_arg(a[0], "chars"));
    return Value::string(py_strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    MOESERVE_ASSIGN_OR_RETURN(auto a, bind({"sep", "maxsplit"}));
    MOESERVE_ASSIGN_OR_RETURN(auto sep, optional_string_arg(a[0], "sep"));
    if (sep && sep->empty()) return Status(StatusCode::kInvalidArgument, "empty separator");
    MOESERVE_ASSIGN_OR_RETURN(int64_t maxsplit, int_arg(a[1], -1, "maxsplit"));
    std::vector<std::string> parts = name == "split" ? py_split(s, sep, maxsplit) : py_rsplit(s, sep, maxsplit);
    MOESERVE_RETURN_IF_ERROR(interp.charge_list(parts.size()));
    return string_list(std::move(parts));
  }
  if (name == "splitlines") {
    MOESERVE_ASSIGN_OR_RETURN(auto a, bind({}));
    std::vector<std::string> parts = py_split(s, std::string("\n"), -1);
    if (!parts.empty() && parts.back().empty()) parts.pop_back();
    return string_list(std::move(parts));
  }
  if (name == "replace") {
    MOESERVE_ASSIGN_OR_RETURN(auto a, bind({"old", "new", "count"}));
    if (!a[0].is_string() || !a[1].is_string()) return Status(StatusCode::kInvalidArgument, "replace() needs strings");
    MOESERVE_ASSIGN_OR_RETURN(int64_t count, int_arg(a[2], -1, "count"));
    std::string out = py_replace(s, a[0].as_string(), a[1].as_string(), count);
    MOESERVE_RETURN_IF_ERROR(interp.charge_string(out.size()));
    return Value::string(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    MOESERVE_ASSIGN_OR_RETURN(auto a, bind({"sub"}));
    if (!a[0].is_string()) return make_error(StatusCode::kInvalidArgument, "{}() needs a string", name);
    if (name == "count") return Value::integer(py_count(s, a[0].as_string()));
    return Value::integer(py_find(s, a[0].as_string(), name == "rfind"));
  }
  if (name == "join") {
    MOESERVE_ASSIGN_OR_RETURN(auto a, bind({"iterable"}));
    if (!a[0].is_list()) return Status(StatusCode::kInvalidArgument, "join() needs a list of strings");
    std::string out;
    bool first = true;
    for (const Value& item : a[0].as_list().items) {
      if (!item.is_string()) return Status(StatusCode::kInvalidArgument, "join() needs a list of strings");
      if (!first) out += s;
      first = false;
      out += item.as_string();
      MOESERVE_RETURN_IF_ERROR(interp.charge_string(out.size()));
    }
    return Value::string(std::move(out));
  }
  MOESERVE_ASSIGN_OR_RETURN(auto none, bind({}));
  if (name == "upper") return Value::string(ascii_upper(s));
  if (name == "lower") return Value::string(ascii_lower(s));
  if (name == "title") return Value::string(py_title_method(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "isdigit") return char_class<is_digit_char>(s);
  if (name == "isalpha") return char_class<is_alpha_char>(s);
  if (name == "isalnum") return char_class<is_alnum_char>(s);
  if (name == "isspace") {
    return Value::boolean(!s.empty() && py_strip(s, std::nullopt, true, true).empty());
  }
  if (name == "islower" || name == "isupper") {
    bool want_upper = name == "isupper", any = false;
    for (char c : s) {
      bool lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
      if (want_upper ? lower : upper) return Value::boolean(false);
      any = any || lower || upper;
    }
    return Value::boolean(any);
  }
  return make_error(StatusCode::kInternal, "unhandled str method '{}'", name);
}

Result<Value> call_dict_method(const DictData& dict, std::string_view name, CallArgs& args) {
  if (name == "get") {
    MOESERVE_ASSIGN_OR_RETURN(auto a, bind_arguments(name, args, {"key", "default"}));
    const Value* found = a[0].is_string() ? dict.find(a[0].as_string()) : nullptr;
    if (found) return *found;
    return a[1].is_undefined() ? Value::none() : a[1];
  }
  MOESERVE_ASSIGN_OR_RETURN(auto none, bind_arguments(name, args, {}));
  std::vector<Value> out;
  for (const auto& [key, value] : dict.entries()) {
    if (name == "items") out.push_back(Value::list({Value::string(key), value}, true));
    else if (name == "keys") out.push_back(Value::string(key));
    else out.push_back(value);
  }
  return Value::list(std::move(out));
}

class BoundMethod : public Callable {
 public:
  BoundMethod(Value receiver, std::string_view name) : receiver_(std::move(receiver)), name_(name) {}
  std::string name() const override { return std::string(receiver_.type_name()) + "." + std::string(name_); }
  Result<Value> call(Interpreter& interp, CallArgs& args) const override {
    if (receiver_.is_string()) return call_string_method(interp, receiver_.as_string(), name_, args);
    return call_dict_method(receiver_.as_dict(), name_, args);
  }

 private:
  Value receiver_;
  std::string_view name_;  // points into the static method tables
};

// ---- globals ----------------------------------------------------------------------

using GlobalFn = Result<Value> (*)(Interpreter&, CallArgs&);

class GlobalFunction : public Callable {
 public:
  GlobalFunction(std::string_view name, GlobalFn fn) : name_(name), fn_(fn) {}
  std::string name() const override { return std::string(name_); }
  Result<Value> call(Interpreter& interp, CallArgs& args) const override { return fn_(interp, args); }

 private:
  std::string_view name_;
  GlobalFn fn_;
};

Result<Value> global_range(Interpreter& interp, CallArgs& args) {
  if (!args.keyword.empty() || args.positional.empty() || args.positional.size() > 3) {
    return Status(StatusCode::kInvalidArgument, "range() takes 1 to 3 integer arguments");
  }
  for (const Value& v : args.positional) {
    if (!v.is_int() && !v.is_bool()) {
      return make_error(StatusCode::kInvalidArgument, "range() arguments must be integers, not '{}'", v.type_name());
    }
  }
  int64_t start = 0, stop, step = 1;
  if (args.positional.size() == 1) {
    stop = args.positional[0].to_int();
  } else {
    start = args.positional[0].to_int();
    stop = args.positional[1].to_int();
    if (args.positional.size() == 3) step = args.positional[2].to_int();
  }
  if (step == 0) return Status(StatusCode::kInvalidArgument, "range() step must not be zero");
  // Count without overflow before materializing anything.
  __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
  __int128 abs_step = step > 0 ? step : -static_cast<__int128>(step);
  __int128 count = span <= 0 ? 0 : (span + abs_step - 1) / abs_step;
  if (count > static_cast<__int128>(interp.limits().max_list_items)) {
    return make_error(StatusCode::kOutOfRange, "range() of {} items exceeds the limit of {}",
                      static_cast<long long>(std::min<__int128>(count, INT64_MAX)), interp.limits().max_list_items);
  }
  MOESERVE_RETURN_IF_ERROR(interp.charge_list(static_cast<size_t>(count)));
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(count));
  for (__int128 i = 0; i < count; ++i) items.push_back(Value::integer(static_cast<int64_t>(start + i * step)));
  return Value::list(std::move(items));
}

Result<DictData> keyword_dict(std::string_view fn, CallArgs& args) {
  DictData dict;
  if (args.positional.size() > 1) return make_error(StatusCode::kInvalidArgument, "{}() takes at most one mapping", fn);
  if (!args.positional.empty()) {
    if (!args.positional[0].is_dict()) {
      return make_error(StatusCode::kInvalidArgument, "{}() positional argument must be a mapping", fn);
    }
    for (const auto& [key, value] : args.positional[0].as_dict().entries()) dict.set(key, value);
  }
  for (auto& [key, value] : args.keyword) dict.set(key, std::move(value));
  return dict;
}

Result<Value> global_namespace(Interpreter& interp, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(DictData attrs, keyword_dict("namespace", args));
  Value ns = Value::new_namespace(std::move(attrs));
  interp.track_namespace(ns.namespace_ptr());
  return ns;
}

Result<Value> global_dict(Interpreter&, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(DictData dict, keyword_dict("dict", args));
  return Value::dict(std::move(dict));
}

Result<Value> global_raise_exception(Interpreter&, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto a, bind_arguments("raise_exception", args, {"message"}));
  return Status(StatusCode::kInvalidArgument, to_display_string(a[0]));
}

// strftime_now(format): the render time in UTC (transformers uses local time;
// a server's clock zone should not change prompts).
Result<Value> global_strftime_now(Interpreter& interp, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto a, bind_arguments("strftime_now", args, {"format"}));
  if (!a[0].is_string()) return Status(StatusCode::kInvalidArgument, "strftime_now() needs a format string");
  const std::string& format = a[0].as_string();
  if (format.size() > 256) return Status(StatusCode::kInvalidArgument, "strftime_now() format is too long");
  std::time_t t = static_cast<std::time_t>(interp.now_unix_seconds());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[2048];
  size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &tm);
  if (n == 0 && !format.empty()) return Status(StatusCode::kInvalidArgument, "strftime_now() result is too long");
  return Value::string(std::string(buf, n));
}

struct GlobalEntry {
  std::string_view name;
  Value value;
};

const std::vector<GlobalEntry>& globals() {
  static const std::vector<GlobalEntry> kGlobals = [] {
    std::vector<GlobalEntry> g;
    auto add = [&](std::string_view name, GlobalFn fn) {
      g.push_back({name, Value::callable(std::make_shared<GlobalFunction>(name, fn))});
    };
    add("range", global_range);
    add("namespace", global_namespace);
    add("dict", global_dict);
    add("raise_exception", global_raise_exception);
    add("strftime_now", global_strftime_now);
    return g;
  }();
  return kGlobals;
}

}  // namespace

bool is_known_method(std::string_view name) {
  return in_list(kStringMethods, name) || in_list(kDictMethods, name) || in_list(kOtherCallableAttributes, name);
}

std::optional<Value> bind_method(const Value& receiver, std::string_view name) {
  auto bound = [&](const std::string_view* begin, const std::string_view* end) -> std::optional<Value> {
    const std::string_view* it = std::find(begin, end, name);
    if (it == end) return std::nullopt;
    return Value::callable(std::make_shared<BoundMethod>(receiver, *it));
  };
  if (receiver.is_string()) return bound(std::begin(kStringMethods), std::end(kStringMethods));
  if (receiver.is_dict()) return bound(std::begin(kDictMethods), std::end(kDictMethods));
  return std::nullopt;
}

std::optional<Value> lookup_global(std::string_view name) {
  for (const GlobalEntry& entry : globals()) {
    if (entry.name == name) return entry.value;
  }
  return std::nullopt;
}

}  // namespace moeserve::chat::jinja
