// Statements: if, for (loop variables, else, filters, unpacking, break and
// continue), set (scoping, namespaces, blocks, unpacking), macros, filter
// blocks. Scoping follows Python's Jinja2.
#include <gtest/gtest.h>

#include "jinja_test_util.h"

namespace moeserve::chat::jinja {
namespace {

using testing::render;
using testing::render_error;

TEST(JinjaStatements, IfElifElse) {
  const char* t = "{% if n > 10 %}big{% elif n > 5 %}medium{% elif n > 0 %}small{% else %}none{% endif %}";
  EXPECT_EQ(render(t, {{"n", 11}}), "big");
  EXPECT_EQ(render(t, {{"n", 6}}), "medium");
  EXPECT_EQ(render(t, {{"n", 1}}), "small");
  EXPECT_EQ(render(t, {{"n", 0}}), "none");
  // Truthiness is Python's.
  EXPECT_EQ(render("{% if [] or {} or '' or 0 or 0.0 or none %}t{% else %}f{% endif %}"), "f");
  EXPECT_EQ(render("{% if [0] and {'a': 0} and ' ' and -1 %}t{% endif %}"), "t");
}

TEST(JinjaStatements, LoopVariables) {
  EXPECT_EQ(render("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
                   "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}"),
            "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}<{{ loop.previtem }}|{{ loop.nextitem }}>"
                   "{{ loop.previtem is defined }}{% endfor %}"),
            "<|2>False<1|3>True<2|>True");
  EXPECT_EQ(render("{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "ababa");
  // Nested loops: the inner `loop` shadows the outer one.
  EXPECT_EQ(render("{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ b }}{% endfor %}{{ loop.index }};{% endfor %}"),
            "1x2y1;1x2y2;");
}

TEST(JinjaStatements, LoopElseFilterAndControl) {
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in undefined_list %}x{% else %}empty{% endfor %}"), "empty");
  // The `if` filter runs before the loop, so loop.length/last count kept items.
  EXPECT_EQ(render("{% for x in range(10) if x is odd %}{{ x }}{{ '.' if not loop.last }}{% endfor %}"), "1.3.5.7.9");
  EXPECT_EQ(render("{% for x in [2, 4] if x is odd %}x{% else %}none odd{% endfor %}"), "none odd");
  EXPECT_EQ(render("{% for x in range(6) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "023");
}

TEST(JinjaStatements, LoopsOverDictsStringsAndPairs) {
  nlohmann::ordered_json ctx = {{"d", {{"b", 1}, {"a", 2}}}};
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}", ctx), "ba");  // keys, in insertion order
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", ctx), "b=1;a=2;");
  EXPECT_EQ(render("{% for (k, v) in d | items %}{{ k }}{{ v }}{% endfor %}", ctx), "b1a2");
  EXPECT_EQ(render("{% for c in 'h\xC3\xA9' %}[{{ c }}]{% endfor %}"), "[h][\xC3\xA9]");
  EXPECT_EQ(render("{% for a, b in [[1, 2], 'xy'] %}{{ a }}{{ b }}{% endfor %}"), "12xy");
  EXPECT_EQ(render_error("{% for a, b in [[1, 2, 3]] %}{% endfor %}").message(),
            "chat template line 1:4: cannot unpack a list into 2 names");
  EXPECT_EQ(render_error("{% for x in 5 %}{% endfor %}").message(), "chat template line 1:13: 'int' object is not iterable");
}

TEST(JinjaStatements, SetScoping) {
  // A loop body's assignments do not leak out, nor survive to the next iteration.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + 10 %}{{ x }};{% endfor %}{{ x }}"), "11;11;1");
  EXPECT_EQ(render("{% for i in [1, 2] %}[{{ y }}]{% set y = i %}{% endfor %}"), "[][]");
  // `if` does not open a scope.
  EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
  // Template variables can be shadowed by `set`.
  EXPECT_EQ(render("{% set enable_thinking = enable_thinking if enable_thinking is defined else true %}{{ enable_thinking }}"), "True");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set c, d = 'xy' %}{{ c }}{{ d }}"), "12|xy");
  EXPECT_EQ(render("{% set t = 1, 2 %}{{ t }}"), "(1, 2)");
}

TEST(JinjaStatements, NamespacesCarryStateOutOfLoops) {
  EXPECT_EQ(render("{% set ns = namespace(total=0, seen=[]) %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i %}"
                   "{% set ns.seen = ns.seen + [i] %}{% endfor %}{{ ns.total }} {{ ns.seen }}"),
            "6 [1, 2, 3]");
  EXPECT_EQ(render("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}"), "12False");
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{{ ns }}"), "<Namespace {'a': 1}>");
  EXPECT_EQ(render_error("{% set d = {} %}{% set d.x = 1 %}").message(),
            "chat template line 1:20: cannot set attribute 'x' on 'd': it is a dict, not a namespace()");
}

TEST(JinjaStatements, BlockSetAndFilterBlocks) {
  EXPECT_EQ(render("{% set greeting %}Hello {{ name }}!{% endset %}[{{ greeting }}]", {{"name", "Ann"}}), "[Hello Ann!]");
  EXPECT_EQ(render("{% set shout | upper | replace('!', '?') %}hi {{ 1 }}!{% endset %}{{ shout }}"), "HI 1?");
  EXPECT_EQ(render("{% filter upper %}abc{{ 'd' }}{% endfilter %}|{% filter trim | title %}  x y  {% endfilter %}"),
            "ABCD|X Y");
  EXPECT_EQ(render("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(JinjaStatements, Macros) {
  const char* defs =
      "{% macro tag(name, value='-', sep=':') %}<{{ name }}{{ sep }}{{ value }}>{% endmacro %}";
  EXPECT_EQ(render(std::string(defs) + "{{ tag('a') }}{{ tag('b', 2) }}{{ tag('c', sep='=') }}{{ tag(value=3, name='d') }}"),
            "<a:-><b:2><c=-><d:3>");
  // A parameter that is not given and has no default is undefined.
  EXPECT_EQ(render("{% macro m(a, b) %}[{{ a }}|{{ b }}|{{ b is defined }}]{% endmacro %}{{ m(1) }}"), "[1||False]");
  // Defaults are evaluated at call time and may use earlier parameters.
  EXPECT_EQ(render("{% macro m(a, b=a * 2) %}{{ b }}{% endmacro %}{{ m(4) }}"), "8");
  // Macros see the template's variables (even ones set after the definition)
  // but not their caller's loop variables.
  EXPECT_EQ(render("{% macro m() %}{{ g }}-{{ i }}{% endmacro %}{% set g = 7 %}{% for i in [1] %}{{ m() }}{% endfor %}"), "7-");
  // Recursion works within the depth limit.
  EXPECT_EQ(render("{% macro fact(n) %}{{ 1 if n <= 1 else n * fact(n - 1) | int }}{% endmacro %}{{ fact(10) }}"), "3628800");
  // A macro's output is a string.
  EXPECT_EQ(render("{% macro two() %}2{% endmacro %}{{ two() ~ two() }}|{{ (two() | int) + 1 }}"), "22|3");
  EXPECT_EQ(render_error(std::string(defs) + "{{ tag(1, 2, 3, 4) }}").message(),
            "chat template line 1:91: macro 'tag' takes not more than 3 argument(s), 4 given");
  EXPECT_EQ(render_error(std::string(defs) + "{{ tag(1, colour=2) }}").message(),
            "chat template line 1:91: macro 'tag' has no parameter 'colour'");
}

TEST(JinjaStatements, MacroCallingMacroAndNamespaceMutation) {
  // Mirrors the Qwen3.5 template: a macro updating a namespace counter.
  const char* t =
      "{% set count = namespace(value=0) %}"
      "{% macro render(items, counting) %}{% for item in items %}{% if counting %}"
      "{% set count.value = count.value + 1 %}{% endif %}#{{ count.value }}{% endfor %}{% endmacro %}"
      "{{ render([1, 2], true) }}|{{ render([1], false) }}|{{ render([1], true) | trim }}";
  EXPECT_EQ(render(t), "#1#2|#2|#3");
}

}  // namespace
}  // namespace moeserve::chat::jinja
