#include "runtime/grammar/gbnf.h"

#include <algorithm>
#include <string>

#include "core/utf8_encode.h"
#include "runtime/grammar/grammar_builder.h"

namespace moeserve::runtime::grammar {
namespace {

constexpr uint64_t kMaxRepeatCount = 1000000000;

bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string describe(char c) {
  if (c >= 0x20 && c < 0x7F) return fmt::format("'{}'", c);
  return fmt::format("byte 0x{:02X}", uint8_t(c));
}

// Recursive descent over the text; each group nests one level deeper, and
// the depth is checked, so hostile nesting is an error, not a stack overflow.
class Parser {
 public:
  Parser(std::string_view text, const GrammarLimits& limits)
      : text_(text), limits_(limits), builder_(text, limits) {}

  Result<std::shared_ptr<const Grammar>> run() {
    skip_space();
    while (!done()) {
      MOESERVE_RETURN_IF_ERROR(parse_rule());
      skip_space();
    }
    return builder_.finish();
  }

 private:
  Status fail(size_t at, std::string_view reason) const { return grammar_error(text_, at, reason); }
  bool done() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }
  size_t word_end(size_t at) const {
    while (at < text_.size() && is_word(text_[at])) ++at;
    return at;
  }
  size_t skip_blanks(size_t at) const {
    while (at < text_.size() && (text_[at] == ' ' || text_[at] == '\t')) ++at;
    return at;
  }
  // Blanks, newlines and # comments.
  void skip_space() {
    while (!done()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++pos_;
      } else if (c == '#') {
        while (!done() && peek() != '\n') ++pos_;
      } else {
        return;
      }
    }
  }
  // `name ::=` starts here: the current rule has ended.
  bool at_rule_start() const {
    const size_t end = word_end(pos_);
    return end > pos_ && text_.substr(skip_blanks(end)).starts_with("::=");
  }

  Status parse_rule() {
    const size_t start = pos_;
    const size_t end = word_end(pos_);
    if (end == pos_) return fail(pos_, fmt::format("expected a rule name, found {}", describe(peek())));
    const std::string_view name = text_.substr(pos_, end - pos_);
    pos_ = skip_blanks(end);
    if (!text_.substr(pos_).starts_with("::=")) {
      return fail(pos_, fmt::format("expected '::=' after rule name '{}'", name));
    }
    pos_ += 3;
    Result<uint32_t> rule = builder_.named_rule(name, start);
    if (!rule) return fail(start, rule.status().message());
    Result<std::vector<Seq>> alts = parse_alternates(0, *rule);
    if (!alts) return alts.status();
    if (!done() && !at_rule_start()) {
      return fail(pos_, peek() == ')' ? std::string("')' without a matching '('")
                                      : fmt::format("unexpected {}", describe(peek())));
    }
    const Status st = builder_.define(*rule, std::move(alts.value()), start);
    return st.is_ok() ? st : fail(start, st.message());
  }

  Result<std::vector<Seq>> parse_alternates(int depth, uint32_t owner) {
    std::vector<Seq> alts;
    while (true) {
      Result<Seq> seq = parse_sequence(depth, owner);
      if (!seq) return seq.status();
      alts.push_back(std::move(seq.value()));
      skip_space();
      if (peek() != '|' || done()) return alts;
      ++pos_;
    }
  }

