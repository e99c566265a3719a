// JSON Schema -> GBNF (server/api/json_schema_grammar.h), checked through
// the grammar engine: documents the schema accepts pass byte by byte and
// end complete; documents it refuses stop somewhere or end incomplete; every
// unsupported keyword is refused by name and place.
#include "server/api/json_schema_grammar.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/grammar/gbnf.h"
#include "runtime/grammar/matcher.h"

namespace moeserve::server::api {
namespace {

using ojson = nlohmann::ordered_json;
using runtime::grammar::GrammarState;

std::shared_ptr<const runtime::grammar::Grammar> compile(const std::string& schema_text) {
  Result<std::string> gbnf = json_schema_to_gbnf(ojson::parse(schema_text));
  EXPECT_TRUE(gbnf.is_ok()) << gbnf.status().message();
  if (!gbnf.is_ok()) return nullptr;
  auto g = runtime::grammar::parse_gbnf(*gbnf);
  EXPECT_TRUE(g.is_ok()) << g.status().message() << "\n" << *gbnf;
  return g.is_ok() ? *g : nullptr;
}

bool accepts(const std::shared_ptr<const runtime::grammar::Grammar>& g, const std::string& doc) {
  GrammarState s(g);
  return s.feed_all(doc) && s.complete();
}

struct Case {
  const char* schema;
  std::vector<const char*> good, bad;
};

TEST(JsonSchemaGrammar, AcceptsWhatTheSchemaAcceptsAndNothingElse) {
  const Case cases[] = {
      {R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
           "required": ["name", "age"], "additionalProperties": false})",
       {R"({"name": "Ada", "age": 36})", R"({"name":"","age":-5})",
        "{\n  \"name\": \"\\u00e9\\n\",\n  \"age\": 0\n}"},
       {R"({"age": 36, "name": "Ada"})", R"({"name": "Ada"})", R"({"name": "Ada", "age": 3.5})",
        R"({"name": "Ada", "age": 36, "x": 1})", R"({"name": 1, "age": 2})",
        R"({"name": "Ada", "age": 012})"}},
      // Optional properties may go; the order stays.
      {R"({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"type": "number"}},
           "required": ["b"]})",
       {R"({"b": null})", R"({"a": true, "b": null})", R"({"b": null, "c": 1.5e3})",
        R"({"a": false, "b": null, "c": -0.25})"},
       {R"({})", R"({"a": true})", R"({"b": null, "a": true})", R"({"a": true,, "b": null})",
        R"({"b": null,})"}},
      {R"({"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "string"}}})",
       {R"({})", R"({"x": "1"})", R"({"y": "2"})", R"({"x": "1", "y": "2"})"},
       {R"({"y": "2", "x": "1"})", R"({,"y": "2"})"}},
      {R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})",
       {"[1, 2]", "[1,2,3]", "[ 0 , -1 ]"},
       {"[]", "[1]", "[1, 2, 3, 4]", "[1, \"2\"]"}},
      {R"({"type": "array", "items": {"enum": ["red", "green", 3, null]}})",
       {"[]", R"(["red"])", R"(["green", 3, null, "red"])"},
       {R"(["blue"])", R"([4])", R"(["Red"])"}},
      {R"({"const": {"v": 1}})", {R"({"v":1})"}, {R"({"v": 1})", R"({"v":2})"}},
      {R"({"type": ["string", "null"], "maxLength": 3})", {R"("abc")", R"("")", "null"}, {R"("abcd")", "1"}},
      {R"({"type": "string", "minLength": 2})",
       {R"("ab")", R"("\u00e9\u00e9")", "\"\xC3\xA9\xC3\xA9\""},
       {R"("a")", R"("")"}},
      {R"({"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]}]})",
       {"42", R"({"k": "v"})"},
       {R"({})", R"("42")"}},
      {R"({"type": "string", "format": "date-time"})",
       {R"("2026-11-26T19:35:43Z")", R"("2026-01-31T00:00:00.5+01:00")"},
       {R"("2026-13-01T00:00:00Z")", R"("2026-11-26 19:35:43Z")"}},
      // Days per month and leap years, as Ajv checks them.
      {R"({"type": "string", "format": "date"})",
       {R"("2026-01-31")", R"("2026-04-30")", R"("2024-02-29")", R"("2000-02-29")", R"("2026-02-28")",
        R"("1996-02-29")", R"("0000-02-29")"},
       {R"("8605-11-31")", R"("2026-02-29")", R"("1900-02-29")", R"("2026-06-31")", R"("2026-02-30")",
        R"("2026-00-10")", R"("2026-01-00")"}},
      {R"({"type": "string", "format": "uuid"})",
       {R"("123e4567-e89b-12d3-a456-426614174000")"},
       {R"("123e4567")"}},
      // Recursion through $defs, and Pydantic's one-schema allOf.
      {R"({"$defs": {"Node": {"type": "object", "properties": {"v": {"type": "integer"},
                                "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                              "required": ["v", "kids"]}},
           "allOf": [{"$ref": "#/$defs/Node"}]})",
       {R"({"v": 1, "kids": []})", R"({"v": 1, "kids": [{"v": 2, "kids": [{"v": 3, "kids": []}]}]})"},
       {R"({"v": 1})", R"({"v": 1, "kids": [{"v": 2}]})"}},
      // A root that is a $ref beside its definitions (zod-to-json-schema names its type so).
      {R"({"$ref": "#/definitions/P", "definitions": {"P": {"type": "object", "properties": {"a": {"enum": [1, 2]}},
           "required": ["a"], "additionalProperties": false}}, "$schema": "http://json-schema.org/draft-07/schema#"})",
       {R"({"a": 2})"},
       {R"({"a": 3})", "{}"}},
      // No type: any JSON; an object without properties: any object.
      {R"({})", {"1", R"("s")", R"({"a": [1, {"b": null}]})", "[]", "true"}, {"tru", "{", "01"}},
      {R"({"type": "object"})", {"{}", R"({"a": [1, {"b": null}]})"}, {"[]", "1"}},
      {R"({"type": "object", "additionalProperties": {"type": "integer"}})",
       {"{}", R"({"a": 1, "b": 2})"},
       {R"({"a": "x"})"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    auto g = compile(c.schema);
    ASSERT_NE(g, nullptr);
    for (const char* doc : c.good) EXPECT_TRUE(accepts(g, doc)) << "should accept " << doc;
    for (const char* doc : c.bad) EXPECT_FALSE(accepts(g, doc)) << "should refuse " << doc;
  }
}

