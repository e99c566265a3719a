// Encoding one Unicode code point as UTF-8: shared by the tokenizer and the
// chat-template engine, which sit on separate branches above core.
#pragma once

#include <string>

namespace moeserve {

// Appends `code_point` as 1-4 bytes. A value past U+10FFFF (not a code point)
// is written as U+FFFD, so the output is always well-formed UTF-8 length-wise.
inline void append_utf8(std::string& out, char32_t code_point) {
  if (code_point > 0x10FFFF) code_point = 0xFFFD;
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

}  // namespace moeserve
