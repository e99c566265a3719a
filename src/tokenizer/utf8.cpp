#include "tokenizer/utf8.h"

namespace moeserve::tok {

void Utf8StreamDecoder::start_sequence(uint8_t byte, std::string& out) {
  if (byte < 0x80) {
    out.push_back(static_cast<char>(byte));
    return;
  }
  // Lead bytes and the tighter bounds on the first continuation byte exclude
  // overlong forms, surrogates and code points above U+10FFFF up front.
  if (byte >= 0xC2 && byte <= 0xDF) {
    bytes_needed_ = 1;
  } else if (byte >= 0xE0 && byte <= 0xEF) {
    if (byte == 0xE0) lower_ = 0xA0;
    if (byte == 0xED) upper_ = 0x9F;
    bytes_needed_ = 2;
  } else if (byte >= 0xF0 && byte <= 0xF4) {
    if (byte == 0xF0) lower_ = 0x90;
    if (byte == 0xF4) upper_ = 0x8F;
    bytes_needed_ = 3;
  } else {
    append_utf8(out, kReplacementChar);
    return;
  }
  held_[0] = static_cast<char>(byte);
  bytes_seen_ = 0;
}

void Utf8StreamDecoder::push_byte(uint8_t byte, std::string& out) {
  if (bytes_needed_ == 0) {
    start_sequence(byte, out);
    return;
  }
  if (byte < lower_ || byte > upper_) {
    // The held bytes are a maximal invalid subpart: one U+FFFD for them, and
    // this byte starts afresh.
    *this = Utf8StreamDecoder();
    append_utf8(out, kReplacementChar);
    start_sequence(byte, out);
    return;
  }
  lower_ = 0x80;
  upper_ = 0xBF;
  held_[++bytes_seen_] = static_cast<char>(byte);
  if (bytes_seen_ == bytes_needed_) {
    out.append(held_, static_cast<size_t>(bytes_needed_ + 1));
    bytes_needed_ = 0;
    bytes_seen_ = 0;
  }
}

void Utf8StreamDecoder::push(std::string_view bytes, std::string& out) {
  for (char c : bytes) push_byte(static_cast<uint8_t>(c), out);
}

void Utf8StreamDecoder::finish(std::string& out) {
  if (bytes_needed_ != 0) append_utf8(out, kReplacementChar);
  reset();
}

bool is_valid_utf8(std::string_view bytes) {
  size_t i = 0;
  const size_t n = bytes.size();
  auto at = [&](size_t k) { return static_cast<uint8_t>(bytes[k]); };
  while (i < n) {
    const uint8_t lead = at(i);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    // Same rules as Utf8StreamDecoder: the first continuation byte's range
    // depends on the lead byte; the others are always 0x80..0xBF.
    int length = 0;
    uint8_t lower = 0x80, upper = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) lower = 0xA0;
      if (lead == 0xED) upper = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) lower = 0x90;
      if (lead == 0xF4) upper = 0x8F;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(length) > n) return false;
    if (at(i + 1) < lower || at(i + 1) > upper) return false;
    for (int k = 2; k < length; ++k) {
      if (at(i + k) < 0x80 || at(i + k) > 0xBF) return false;
    }
    i += static_cast<size_t>(length);
  }
  return true;
}

std::string sanitize_utf8(std::string_view bytes) {
  if (is_valid_utf8(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  Utf8StreamDecoder decoder;
  decoder.push(bytes, out);
  decoder.finish(out);
  return out;
}

std::vector<char32_t> decode_valid_utf8(std::string_view valid) {
  std::vector<char32_t> cps;
  cps.reserve(valid.size());
  size_t i = 0;
  while (i < valid.size()) {
    const auto lead = static_cast<uint8_t>(valid[i]);
    int length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    if (i + static_cast<size_t>(length) > valid.size()) length = 1;  // defensive: never read past
    char32_t cp = length == 1 ? lead : length == 2 ? (lead & 0x1F) : length == 3 ? (lead & 0x0F) : (lead & 0x07);
    for (int k = 1; k < length; ++k) cp = (cp << 6) | (static_cast<uint8_t>(valid[i + k]) & 0x3F);
    cps.push_back(cp);
    i += static_cast<size_t>(length);
  }
  return cps;
}

}  // namespace moeserve::tok
