#include "chat/jinja_lexer.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "chat/jinja_strings.h"
#include "core/utf8_encode.h"

namespace moeserve::chat::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // Jinja2's keep_trailing_newline=False
  return out;
}

// What the previous tag asks of the text that follows it.
enum class FollowStrip { kNone, kAllWhitespace, kOneNewline };

class Lexer {
 public:
  Lexer(std::string source, const SourceInfo& info, const LexerOptions& options)
      : src_(std::move(source)), info_(info), options_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Result<std::vector<Token>> run();

 private:
  SourcePos pos_at(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }
  Status error(size_t offset, const std::string& message) const {
    return located_error(StatusCode::kInvalidFormat, info_, pos_at(offset), message);
  }
  void emit(TokenKind kind, size_t offset, std::string text = {}) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    t.pos = pos_at(offset);
    tokens_.push_back(std::move(t));
  }

  void emit_text(size_t begin, size_t end, char tag_kind, char tag_modifier);
  size_t apply_follow_strip(size_t begin, size_t end);
  Status lex_comment(size_t& i, size_t tag_start);
  Status lex_tag(size_t& i, char tag_kind, size_t tag_start);
  Status lex_raw(size_t& i, size_t after_raw, size_t tag_offset);
  Status lex_expression_token(size_t& i);
  Status lex_string(size_t& i);
  Status lex_number(size_t& i);

  std::string src_;
  const SourceInfo& info_;
  LexerOptions options_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  FollowStrip follow_ = FollowStrip::kNone;
  bool line_starting_ = true;  // the text about to be lexed begins a line
};

// Applies the previous tag's trailing whitespace control to [begin, end) and
// returns the new begin. Records whether what was stripped ended a line, which
// decides whether lstrip_blocks may strip the next tag's indentation.
size_t Lexer::apply_follow_strip(size_t begin, size_t end) {
  size_t new_begin = begin;
  if (follow_ == FollowStrip::kAllWhitespace) {
    while (new_begin < end && is_space(src_[new_begin])) ++new_begin;
  } else if (follow_ == FollowStrip::kOneNewline) {
    if (new_begin < end && src_[new_begin] == '\n') ++new_begin;
  }
  if (follow_ != FollowStrip::kNone) {
    line_starting_ = new_begin > begin && src_[new_begin - 1] == '\n';
  }
  follow_ = FollowStrip::kNone;
  return new_begin;
}

// Emits the text [begin, end) that precedes a tag of the given kind ('{', '%',
// '#', or 0 at the end of the source), after whitespace control.
void Lexer::emit_text(size_t begin, size_t end, char tag_kind, char tag_modifier) {
  begin = apply_follow_strip(begin, end);
  if (tag_modifier == '-') {
    while (end > begin && is_space(src_[end - 1])) --end;
  } else if (options_.lstrip_blocks && tag_modifier != '+' && (tag_kind == '%' || tag_kind == '#')) {
    size_t line_begin = end;
    while (line_begin > begin && (src_[line_begin - 1] == ' ' || src_[line_begin - 1] == '\t')) {
      --line_begin;
    }
    bool at_line_start = line_begin > begin ? src_[line_begin - 1] == '\n' : line_starting_;
    if (at_line_start) end = line_begin;
  }
  if (end > begin) emit(TokenKind::kText, begin, src_.substr(begin, end - begin));
  line_starting_ = false;
}

Result<std::vector<Token>> Lexer::run() {
  size_t i = 0;
  while (i <= src_.size()) {
    size_t tag = i;
    while (tag + 1 < src_.size() &&
           !(src_[tag] == '{' && (src_[tag + 1] == '{' || src_[tag + 1] == '%' || src_[tag + 1] == '#'))) {
      ++tag;
    }
    if (tag + 1 >= src_.size()) {  // no more tags
      emit_text(i, src_.size(), 0, 0);
      break;
    }
    char kind = src_[tag + 1];
    char modifier = tag + 2 < src_.size() ? src_[tag + 2] : 0;
    if (modifier != '-' && modifier != '+') modifier = 0;
    emit_text(i, tag, kind, modifier);
    i = tag + 2 + (modifier ? 1 : 0);
    if (kind == '#') {
      MOESERVE_RETURN_IF_ERROR(lex_comment(i, tag));
    } else {
      emit(kind == '{' ? TokenKind::kVarBegin : TokenKind::kBlockBegin, tag);
      MOESERVE_RETURN_IF_ERROR(lex_tag(i, kind, tag));
    }
  }
  emit(TokenKind::kEnd, src_.size());
  return std::move(tokens_);
}

Status Lexer::lex_comment(size_t& i, size_t tag_start) {
  size_t open = i;
  size_t close = src_.find("#}", i);
  if (close == std::string::npos) return error(tag_start, "unclosed comment: missing '#}'");
  bool strip = close > open && src_[close - 1] == '-';
  bool keep = close > open && src_[close - 1] == '+';
  i = close + 2;
  follow_ = strip ? FollowStrip::kAllWhitespace
                  : (options_.trim_blocks && !keep ? FollowStrip::kOneNewline : FollowStrip::kNone);
  return Status::ok();
}

