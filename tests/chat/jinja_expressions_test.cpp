// Expressions: literals, printing, arithmetic, comparisons, logic, slicing,
// attribute/item access. Expected values are what Python's Jinja2 prints.
#include <gtest/gtest.h>

#include "chat/jinja_value.h"
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

TEST(JinjaExpressions, LiteralsPrintLikePython) {
  expect_all({
      {"{{ 42 }}|{{ -7 }}|{{ 1.0 }}|{{ 2.50 }}|{{ 1e16 }}|{{ 1e-5 }}|{{ 0.0001 }}", "42|-7|1.0|2.5|1e+16|1e-05|0.0001"},
      {"{{ true }}|{{ False }}|{{ none }}|{{ None }}", "True|False|None|None"},
      {"{{ [1, 'a', none, true, 1.0] }}", "[1, 'a', None, True, 1.0]"},
      {"{{ {'k': 'v', 'n': [1, 2]} }}", "{'k': 'v', 'n': [1, 2]}"},
      {"{{ (1, 2) }}|{{ (1,) }}|{{ () }}", "(1, 2)|(1,)|()"},
      {"{{ ['it\\'s', 'say \"hi\"', 'both \\' \"'] }}", "[\"it's\", 'say \"hi\"', 'both \\' \"']"},
      {"{{ ['tab\\tnew\\nline\\\\'] }}", "['tab\\tnew\\nline\\\\']"},
  });
}

TEST(JinjaExpressions, ArithmeticFollowsPython) {
  expect_all({
      {"{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 2 ** 3 ** 2 }}|{{ 10 - 3 - 2 }}", "7|9|64|5"},
      {"{{ 7 / 2 }}|{{ 4 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 7 % -3 }}", "3.5|2.0|3|-4|1|2|-2"},
      {"{{ 7.5 // 2 }}|{{ -7.5 % 2 }}|{{ 2 ** -1 }}|{{ 2 ** 0.5 }}|{{ 0.1 + 0.2 }}", "3.0|0.5|0.5|1.4142135623730951|0.30000000000000004"},
      {"{{ 1 + 1.5 }}|{{ true + 1 }}|{{ -(3) }}|{{ +4 }}|{{ --5 }}", "2.5|2|-3|4|5"},
      {"{{ 'ab' + 'cd' }}|{{ 'ab' * 3 }}|{{ 2 * 'xy' }}|{{ [1] + [2, 3] }}|{{ [0] * 3 }}", "abcd|ababab|xyxy|[1, 2, 3]|[0, 0, 0]"},
      {"{{ 'a' ~ 1 ~ none ~ true ~ 2.0 }}|{{ 'x' ~ undefined_name ~ 'y' }}", "a1NoneTrue2.0|xy"},
  });
}

TEST(JinjaExpressions, ArithmeticErrors) {
  EXPECT_NE(render_error("{{ 1 / 0 }}").message().find("division by zero"), std::string::npos);
  EXPECT_NE(render_error("{{ 5 // 0 }}").message().find("division or modulo by zero"), std::string::npos);
  EXPECT_EQ(render_error("{{ 'a' + 1 }}").message(), "chat template line 1:8: unsupported operand types for +: 'str' and 'int'");
  EXPECT_EQ(render_error("{{ 9223372036854775807 + 1 }}").code(), StatusCode::kOutOfRange);
  EXPECT_EQ(render_error("{{ 3 ** 64 }}").code(), StatusCode::kOutOfRange);
  EXPECT_EQ(render_error("{{ '%s' % 1 }}").code(), StatusCode::kUnsupported);
  EXPECT_EQ(render_error("{{ -'a' }}").message(), "chat template line 1:4: bad operand type for unary -: 'str'");
}

