// Code point ranges and their UTF-8 byte-range sequences: how a character
// class over Unicode becomes terminals a byte-level matcher can run.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace moeserve::runtime::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

struct CodeRange {
  uint32_t lo = 0;
  uint32_t hi = 0;
  auto operator<=>(const CodeRange&) const = default;
};

// A run of 1-4 byte ranges: byte i of a match lies in r[i].
struct Utf8Seq {
  struct Range {
    uint8_t lo = 0;
    uint8_t hi = 0;
    auto operator<=>(const Range&) const = default;
  };
  uint8_t len = 0;
  std::array<Range, 4> r{};
};

// Sorted, merged ranges without the surrogates (U+D800..U+DFFF have no UTF-8
// form); ranges past U+10FFFF are cut there.
std::vector<CodeRange> normalize_ranges(std::vector<CodeRange> ranges);
// Every scalar value not in `normalized` (which normalize_ranges made).
std::vector<CodeRange> complement_ranges(const std::vector<CodeRange>& normalized);

// Appends sequences whose matches are exactly the UTF-8 encodings of the
// code points lo..hi (lo <= hi, no surrogates inside): the range is split at
// the encoding-length boundaries, then wherever its ends do not cover whole
// blocks of continuation bytes, until each piece is a product of byte ranges.
void append_utf8_sequences(uint32_t lo, uint32_t hi, std::vector<Utf8Seq>& out);

// Decodes one well-formed UTF-8 code point of `s` at `at` (no overlong forms,
// no surrogates); returns its length in bytes, or 0 when malformed.
size_t decode_utf8(std::string_view s, size_t at, uint32_t& code_point);

}  // namespace moeserve::runtime::grammar
