// Builtin filters, tests, methods and globals of the chat-template engine.
//
// The parser resolves filter and test names when it reads the template, so an
// unsupported one is reported at parse time with its position rather than
// when a request happens to reach it.
#pragma once

#include <optional>
#include <string_view>

#include "chat/jinja_value.h"

namespace moeserve::chat::jinja {

class Interpreter;

using FilterFn = Result<Value> (*)(Interpreter& interp, const Value& input, CallArgs& args);
using TestFn = Result<bool> (*)(Interpreter& interp, const Value& input, CallArgs& args);

// nullptr when the name is not a supported filter / test.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

// Whether `name` is a method of some supported type (str, dict, loop); the
// parser rejects calls of any other `x.name(...)`.
bool is_known_method(std::string_view name);
// `receiver.name` when it names a method of the receiver's type: a callable
// bound to the receiver. nullopt when the type has no such method.
std::optional<Value> bind_method(const Value& receiver, std::string_view name);

// Builtin global functions: range, namespace, dict, raise_exception,
// strftime_now. nullopt for other names.
std::optional<Value> lookup_global(std::string_view name);

// Filter tables, one per implementation file (find_filter searches them all).
struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};
const std::vector<FilterEntry>& text_filters();
const std::vector<FilterEntry>& collection_filters();

}  // namespace moeserve::chat::jinja
