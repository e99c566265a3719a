// Shared by the grammar tests: a JSON grammar in GBNF and small helpers.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>

#include "runtime/grammar/gbnf.h"
#include "runtime/grammar/matcher.h"

namespace moeserve::runtime::grammar::testing {

// JSON as JsonPrefix (runtime/json_prefix.h) recognises it: the value comes
// first, and a run of whitespace between tokens is at most 24 bytes. The
// root is an object; replace the first line to allow any value.
inline constexpr std::string_view kJsonGbnf = R"gbnf(root ::= object ws
value   ::= object | array | string | number | "true" | "false" | "null"
object  ::= "{" ws ( member ( "," ws member )* )? "}"
member  ::= string ws ":" ws value ws
array   ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
# strings: any character but '"', '\' and controls, or an escape
string  ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number  ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws      ::= [ \t\n\r]{0,24}
)gbnf";

inline std::string json_any_value_gbnf() {
  std::string text(kJsonGbnf);
  return "root ::= value ws" + text.substr(text.find('\n'));
}

inline std::shared_ptr<const Grammar> compile(std::string_view text) {
  auto r = parse_gbnf(text);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string() << "\n" << text;
  return r.is_ok() ? r.value() : nullptr;
}

// The whole of `s` is a sentence of the grammar.
inline bool matches(const std::shared_ptr<const Grammar>& g, std::string_view s) {
  GrammarState st(g);
  return st.feed_all(s) && st.complete();
}

}  // namespace moeserve::runtime::grammar::testing