  Result<Seq> parse_sequence(int depth, uint32_t owner) {
    Seq seq;
    size_t last = std::string::npos;  // where the last element's symbols begin
    while (true) {
      skip_space();
      if (done() || peek() == '|' || peek() == ')' || at_rule_start()) return seq;
      const size_t at = pos_;
      const char c = peek();
      if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last == std::string::npos) {
          return fail(at, fmt::format("'{}' has nothing before it to repeat", c));
        }
        Status st = parse_postfix(seq, last, owner);
        if (!st) return st;
        continue;
      }
      Result<Seq> element = parse_element(depth, owner);
      if (!element) return element.status();
      last = seq.size();
      seq.insert(seq.end(), element->begin(), element->end());
    }
  }

  // The builder's errors carry only the reason; this adds where.
  Result<Seq> located(size_t at, Result<Seq> r) const {
    if (r) return r;
    return fail(at, r.status().message());
  }

  Result<Seq> parse_element(int depth, uint32_t owner) {
    const size_t at = pos_;
    const char c = peek();
    if (c == '"') return parse_literal();
    if (c == '[') return parse_class(owner);
    if (c == '(') return parse_group(depth, owner);
    if (c == '.') {
      ++pos_;
      return located(at, builder_.char_class(complement_ranges({}), owner));
    }
    if (is_word(c)) {
      const size_t end = word_end(pos_);
      pos_ = end;
      return located(at, builder_.rule_ref(text_.substr(at, end - at), at));
    }
    return fail(at, fmt::format("unexpected {}", describe(c)));
  }

  Result<Seq> parse_group(int depth, uint32_t owner) {
    const size_t at = pos_;
    if (depth + 1 > limits_.max_nesting) {
      return fail(at, fmt::format("groups nested more than {} deep", limits_.max_nesting));
    }
    ++pos_;
    Result<std::vector<Seq>> alts = parse_alternates(depth + 1, owner);
    if (!alts) return alts.status();
    if (peek() != ')' || done()) return fail(pos_, "expected ')' to close the group");
    ++pos_;
    if (alts->size() == 1) return std::move(alts.value()[0]);  // a plain sequence: inlined
    Result<Sym> h = builder_.helper(owner, std::move(alts.value()));
    if (!h) return fail(at, h.status().message());
    return Seq{*h};
  }

  // One character of a literal or class, escapes decoded.
  Result<uint32_t> parse_char() {
    const size_t at = pos_;
    if (peek() != '\\') {
      uint32_t cp = 0;
      const size_t n = decode_utf8(text_, pos_, cp);
      if (n == 0) return fail(at, "invalid UTF-8 in the grammar text");
      pos_ += n;
      return cp;
    }
    if (pos_ + 1 >= text_.size()) return fail(at, "unterminated escape");
    const char e = text_[pos_ + 1];
    pos_ += 2;
    switch (e) {
      case 'n':
        return uint32_t('\n');
      case 'r':
        return uint32_t('\r');
      case 't':
        return uint32_t('\t');
      case '\\':
      case '"':
      case '[':
      case ']':
        return uint32_t(uint8_t(e));
      case 'x':
      case 'u':
      case 'U': {
        const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int i = 0; i < digits; ++i) {
          const int v = hex_value(peek());
          if (v < 0 || done())
            return fail(at, fmt::format("bad escape: \\{} needs {} hex digits", e, digits));
          cp = cp << 4 | uint32_t(v);
          ++pos_;
        }
        if (cp > kMaxCodePoint) return fail(at, fmt::format("bad escape: U+{:X} is past U+10FFFF", cp));
        return cp;
      }
      default:
        if (e >= 0x20 && e < 0x7F) return fail(at, fmt::format("bad escape '\\{}'", e));
        return fail(at, fmt::format("bad escape: '\\' then {}", describe(e)));
    }
  }

  Result<Seq> parse_literal() {
    const size_t start = pos_++;
    std::string bytes;
    while (true) {
      if (done()) return fail(start, "unterminated string literal");
      if (peek() == '"') break;
      const size_t at = pos_;
      Result<uint32_t> cp = parse_char();
      if (!cp) return cp.status();
      if (*cp >= 0xD800 && *cp <= 0xDFFF) return fail(at, "a surrogate code point has no UTF-8 form");
      append_utf8(bytes, char32_t(*cp));
    }
    ++pos_;
    return located(start, builder_.literal(bytes));
  }

  Result<Seq> parse_class(uint32_t owner) {
    const size_t start = pos_++;
    const bool negated = peek() == '^' && !done();
    if (negated) ++pos_;
    std::vector<CodeRange> ranges;
    while (true) {
      if (done()) return fail(start, "unterminated character class");
      if (peek() == ']') break;
      const size_t at = pos_;
      Result<uint32_t> lo = parse_char();
      if (!lo) return lo.status();
      uint32_t hi = *lo;
      if (peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        Result<uint32_t> end = parse_char();
        if (!end) return end.status();
        if (*end < *lo) return fail(at, "character range ends before it starts");
        hi = *end;
      }
      ranges.push_back({*lo, hi});
    }
    ++pos_;
    std::vector<CodeRange> set = normalize_ranges(std::move(ranges));
    if (negated) set = complement_ranges(set);
    return located(start, builder_.char_class(set, owner));
  }

  Result<uint64_t> parse_count() {
    const size_t at = pos_;
    if (!is_digit(peek()) || done()) return fail(at, "expected a number in the repetition bounds");
    uint64_t v = 0;
    while (is_digit(peek()) && !done()) {
      v = v * 10 + uint64_t(peek() - '0');
      if (v > kMaxRepeatCount) return fail(at, "repetition count too large");
      ++pos_;
    }
    return v;
  }

  // * + ? {m} {m,} {m,n} after the element whose symbols start at seq[last].
  Status parse_postfix(Seq& seq, size_t last, uint32_t owner) {
    const size_t at = pos_;
    const char c = text_[pos_++];
    uint64_t min = 0;
    uint64_t max = kUnbounded;
    if (c == '+') {
      min = 1;
    } else if (c == '?') {
      max = 1;
    } else if (c == '{') {
      skip_space();
      Result<uint64_t> m = parse_count();
      if (!m) return m.status();
      min = max = *m;
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
        max = kUnbounded;
        if (is_digit(peek())) {
          Result<uint64_t> n = parse_count();
          if (!n) return n.status();
          max = *n;
          skip_space();
        }
      }
      if (peek() != '}' || done()) return fail(pos_, "expected '}' to close the repetition bounds");
      ++pos_;
      if (min > max)
        return fail(at,
                    fmt::format("repetition bounds {{{},{}}}: the minimum exceeds the maximum", min, max));
    }
    const Seq item(seq.begin() + ptrdiff_t(last), seq.end());
    seq.resize(last);
    Result<Seq> rep = builder_.repeat(item, min, max, owner);
    if (!rep) return fail(at, rep.status().message());
    seq.insert(seq.end(), rep->begin(), rep->end());
    return Status::ok();
  }

  std::string_view text_;
  GrammarLimits limits_;
  GrammarBuilder builder_;
  size_t pos_ = 0;
};

}  // namespace

Result<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text, const GrammarLimits& limits) {
  if (text.size() > limits.max_text_bytes) {
    return grammar_error(text, 0,
                         fmt::format("the grammar is {} bytes, more than the limit of {}", text.size(),
                                     limits.max_text_bytes));
  }
  GrammarLimits clamped = limits;
  clamped.max_elements = std::min<size_t>(clamped.max_elements, kMaxElemIndex);
  clamped.max_rules = std::min<size_t>(clamped.max_rules, kMaxElemIndex);
  return Parser(text, clamped).run();
}

}  // namespace moeserve::runtime::grammar
