// GBNF, the grammar format llama-server accepts for constrained decoding,
// compiled into a byte-level Grammar (grammar.h) for GrammarState (matcher.h).
//
//   root   ::= "{" ws pair ("," ws pair)* "}"   # a comment
//   pair   ::= [a-z_]+ ":" ws [0-9]{1,3}
//   ws     ::= [ \t\n]*
//
// Rules `name ::= alternatives` (names [a-zA-Z0-9_-]+; a rule may span lines,
// the next one starts where `name ::=` appears); "literals" and [classes]
// (negated [^...], ranges a-z) with the escapes \n \r \t \\ \" \[ \] \xHH
// \uHHHH \UHHHHHHHH; `.` any character; groups ( ... ); alternatives |;
// postfix * + ? {m} {m,} {m,n}. A rule named `root` is where matching starts.
//
// Text is hostile input (it comes with a request): every problem is a
// kInvalidArgument Status "grammar line L, column C: reason" — unknown rules,
// a missing root, left recursion, unterminated literals, bad escapes, bad
// repetition bounds — and GrammarLimits bounds what compiling may build.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "core/status.h"
#include "runtime/grammar/grammar.h"

namespace moeserve::runtime::grammar {

struct GrammarLimits {
  size_t max_text_bytes = size_t(1) << 20;
  // Rules once repetitions and classes have become helper rules.
  size_t max_rules = 10000;
  // Compiled elements in all: x{0,100000} is refused, not allocated.
  size_t max_elements = 1000000;
  // Nested groups: the parser recurses once a level.
  int max_nesting = 256;
};

Result<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text, const GrammarLimits& limits = {});

}  // namespace moeserve::runtime::grammar