TEST(JsonSchemaGrammar, WhitespaceAndNumbersAreBounded) {
  auto g = compile(R"({"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]})");
  ASSERT_NE(g, nullptr);
  EXPECT_FALSE(accepts(g, "{" + std::string(40, ' ') + "\"n\": 1}"));
  EXPECT_FALSE(accepts(g, "{\"n\": " + std::string(40, '9') + "}"));
  EXPECT_TRUE(accepts(g, "{\"n\": 1234567890123456.5}"));
}

TEST(JsonSchemaGrammar, RefusesWhatItCannotGuaranteeByNameAndPlace) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "string", "pattern": "^[a-z]+$"})", "unsupported keyword 'pattern' at schema"},
      {R"({"type": "object", "properties": {"zip": {"type": "string", "pattern": "x"}}})",
       "unsupported keyword 'pattern' at schema.properties.zip"},
      {R"({"type": "integer", "minimum": 0})", "unsupported keyword 'minimum' at schema"},
      {R"({"type": "array", "prefixItems": [{"type": "string"}]})", "unsupported keyword 'prefixItems'"},
      {R"({"type": "string", "format": "email"})", "unsupported string format"},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})", "only a list of one schema"},
      {R"({"$ref": "https://example.com/schema.json"})", "only #/$defs/NAME"},
      {R"({"$ref": "#/$defs/Missing"})", "only #/$defs/NAME"},
      {R"({"type": "banana"})", "not a JSON Schema type"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "minItems > maxItems"},
      {R"({"type": "array", "maxItems": 100000000})", "must be an integer 0..4096"},
      {R"({"enum": []})", "non-empty list"},
      {"false", "no value matches it"},
      {"[1]", "must be an object or a boolean"},
  };
  for (const auto& [schema, want] : cases) {
    Result<std::string> r = json_schema_to_gbnf(ojson::parse(schema));
    ASSERT_FALSE(r.is_ok()) << schema;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(want), std::string::npos) << schema << ": " << r.status().message();
  }
}

TEST(JsonSchemaGrammar, AnnotationsAreIgnoredAndDeepNestingIsRefused) {
  auto g = compile(R"({"title": "T", "description": "d", "$schema": "x", "type": "boolean", "default": true,
                      "examples": [true], "$comment": "c"})");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(accepts(g, "false"));
  std::string deep = R"({"type": "string"})";
  for (int i = 0; i < 100; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  Result<std::string> r = json_schema_to_gbnf(ojson::parse(deep));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("nests deeper"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::server::api
