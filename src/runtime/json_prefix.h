// A byte-level recogniser of JSON prefixes (RFC 8259): fed one byte at a
// time, it answers whether the bytes so far can still be continued into a
// complete JSON text, and whether they already are one. Constrained decoding
// (token_constraint.h) runs it over each candidate token's bytes. Strings
// take any byte >= 0x20 except '"' and '\' unescaped (bytes of multi-byte
// UTF-8 characters pass through: a token may end mid-character), escapes
// \" \\ \/ \b \f \n \r \t \uXXXX; numbers as the grammar has them; literals
// true, false, null. Nesting is bounded (kMaxDepth) so the state stays small
// and copyable. Unlike RFC 8259, which allows any whitespace between tokens,
// the text must start with its value and a run of whitespace outside strings
// is at most kMaxWhitespaceRun bytes: a model must not be able to fill its
// answer with blanks (llama.cpp's JSON grammar bounds it the same way).
#pragma once

#include <cstdint>
#include <string>

namespace moeserve::runtime {

class JsonPrefix {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxWhitespaceRun = 24;

  // object_only: the text must be an object (response_format json_object).
  explicit JsonPrefix(bool object_only = true) : object_only_(object_only) {}

  // Consumes one byte; false (and no change) when it cannot continue a JSON text.
  bool feed(uint8_t c);
  // Every byte of `bytes`, stopping at the first refused one.
  bool feed_all(const std::string& bytes);
  // The bytes so far are a complete JSON text (trailing whitespace allowed).
  bool complete() const;

 private:
  enum class Lex : uint8_t {
    kValue,       // expecting a value (or ']' right after '[')
    kKeyOrEnd,    // after '{': a key or '}'
    kKey,         // after ',' in an object: a key
    kColon,       // after a key
    kCommaOrEnd,  // after a value inside a container
    kString,      // inside a string
    kEscape,      // after '\'
    kUnicode,     // inside \uXXXX (hex_left more digits)
    kNumber,      // inside a number (num_ tracks the part)
    kLiteral,     // inside true / false / null
    kDone,        // the top-level value is complete
  };
  enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };

  bool value_start(uint8_t c);
  bool after_value(uint8_t c);  // a byte following a completed value
  void close_value();           // a value ended: back to the container or done
  bool number(uint8_t c);

  bool object_only_;
  Lex lex_ = Lex::kValue;
  bool string_is_key_ = false;
  Num num_ = Num::kMinus;
  uint8_t hex_left_ = 0;
  const char* literal_ = nullptr;  // the rest of true/false/null
  int depth_ = 0;
  char stack_[kMaxDepth] = {};  // '{' or '[' per open container
  bool started_ = false;        // the top-level value has begun
  bool array_start_ = false;    // right after '[' (']' may come)
  uint8_t ws_run_ = 0;          // whitespace bytes in a row outside strings

  bool step(uint8_t c);
};

}  // namespace moeserve::runtime
