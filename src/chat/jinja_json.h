// JSON in and out of the chat-template engine.
//
// `tojson` must match what transformers renders, because the tool list is
// printed into the prompt with it: Python's json.dumps with
// ensure_ascii=False, separators ", " and ": " (or "," and ": " once an
// indent is given), keys in insertion order unless sort_keys, floats in
// Python's repr form.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "chat/jinja_value.h"

namespace moeserve::chat::jinja {

struct JsonDumpOptions {
  std::optional<std::string> indent;  // nullopt: everything on one line
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::optional<std::string> item_separator;  // default ", " (or "," with indent)
  std::string key_separator = ": ";
};

// Fails for values JSON cannot hold: undefined, namespaces, macros.
Result<std::string> dump_json(const Value& value, const JsonDumpOptions& options = {});

// Converts request JSON into template values; `max_nesting` bounds how deep
// arrays and objects may nest (deeper input is rejected, not recursed into).
Result<Value> value_from_json(const nlohmann::ordered_json& json, uint32_t max_nesting);

}  // namespace moeserve::chat::jinja
