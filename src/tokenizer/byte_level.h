// The GPT-2 byte-level alphabet: every byte gets a printable code point so
// that a BPE vocabulary made of strings can cover arbitrary bytes.
//
// Definition: the bytes that are already printable and not whitespace
// ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to the code point of the same value;
// the remaining 68 bytes, in increasing order, map to 256, 257, ... (so the
// space 0x20 becomes U+0120 'Ġ' and the newline 0x0A becomes U+010A 'Ċ').
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve::tok {

class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& get();

  char32_t code_point(uint8_t byte) const { return byte_to_cp_[byte]; }
  // The UTF-8 text of a byte's symbol (one or two bytes).
  const std::string& symbol(uint8_t byte) const { return byte_to_text_[byte]; }
  std::optional<uint8_t> byte_of(char32_t cp) const;

  // Byte-level text -> raw bytes. A code point outside the alphabet (only
  // possible in a malformed vocabulary) is kept as its own UTF-8.
  std::string decode(std::string_view symbols) const;
  // Raw bytes -> byte-level text.
  std::string encode(std::string_view bytes) const;

 private:
  ByteLevelAlphabet();
  std::array<char32_t, 256> byte_to_cp_{};
  std::array<std::string, 256> byte_to_text_{};
  std::array<int16_t, 324> cp_to_byte_{};  // the alphabet spans U+0021..U+0143
};

}  // namespace moeserve::tok
