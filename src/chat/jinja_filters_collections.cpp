// Filters on sequences and mappings (Jinja2 semantics): first, last, reverse,
// sort, unique, list, items, dictsort, join, map, select/reject,
// selectattr/rejectattr, batch, sum, min, max, attr.
#include <algorithm>
#include <charconv>

#include "chat/jinja_builtins.h"
#include "chat/jinja_interpreter.h"
#include "chat/jinja_operators.h"
#include "chat/jinja_strings.h"

namespace moeserve::chat::jinja {
namespace {

Result<std::vector<Value>> bind(std::string_view name, CallArgs& args, const std::vector<std::string_view>& params) {
  return bind_arguments(name, args, params);
}

// Jinja2's attribute getter: "a.b.0" walks items/attributes, digits index.
Result<Value> get_path(Interpreter& interp, const Value& item, const Value& path) {
  if (path.is_int()) return interp.get_item(item, path);
  if (!path.is_string()) return Status(StatusCode::kInvalidArgument, "attribute must be a string");
  Value current = item;
  for (const std::string& part : py_split(path.as_string(), std::string("."), -1)) {
    int64_t index = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
    bool numeric = !part.empty() && ec == std::errc() && end == part.data() + part.size() && part[0] != '-';
    Value key = numeric ? Value::integer(index) : Value::string(part);
    MOESERVE_ASSIGN_OR_RETURN(current, interp.get_item(current, key));
  }
  return current;
}

// Sort/unique key: the attribute (if any), lower-cased when not case sensitive.
Result<Value> sort_key(Interpreter& interp, const Value& item, const Value& attribute, bool case_sensitive) {
  Value key = item;
  if (!attribute.is_undefined() && !attribute.is_none()) {
    MOESERVE_ASSIGN_OR_RETURN(key, get_path(interp, item, attribute));
  }
  if (!case_sensitive && key.is_string()) return Value::string(ascii_lower(key.as_string()));
  return key;
}

Result<Value> filter_first(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("first", args, {}));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_value(v));
  if (items.empty()) return Value::undefined("no first item, sequence was empty");
  return items.front();
}

Result<Value> filter_last(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("last", args, {}));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_value(v));
  if (items.empty()) return Value::undefined("no last item, sequence was empty");
  return items.back();
}

Result<Value> filter_reverse(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("reverse", args, {}));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_value(v));
  std::reverse(items.begin(), items.end());
  if (v.is_string()) {
    std::string out;
    for (const Value& c : items) out += c.as_string();
    return Value::string(std::move(out));
  }
  MOESERVE_RETURN_IF_ERROR(interp.charge_list(items.size()));
  return Value::list(std::move(items));
}

Result<Value> filter_list(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("list", args, {}));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_value(v));
  MOESERVE_RETURN_IF_ERROR(interp.charge_list(items.size()));
  return Value::list(std::move(items));
}

Result<Value> filter_sort(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("sort", args, {"reverse", "case_sensitive", "attribute"}));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_value(v));
  MOESERVE_RETURN_IF_ERROR(interp.charge_list(items.size() * 8));  // n log n comparisons
  std::vector<std::pair<Value, Value>> keyed;  // (key, item)
  for (Value& item : items) {
    MOESERVE_ASSIGN_OR_RETURN(Value key, sort_key(interp, item, bound[2], bound[1].truthy()));
    keyed.emplace_back(std::move(key), std::move(item));
  }
  Status failure;
  bool descending = bound[0].truthy();
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    Result<int> c = compare_values(a.first, b.first);
    if (!c.is_ok()) {
      if (failure.is_ok()) failure = c.status();
      return false;
    }
    return descending ? *c > 0 : *c < 0;
  });
  MOESERVE_RETURN_IF_ERROR(failure);
  std::vector<Value> out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value::list(std::move(out));
}

Result<Value> filter_unique(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("unique", args, {"case_sensitive", "attribute"}));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_value(v));
  MOESERVE_RETURN_IF_ERROR(interp.charge(items.size() * items.size() / 64));  // quadratic scan
  std::vector<Value> seen, out;
  for (Value& item : items) {
    MOESERVE_ASSIGN_OR_RETURN(Value key, sort_key(interp, item, bound[1], bound[0].truthy()));
    bool dup = std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, key); });
    if (dup) continue;
    seen.push_back(std::move(key));
    out.push_back(std::move(item));
  }
  return Value::list(std::move(out));
}

