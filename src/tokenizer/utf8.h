// UTF-8 helpers for the tokenizer: validation, lenient decoding and encoding.
//
// Invalid input is never rejected: it is decoded the way the WHATWG Encoding
// Standard's (non-fatal) UTF-8 decoder does it — each maximal invalid subpart
// becomes one U+FFFD. That is what a browser or Node's TextDecoder produce, so
// our tokenizer sees the same text a JavaScript tokenizer would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/utf8_encode.h"

namespace moeserve::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;

bool is_valid_utf8(std::string_view bytes);

// The input with every invalid sequence replaced by U+FFFD (a copy when valid).
std::string sanitize_utf8(std::string_view bytes);

using moeserve::append_utf8;  // core/utf8_encode.h

// Decodes valid UTF-8 (e.g. the output of sanitize_utf8) into code points.
std::vector<char32_t> decode_valid_utf8(std::string_view valid);

// Streaming form of sanitize_utf8: bytes can arrive in arbitrary pieces and
// only complete characters (or U+FFFD for a sequence that can no longer become
// valid) are appended to `out`; an incomplete trailing sequence is held back.
class Utf8StreamDecoder {
 public:
  void push(std::string_view bytes, std::string& out);
  // End of input: a held incomplete sequence becomes one U+FFFD.
  void finish(std::string& out);
  bool has_pending() const { return bytes_needed_ != 0; }
  void reset() { *this = Utf8StreamDecoder(); }

 private:
  void push_byte(uint8_t byte, std::string& out);
  void start_sequence(uint8_t byte, std::string& out);

  int bytes_needed_ = 0;
  int bytes_seen_ = 0;
  uint8_t lower_ = 0x80;  // bounds of the next continuation byte (WHATWG)
  uint8_t upper_ = 0xBF;
  char held_[4] = {};
};

}  // namespace moeserve::tok
