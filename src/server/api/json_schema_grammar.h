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
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace moeserve::server::api {

struct SchemaGrammarLimits {
  int max_depth = 64;         // nesting of schemas (not of $ref recursion, which is a rule)
  size_t max_rules = 4096;    // rules the schema may produce
  int64_t max_repeat = 4096;  // minItems / maxItems / minLength / maxLength bounds
};

// The GBNF of every JSON text the schema accepts (within the limits above);
// its root rule is `root`.
Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                        const SchemaGrammarLimits& limits = {});

// Several schemas in one grammar (a request's strict tools): each becomes
// the rule `name`; the rules they need are named apart and the building
// blocks (ws, string, value, ...) are written once. Errors name `path`
// ("tools[1].function.parameters.properties.city").
struct SchemaRule {
  std::string name;
  const nlohmann::ordered_json* schema = nullptr;
  std::string path;
};
// `reserved`: the caller's own rule names, which the schemas' rules avoid.
// The result has no root rule unless a SchemaRule is named "root".
Result<std::string> json_schema_rules(std::span<const SchemaRule> schemas,
                                      const std::set<std::string>& reserved,
                                      const SchemaGrammarLimits& limits = {});

// Bytes as a GBNF string literal ("\"" for a quote, \x.. for control bytes).
std::string gbnf_literal(std::string_view bytes);

}  // namespace moeserve::server::api
