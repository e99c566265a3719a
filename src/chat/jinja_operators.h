// Python semantics of the expression operators: arithmetic, `in`, attribute
// and item access, slicing. Errors come back unlocated; the interpreter adds
// the line:column of the expression.
#pragma once

#include <string_view>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace moeserve::chat::jinja {

class Interpreter;

Result<Value> apply_binary(Interpreter& interp, BinaryOp op, const Value& a, const Value& b);
Result<Value> apply_unary(UnaryOp op, const Value& v);
// `needle in haystack`.
Result<bool> value_in(const Value& needle, const Value& haystack);
// obj[start:stop:step]; each bound may be none/undefined (omitted).
Result<Value> slice_value(Interpreter& interp, const Value& obj, const Value& start, const Value& stop,
                          const Value& step);
// `obj.name`: methods first, then dict keys / namespace attributes (Jinja2's
// getattr order). Missing attributes are undefined; reading from an undefined
// value is an error, as in Jinja2.
Result<Value> access_attribute(const Value& obj, std::string_view name);
// `obj[key]`: items first, then methods (Jinja2's getitem order).
Result<Value> access_item(const Value& obj, const Value& key);
// What a for-loop walks over: list items, dict keys, string characters;
// undefined iterates as empty (Jinja2's Undefined). Other types are an error.
Result<std::vector<Value>> iterate_value(const Value& v);
// Error for using an undefined value where a real one is needed.
Status undefined_error(const Value& v);

}  // namespace moeserve::chat::jinja
