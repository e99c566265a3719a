// JSON Schema -> GBNF (runtime/grammar/gbnf.h): structured output for
// response_format json_schema, Responses' text.format and strict tools.
//
// What clients send in practice is covered: objects with properties
// (required and optional, in the schema's order; additionalProperties
// false, absent or true — only the declared properties are generated, which
// every such schema accepts), arrays with items, minItems and maxItems,
// enum, const, string (minLength, maxLength, format date, time, date-time,
// uuid), number, integer, boolean, null, a list of types, anyOf / oneOf,
// a one-schema allOf, $ref to #/$defs/... or #/definitions/... (recursion
// allowed) and the empty schema (any JSON value). Annotations (title,
// description, default, examples, $schema, $id, $comment, deprecated,
// readOnly, writeOnly) are ignored. Any other keyword is refused with a
// message that names it and where it is ("unsupported keyword 'pattern' at
// schema.properties.zip"): the client learns its answer would not be
// guaranteed to match, instead of getting one that does not.
//
// The JSON is compact-ish: at most a few whitespace bytes between tokens,
// numbers of bounded length, so a model cannot run on inside one value.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace moeserve::server::api {

struct SchemaGrammarLimits {
  int max_depth = 64;           // nesting of schemas (not of $ref recursion, which is a rule)
  size_t max_rules = 4096;      // rules the schema may produce
  int64_t max_repeat = 4096;    // minItems / maxItems / minLength / maxLength bounds
};

// The GBNF of every JSON text the schema accepts (within the limits above);
// its root rule is `root`.
Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema, const SchemaGrammarLimits& limits = {});

}  // namespace moeserve::server::api
