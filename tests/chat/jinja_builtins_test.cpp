// Filters, `is` tests, str/dict methods and global functions.
#include <gtest/gtest.h>

#include "jinja_test_util.h"

namespace moeserve::chat::jinja {
namespace {

using testing::render;
using testing::render_error;

struct Case {
  const char* source;
  const char* expected;
};

void expect_all(const std::vector<Case>& cases, const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  for (const Case& c : cases) EXPECT_EQ(render(c.source, context), c.expected) << c.source;
}

TEST(JinjaFilters, Strings) {
  expect_all({
      {"{{ 'Hello World' | lower }}|{{ 'abc' | upper }}|{{ 'hello-world foo(bar)' | title }}|{{ 'hELLO wORLD' | capitalize }}",
       "hello world|ABC|Hello-World Foo(Bar)|Hello world"},
      {"[{{ '  x y \n' | trim }}]|[{{ 'xxaxx' | trim('x') }}]|[{{ 5 | trim }}]", "[x y]|[a]|[5]"},
      {"{{ 'aXbXc' | replace('X', '-') }}|{{ 'aXbXc' | replace('X', '-', 1) }}|{{ 'ab' | replace('', '.') }}", "a-b-c|a-bXc|.a.b."},
      {"{{ 1.5 | string }}|{{ none | string }}|{{ [1] | string }}|{{ 'x' | string }}", "1.5|None|[1]|x"},
      {"{{ '<a href=\"x\">&\\'</a>' | e }}|{{ '<b>' | escape }}|{{ '<i>' | safe }}",
       "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt;|&lt;b&gt;|<i>"},
      {"{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent('>', blank=true) }}",
       "a\n  b\n\n  c|  a\n  b|a\n>\n>b"},
      {"{{ 'one two, three_four 5' | wordcount }}", "4"},
  });
}

TEST(JinjaFilters, NumbersAndConversions) {
  expect_all({
      {"{{ '42' | int + 1 }}|{{ ' -7 ' | int }}|{{ '3.9' | int }}|{{ 3.9 | int }}|{{ 'x' | int }}|{{ 'x' | int(5) }}|{{ true | int }}",
       "43|-7|3|3|0|5|1"},
      {"{{ '2.5' | float }}|{{ 2 | float }}|{{ 'nope' | float }}|{{ 'nope' | float(1.5) }}", "2.5|2.0|0.0|1.5"},
      {"{{ -3 | abs }}|{{ -2.5 | abs }}|{{ 0 - 3 | abs }}", "3|2.5|-3"},  // unary minus binds tighter than |
      {"{{ 2.5 | round }}|{{ 3.5 | round }}|{{ 2.567 | round(2) }}|{{ 2.561 | round(2, 'floor') }}|{{ 2.561 | round(1, 'ceil') }}|{{ 7 | round }}",
       "2.0|4.0|2.57|2.56|2.6|7"},
  });
}

TEST(JinjaFilters, LengthDefaultAndFriends) {
  expect_all({
      {"{{ 'h\xC3\xA9\xF0\x9F\x98\x80' | length }}|{{ [1, 2] | count }}|{{ {'a': 1} | length }}|{{ missing | length }}", "3|2|1|0"},
      {"{{ missing | default('d') }}|{{ none | default('d') }}|[{{ '' | default('d') }}]|{{ '' | d('d', true) }}|{{ 0 | default(5, boolean=true) }}",
       "d|None|[]|d|5"},
  });
}

TEST(JinjaFilters, Sequences) {
  nlohmann::ordered_json ctx = {
      {"people", {{{"name", "bo"}, {"age", 30}, {"tags", {"x"}}},
                  {{"name", "Al"}, {"age", 25}, {"tags", nlohmann::ordered_json::array()}},
                  {{"name", "cy"}, {"age", 30}}}},
      {"d", {{"b", 2}, {"A", 3}, {"c", 1}}}};
  expect_all({
      {"{{ [3, 1, 2] | first }}|{{ [3, 1, 2] | last }}|{{ 'abc' | first }}|{{ d | first }}|[{{ [] | first }}]", "3|2|a|b|[]"},
      {"{{ [1, 2, 3] | reverse | list }}|{{ 'abc' | reverse }}|{{ 'ab' | list }}|{{ d | list }}", "[3, 2, 1]|cba|['a', 'b']|['b', 'A', 'c']"},
      {"{{ ['b', 'A', 'a', 'C'] | sort }}|{{ ['b', 'A', 'a'] | sort(case_sensitive=true) }}|{{ [3, 1, 2] | sort(reverse=true) }}",
       "['A', 'a', 'b', 'C']|['A', 'a', 'b']|[3, 2, 1]"},
      {"{{ people | sort(attribute='age') | map(attribute='name') | join(',') }}", "Al,bo,cy"},
      {"{{ ['b', 'A', 'a', 'b'] | unique | list }}|{{ ['a', 'A'] | unique(case_sensitive=true) | list }}|{{ people | unique(attribute='age') | map(attribute='name') | list }}",
       "['b', 'A']|['a', 'A']|['bo', 'Al']"},
      {"{{ d | items | list }}|{{ d | dictsort }}|{{ d | dictsort(by='value') }}|{{ d | dictsort(reverse=true) | first }}",
       "[('b', 2), ('A', 3), ('c', 1)]|[('A', 3), ('b', 2), ('c', 1)]|[('c', 1), ('b', 2), ('A', 3)]|('c', 1)"},
      {"{{ [1, 'a', none] | join }}|{{ people | join(' ', attribute='name') }}|{{ ['x', 'y'] | join(', ') }}", "1aNone|bo Al cy|x, y"},
      {"{{ people[:2] | map(attribute='tags.0') | list }}|{{ people | map(attribute='nick', default='?') | list }}|{{ ['a', 'B'] | map('upper') | list }}",
       "['x', Undefined]|['?', '?', '?']|['A', 'B']"},
      {"{{ [1, 2, 3, 4] | select('odd') | list }}|{{ [1, 2, 3, 4] | reject('odd') | list }}|{{ [0, 1, '', 'a'] | select | list }}|{{ [5, 10, 15] | select('divisibleby', 5) | select('gt', 6) | list }}",
       "[1, 3]|[2, 4]|[1, 'a']|[10, 15]"},
      {"{{ people | selectattr('age', 'equalto', 30) | map(attribute='name') | list }}|{{ people | rejectattr('tags') | map(attribute='name') | list }}|{{ people | selectattr('tags', 'defined') | list | length }}",
       "['bo', 'cy']|['Al', 'cy']|2"},
      {"{{ range(7) | batch(3) | list }}|{{ [1, 2, 3] | batch(2, 0) | list }}", "[[0, 1, 2], [3, 4, 5], [6]]|[[1, 2], [3, 0]]"},
      {"{{ [1, 2, 3] | sum }}|{{ people | sum(attribute='age') }}|{{ [[1], [2]] | sum(start=[]) }}|{{ [0.5, 1] | sum }}", "6|85|[1, 2]|1.5"},
      {"{{ [3, 1, 2] | min }}|{{ [3, 1, 2] | max }}|{{ ['b', 'A'] | min }}|{{ (people | max(attribute='age'))['name'] }}|[{{ [] | max }}]",
       "1|3|A|bo|[]"},
      // attr() is getattr(): namespace attributes and methods, not dict keys.
      {"{% set ns = namespace(k=1) %}{{ ns | attr('k') }}|[{{ {'k': 1} | attr('k') }}]|{{ ('a' | attr('upper'))() }}", "1|[]|A"},
  }, ctx);
  EXPECT_EQ(render_error("{{ 'abc' | items }}").message(),
            "chat template line 1:12: filter 'items': can only get item pairs from a mapping, not 'str'");
  EXPECT_EQ(render_error("{{ [1, 'a'] | sort }}").message(), "chat template line 1:15: filter 'sort': cannot compare 'str' with 'int'");
}

TEST(JinjaFilters, UnknownNamesInsideMapAndSelectFailAtRender) {
  EXPECT_EQ(render_error("{{ [1] | map('nope') | list }}").code(), StatusCode::kUnsupported);
  EXPECT_EQ(render_error("{{ [1] | select('nope') | list }}").code(), StatusCode::kUnsupported);
}

TEST(JinjaTests, TypeAndValueTests) {
  nlohmann::ordered_json ctx = {{"d", {{"a", 1}}}, {"l", {1}}, {"s", "x"}, {"n", nullptr}, {"f", 1.5}, {"i", 2}, {"b", true}};
  expect_all({
      {"{{ d is mapping }}{{ l is mapping }}{{ d is iterable }}{{ s is iterable }}{{ i is iterable }}{{ missing is iterable }}", "TrueFalseTrueTrueFalseTrue"},
      {"{{ l is sequence }}{{ s is sequence }}{{ d is sequence }}{{ n is sequence }}", "TrueTrueTrueFalse"},
      {"{{ s is string }}{{ i is string }}{{ n is none }}{{ missing is none }}{{ missing is undefined }}{{ n is defined }}", "TrueFalseTrueFalseTrueTrue"},
      {"{{ i is number }}{{ f is number }}{{ b is number }}{{ i is integer }}{{ b is integer }}{{ f is float }}{{ i is float }}", "TrueTrueTrueTrueFalseTrueFalse"},
      {"{{ b is boolean }}{{ i is boolean }}{{ b is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }}", "TrueFalseTrueFalseTrueFalse"},
      {"{{ 3 is odd }}{{ 3 is even }}{{ 10 is divisibleby 5 }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 'aB' is upper }}", "TrueFalseTrueTrueTrueFalse"},
      {"{{ 2 is equalto 2 }}{{ 2 is eq(3) }}{{ 2 is ne 3 }}{{ 2 is lt 3 }}{{ 2 is gt 3 }}{{ 3 is ge 3 }}{{ 2 is le 1 }}", "TrueFalseTrueTrueFalseTrueFalse"},
      {"{{ 2 is in [1, 2] }}{{ 'z' is in 'abc' }}{{ n is sameas none }}{{ b is sameas true }}{{ range is callable }}{{ s is callable }}", "TrueFalseTrueTrueTrueFalse"},
      {"{{ s is not string }}{{ missing is not defined }}", "FalseTrue"},
  }, ctx);
  EXPECT_EQ(render_error("{{ 'a' is odd }}").message(), "chat template line 1:8: test 'odd': 'odd' needs a number, not 'str'");
}

TEST(JinjaMethods, StringMethods) {
  expect_all({
      {"[{{ '  a b  '.strip() }}][{{ 'xxaxx'.strip('x') }}][{{ '\\n\\nx\\n'.lstrip('\\n') }}][{{ 'x  '.rstrip() }}]", "[a b][a][x\n][x]"},
      {"{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a-b-c'.rsplit('-', 1) }}|{{ ' a b c '.rsplit(none, 1) }}",
       "['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a-b', 'c']|[' a b', 'c']"},
      {"{{ 'abc'.startswith('ab') }}{{ 'abc'.startswith(('x', 'a')) }}{{ 'abc'.endswith('bc') }}{{ 'abc'.endswith(('x',)) }}", "TrueTrueTrueFalse"},
      {"{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'Hi There'.upper() }}|{{ 'Hi There'.lower() }}|{{ 'hello wORLD'.title() }}|{{ 'hELLO'.capitalize() }}",
       "bba|HI THERE|hi there|Hello World|Hello"},
      {"{{ 'h\xC3\xA9llo'.find('l') }}|{{ 'hello'.rfind('l') }}|{{ 'hello'.find('z') }}|{{ 'banana'.count('an') }}|{{ '-'.join(['a', 'b']) }}",
       "2|3|-1|2|a-b"},
      {"{{ '123'.isdigit() }}{{ '12a'.isdigit() }}{{ 'ab'.isalpha() }}{{ 'a1'.isalnum() }}{{ ' \\t'.isspace() }}{{ 'ab'.islower() }}{{ 'AB'.isupper() }}",
       "TrueFalseTrueTrueTrueTrueTrue"},
      {"{{ 'a\\nb\\n'.splitlines() }}", "['a', 'b']"},
  });
  EXPECT_EQ(render_error("{{ 'a'.split('') }}").message(), "chat template line 1:7: empty separator");
}

TEST(JinjaMethods, DictMethods) {
  nlohmann::ordered_json ctx = {{"d", {{"x", 1}, {"y", {1, 2}}}}};
  expect_all({{"{{ d.keys() | list }}|{{ d.values() | list }}|{{ d.items() | list }}", "['x', 'y']|[1, [1, 2]]|[('x', 1), ('y', [1, 2])]"},
              {"{{ d.get('x') }}|{{ d.get('z') }}|{{ d.get('z', 0) }}", "1|None|0"}},
             ctx);
}

TEST(JinjaGlobals, RangeDictNamespace) {
  expect_all({
      {"{{ range(3) | list }}|{{ range(1, 4) | list }}|{{ range(10, 0, -3) | list }}|{{ range(0) | list }}", "[0, 1, 2]|[1, 2, 3]|[10, 7, 4, 1]|[]"},
      {"{{ dict(a=1, b='x') }}|{{ dict({'k': 1}, z=2) }}", "{'a': 1, 'b': 'x'}|{'k': 1, 'z': 2}"},
  });
  EXPECT_NE(render_error("{{ range(1, 2, 0) }}").message().find("step must not be zero"), std::string::npos);
}

TEST(JinjaGlobals, RaiseExceptionStopsRenderingWithTheMessage) {
  Status st = render_error("ok so far\n{% if true %}{{ raise_exception('No user query found in messages.') }}{% endif %}");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "chat template line 2:17: No user query found in messages.");
}

TEST(JinjaGlobals, StrftimeNowUsesTheProvidedTime) {
  // The test helper fixes the time at 1700000000 = 2023-11-14 22:13:20 UTC.
  EXPECT_EQ(render("{{ strftime_now('%Y-%m-%d %H:%M') }}|{{ strftime_now('%d %b %Y') }}"), "2023-11-14 22:13|14 Nov 2023");
}

}  // namespace
}  // namespace moeserve::chat::jinja
