// Parse-time rejection of everything outside the supported subset, with the
// construct named and its line:column.
#include <gtest/gtest.h>

#include "jinja_test_util.h"

namespace moeserve::chat::jinja {
namespace {

using testing::render;
using testing::render_error;

TEST(JinjaParser, UnsupportedStatementsAreNamedWithTheirPosition) {
  Status st = render_error("line 1\nline 2\n  {% include 'other.jinja' %}");
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_EQ(st.message(), "chat template line 3:6: unsupported statement 'include'");
  for (const char* name : {"import", "extends", "block", "call", "with", "autoescape", "do", "from"}) {
    st = render_error(std::string("{% ") + name + " x %}");
    EXPECT_EQ(st.code(), StatusCode::kUnsupported) << name;
    EXPECT_EQ(st.message(), std::string("chat template line 1:4: unsupported statement '") + name + "'");
  }
  st = render_error("{% frobnicate %}");
  EXPECT_EQ(st.message(), "chat template line 1:4: unknown statement 'frobnicate'");
}

TEST(JinjaParser, UnknownFiltersTestsAndMethodsFailAtParseTime) {
  // The failing branch is never taken at render time: parsing alone rejects it.
  Status st = render_error("{% if false %}{{ x | xmlattr }}{% endif %}");
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_EQ(st.message(), "chat template line 1:22: unsupported filter 'xmlattr'");
  st = render_error("{% if false %}\n{{ x is prime }}{% endif %}");
  EXPECT_EQ(st.message(), "chat template line 2:9: unsupported test 'prime'");
  st = render_error("{% set xs = [] %}{% if false %}{{ xs.append(1) }}{% endif %}");
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_EQ(st.message(), "chat template line 1:44: unsupported method 'append'");
  st = render_error("{{ f(*args) }}");
  EXPECT_EQ(st.message(), "chat template line 1:6: unsupported '*args' / '**kwargs' in a call");
  st = render_error("{% for x in xs recursive %}{% endfor %}");
  EXPECT_EQ(st.message(), "chat template line 1:16: unsupported for-loop option 'recursive'");
}

TEST(JinjaParser, UnbalancedBlocksAreReported) {
  Status st = render_error("{% for m in messages %}\n{{ m }}");
  EXPECT_EQ(st.code(), StatusCode::kInvalidFormat);
  EXPECT_EQ(st.message(), "chat template line 1:4: 'for' is never closed (expected '{% endfor %}')");
  st = render_error("{% if x %}a{% elif y %}b{% else %}c");
  EXPECT_EQ(st.message(), "chat template line 1:4: 'if' is never closed (expected '{% endif %}')");
  st = render_error("text\n{% endif %}");
  EXPECT_EQ(st.message(), "chat template line 2:4: unexpected 'endif' with no open block to close");
  st = render_error("{% for x in y %}{% endif %}{% endfor %}");
  EXPECT_EQ(st.message(), "chat template line 1:20: unexpected 'endif' with no open block to close");
}

TEST(JinjaParser, LoopControlOnlyInsideLoops) {
  EXPECT_EQ(render_error("{% break %}").message(), "chat template line 1:4: 'break' outside of a for loop");
  // A macro body is not inside the caller's loop.
  EXPECT_EQ(render_error("{% for x in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}").message(),
            "chat template line 1:37: 'continue' outside of a for loop");
}

TEST(JinjaParser, ExpressionSyntaxErrors) {
  EXPECT_EQ(render_error("{{ }}").message(), "chat template line 1:4: expected an expression");
  EXPECT_EQ(render_error("{{ (1 + 2 }}").message(), "chat template line 1:11: unexpected '}', expected ')'");
  EXPECT_EQ(render_error("{{ [1, 2 }}").message(), "chat template line 1:10: unexpected '}', expected ']'");
  EXPECT_EQ(render_error("{{ (1 + 2").message(), "chat template line 1:4: unclosed '('");
  EXPECT_EQ(render_error("{{ x ) }}").message(), "chat template line 1:6: unexpected ')'");
  EXPECT_EQ(render_error("{{ (1 2) }}").message(), "chat template line 1:7: expected ','");
  EXPECT_EQ(render_error("{{ a b }}").message(), "chat template line 1:6: expected '}}'");
  EXPECT_EQ(render_error("{% set %}").message(), "chat template line 1:8: expected a variable name");
  EXPECT_EQ(render_error("{% if x %}{% else %}{% elif y %}{% endif %}").message(),
            "chat template line 1:24: unexpected 'elif' with no open block to close");
  EXPECT_EQ(render_error("{{ f(a=1, 2) }}").message(), "chat template line 1:11: positional argument after keyword argument");
}

TEST(JinjaParser, NestingIsBounded) {
  std::string deep = "{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}";
  Status st = render_error(deep);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("nests deeper than 100 levels"), std::string::npos) << st.message();
  std::string negations = "{{ " + std::string(5000, '-') + "1 }}";
  EXPECT_EQ(render_error(negations).code(), StatusCode::kOutOfRange);
  std::string nots;
  for (int i = 0; i < 3000; ++i) nots += "not ";
  EXPECT_EQ(render_error("{{ " + nots + "x }}").code(), StatusCode::kOutOfRange);
  std::string blocks;
  for (int i = 0; i < 200; ++i) blocks += "{% if true %}";
  for (int i = 0; i < 200; ++i) blocks += "{% endif %}";
  EXPECT_EQ(render_error(blocks).code(), StatusCode::kOutOfRange);
  // Fifty levels are fine.
  EXPECT_EQ(render("{{ " + std::string(50, '(') + "7" + std::string(50, ')') + " }}"), "7");
}

TEST(JinjaParser, SourceSizeIsBounded) {
  TemplateOptions options;
  options.parse.max_source_bytes = 10;
  Result<Template> t = Template::parse("{{ 'this is longer than ten bytes' }}", options);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), StatusCode::kOutOfRange);
}

TEST(JinjaParser, ErrorsNameTheTemplate) {
  TemplateOptions options;
  options.name = "qwen3.gguf chat template";
  Result<Template> t = Template::parse("{% include 'x' %}", options);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().message(), "qwen3.gguf chat template line 1:4: unsupported statement 'include'");
}

TEST(JinjaParser, TestArgumentsWithAndWithoutParentheses) {
  EXPECT_EQ(render("{{ 9 is divisibleby 3 }}|{{ 9 is divisibleby(4) }}|{{ 2 is not odd }}"), "True|False|True");
  // A name after the test that is a keyword is not taken as its argument.
  EXPECT_EQ(render("{{ 'a' if x is defined else 'b' }}"), "b");
  EXPECT_EQ(render("{{ x is none or true }}", {{"x", nullptr}}), "True");
}

}  // namespace
}  // namespace moeserve::chat::jinja