TEST(JinjaExpressions, ComparisonsAndLogic) {
  expect_all({
      {"{{ 1 == 1.0 }}|{{ true == 1 }}|{{ 'a' == 'a' }}|{{ [1, [2]] == [1, [2]] }}|{{ {'a': 1} == {'a': 1} }}", "True|True|True|True|True"},
      {"{{ 1 != 2 }}|{{ none == none }}|{{ none == 0 }}|{{ '1' == 1 }}", "True|True|False|False"},
      {"{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 1 <= 1 >= 0 }}|{{ 'abc' < 'abd' }}|{{ [1, 2] < [1, 3] }}", "True|False|True|True|True"},
      {"{{ 'b' in 'abc' }}|{{ 2 in [1, 2] }}|{{ 'k' in {'k': 1} }}|{{ 3 not in [1, 2] }}|{{ 'x' in undefined_name }}", "True|True|True|True|False"},
      {"{{ true and 'yes' }}|{{ 0 and 'no' }}|{{ '' or 'fallback' }}|{{ 'first' or 'second' }}|{{ not [] }}", "yes|0|fallback|first|True"},
      {"{{ 'a' if 1 > 2 else 'b' }}|{{ 'shown' if true }}|[{{ 'hidden' if false }}]", "b|shown|[]"},
      {"{{ 'x' if true else 'y' if true else 'z' }}", "x"},
  });
  EXPECT_EQ(render_error("{{ 1 < 'a' }}").message(), "chat template line 1:8: cannot compare 'int' with 'str'");
  EXPECT_EQ(render_error("{{ 1 in 'abc' }}").message(),
            "chat template line 1:9: 'in <string>' requires a string as left operand, not 'int'");
}

TEST(JinjaExpressions, SlicingAndIndexing) {
  nlohmann::ordered_json ctx = {{"s", "h\xC3\xA9llo w\xC3\xB6rld"}, {"xs", {1, 2, 3, 4, 5}}};
  expect_all({
      {"{{ xs[0] }}|{{ xs[-1] }}|{{ xs[1:3] }}|{{ xs[:2] }}|{{ xs[3:] }}|{{ xs[::2] }}|{{ xs[::-1] }}", "1|5|[2, 3]|[1, 2]|[4, 5]|[1, 3, 5]|[5, 4, 3, 2, 1]"},
      {"{{ xs[-2:] }}|{{ xs[10:] }}|{{ xs[3:1:-1] }}|{{ xs[-100:2] }}|{{ xs.1 }}", "[4, 5]|[]|[4, 3]|[1, 2]|2"},
      // Strings index by code point, as Python does.
      {"{{ s[1] }}|{{ s[:5] }}|{{ s[::-1] }}|{{ s[-5:-1] }}|{{ s|length }}", "\xC3\xA9|h\xC3\xA9llo|dlr\xC3\xB6w oll\xC3\xA9h|w\xC3\xB6rl|11"},
      {"[{{ xs[7] }}]|[{{ s[20] }}]", "[]|[]"},  // out of range: undefined, prints empty
  }, ctx);
  EXPECT_NE(render_error("{{ xs[::0] }}", ctx).message().find("slice step cannot be zero"), std::string::npos);
  // Extreme steps and bounds neither overflow nor misbehave.
  EXPECT_EQ(render("{{ xs[1::9223372036854775807] }}|{{ xs[::-9223372036854775807 - 1] }}|{{ xs[-9223372036854775807:2] }}", ctx),
            "[2]|[5]|[1, 2]");
}

TEST(JinjaExpressions, AttributeAndItemAccess) {
  nlohmann::ordered_json ctx = {{"m", {{"role", "user"}, {"items", "stored"}, {"nested", {{"k", {1, 2}}}}}}};
  expect_all({
      {"{{ m.role }}|{{ m['role'] }}|{{ m.nested.k[1] }}|{{ m['nested']['k'].0 }}", "user|user|2|1"},
      // `.items` is the dict method (Python getattr order); ['items'] the key.
      {"{{ m['items'] }}|{{ m.items() | length }}", "stored|3"},
      {"{{ m.missing is defined }}|[{{ m.missing }}]|{{ m.get('role') }}|{{ m.get('x', 'dflt') }}|{{ m.get('x') }}", "False|[]|user|dflt|None"},
  }, ctx);
}

TEST(JinjaValue, PythonFloatRepr) {
  EXPECT_EQ(format_python_float(1.0), "1.0");
  EXPECT_EQ(format_python_float(-0.0), "-0.0");
  EXPECT_EQ(format_python_float(123456789012345.0), "123456789012345.0");
  EXPECT_EQ(format_python_float(1e15), "1000000000000000.0");
  EXPECT_EQ(format_python_float(1e16), "1e+16");
  EXPECT_EQ(format_python_float(1.5e-7), "1.5e-07");
  EXPECT_EQ(format_python_float(1e100), "1e+100");
  EXPECT_EQ(format_python_float(0.1), "0.1");
  EXPECT_EQ(format_python_float(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(format_python_float(1.0 / 0.0), "inf");
}

}  // namespace
}  // namespace moeserve::chat::jinja
