#include "chat/jinja_strings.h"

#include <algorithm>

namespace moeserve::chat::jinja {

uint32_t utf8_decode_at(std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  int extra = 0;
  uint32_t cp = 0;
  if ((c & 0xE0) == 0xC0) {
    extra = 1;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    extra = 2;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    extra = 3;
    cp = c & 0x07;
  } else {
    ++i;
    return 0xFFFD;
  }
  if (i + static_cast<size_t>(extra) >= s.size()) {  // truncated sequence
    ++i;
    return 0xFFFD;
  }
  for (int k = 1; k <= extra; ++k) {
    unsigned char cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    if ((cc & 0xC0) != 0x80) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  i += static_cast<size_t>(extra) + 1;
  return cp;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t utf8_length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    utf8_decode_at(s, i);
    ++n;
  }
  return n;
}

std::vector<size_t> utf8_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    offsets.push_back(i);
    utf8_decode_at(s, i);
  }
  offsets.push_back(s.size());
  return offsets;
}

bool python_is_printable(uint32_t cp) {
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp >= 0x80 && cp <= 0xA0) return false;  // C1 controls and no-break space
  if (cp == 0xAD) return false;                 // soft hyphen (format)
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F)) return false;
  if (cp >= 0x2028 && cp <= 0x202F) return false;
  if (cp >= 0x205F && cp <= 0x206F) return false;
  if (cp == 0x3000 || cp == 0xFEFF) return false;
  if (cp >= 0xD800 && cp <= 0xDFFF) return false;  // surrogates
  if (cp >= 0xE000 && cp <= 0xF8FF) return false;  // private use
  return true;
}

bool python_is_space(uint32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E:
    case 0x1F: case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {

// Code points of s, decoded once.
std::vector<uint32_t> decode_all(std::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) cps.push_back(utf8_decode_at(s, i));
  return cps;
}

}  // namespace

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right) {
  std::vector<uint32_t> strip_set;
  if (chars) strip_set = decode_all(*chars);
  auto strippable = [&](uint32_t cp) {
    if (!chars) return python_is_space(cp);
    return std::find(strip_set.begin(), strip_set.end(), cp) != strip_set.end();
  };
  std::vector<size_t> offsets = utf8_offsets(s);
  size_t n = offsets.size() - 1;
  size_t begin = 0, end = n;
  auto cp_at = [&](size_t k) {
    size_t i = offsets[k];
    return utf8_decode_at(s, i);
  };
  if (left) {
    while (begin < end && strippable(cp_at(begin))) ++begin;
  }
  if (right) {
    while (end > begin && strippable(cp_at(end - 1))) --end;
  }
  return std::string(s.substr(offsets[begin], offsets[end] - offsets[begin]));
}

namespace {

// Whitespace split (sep=None). Scans from the left, or from the right for
// rsplit, so that maxsplit keeps the remainder on the correct side.
std::vector<std::string> split_whitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  std::vector<size_t> offsets = utf8_offsets(s);
  size_t n = offsets.size() - 1;
  std::vector<bool> space(n);
  for (size_t k = 0; k < n; ++k) {
    size_t i = offsets[k];
    space[k] = python_is_space(utf8_decode_at(s, i));
  }
  std::vector<std::string> parts;
  auto piece = [&](size_t a, size_t b) { return std::string(s.substr(offsets[a], offsets[b] - offsets[a])); };
  if (!from_right) {
    size_t k = 0;
    while (true) {
      while (k < n && space[k]) ++k;
      if (k == n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t end = n;
        // Python keeps trailing whitespace on the unsplit remainder.
        parts.push_back(piece(k, end));
        break;
      }
      size_t start = k;
      while (k < n && !space[k]) ++k;
      parts.push_back(piece(start, k));
    }
    return parts;
  }
  size_t k = n;
  while (true) {
    while (k > 0 && space[k - 1]) --k;
    if (k == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      parts.push_back(piece(0, k));
      break;
    }
    size_t end = k;
    while (k > 0 && !space[k - 1]) --k;
    parts.push_back(piece(k, end));
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

}  // namespace

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit) {
  if (!sep) return split_whitespace(s, maxsplit, false);
  std::vector<std::string> parts;
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    size_t hit = s.find(*sep, start);
    if (hit == std::string_view::npos) break;
    parts.emplace_back(s.substr(start, hit - start));
    start = hit + sep->size();
  }
  parts.emplace_back(s.substr(start));
  return parts;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                   int64_t maxsplit) {
  if (!sep) return split_whitespace(s, maxsplit, true);
  std::vector<std::string> parts;
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    if (end < sep->size()) break;
    size_t hit = s.rfind(*sep, end - sep->size());
    if (hit == std::string_view::npos) break;
    parts.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
    end = hit;
  }
  parts.emplace_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::string py_replace(std::string_view s, std::string_view from, std::string_view to,
                       int64_t count) {
  std::string out;
  if (from.empty()) {
    std::vector<size_t> offsets = utf8_offsets(s);
    int64_t done = 0;
    for (size_t k = 0; k < offsets.size(); ++k) {  // one insertion point per gap
      if (count < 0 || done < count) {
        out.append(to);
        ++done;
      }
      if (k + 1 < offsets.size()) out.append(s.substr(offsets[k], offsets[k + 1] - offsets[k]));
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

int64_t py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(utf8_length(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos + sub.size())) {
    ++n;
  }
  return n;
}

int64_t py_find(std::string_view s, std::string_view sub, bool from_right) {
  size_t hit = from_right ? s.rfind(sub) : s.find(sub);
  if (hit == std::string_view::npos) return -1;
  return static_cast<int64_t>(utf8_length(s.substr(0, hit)));
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string ascii_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

namespace {
bool ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
char to_upper(char c) { return (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c; }
char to_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
}  // namespace

std::string py_title_method(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    bool alpha = ascii_alpha(c);
    if (alpha) c = prev_cased ? to_lower(c) : to_upper(c);
    // Non-ASCII bytes count as cased so they do not split words.
    prev_cased = alpha || static_cast<unsigned char>(c) >= 0x80;
  }
  return out;
}

std::string jinja_title_filter(std::string_view s) {
  std::string out(s);
  bool word_start = true;
  for (char& c : out) {
    bool boundary = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
                    c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (boundary) {
      word_start = true;
      continue;
    }
    c = word_start ? to_upper(c) : to_lower(c);
    word_start = false;
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = to_upper(out[0]);
  return out;
}

}  // namespace moeserve::chat::jinja