// Lexes the inside of a {{ }} or {% %} tag up to and including its end.
Status Lexer::lex_tag(size_t& i, char tag_kind, size_t tag_start) {
  size_t tag_offset = tag_start;
  const char end_char = tag_kind == '{' ? '}' : '%';
  // Brackets opened inside the tag: `}}` inside a dict literal is not the end.
  std::vector<size_t> open_brackets;
  bool first_token = true;
  while (true) {
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (i >= src_.size()) {
      if (!open_brackets.empty()) {
        return error(open_brackets.back(), fmt::format("unclosed '{}'", src_[open_brackets.back()]));
      }
      return error(tag_offset, tag_kind == '{' ? "unclosed '{{': missing '}}'" : "unclosed '{%': missing '%}'");
    }
    const size_t depth = open_brackets.size();
    bool minus_end = src_[i] == '-' && i + 2 < src_.size() && src_[i + 1] == end_char && src_[i + 2] == '}';
    // `+%}` keeps the newline trim_blocks would drop.
    bool plus_end = tag_kind == '%' && src_[i] == '+' && i + 2 < src_.size() && src_[i + 1] == '%' && src_[i + 2] == '}';
    bool plain_end = src_[i] == end_char && i + 1 < src_.size() && src_[i + 1] == '}';
    if (depth == 0 && (minus_end || plus_end || plain_end)) {
      emit(tag_kind == '{' ? TokenKind::kVarEnd : TokenKind::kBlockEnd, i);
      i += (minus_end || plus_end) ? 3 : 2;
      if (minus_end) {
        follow_ = FollowStrip::kAllWhitespace;
      } else if (tag_kind == '%' && options_.trim_blocks && !plus_end) {
        follow_ = FollowStrip::kOneNewline;
      } else {
        follow_ = FollowStrip::kNone;
      }
      return Status::ok();
    }
    if (first_token && tag_kind == '%' && src_.compare(i, 3, "raw") == 0 &&
        (i + 3 >= src_.size() || !is_name_char(src_[i + 3]))) {
      tokens_.pop_back();  // the BlockBegin: raw blocks become plain text
      return lex_raw(i, i + 3, tag_offset);
    }
    first_token = false;
    char c = src_[i];
    if (c == '(' || c == '[' || c == '{') open_brackets.push_back(i);
    if (c == ')' || c == ']' || c == '}') {
      char opener = c == ')' ? '(' : (c == ']' ? '[' : '{');
      if (open_brackets.empty() || src_[open_brackets.back()] != opener) {
        if (open_brackets.empty()) return error(i, fmt::format("unexpected '{}'", c));
        char want = src_[open_brackets.back()] == '(' ? ')' : (src_[open_brackets.back()] == '[' ? ']' : '}');
        return error(i, fmt::format("unexpected '{}', expected '{}'", c, want));
      }
      open_brackets.pop_back();
    }
    MOESERVE_RETURN_IF_ERROR(lex_expression_token(i));
  }
}

// `{% raw %}...{% endraw %}`: the body is emitted verbatim as text.
Status Lexer::lex_raw(size_t& i, size_t after_raw, size_t tag_offset) {
  size_t k = after_raw;
  while (k < src_.size() && is_space(src_[k])) ++k;
  bool strip_body_front = false;
  if (k < src_.size() && src_[k] == '-') {
    strip_body_front = true;
    ++k;
  }
  if (src_.compare(k, 2, "%}") != 0) return error(k, "expected '%}' after 'raw'");
  size_t body_begin = k + 2;
  size_t search = body_begin;
  while (true) {
    size_t open = src_.find("{%", search);
    if (open == std::string::npos) return error(tag_offset, "unclosed raw block: missing '{% endraw %}'");
    size_t p = open + 2;
    bool strip_body_back = p < src_.size() && src_[p] == '-';
    if (strip_body_back) ++p;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 6, "endraw") != 0 || (p + 6 < src_.size() && is_name_char(src_[p + 6]))) {
      search = open + 2;
      continue;
    }
    p += 6;
    while (p < src_.size() && is_space(src_[p])) ++p;
    bool strip_after = p < src_.size() && src_[p] == '-';
    if (strip_after) ++p;
    if (src_.compare(p, 2, "%}") != 0) return error(p, "expected '%}' after 'endraw'");
    size_t b = body_begin, e = open;
    if (strip_body_front) {
      while (b < e && is_space(src_[b])) ++b;
    }
    if (strip_body_back) {
      while (e > b && is_space(src_[e - 1])) --e;
    }
    if (e > b) emit(TokenKind::kText, b, src_.substr(b, e - b));
    i = p + 2;
    follow_ = strip_after ? FollowStrip::kAllWhitespace
                          : (options_.trim_blocks ? FollowStrip::kOneNewline : FollowStrip::kNone);
    return Status::ok();
  }
}

