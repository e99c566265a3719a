#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace moeserve::tok {
namespace {
bool maps_to_itself(int byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF);
}
}  // namespace

ByteLevelAlphabet::ByteLevelAlphabet() {
  cp_to_byte_.fill(-1);
  char32_t next_extra = 256;
  for (int byte = 0; byte < 256; ++byte) {
    const char32_t cp = maps_to_itself(byte) ? static_cast<char32_t>(byte) : next_extra++;
    byte_to_cp_[byte] = cp;
    append_utf8(byte_to_text_[byte], cp);
    cp_to_byte_[cp] = static_cast<int16_t>(byte);
  }
}

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

std::optional<uint8_t> ByteLevelAlphabet::byte_of(char32_t cp) const {
  if (cp >= cp_to_byte_.size() || cp_to_byte_[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(cp_to_byte_[cp]);
}

std::string ByteLevelAlphabet::decode(std::string_view symbols) const {
  std::string out;
  out.reserve(symbols.size());
  const std::string valid = sanitize_utf8(symbols);
  for (char32_t cp : decode_valid_utf8(valid)) {
    if (auto byte = byte_of(cp)) {
      out.push_back(static_cast<char>(*byte));
    } else {
      append_utf8(out, cp);
    }
  }
  return out;
}

std::string ByteLevelAlphabet::encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += byte_to_text_[static_cast<uint8_t>(c)];
  return out;
}

}  // namespace moeserve::tok
