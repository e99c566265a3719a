// Lexing and whitespace control: trim_blocks / lstrip_blocks as transformers
// configures Jinja2, the -/+ modifiers, comments, raw blocks, literals.
// Expected strings were checked against Python's Jinja2 with the same settings.
#include <gtest/gtest.h>

#include "chat/jinja_lexer.h"
#include "jinja_test_util.h"

namespace moeserve::chat::jinja {
namespace {

using testing::render;
using testing::render_error;

TEST(JinjaWhitespace, TrimBlocksDropsTheNewlineAfterABlockTag) {
  EXPECT_EQ(render("{% if true %}\nA{% endif %}\nB"), "AB");
  // Only one newline, and only after block/comment tags, never after {{ }}.
  EXPECT_EQ(render("{% if true %}\n\nA{% endif %}"), "\nA");
  EXPECT_EQ(render("{{ 1 }}\nB"), "1\nB");
  EXPECT_EQ(render("x{# note #}\ny"), "xy");
}

TEST(JinjaWhitespace, LstripBlocksDropsIndentationBeforeATagThatStartsALine) {
  EXPECT_EQ(render("a\n  {% if true %}\n  x\n  {% endif %}\nb"), "a\n  x\nb");
  EXPECT_EQ(render("x\n  {# c #}\ny"), "x\ny");
  // Not when something else precedes the tag on its line, and never for {{ }}.
  EXPECT_EQ(render("x  {% if true %}y{% endif %}"), "x  y");
  EXPECT_EQ(render("x\n  {{ 1 }}\ny"), "x\n  1\ny");
  // At the very start of the template, and spaces after the tag are kept.
  EXPECT_EQ(render("\t {% if true %}  \ny{% endif %}"), "  \ny");
}

TEST(JinjaWhitespace, MinusModifiersStripAllAdjacentWhitespace) {
  EXPECT_EQ(render("a  \n  {{- 'b' -}}  \n  c"), "abc");
  EXPECT_EQ(render("x\n    {%- if true %}\n    y\n    {% endif -%}\n    z"), "x    y\nz");
  EXPECT_EQ(render("a \n {#- comment -#} \n b"), "ab");
}

TEST(JinjaWhitespace, PlusModifiersDisableLstripAndTrim) {
  EXPECT_EQ(render("a\n  {%+ if true %}x{% endif %}"), "a\n  x");
  EXPECT_EQ(render("{% if true +%}\nA{% endif %}"), "\nA");
  EXPECT_EQ(render("x{# c +#}\ny"), "x\ny");
}

TEST(JinjaWhitespace, NewlinesAreNormalizedAndOneTrailingNewlineDropped) {
  EXPECT_EQ(render("a\r\nb\r\n{% if true %}\r\nc{% endif %}"), "a\nb\nc");
  EXPECT_EQ(render("a\n"), "a");
  EXPECT_EQ(render("a\n\n"), "a\n");
}

TEST(JinjaWhitespace, RawBlocksAreVerbatim) {
  EXPECT_EQ(render("{% raw %}{{ x }} {% if %}{% endraw %}"), "{{ x }} {% if %}");
  EXPECT_EQ(render("{% raw -%}   {{ y }}   {%- endraw %}!"), "{{ y }}!");
  Status st = render_error("{% raw %}never closed");
  EXPECT_NE(st.message().find("unclosed raw block"), std::string::npos) << st.message();
}

TEST(JinjaLexer, StringEscapesFollowPython) {
  EXPECT_EQ(render(R"({{ "a\tb\nc\\d\"e" }})"), "a\tb\nc\\d\"e");
  EXPECT_EQ(render(R"({{ 'it\'s' }}|{{ "\x41\u00e9\U0001F600" }}|{{ "\q" }})"), "it's|A\xC3\xA9\xF0\x9F\x98\x80|\\q");
  EXPECT_EQ(render(R"({{ "\ud83d\ude00" }})"), "\xF0\x9F\x98\x80");  // surrogate pair joined
  EXPECT_EQ(render(R"({{ "ab" "cd" }})"), "abcd");                    // adjacent literals concatenate
}

TEST(JinjaLexer, NumbersAndBraceBalancing) {
  EXPECT_EQ(render("{{ 1_000 + 2 }}|{{ 1.5e3 }}|{{ 2E-2 }}"), "1002|1500.0|0.02");
  // `}}` inside a dict literal does not end the tag.
  EXPECT_EQ(render("{{ {'a': {'b': 1}}['a']['b'] }}"), "1");
  EXPECT_EQ(render("{{ '%}' }}{% if '%}' %}ok{% endif %}"), "%}ok");
}

TEST(JinjaLexer, UnclosedTagsReportWhereTheyStart) {
  Status st = render_error("line one\n  {{ x ");
  EXPECT_EQ(st.code(), StatusCode::kInvalidFormat);
  EXPECT_EQ(st.message(), "chat template line 2:3: unclosed '{{': missing '}}'");
  st = render_error("{# never closed");
  EXPECT_EQ(st.message(), "chat template line 1:1: unclosed comment: missing '#}'");
  st = render_error("{{ 'abc }}");
  EXPECT_EQ(st.message(), "chat template line 1:4: unterminated string literal");
  st = render_error("{{ a $ b }}");
  EXPECT_EQ(st.message(), "chat template line 1:6: unexpected character '$' in tag");
}

TEST(JinjaLexer, TokenPositionsAreOneBasedLineAndColumn) {
  SourceInfo info;
  Result<std::vector<Token>> tokens = tokenize("ab\n  {{ name }}", info);
  ASSERT_TRUE(tokens.is_ok());
  ASSERT_GE(tokens->size(), 3u);
  EXPECT_EQ((*tokens)[2].kind, TokenKind::kName);
  EXPECT_EQ((*tokens)[2].text, "name");
  EXPECT_EQ((*tokens)[2].pos.line, 2);
  EXPECT_EQ((*tokens)[2].pos.column, 6);
}

}  // namespace
}  // namespace moeserve::chat::jinja
