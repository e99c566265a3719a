// tojson formatting (transformers' override of Jinja2's filter: Python's
// json.dumps, ensure_ascii off, no HTML escaping) and JSON -> value conversion.
#include <gtest/gtest.h>

#include "jinja_test_util.h"

namespace moeserve::chat::jinja {
namespace {

using testing::render;
using testing::render_error;

TEST(JinjaJson, CompactFormKeepsKeyOrderAndPythonSeparators) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(
      R"({"x": {"name": "get_weather", "args": {"b": 1, "a": [1, 2.5, null, true, false]}, "empty": {}, "none": []}})");
  EXPECT_EQ(render("{{ x | tojson }}", ctx),
            R"({"name": "get_weather", "args": {"b": 1, "a": [1, 2.5, null, true, false]}, "empty": {}, "none": []})");
  EXPECT_EQ(render("{{ x.args | tojson(sort_keys=true) }}", ctx), R"({"a": [1, 2.5, null, true, false], "b": 1})");
  EXPECT_EQ(render("{{ x.args | tojson(separators=(',', ':')) }}", ctx), R"({"b":1,"a":[1,2.5,null,true,false]})");
}

TEST(JinjaJson, IndentedForm) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({"x": {"a": [1, {"b": []}], "c": {}}})");
  EXPECT_EQ(render("{{ x | tojson(indent=2) }}", ctx),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    }\n  ],\n  \"c\": {}\n}");
  EXPECT_EQ(render("{{ [1, 2] | tojson(indent='\\t') }}", ctx), "[\n\t1,\n\t2\n]");
  EXPECT_EQ(render("{{ [1] | tojson(indent=0) }}", ctx), "[\n1\n]");
}

TEST(JinjaJson, StringsAreEscapedLikePython) {
  nlohmann::ordered_json ctx = {{"s", "quote\" backslash\\ nl\n tab\t cr\r ctl\x01 del\x7f <>&' \xC3\xA9 \xE2\x80\xA8 \xF0\x9F\x98\x80"}};
  // ensure_ascii=False (transformers' default): non-ASCII stays literal, no HTML escaping.
  EXPECT_EQ(render("{{ s | tojson }}", ctx),
            "\"quote\\\" backslash\\\\ nl\\n tab\\t cr\\r ctl\\u0001 del\x7f <>&' \xC3\xA9 \xE2\x80\xA8 \xF0\x9F\x98\x80\"");
  EXPECT_EQ(render("{{ s | tojson(true) }}", ctx),
            "\"quote\\\" backslash\\\\ nl\\n tab\\t cr\\r ctl\\u0001 del\\u007f <>&' \\u00e9 \\u2028 \\ud83d\\ude00\"");
}

TEST(JinjaJson, NumbersAndNonJsonValues) {
  EXPECT_EQ(render("{{ [1.0, 0.1, 1e20, -2, 1.5e-7] | tojson }}"), "[1.0, 0.1, 1e+20, -2, 1.5e-07]");
  EXPECT_EQ(render("{{ (1, 'a') | tojson }}"), "[1, \"a\"]");  // tuples are arrays
  EXPECT_EQ(render_error("{% set ns = namespace() %}{{ ns | tojson }}").message(),
            "chat template line 1:35: filter 'tojson': Object of type Namespace is not JSON serializable");
}

TEST(JinjaJson, ConvertsRequestJson) {
  nlohmann::ordered_json json = nlohmann::ordered_json::parse(
      R"({"i": 3, "big": 18446744073709551615, "f": 1.0, "s": "x", "n": null, "b": false, "l": [1], "o": {"z": 1, "a": 2}})");
  Result<Value> v = value_from_json(json, 8);
  ASSERT_TRUE(v.is_ok());
  const DictData& d = v->as_dict();
  EXPECT_TRUE(d.find("i")->is_int());
  EXPECT_TRUE(d.find("big")->is_float());  // beyond int64: kept as a float
  EXPECT_TRUE(d.find("f")->is_float());
  EXPECT_TRUE(d.find("n")->is_none());
  EXPECT_TRUE(d.find("b")->is_bool());
  EXPECT_EQ(d.find("o")->as_dict().entries()[0].first, "z");  // insertion order kept
  EXPECT_EQ(to_display_string(*v), "{'i': 3, 'big': 1.8446744073709552e+19, 'f': 1.0, 's': 'x', 'n': None, 'b': False, 'l': [1], 'o': {'z': 1, 'a': 2}}");
}

TEST(JinjaJson, LargeObjectsStayFast) {
  // Hash-indexed once they grow past a few entries: many distinct keys convert
  // and look up correctly.
  nlohmann::ordered_json obj = nlohmann::ordered_json::object();
  for (int i = 0; i < 3000; ++i) obj[fmt::format("k{}", i)] = i;
  Result<Value> v = value_from_json(obj, 8);
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(v->as_dict().size(), 3000u);
  EXPECT_EQ(v->as_dict().find("k2999")->as_int(), 2999);
  EXPECT_EQ(v->as_dict().find("k3000"), nullptr);
  EXPECT_EQ(render("{{ d.k1234 }}|{{ 'k7' in d }}|{{ 'k7x' in d }}|{{ d | length }}", {{"d", obj}}), "1234|True|False|3000");
}

}  // namespace
}  // namespace moeserve::chat::jinja
