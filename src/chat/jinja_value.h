// Runtime values of the chat-template engine.
//
// The engine renders Hugging Face chat templates, which are written for
// Python's Jinja2 as configured by transformers. Values therefore follow
// Python semantics: ints and floats are distinct, bool counts as an int in
// arithmetic, lists and dicts are shared by reference (so `namespace` objects
// can be mutated through any alias), and dicts keep insertion order because
// `tojson` must reproduce the key order of the request.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "core/status.h"

namespace moeserve::chat::jinja {

class Value;
class Callable;
class Interpreter;
class DictData;
struct ListData;
struct NamespaceData;

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable
  };

  Value() = default;  // undefined, with no name
  static Value undefined(std::string name) { return Value(Undefined{std::move(name)}); }
  static Value none() { return Value(nullptr); }
  static Value boolean(bool b) { return Value(b); }
  static Value integer(int64_t i) { return Value(i); }
  static Value number(double d) { return Value(d); }
  static Value string(std::string s) { return Value(std::move(s)); }
  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value dict(DictData data);
  // Wraps a dict the caller keeps and updates in place; `nesting` must
  // already be set on it.
  static Value shared_dict(std::shared_ptr<DictData> data) { return Value(std::move(data)); }
  static Value new_namespace(DictData attrs);
  static Value callable(std::shared_ptr<const Callable> fn);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // Python's numbers.Number: bool is an int subclass.
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  // Numeric view for int, float or bool (callers check is_number()).
  double to_double() const;
  // Integer view for int or bool (callers check).
  int64_t to_int() const { return is_bool() ? (as_bool() ? 1 : 0) : as_int(); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const ListData& as_list() const;
  const DictData& as_dict() const;
  NamespaceData& as_namespace() const;
  const std::shared_ptr<NamespaceData>& namespace_ptr() const { return std::get<std::shared_ptr<NamespaceData>>(data_); }
  const Callable& as_callable() const;
  // The name an undefined value was looked up under, for error messages.
  const std::string& undefined_name() const { return std::get<Undefined>(data_).name; }

  // How deeply containers nest in this value: 0 for scalars, 1 for a flat
  // list or dict. Namespaces count as 1: they are never walked recursively.
  uint32_t nesting() const;

  // Python truthiness.
  bool truthy() const;
  // Python type name, for error messages ("str", "int", "dict", ...).
  const char* type_name() const;

 private:
  struct Undefined {
    std::string name;
  };
  template <typename T>
  explicit Value(T v) : data_(std::move(v)) {}

  // Order must match Kind.
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string,
               std::shared_ptr<ListData>, std::shared_ptr<DictData>,
               std::shared_ptr<NamespaceData>, std::shared_ptr<const Callable>>
      data_;
};

// Insertion-ordered string-keyed map. Chat messages and tool schemas are small
// objects, so lookups scan linearly until the map grows past a few entries and
// only then build a hash index.
class DictData {
 public:
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value value);
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  // In-place update of the value at a position of entries() (for the loop
  // object, which changes every iteration like Jinja2's LoopContext).
  Value& value_at(size_t index);

  // Containers nested inside (1 for a dict of scalars); set by Value::dict.
  uint32_t nesting = 1;

 private:
  static constexpr size_t kIndexThreshold = 16;
  size_t find_index(std::string_view key) const;  // entries_.size() when absent

  std::vector<std::pair<std::string, Value>> entries_;
  std::unordered_map<std::string, size_t> index_;  // only once size() > kIndexThreshold
};

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;  // only changes how the value prints: (1, 2) vs [1, 2]
  uint32_t nesting = 1;   // containers nested inside; set by Value::list
};

// `namespace(...)`: the one mutable object templates may assign into
// (`{% set ns.attr = ... %}`), used to carry state out of loops.
struct NamespaceData {
  DictData attrs;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Something a template can call: a macro, a builtin global, a bound method.
class Callable {
 public:
  virtual ~Callable() = default;
  virtual std::string name() const = 0;
  virtual Result<Value> call(Interpreter& interp, CallArgs& args) const = 0;
};

inline const ListData& Value::as_list() const { return *std::get<std::shared_ptr<ListData>>(data_); }
inline const DictData& Value::as_dict() const { return *std::get<std::shared_ptr<DictData>>(data_); }
inline NamespaceData& Value::as_namespace() const { return *std::get<std::shared_ptr<NamespaceData>>(data_); }
inline const Callable& Value::as_callable() const { return *std::get<std::shared_ptr<const Callable>>(data_); }

// Python `==`: deep, with 1 == 1.0 == True; undefined equals only undefined.
bool values_equal(const Value& a, const Value& b);
// Python `<` for numbers, strings (code-point order) and lists; an error for
// other combinations. Returns -1, 0 or 1.
Result<int> compare_values(const Value& a, const Value& b);

// Python str(): what `{{ value }}` prints. Undefined prints as "".
std::string to_display_string(const Value& v);
// Python repr(): used for strings inside printed lists and dicts.
std::string to_repr(const Value& v);
// Python float repr: shortest round-trip digits, "1.0", "1e+16", "inf".
std::string format_python_float(double d);

// Binds call arguments to parameter names (positional first, then keyword),
// like a Python signature. Missing parameters come back undefined.
Result<std::vector<Value>> bind_arguments(std::string_view function_name, CallArgs& args,
                                          const std::vector<std::string_view>& params);

}  // namespace moeserve::chat::jinja
