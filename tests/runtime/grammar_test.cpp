// The GBNF compiler (runtime/grammar/gbnf.h) and the byte-level matcher
// (runtime/grammar/matcher.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/utf8_encode.h"
#include "runtime/grammar/gbnf.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/utf8_ranges.h"
#include "runtime/grammar_test_util.h"
#include "runtime/json_prefix.h"

namespace moeserve::runtime::grammar {
namespace {

using testing::compile;
using testing::matches;

// The error message of a grammar that must not compile.
std::string error_of(std::string_view text, const GrammarLimits& limits = {}) {
  auto r = parse_gbnf(text, limits);
  EXPECT_FALSE(r.is_ok()) << text;
  if (r.is_ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

TEST(GrammarParse, LiteralsWithEveryEscape) {
  auto g = compile(R"(root ::= "a\n\t\r\\\"\[\]\x41\u00e9\U0001F600")");
  EXPECT_TRUE(matches(g, "a\n\t\r\\\"[]A\xC3\xA9\xF0\x9F\x98\x80"));
  EXPECT_FALSE(matches(g, "a\n\t\r\\\"[]A\xC3\xA9"));
  // A repeated literal repeats as a whole; the empty literal matches nothing.
  auto rep = compile(R"(root ::= "ab"* "" "c")");
  EXPECT_TRUE(matches(rep, "c"));
  EXPECT_TRUE(matches(rep, "ababc"));
  EXPECT_FALSE(matches(rep, "abbc"));
}

TEST(GrammarParse, CharacterClasses) {
  auto g = compile(R"(root ::= [a-z0-9_]+ [^"\\] [\x00-\x1F] [a-] []? [\]x])");
  EXPECT_TRUE(matches(g, "ab_9Z\x01-]"));
  EXPECT_TRUE(matches(g,
                      "q!\ta"
                      "x"));
  EXPECT_FALSE(matches(g, "A!\ta]"));   // 'A' is not in [a-z0-9_]
  EXPECT_FALSE(matches(g, "a\"\ta]"));  // '"' is excluded
  EXPECT_FALSE(matches(g, "a!\ta]]"));
  // `.` is any character, newline included, of any length.
  auto dot = compile("root ::= . . .");
  EXPECT_TRUE(matches(dot, "\n\xC3\xA9\xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(matches(dot, "ab"));
}

TEST(GrammarParse, GroupsAlternativesAndMultiLineRules) {
  auto g = compile(R"(
# a comment line
root ::= greeting ( " " | "-" )
    name   # the rest of the rule is on the next lines
  | "bye"
greeting ::= "hi" | "hello"
name ::= ( [A-Z] ( [a-z] | "_" )* ) | "x-1"
my_rule-2 ::= "unused"
)");
  EXPECT_TRUE(matches(g, "hi Bob"));
  EXPECT_TRUE(matches(g, "hello-B_o"));
  EXPECT_TRUE(matches(g, "hi x-1"));
  EXPECT_TRUE(matches(g, "bye"));
  EXPECT_FALSE(matches(g, "hi"));
  EXPECT_FALSE(matches(g, "hello bob"));
  // A new rule starts where `name ::=` appears, even on the same line.
  auto same_line = compile(R"(root ::= a "!" a ::= "x")");
  EXPECT_TRUE(matches(same_line, "x!"));
  // An empty alternative matches the empty string.
  auto empty = compile(R"(root ::= "a" | )");
  EXPECT_TRUE(matches(empty, ""));
  EXPECT_TRUE(matches(empty, "a"));
}

TEST(GrammarParse, RepetitionBoundsAreExact) {
  struct Case {
    const char* text;
    int min, max;  // max -1: unbounded
  };
  const Case cases[] = {
      {R"(root ::= "a"{0})", 0, 0},   {R"(root ::= "a"{3})", 3, 3},       {R"(root ::= "a"{2,})", 2, -1},
      {R"(root ::= "a"{1,3})", 1, 3}, {R"(root ::= "a"{ 0 , 2 })", 0, 2}, {R"(root ::= "a"*)", 0, -1},
      {R"(root ::= "a"+)", 1, -1},    {R"(root ::= "a"?)", 0, 1},
  };
  for (const Case& c : cases) {
    auto g = compile(c.text);
    for (int n = 0; n <= 7; ++n) {
      const bool want = n >= c.min && (c.max < 0 || n <= c.max);
      EXPECT_EQ(matches(g, std::string(size_t(n), 'a')), want) << c.text << " n=" << n;
    }
  }
  // A group repeated, and a repetition repeated.
  auto g = compile(R"(root ::= ("ab" | "c"){2,3} "x"**)");
  EXPECT_TRUE(matches(g, "abc"));
  EXPECT_TRUE(matches(g, "cabcxx"));
  EXPECT_FALSE(matches(g, "c"));
  EXPECT_FALSE(matches(g, "cccc"));
}

TEST(GrammarParse, RepetitionOfSomethingThatMatchesNothing) {
  // ("a"?)* goes round a loop that may consume nothing: allowed, and finite.
  auto g = compile(R"(root ::= ("a"? | [b-c]*)* "z")");
  EXPECT_TRUE(matches(g, "z"));
  EXPECT_TRUE(matches(g, "abcbaz"));
  EXPECT_FALSE(matches(g, "abd"));
}

TEST(GrammarErrors, NameTheLineColumnAndRule) {
  EXPECT_EQ(error_of("root ::= foo"), "grammar line 1, column 10: undefined rule 'foo'");
  EXPECT_EQ(error_of("root ::= \"a\"\n\nx ::= bar"), "grammar line 3, column 7: undefined rule 'bar'");
  EXPECT_NE(error_of("a ::= \"x\"").find("no rule named 'root'"), std::string::npos);
  EXPECT_EQ(error_of("root ::= \"abc"), "grammar line 1, column 10: unterminated string literal");
  EXPECT_EQ(error_of("root ::= [abc"), "grammar line 1, column 10: unterminated character class");
  EXPECT_EQ(error_of("root ::= \"\\q\""), "grammar line 1, column 11: bad escape '\\q'");
  EXPECT_NE(error_of("root ::= \"\\x4\"").find("column 11: bad escape: \\x needs 2 hex digits"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= [\\U00110000]").find("past U+10FFFF"), std::string::npos);
  EXPECT_EQ(error_of("root ::= \"a\"{3,2}"),
            "grammar line 1, column 13: repetition bounds {3,2}: the minimum exceeds the maximum");
  EXPECT_NE(error_of("root ::= [z-a]").find("column 11: character range ends before it starts"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= *\"a\"").find("nothing before it to repeat"), std::string::npos);
  EXPECT_NE(error_of("root = \"a\"").find("expected '::='"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\" )").find("column 14: ')' without a matching '('"), std::string::npos);
  EXPECT_NE(error_of("root ::= ( \"a\"").find("expected ')'"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"\nroot ::= \"b\"").find("line 2, column 1: rule 'root' is defined twice"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= \"\xC3\"").find("invalid UTF-8"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{99999999999}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\" @").find("unexpected '@'"), std::string::npos);
}

TEST(GrammarErrors, LeftRecursionIsRefusedAndNamed) {
  EXPECT_NE(error_of("root ::= root \"a\" | \"b\"").find("line 1, column 1: left recursion: rule 'root'"),
            std::string::npos);
  // Indirect.
  const std::string indirect = error_of("root ::= a\na ::= b \"x\"\nb ::= a \"y\" | \"z\"");
  EXPECT_NE(indirect.find("left recursion: rule 'a'"), std::string::npos) << indirect;
  EXPECT_NE(indirect.find("a -> b -> a"), std::string::npos) << indirect;
  // Through a prefix that can match nothing, and through a group and a repetition.
  EXPECT_NE(error_of("root ::= opt root \"x\" | \"y\"\nopt ::= \"z\"?").find("rule 'root'"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= [a]* ( root \"x\" )+ | \"y\"").find("rule 'root'"), std::string::npos);
  // A reference after something that consumes is fine.
  auto g = compile("root ::= \"(\" root \")\" | \"\"");
  EXPECT_TRUE(matches(g, "((()))"));
  EXPECT_FALSE(matches(g, "(()"));
}

TEST(GrammarErrors, LimitsAgainstHostileGrammars) {
  EXPECT_NE(error_of("root ::= \"a\"{0,100000}").find("more than 10000 rules"), std::string::npos);
  EXPECT_NE(error_of("root ::= (\"a\"{1000}){1001}").find("more than 1000000 elements"), std::string::npos);
  EXPECT_NE(error_of("root ::= ((\"ab\"{1000}){1000}){1000}").find("elements"), std::string::npos);
  for (size_t depth : {size_t(257), size_t(100000)}) {
    const std::string deep = "root ::= " + std::string(depth, '(') + "\"a\"" + std::string(depth, ')');
    EXPECT_NE(error_of(deep).find("column 266: groups nested more than 256 deep"), std::string::npos);
  }
  const std::string ok = "root ::= " + std::string(256, '(') + "\"a\"" + std::string(256, ')');
  EXPECT_TRUE(matches(compile(ok), "a"));
  const std::string big = "root ::= \"a\"\n" + std::string(size_t(1) << 20, ' ');
  EXPECT_NE(error_of(big).find("more than the limit"), std::string::npos);
  GrammarLimits small;
  small.max_rules = 3;
  EXPECT_NE(
      error_of("root ::= a b c\na ::= \"a\"\nb ::= \"b\"\nc ::= \"c\"", small).find("more than 3 rules"),
      std::string::npos);
}

TEST(GrammarUtf8, ClassesMatchUtf8BytesOneAtATime) {
  auto g = compile(R"(root ::= [^"]+)");
  GrammarState st(g);
  ASSERT_TRUE(st.feed(0xC3));  // 'é' = C3 A9, fed one byte at a time
  EXPECT_FALSE(st.complete());
  EXPECT_TRUE(st.can_continue());
  EXPECT_FALSE(st.feed('a'));  // a continuation byte must come
  ASSERT_TRUE(st.feed(0xA9));
  EXPECT_TRUE(st.complete());
  EXPECT_FALSE(st.feed('"'));
  EXPECT_FALSE(st.feed(0xA9)) << "a stray continuation byte";
  EXPECT_FALSE(st.feed(0xC0)) << "never in UTF-8";
  EXPECT_FALSE(st.feed(0xFF));
  EXPECT_FALSE(matches(g, "\xE0\x80\x80")) << "overlong";
  EXPECT_FALSE(matches(g, "\xED\xA0\x80")) << "a surrogate";
  EXPECT_FALSE(matches(g, "\xF4\x90\x80\x80")) << "past U+10FFFF";
  EXPECT_TRUE(matches(g, "\xED\x9F\xBF\xEE\x80\x80\xF4\x8F\xBF\xBF"));

  auto greek = compile("root ::= [α-ω]+");
  EXPECT_TRUE(matches(greek, "αβγω"));
  EXPECT_FALSE(matches(greek, "Ω"));  // U+03A9, below α
  EXPECT_FALSE(matches(greek, "a"));
}

// Random classes over code points: a byte string of one encoded code point
// matches exactly when the code point is in the class.
TEST(GrammarUtf8, RandomClassesAgreeWithTheirCodePoints) {
  std::mt19937 rng(11);
  const uint32_t edges[] = {0,      0x7F,   0x80,   0x7FF,   0x800,   0xFFF,   0x1000,
                            0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0x10FFFF};
  auto pick = [&]() -> uint32_t {
    const uint32_t e = edges[rng() % std::size(edges)];
    const int32_t off = int32_t(rng() % 5) - 2;
    const int64_t v = int64_t(e) + off;
    return rng() % 3 == 0 ? rng() % 0x110000 : uint32_t(std::clamp<int64_t>(v, 0, 0x10FFFF));
  };
  for (int round = 0; round < 60; ++round) {
    std::vector<CodeRange> ranges;
    std::string text = "root ::= [";
    if (round % 2) text += "^";
    for (int i = 0; i < 1 + int(rng() % 3); ++i) {
      uint32_t a = pick(), b = pick();
      if (a > b) std::swap(a, b);
      ranges.push_back({a, b});
      text += fmt::format("\\U{:08X}-\\U{:08X}", a, b);
    }
    text += "]";
    std::vector<CodeRange> set = normalize_ranges(ranges);
    if (round % 2) set = complement_ranges(set);
    auto g = compile(text);
    ASSERT_NE(g, nullptr);
    for (int k = 0; k < 400; ++k) {
      uint32_t cp = pick();
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      std::string bytes;
      append_utf8(bytes, char32_t(cp));
      const bool in =
          std::any_of(set.begin(), set.end(), [&](CodeRange r) { return cp >= r.lo && cp <= r.hi; });
      EXPECT_EQ(matches(g, bytes), in) << text << " U+" << std::hex << cp;
    }
    // Random short byte strings: matched only if they are one such code point.
    for (int k = 0; k < 400; ++k) {
      static constexpr uint8_t kLeads[] = {0x41, 0x7F, 0xC2, 0xDF, 0xE0, 0xED,
                                           0xEF, 0xF0, 0xF4, 0xF5, 0xC0, 0x80};
      std::string bytes(1, char(rng() % 2 ? kLeads[rng() % std::size(kLeads)] : rng() % 256));
      for (size_t i = 0, n = rng() % 4; i < n; ++i)
        bytes += char(rng() % 5 == 0 ? rng() % 256 : 0x80 + rng() % 64);
      uint32_t cp = 0;
      const size_t len = decode_utf8(bytes, 0, cp);
      const bool in = len == bytes.size() && std::any_of(set.begin(), set.end(), [&](CodeRange r) {
                        return cp >= r.lo && cp <= r.hi;
                      });
      EXPECT_EQ(matches(g, bytes), in) << text;
    }
  }
}

TEST(GrammarJson, AcceptsDocumentsAndEveryPrefixAndRefusesBadOnes) {
  auto g = compile(testing::kJsonGbnf);
  const std::string docs[] = {
      R"({})",
      R"({"a": 1, "b": [true, false, null, -0.5e+3, 0, 12.25E-2], "c": {"d": "x\"\\\/\b\f\n\r\t\u00e9y"}})",
      "{\"\xC3\xA9t\xC3\xA9\": [ ] , \"n\" : [[], [{}]], \"\xE4\xB8\xAD\": \"\xF0\x9F\x98\x80\"}\n ",
  };
  for (const std::string& doc : docs) {
    GrammarState st(g);
    for (size_t i = 0; i < doc.size(); ++i) {
      ASSERT_TRUE(st.feed(uint8_t(doc[i]))) << doc << " refused at byte " << i;
      if (doc.find_first_not_of(" \n", i + 1) != std::string::npos) {
        EXPECT_FALSE(st.complete()) << i;
      }
    }
    EXPECT_TRUE(st.complete()) << doc;
  }
  const char* bad[] = {"[1]",
                       "{\"a\" 1}",
                       "{\"a\": 01}",
                       "{\"a\": 1.}",
                       "{\"a\": tru}",
                       "{\"a\": \"\x01\"}",
                       "{\"a\": \"\\x\"}",
                       "{\"a\": 1,}",
                       "{\"a\": [1,]}",
                       "{} x",
                       " {}",
                       "{'a': 1}",
                       "{\"a\": \"\xC3\"}",
                       "{\"a\": \"\xFF\"}"};
  for (const char* text : bad) EXPECT_FALSE(matches(g, text)) << text;
  const auto blanks_inside = [](size_t n) {
    std::string s = "{";  // appends (not operator+): gcc 12 -Wrestrict false positive
    s.append(n, ' ');
    return s + "}";
  };
  EXPECT_FALSE(matches(g, blanks_inside(25)));
  EXPECT_TRUE(matches(g, blanks_inside(24)));
}

// The JSON grammar and JsonPrefix decide every byte alike (ASCII input:
// JsonPrefix passes any byte >= 0x80 inside strings, the grammar only UTF-8).
TEST(GrammarJson, AgreesWithJsonPrefixByteForByte) {
  const std::string alphabet = "{}[]:,\"\\ 0123-.eEtrufalsn x\n\tbu/A\x01\x7F";
  std::mt19937 rng(5);
  for (const bool object_only : {true, false}) {
    auto g = compile(object_only ? std::string(testing::kJsonGbnf) : testing::json_any_value_gbnf());
    int long_agreements = 0;
    for (int n = 0; n < 30000; ++n) {
      std::string text = n % 2 ? "{\"a\":" : "";
      const int len = 1 + int(rng() % 14);
      for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
      JsonPrefix p(object_only);
      GrammarState st(g);
      size_t i = 0;
      for (; i < text.size(); ++i) {
        const bool a = p.feed(uint8_t(text[i]));
        ASSERT_EQ(st.feed(uint8_t(text[i])), a) << "byte " << i << " of " << text;
        if (!a) break;
        ASSERT_EQ(st.complete(), p.complete()) << "after byte " << i << " of " << text;
      }
      long_agreements += i >= 8;
    }
    EXPECT_GT(long_agreements, 400);
  }
}

TEST(GrammarMatcher, StatesAreCanonicalValues) {
  auto g = compile(R"(root ::= ( "ab" | "a" "b" | [a-b] "b" )* )");
  GrammarState a(g), b(g);
  ASSERT_TRUE(a.feed_all("abab"));
  ASSERT_TRUE(b.feed_all("ab"));
  EXPECT_TRUE(a == b) << "the same pending stacks, reached by different input";
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  ASSERT_TRUE(b.feed('a'));
  EXPECT_FALSE(a == b);
  EXPECT_EQ(b.stack_count(), 3u);  // after "a": three ways to read "b"
  // All or nothing.
  GrammarState c = a;
  EXPECT_FALSE(c.feed_all("abx"));
  EXPECT_TRUE(c == a);
  EXPECT_FALSE(GrammarState(nullptr).can_continue());
}

TEST(GrammarMatcher, TheStackBoundRefusesTooAmbiguousInput) {
  std::string text = "root ::= \"b\" x\nx ::= \"a\"";
  const size_t n = GrammarState::kMaxStacks + 10;
  for (size_t i = 1; i < n; ++i) text += " | \"a\"";
  auto g = compile(text);
  GrammarState st(g);
  EXPECT_FALSE(st.feed('b')) << "more than kMaxStacks stacks would be live";
  EXPECT_TRUE(st.can_continue());
  EXPECT_EQ(st.stack_count(), 1u);
  // Fewer alternatives fit.
  std::string fits = "root ::= \"b\" x\nx ::= \"a\"";
  for (size_t i = 1; i < 1000; ++i) fits += " | \"a\"";
  GrammarState ok(compile(fits));
  ASSERT_TRUE(ok.feed('b'));
  EXPECT_EQ(ok.stack_count(), 1000u);
  EXPECT_TRUE(ok.feed('a'));
  EXPECT_TRUE(ok.complete());
  EXPECT_EQ(ok.stack_count(), 1u) << "the finished stacks merge";
  // Deep nesting stays bounded too.
  auto nest = compile(R"g(root ::= "(" root ")" | "x")g");
  GrammarState deep(nest);
  size_t fed = 0;
  while (fed < 2 * GrammarState::kMaxStackDepth && deep.feed('(')) ++fed;
  EXPECT_LT(fed, 2 * GrammarState::kMaxStackDepth);
  EXPECT_GT(fed, GrammarState::kMaxStackDepth / 2);
}

}  // namespace
}  // namespace moeserve::runtime::grammar