Result<Value> filter_items(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("items", args, {}));
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) {
    return make_error(StatusCode::kInvalidArgument, "can only get item pairs from a mapping, not '{}'", v.type_name());
  }
  MOESERVE_RETURN_IF_ERROR(interp.charge_list(v.as_dict().size()));
  std::vector<Value> pairs;
  for (const auto& [key, value] : v.as_dict().entries()) {
    pairs.push_back(Value::list({Value::string(key), value}, true));
  }
  return Value::list(std::move(pairs));
}

Result<Value> filter_dictsort(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("dictsort", args, {"case_sensitive", "by", "reverse"}));
  if (!v.is_dict()) return make_error(StatusCode::kInvalidArgument, "dictsort needs a mapping, not '{}'", v.type_name());
  bool by_value = bound[1].is_string() && bound[1].as_string() == "value";
  if (bound[1].is_string() && !by_value && bound[1].as_string() != "key") {
    return Status(StatusCode::kInvalidArgument, "'by' must be 'key' or 'value'");
  }
  std::vector<Value> pairs;
  for (const auto& [key, value] : v.as_dict().entries()) {
    pairs.push_back(Value::list({Value::string(key), value}, true));
  }
  CallArgs sort_args;
  sort_args.keyword.emplace_back("reverse", bound[2]);
  sort_args.keyword.emplace_back("case_sensitive", bound[0]);
  sort_args.keyword.emplace_back("attribute", Value::integer(by_value ? 1 : 0));
  return filter_sort(interp, Value::list(std::move(pairs)), sort_args);
}

Result<Value> filter_join(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("join", args, {"d", "attribute"}));
  std::string separator = bound[0].is_undefined() ? "" : to_display_string(bound[0]);
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_value(v));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += separator;
    Value item = items[i];
    if (!bound[1].is_undefined() && !bound[1].is_none()) {
      MOESERVE_ASSIGN_OR_RETURN(item, get_path(interp, item, bound[1]));
    }
    out += to_display_string(item);
    MOESERVE_RETURN_IF_ERROR(interp.charge_string(out.size()));
  }
  return Value::string(std::move(out));
}

Result<Value> filter_map(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_value(v));
  const Value* attribute = nullptr;
  Value default_value;
  for (const auto& [name, value] : args.keyword) {
    if (name == "attribute") attribute = &value;
    else if (name == "default") default_value = value;
  }
  std::vector<Value> out;
  if (attribute) {
    for (const Value& item : items) {
      MOESERVE_ASSIGN_OR_RETURN(Value mapped, get_path(interp, item, *attribute));
      out.push_back(mapped.is_undefined() && !default_value.is_undefined() ? default_value : mapped);
    }
    return Value::list(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return Status(StatusCode::kInvalidArgument, "map needs a filter name or attribute=");
  }
  std::string name = args.positional[0].as_string();
  FilterFn fn = find_filter(name);
  if (!fn) return make_error(StatusCode::kUnsupported, "unsupported filter '{}'", name);
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    CallArgs call_args = rest;
    MOESERVE_ASSIGN_OR_RETURN(Value mapped, fn(interp, item, call_args));
    out.push_back(std::move(mapped));
  }
  return Value::list(std::move(out));
}

// select / reject / selectattr / rejectattr share one implementation.
Result<Value> select_items(Interpreter& interp, const Value& v, CallArgs& args, bool by_attribute, bool keep_matches) {
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_value(v));
  size_t next_arg = 0;
  Value attribute;
  if (by_attribute) {
    if (args.positional.empty()) return Status(StatusCode::kInvalidArgument, "missing attribute name");
    attribute = args.positional[next_arg++];
  }
  TestFn test = nullptr;
  if (next_arg < args.positional.size()) {
    const Value& name = args.positional[next_arg++];
    if (!name.is_string()) return Status(StatusCode::kInvalidArgument, "test name must be a string");
    test = find_test(name.as_string());
    if (!test) return make_error(StatusCode::kUnsupported, "unsupported test '{}'", name.as_string());
  }
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next_arg), args.positional.end());
  test_args.keyword = args.keyword;
  std::vector<Value> out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attribute) {
      MOESERVE_ASSIGN_OR_RETURN(subject, get_path(interp, item, attribute));
    }
    bool match;
    if (test) {
      CallArgs call_args = test_args;
      MOESERVE_ASSIGN_OR_RETURN(match, test(interp, subject, call_args));
    } else {
      match = subject.truthy();
    }
    if (match == keep_matches) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Result<Value> filter_select(Interpreter& i, const Value& v, CallArgs& a) { return select_items(i, v, a, false, true); }
