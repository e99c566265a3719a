// Reading an HTTP request body as JSON without trusting it: a nesting-depth
// scan runs before nlohmann's parser (which recurses once per level, so a
// body of 100k '[' would overflow the stack), and every parser exception is
// turned into an ApiError value.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "server/api/api_error.h"

namespace moeserve::server::api {

// The result of parsing a request: a value, or the error to answer with.
template <class T>
struct Parsed {
  std::optional<T> value;
  ApiError error;

  bool ok() const { return value.has_value(); }
};

// Deeper bodies are rejected before parsing. OpenAI bodies need ~10 levels
// (tool parameter schemas a few more); 64 leaves plenty of room.
inline constexpr int kMaxJsonDepth = 64;

// The deepest nesting of [ and { in `text`, counting only brackets outside
// string literals. Does not validate the JSON; stops counting (returns early)
// once `limit` is exceeded, so the scan is O(n) with no allocation.
int json_nesting_depth(std::string_view text, int limit = kMaxJsonDepth);

// Parses `text` as JSON (keys keep their order: tool schemas are rendered into
// the prompt as written). Errors: 400 naming the byte position of a syntax
// error, or the depth limit. Never throws.
Parsed<nlohmann::ordered_json> parse_json_text(std::string_view text, int max_depth = kMaxJsonDepth);

// parse_json_text, and the result must be a JSON object.
Parsed<nlohmann::ordered_json> parse_json_object_body(std::string_view body);

}  // namespace moeserve::server::api