Status Lexer::lex_expression_token(size_t& i) {
  char c = src_[i];
  if (is_name_start(c)) {
    size_t start = i;
    while (i < src_.size() && is_name_char(src_[i])) ++i;
    emit(TokenKind::kName, start, src_.substr(start, i - start));
    return Status::ok();
  }
  if (is_digit(c)) return lex_number(i);
  if (c == '\'' || c == '"') return lex_string(i);
  static const char* const kTwoCharOps[] = {"//", "**", "==", "!=", "<=", ">="};
  for (const char* op : kTwoCharOps) {
    if (src_.compare(i, 2, op) == 0) {
      emit(TokenKind::kOperator, i, op);
      i += 2;
      return Status::ok();
    }
  }
  static const std::string_view kOneCharOps = "+-*/%~<>=()[]{},.:|";
  if (kOneCharOps.find(c) != std::string_view::npos) {
    emit(TokenKind::kOperator, i, std::string(1, c));
    ++i;
    return Status::ok();
  }
  return error(i, fmt::format("unexpected character '{}' in tag", c));
}

Status Lexer::lex_number(size_t& i) {
  size_t start = i;
  std::string digits;
  auto take_digits = [&]() {
    while (i < src_.size() && (is_digit(src_[i]) || (src_[i] == '_' && i + 1 < src_.size() && is_digit(src_[i + 1])))) {
      if (src_[i] != '_') digits.push_back(src_[i]);
      ++i;
    }
  };
  take_digits();
  bool is_float = false;
  if (i + 1 < src_.size() && src_[i] == '.' && is_digit(src_[i + 1])) {
    is_float = true;
    digits.push_back('.');
    ++i;
    take_digits();
  }
  if (i < src_.size() && (src_[i] == 'e' || src_[i] == 'E')) {
    size_t k = i + 1;
    if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
    if (k < src_.size() && is_digit(src_[k])) {
      is_float = true;
      digits.append(src_, i, k - i);
      i = k;
      take_digits();
    }
  }
  Token t;
  t.pos = pos_at(start);
  if (is_float) {
    t.kind = TokenKind::kFloat;
    t.float_value = std::strtod(digits.c_str(), nullptr);
  } else {
    t.kind = TokenKind::kInteger;
    auto res = std::from_chars(digits.data(), digits.data() + digits.size(), t.int_value);
    if (res.ec != std::errc()) return error(start, "integer literal out of range");
  }
  t.text = src_.substr(start, i - start);
  tokens_.push_back(std::move(t));
  return Status::ok();
}

// Python string literal escapes (Jinja2 decodes them with "unicode-escape").
Status Lexer::lex_string(size_t& i) {
  size_t start = i;
  char quote = src_[i++];
  std::string value;
  auto hex_escape = [&](int digits, uint32_t& cp) {
    if (i + static_cast<size_t>(digits) > src_.size()) return false;
    cp = 0;
    for (int k = 0; k < digits; ++k) {
      char h = src_[i + static_cast<size_t>(k)];
      int v = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
      if (v < 0) return false;
      cp = cp * 16 + static_cast<uint32_t>(v);
    }
    i += static_cast<size_t>(digits);
    return true;
  };
  while (true) {
    if (i >= src_.size()) return error(start, "unterminated string literal");
    char c = src_[i++];
    if (c == quote) break;
    if (c != '\\') {
      value.push_back(c);
      continue;
    }
    if (i >= src_.size()) return error(start, "unterminated string literal");
    char e = src_[i++];
    uint32_t cp = 0;
    switch (e) {
      case 'n': value.push_back('\n'); break;
      case 't': value.push_back('\t'); break;
      case 'r': value.push_back('\r'); break;
      case '\\': value.push_back('\\'); break;
      case '\'': value.push_back('\''); break;
      case '"': value.push_back('"'); break;
      case 'a': value.push_back('\a'); break;
      case 'b': value.push_back('\b'); break;
      case 'f': value.push_back('\f'); break;
      case 'v': value.push_back('\v'); break;
      case '\n': break;  // line continuation
      case 'x':
      case 'u':
      case 'U': {
        int digits = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        if (!hex_escape(digits, cp)) return error(i - 2, fmt::format("malformed \\{} escape in string literal", e));
        // Join a UTF-16 surrogate pair written as two \u escapes.
        if (cp >= 0xD800 && cp <= 0xDBFF && src_.compare(i, 2, "\\u") == 0) {
          size_t save = i;
          i += 2;
          uint32_t low = 0;
          if (hex_escape(4, low) && low >= 0xDC00 && low <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else {
            i = save;
          }
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
        append_utf8(value, cp);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {  // up to three octal digits
          cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
            cp = cp * 8 + static_cast<uint32_t>(src_[i++] - '0');
          }
          append_utf8(value, cp);
        } else {  // unknown escapes are kept as written, like Python
          value.push_back('\\');
          value.push_back(e);
        }
    }
  }
  emit(TokenKind::kString, start, std::move(value));
  return Status::ok();
}

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source, const SourceInfo& info,
                                    const LexerOptions& options) {
  Lexer lexer(normalize_newlines(source), info, options);
  return lexer.run();
}

}  // namespace moeserve::chat::jinja
