// `is` tests, with Jinja2's semantics (including its quirks: a bool is a
// number, an undefined value is iterable, a dict is a sequence).
#include <algorithm>
#include <cmath>
#include <string_view>

#include "chat/jinja_builtins.h"
#include "chat/jinja_interpreter.h"
#include "chat/jinja_operators.h"

namespace moeserve::chat::jinja {
namespace {

Status no_args(std::string_view name, const CallArgs& args) {
  if (args.positional.empty() && args.keyword.empty()) return Status::ok();
  return make_error(StatusCode::kInvalidArgument, "'{}' takes no arguments", name);
}

// The single argument of a comparison-style test.
Result<Value> one_arg(std::string_view name, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> bound, bind_arguments(name, args, {"other"}));
  return bound[0];
}

#define SIMPLE_TEST(fn_name, test_name, expr)                              \
  Result<bool> fn_name(Interpreter&, const Value& v, CallArgs& args) {     \
    MOESERVE_RETURN_IF_ERROR(no_args(test_name, args));                    \
    return (expr);                                                         \
  }

SIMPLE_TEST(test_defined, "defined", !v.is_undefined())
SIMPLE_TEST(test_undefined, "undefined", v.is_undefined())
SIMPLE_TEST(test_none, "none", v.is_none())
SIMPLE_TEST(test_string, "string", v.is_string())
SIMPLE_TEST(test_number, "number", v.is_number())
SIMPLE_TEST(test_integer, "integer", v.is_int())
SIMPLE_TEST(test_float, "float", v.is_float())
SIMPLE_TEST(test_boolean, "boolean", v.is_bool())
SIMPLE_TEST(test_mapping, "mapping", v.is_dict())
SIMPLE_TEST(test_iterable, "iterable", v.is_string() || v.is_list() || v.is_dict() || v.is_undefined())
SIMPLE_TEST(test_sequence, "sequence", v.is_string() || v.is_list() || v.is_dict() || v.is_undefined())
SIMPLE_TEST(test_callable, "callable", v.is_callable())
SIMPLE_TEST(test_true, "true", v.is_bool() && v.as_bool())
SIMPLE_TEST(test_false, "false", v.is_bool() && !v.as_bool())
SIMPLE_TEST(test_escaped, "escaped", false)

bool all_cased(const Value& v, bool want_upper) {
  if (!v.is_string()) return false;
  bool any_cased = false;
  for (char c : v.as_string()) {
    bool lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
    if (want_upper ? lower : upper) return false;
    any_cased = any_cased || lower || upper;
  }
  return any_cased;
}
SIMPLE_TEST(test_lower, "lower", all_cased(v, false))
SIMPLE_TEST(test_upper, "upper", all_cased(v, true))

#undef SIMPLE_TEST

Result<double> numeric_operand(std::string_view test, const Value& v) {
  if (v.is_number()) return v.to_double();
  if (v.is_undefined()) return undefined_error(v);
  return make_error(StatusCode::kInvalidArgument, "'{}' needs a number, not '{}'", test, v.type_name());
}

Result<bool> test_odd(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_RETURN_IF_ERROR(no_args("odd", args));
  MOESERVE_ASSIGN_OR_RETURN(double d, numeric_operand("odd", v));
  double m = std::fmod(d, 2.0);
  return m == 1.0 || m == -1.0;
}

Result<bool> test_even(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_RETURN_IF_ERROR(no_args("even", args));
  MOESERVE_ASSIGN_OR_RETURN(double d, numeric_operand("even", v));
  return std::fmod(d, 2.0) == 0.0;
}

Result<bool> test_divisibleby(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> bound, bind_arguments("divisibleby", args, {"num"}));
  MOESERVE_ASSIGN_OR_RETURN(double d, numeric_operand("divisibleby", v));
  MOESERVE_ASSIGN_OR_RETURN(double n, numeric_operand("divisibleby", bound[0]));
  if (n == 0) return Status(StatusCode::kInvalidArgument, "division by zero");
  return std::fmod(d, n) == 0.0;
}

Result<bool> test_eq(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(Value other, one_arg("equalto", args));
  return values_equal(v, other);
}

Result<bool> test_ne(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(Value other, one_arg("ne", args));
  return !values_equal(v, other);
}

// Python's `is`: identity for objects; for the singletons and small scalars a
// template can write (none, true, false, numbers, strings), equality of the
// same type is what identity amounts to.
Result<bool> test_sameas(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(Value other, one_arg("sameas", args));
  if (v.kind() != other.kind()) return false;
  if (v.is_list()) return &v.as_list() == &other.as_list();
  if (v.is_dict()) return &v.as_dict() == &other.as_dict();
  return values_equal(v, other);
}

template <int kWant>  // -1: <, -2: <=, 1: >, 2: >=
Result<bool> test_order(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(Value other, one_arg("comparison", args));
  MOESERVE_ASSIGN_OR_RETURN(int c, compare_values(v, other));
  switch (kWant) {
    case -1: return c < 0;
    case -2: return c <= 0;
    case 1: return c > 0;
    default: return c >= 0;
  }
}

Result<bool> test_in(Interpreter&, const Value& v, CallArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Value> bound, bind_arguments("in", args, {"seq"}));
  return value_in(v, bound[0]);
}

struct TestEntry {
  std::string_view name;
  TestFn fn;
};

const TestEntry kTests[] = {
    {"defined", test_defined},     {"undefined", test_undefined}, {"none", test_none},
    {"string", test_string},       {"number", test_number},       {"integer", test_integer},
    {"float", test_float},         {"boolean", test_boolean},     {"mapping", test_mapping},
    {"iterable", test_iterable},   {"sequence", test_sequence},   {"callable", test_callable},
    {"true", test_true},           {"false", test_false},         {"escaped", test_escaped},
    {"lower", test_lower},         {"upper", test_upper},         {"odd", test_odd},
    {"even", test_even},           {"divisibleby", test_divisibleby},
    {"equalto", test_eq},          {"eq", test_eq},               {"sameas", test_sameas},
    {"ne", test_ne},               {"lt", test_order<-1>},        {"lessthan", test_order<-1>},
    {"le", test_order<-2>},        {"gt", test_order<1>},         {"greaterthan", test_order<1>},
    {"ge", test_order<2>},         {"in", test_in},
};

}  // namespace

TestFn find_test(std::string_view name) {
  for (const TestEntry& entry : kTests) {
    if (entry.name == name) return entry.fn;
  }
  return nullptr;
}

}  // namespace moeserve::chat::jinja
