// The JSON prefix recogniser behind structured output (runtime/json_prefix.h)
// and the token constraint built on it (runtime/token_constraint.h).
#include "runtime/json_prefix.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/token_constraint.h"

namespace moeserve::runtime {
namespace {

// Feeds `text`; returns the index of the first refused byte, or -1.
int first_refused(JsonPrefix& p, const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (!p.feed(uint8_t(text[i]))) return int(i);
  }
  return -1;
}

TEST(JsonPrefix, AcceptsDocumentsAndEveryPrefixOfThem) {
  const std::string docs[] = {
      R"({})",
      R"({"a": 1, "b": [true, false, null, -0.5e+3, 0, 12.25E-2], "c": {"d": "x\"\\\/\b\f\n\r\t\u00e9y"}})",
      "{\"\xC3\xA9t\xC3\xA9\": [ ] , \"n\" : [[], [{}]]}\n ",
  };
  for (const std::string& doc : docs) {
    JsonPrefix p;
    for (size_t i = 0; i < doc.size(); ++i) {
      ASSERT_TRUE(p.feed(uint8_t(doc[i]))) << doc << " refused at byte " << i;
      if (i + 1 < doc.size() && doc.find_first_not_of(" \n", i + 1) != std::string::npos) {
        EXPECT_FALSE(p.complete()) << doc << " complete after byte " << i;
      }
    }
    EXPECT_TRUE(p.complete()) << doc;
  }
}

TEST(JsonPrefix, RefusesAtTheFirstBadByte) {
  const std::pair<std::string, int> cases[] = {
      {"[1]", 0},           // object_only: an array
      {"{\"a\" 1}", 5},     // missing colon
      {"{\"a\": 01}", 7},   // leading zero
      {"{\"a\": 1.}", 8},   // digit expected after '.'
      {"{\"a\": tru}", 9},  // literal cut
      {"{\"a\": \"\x01\"}", 7},
      {"{\"a\": \"\\x\"}", 8},  // bad escape
      {"{\"a\": \"\\u12G\"}", 11},
      {"{\"a\": 1,}", 8},  // a key must follow ','
      {"{\"a\": [1,]}", 9},
      {"{\"a\": 1]", 7},  // wrong close
      {"{} x", 3},        // only whitespace after the value
      {"{'a': 1}", 1},
      {" {}", 0},                              // the value comes first
      {"{" + std::string(25, ' ') + "}", 25},  // at most 24 blanks in a row
      {"{\"a\":" + std::string(24, '\n') + "1" + std::string(25, ' '), 54},
  };
  for (const auto& [text, at] : cases) {
    JsonPrefix p;
    EXPECT_EQ(first_refused(p, text), at) << text;
  }
}

TEST(JsonPrefix, AnyValueModeAndTheDepthLimit) {
  JsonPrefix value(false);
  EXPECT_EQ(first_refused(value, "[1, \"a\"]"), -1);
  EXPECT_TRUE(value.complete());
  JsonPrefix number(false);
  EXPECT_EQ(first_refused(number, "-12.5e3"), -1);
  EXPECT_TRUE(number.complete());  // a top-level number may end here
  JsonPrefix deep(false);
  EXPECT_EQ(first_refused(deep, std::string(JsonPrefix::kMaxDepth, '[')), -1);
  EXPECT_FALSE(deep.feed('['));
}

// Random short texts over JSON's alphabet: complete() after feeding all of a
// text agrees with nlohmann's validator, and a refused text is never valid.
TEST(JsonPrefix, AgreesWithAJsonParserOnRandomTexts) {
  const std::string alphabet = "{}[]:,\"\\ 0123-.eEtrufalsn x";
  std::mt19937 rng(7);
  int valid = 0;
  for (int n = 0; n < 200000; ++n) {
    std::string text;
    const int len = 1 + int(rng() % 10);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    if (n % 3 == 0) text = "{\"a\":" + text;  // reach deeper states more often
    if (text[0] == ' ') continue;             // leading blanks are refused on purpose
    JsonPrefix p(false);
    const bool fed = first_refused(p, text) < 0;
    const bool parses = nlohmann::json::accept(text);
    valid += parses;
    if (parses) {
      EXPECT_TRUE(fed && p.complete()) << text;
    } else {
      EXPECT_FALSE(fed && p.complete()) << text;
    }
  }
  EXPECT_GT(valid, 100) << "the generator should produce some valid texts";
}

TEST(JsonConstraint, TokensMustKeepTheOutputJsonAndEndOnlyWhenComplete) {
  auto bytes = std::make_shared<std::vector<std::string>>(
      std::vector<std::string>{"{", "\"a\"", ":", " 1", "}", "x", "", "]"});
  const int32_t kEnd = 8;
  JsonConstraint c(bytes, {kEnd}, true);
  EXPECT_TRUE(c.allows(0));
  EXPECT_FALSE(c.allows(5));     // 'x'
  EXPECT_FALSE(c.allows(6));     // a control token (no bytes)
  EXPECT_FALSE(c.allows(kEnd));  // nothing yet
  EXPECT_FALSE(c.allows(99));    // past the table
  for (int32_t t : {0, 1, 2, 3}) {
    ASSERT_TRUE(c.allows(t)) << t;
    c.accept(t);
  }
  EXPECT_FALSE(c.allows(7));
  EXPECT_FALSE(c.allows(kEnd));
  c.accept(4);
  EXPECT_TRUE(c.allows(kEnd));
  EXPECT_FALSE(c.allows(3)) << "after the object only the end may come";
}

}  // namespace
}  // namespace moeserve::runtime
