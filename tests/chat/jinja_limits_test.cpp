// Hostile templates end with an error naming the limit they hit, quickly and
// without exhausting the stack or memory.
#include <gtest/gtest.h>

#include "jinja_test_util.h"

namespace moeserve::chat::jinja {
namespace {

using testing::render;
using testing::render_error;

bool mentions(const Status& st, const std::string& text) { return st.message().find(text) != std::string::npos; }

TEST(JinjaLimits, LongLoopsRunOutOfSteps) {
  RenderLimits small;
  small.max_steps = 100000;
  Status st = render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", {}, small);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(mentions(st, "budget of 100000 steps")) << st.message();
  small.max_steps = 1000;
  st = render_error("{% for i in range(400) %}{{ i }}{% endfor %}", {}, small);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(mentions(st, "chat template line 1:")) << st.message();  // located
  // The same template fits a larger budget.
  EXPECT_TRUE(testing::render_with("{% for i in range(400) %}{{ i }}{% endfor %}").ok);
}

TEST(JinjaLimits, RecursionIsBounded) {
  Status st = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(mentions(st, "deeper than the limit of 256 levels")) << st.message();
  // Mutual recursion through a namespace-free pair of macros, too.
  st = render_error("{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n) }}{% endmacro %}{{ a(1) }}");
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
}

TEST(JinjaLimits, OutputAndStringsAreCapped) {
  RenderLimits limits;
  limits.max_output_bytes = 1000;
  Status st = render_error("{% for i in range(200) %}0123456789{% endfor %}", {}, limits);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(mentions(st, "output exceeds the limit of 1000 bytes")) << st.message();
  // Doubling a string in a loop hits the string cap long before memory runs out.
  st = render_error("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", {},
                    limits);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(mentions(st, "exceeds the output limit")) << st.message();
  st = render_error("{{ 'x' * 100000000000 }}");
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
}

TEST(JinjaLimits, ListsAndNestingAreCapped) {
  Status st = render_error("{{ range(10000000000) | length }}");
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(mentions(st, "range() of 10000000000 items exceeds the limit")) << st.message();
  RenderLimits limits;
  limits.max_list_items = 5000;
  st = render_error("{% set ns = namespace(l=[]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l + [i] %}{% endfor %}", {},
                    limits);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(mentions(st, "a list of 8190 items exceeds the limit of 5000 items")) << st.message();
  // Growing a value one level per iteration stops at the nesting limit.
  st = render_error("{% set ns = namespace(v=0) %}{% for i in range(100000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}");
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(mentions(st, "nests deeper than the limit of 64 levels")) << st.message();
}

TEST(JinjaLimits, SelfReferentialNamespacesPrintAndDoNotLeak) {
  // A namespace stored inside itself (directly or through a list) prints
  // without recursing forever; the sanitizer build checks nothing leaks.
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{% set ns.l = [ns] %}{{ ns }}"),
            "<Namespace {'a': 1, 'self': <Namespace>, 'l': <list>}>");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.l = [ns] %}{{ ns.l | length }}"), "1");
}

TEST(JinjaLimits, JsonInputNestingIsBounded) {
  nlohmann::ordered_json deep = 1;
  for (int i = 0; i < 200; ++i) deep = nlohmann::ordered_json::array({deep});
  Result<Value> v = value_from_json(deep, 64);
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(v.status(), "nests deeper than 64 levels")) << v.status().message();
}

}  // namespace
}  // namespace moeserve::chat::jinja