Result<Value> filter_reject(Interpreter& i, const Value& v, CallArgs& a) { return select_items(i, v, a, false, false); }
Result<Value> filter_selectattr(Interpreter& i, const Value& v, CallArgs& a) { return select_items(i, v, a, true, true); }
Result<Value> filter_rejectattr(Interpreter& i, const Value& v, CallArgs& a) { return select_items(i, v, a, true, false); }

Result<Value> filter_batch(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("batch", args, {"linecount", "fill_with"}));
  if (!bound[0].is_int() || bound[0].as_int() <= 0) {
    return Status(StatusCode::kInvalidArgument, "linecount must be a positive integer");
  }
  size_t size = static_cast<size_t>(bound[0].as_int());
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_value(v));
  MOESERVE_RETURN_IF_ERROR(interp.charge_list(items.size() + size));
  std::vector<Value> batches;
  for (size_t i = 0; i < items.size(); i += size) {
    std::vector<Value> batch(items.begin() + static_cast<std::ptrdiff_t>(i),
                             items.begin() + static_cast<std::ptrdiff_t>(std::min(items.size(), i + size)));
    if (!bound[1].is_undefined() && !bound[1].is_none()) {
      while (batch.size() < size) batch.push_back(bound[1]);
    }
    batches.push_back(Value::list(std::move(batch)));
  }
  return Value::list(std::move(batches));
}

Result<Value> filter_sum(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("sum", args, {"attribute", "start"}));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_value(v));
  Value total = bound[1].is_undefined() ? Value::integer(0) : bound[1];
  for (const Value& item : items) {
    Value term = item;
    if (!bound[0].is_undefined() && !bound[0].is_none()) {
      MOESERVE_ASSIGN_OR_RETURN(term, get_path(interp, item, bound[0]));
    }
    MOESERVE_ASSIGN_OR_RETURN(total, apply_binary(interp, BinaryOp::kAdd, total, term));
  }
  return total;
}

template <bool kMax>
Result<Value> filter_extreme(Interpreter& interp, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind(kMax ? "max" : "min", args, {"case_sensitive", "attribute"}));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_value(v));
  if (items.empty()) return Value::undefined("no aggregated item, sequence was empty");
  size_t best = 0;
  MOESERVE_ASSIGN_OR_RETURN(Value best_key, sort_key(interp, items[0], bound[1], bound[0].truthy()));
  for (size_t i = 1; i < items.size(); ++i) {
    MOESERVE_ASSIGN_OR_RETURN(Value key, sort_key(interp, items[i], bound[1], bound[0].truthy()));
    MOESERVE_ASSIGN_OR_RETURN(int c, compare_values(key, best_key));
    if (kMax ? c > 0 : c < 0) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}

// Python getattr() only: a dict's keys are not attributes (use [] for those).
Result<Value> filter_attr(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(auto bound, bind("attr", args, {"name"}));
  if (!bound[0].is_string()) return Status(StatusCode::kInvalidArgument, "attribute name must be a string");
  const std::string& name = bound[0].as_string();
  if (v.is_namespace()) {
    if (const Value* attr = v.as_namespace().attrs.find(name)) return *attr;
  } else if (std::optional<Value> method = bind_method(v, name)) {
    return *method;
  }
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", v.type_name(), name));
}

}  // namespace

const std::vector<FilterEntry>& collection_filters() {
  static const std::vector<FilterEntry> kFilters = {
      {"first", filter_first},         {"last", filter_last},
      {"reverse", filter_reverse},     {"list", filter_list},
      {"sort", filter_sort},           {"unique", filter_unique},
      {"items", filter_items},         {"dictsort", filter_dictsort},
      {"join", filter_join},           {"map", filter_map},
      {"select", filter_select},       {"reject", filter_reject},
      {"selectattr", filter_selectattr}, {"rejectattr", filter_rejectattr},
      {"batch", filter_batch},         {"sum", filter_sum},
      {"min", filter_extreme<false>},  {"max", filter_extreme<true>},
      {"attr", filter_attr},
  };
  return kFilters;
}

}  // namespace moeserve::chat::jinja
