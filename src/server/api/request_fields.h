// Internal to the request parsers: typed field readers over an already parsed
// JSON object. They report a bad field by throwing RequestError, which the
// public parse_* functions catch at their boundary (openai_request.cpp), so a
// validation step reads as one line instead of a chain of early returns.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "server/api/api_error.h"
#include "server/api/openai_request.h"

namespace moeserve::server::api::detail {

using ojson = nlohmann::ordered_json;

struct RequestError {
  ApiError error;
};

[[noreturn]] void fail(std::string message, std::string param);

// The field, or nullptr when it is absent or null.
const ojson* find_field(const ojson& object, std::string_view name);

// Each reader: nullopt when absent or null; throws RequestError naming
// `param` (default: the field name) when present with the wrong type or range.
std::optional<bool> read_bool(const ojson& object, std::string_view name, std::string param = {});
std::optional<std::string> read_string(const ojson& object, std::string_view name, std::string param = {});
// read_string for a field that must be there.
std::string required_string(const ojson& object, std::string_view name, const std::string& param);
// The translated APIs' function tools (anthropic.h, responses.h) as chat
// tools: each {name, description, <schema_field>} (with type "function"
// when require_function_type) becomes {"type": "function", "function":
// {name, description, parameters}}; a missing schema is an empty object's.
ojson chat_function_tools(const ojson& tools, std::string_view schema_field, bool require_function_type);
// `ok` checks the range; `expected` completes "'name' must be <expected>".
std::optional<double> read_number(const ojson& object, std::string_view name,
                                  const std::function<bool(double)>& ok, std::string_view expected);
std::optional<int64_t> read_integer(const ojson& object, std::string_view name, int64_t min, int64_t max,
                                    std::string_view expected);

// A token id array (each 0..INT32_MAX); throws with `param` otherwise.
std::vector<int32_t> read_token_ids(const ojson& array, const std::string& param);

enum class Endpoint { kChat, kCompletion };

GenerationParams read_generation_params(const ojson& body, Endpoint endpoint);

// messages -> the normalized list the chat template reads.
ojson read_chat_messages(const ojson& body);
// tools -> normalized list (null when absent or empty); tool_choice checked against it.
ojson read_tools(const ojson& body);
std::string read_tool_choice(const ojson& body, const ojson& tools);

}  // namespace moeserve::server::api::detail
