#include "runtime/json_prefix.h"

namespace moeserve::runtime {
namespace {

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

bool JsonPrefix::feed(uint8_t c) {
  const JsonPrefix saved = *this;
  if (step(c)) return true;
  *this = saved;
  return false;
}

bool JsonPrefix::feed_all(const std::string& bytes) {
  for (const char ch : bytes) {
    if (!feed(uint8_t(ch))) return false;
  }
  return true;
}

bool JsonPrefix::complete() const {
  if (lex_ == Lex::kDone) return true;
  const bool final_number =
      num_ == Num::kZero || num_ == Num::kInt || num_ == Num::kFrac || num_ == Num::kExpDigits;
  return lex_ == Lex::kNumber && depth_ == 0 && final_number;
}

void JsonPrefix::close_value() { lex_ = depth_ == 0 ? Lex::kDone : Lex::kCommaOrEnd; }

bool JsonPrefix::value_start(uint8_t c) {
  if (object_only_ && !started_ && c != '{') return false;
  started_ = true;
  switch (c) {
    case '{':
    case '[':
      if (depth_ == kMaxDepth) return false;
      stack_[depth_++] = char(c);
      lex_ = c == '{' ? Lex::kKeyOrEnd : Lex::kValue;
      array_start_ = c == '[';
      return true;
    case '"':
      lex_ = Lex::kString, string_is_key_ = false;
      return true;
    case '-':
      lex_ = Lex::kNumber, num_ = Num::kMinus;
      return true;
    case 't':
      lex_ = Lex::kLiteral, literal_ = "rue";
      return true;
    case 'f':
      lex_ = Lex::kLiteral, literal_ = "alse";
      return true;
    case 'n':
      lex_ = Lex::kLiteral, literal_ = "ull";
      return true;
    default:
      if (!is_digit(c)) return false;
      lex_ = Lex::kNumber, num_ = c == '0' ? Num::kZero : Num::kInt;
      return true;
  }
}

// The byte after a value inside a container: ',' or the container's close.
bool JsonPrefix::after_value(uint8_t c) {
  if (is_ws(c)) return true;
  const char top = stack_[depth_ - 1];
  if (c == ',') {
    lex_ = top == '{' ? Lex::kKey : Lex::kValue;
    return true;
  }
  if ((c == '}' && top == '{') || (c == ']' && top == '[')) {
    --depth_;
    close_value();
    return true;
  }
  return false;
}

bool JsonPrefix::number(uint8_t c) {
  switch (num_) {
    case Num::kMinus:
      if (!is_digit(c)) return false;
      num_ = c == '0' ? Num::kZero : Num::kInt;
      return true;
    case Num::kZero:
    case Num::kInt:
      if (is_digit(c) && num_ == Num::kInt) return true;
      if (c == '.') return num_ = Num::kDot, true;
      if (c == 'e' || c == 'E') return num_ = Num::kExp, true;
      break;
    case Num::kDot:
      if (!is_digit(c)) return false;
      num_ = Num::kFrac;
      return true;
    case Num::kFrac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') return num_ = Num::kExp, true;
      break;
    case Num::kExp:
      if (c == '+' || c == '-') return num_ = Num::kExpSign, true;
      [[fallthrough]];
    case Num::kExpSign:
      if (!is_digit(c)) return false;
      num_ = Num::kExpDigits;
      return true;
    case Num::kExpDigits:
      if (is_digit(c)) return true;
      break;
  }
  // c ends the number (only from a final state): the value is complete and
  // c is read in the state that follows it.
  close_value();
  return step(c);
}

bool JsonPrefix::step(uint8_t c) {
  const bool in_token =
      lex_ == Lex::kString || lex_ == Lex::kEscape || lex_ == Lex::kUnicode || lex_ == Lex::kNumber;
  if (is_ws(c) && !in_token) {
    if (!started_ || ws_run_ >= kMaxWhitespaceRun) return false;
    ++ws_run_;
  } else if (!is_ws(c)) {
    ws_run_ = 0;
  }
  switch (lex_) {
    case Lex::kValue:
      if (is_ws(c)) return true;
      if (array_start_ && c == ']') {
        array_start_ = false;
        --depth_;
        close_value();
        return true;
      }
      array_start_ = false;
      return value_start(c);
    case Lex::kKeyOrEnd:
    case Lex::kKey:
      if (is_ws(c)) return true;
      if (c == '"') return lex_ = Lex::kString, string_is_key_ = true, true;
      if (c == '}' && lex_ == Lex::kKeyOrEnd) {
        --depth_;
        close_value();
        return true;
      }
      return false;
    case Lex::kColon:
      if (is_ws(c)) return true;
      if (c != ':') return false;
      lex_ = Lex::kValue;
      return true;
    case Lex::kCommaOrEnd:
      return after_value(c);
    case Lex::kString:
      if (c == '"') {
        if (string_is_key_) {
          lex_ = Lex::kColon;
        } else {
          close_value();
        }
        return true;
      }
      if (c == '\\') return lex_ = Lex::kEscape, true;
      return c >= 0x20;
    case Lex::kEscape:
      if (c == 'u') return lex_ = Lex::kUnicode, hex_left_ = 4, true;
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't')
        return lex_ = Lex::kString, true;
      return false;
    case Lex::kUnicode:
      if (!is_hex(c)) return false;
      if (--hex_left_ == 0) lex_ = Lex::kString;
      return true;
    case Lex::kNumber:
      return number(c);
    case Lex::kLiteral:
      if (c != uint8_t(*literal_)) return false;
      if (*++literal_ == '\0') close_value();
      return true;
    case Lex::kDone:
      return is_ws(c);
  }
  return false;
}

}  // namespace moeserve::runtime
