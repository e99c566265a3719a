#include "runtime/grammar/utf8_ranges.h"

#include <algorithm>

namespace moeserve::runtime::grammar {
namespace {

constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;

int encode(uint32_t cp, uint8_t out[4]) {
  if (cp < 0x80) {
    out[0] = uint8_t(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = uint8_t(0xC0 | (cp >> 6));
    out[1] = uint8_t(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = uint8_t(0xE0 | (cp >> 12));
    out[1] = uint8_t(0x80 | ((cp >> 6) & 0x3F));
    out[2] = uint8_t(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = uint8_t(0xF0 | (cp >> 18));
  out[1] = uint8_t(0x80 | ((cp >> 12) & 0x3F));
  out[2] = uint8_t(0x80 | ((cp >> 6) & 0x3F));
  out[3] = uint8_t(0x80 | (cp & 0x3F));
  return 4;
}

// lo..hi share one encoding length.
void split_same_length(uint32_t lo, uint32_t hi, std::vector<Utf8Seq>& out) {
  uint8_t a[4];
  uint8_t b[4];
  const int n = encode(lo, a);
  encode(hi, b);
  // Byte k of the encodings may range freely only if every byte after it
  // covers all continuation values; where an end cuts a block of 64^i code
  // points short, split there first.
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t(1) << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      split_same_length(lo, lo | m, out);
      split_same_length((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      split_same_length(lo, (hi & ~m) - 1, out);
      split_same_length(hi & ~m, hi, out);
      return;
    }
  }
  Utf8Seq seq;
  seq.len = uint8_t(n);
  for (int k = 0; k < n; ++k) seq.r[size_t(k)] = {a[k], b[k]};
  out.push_back(seq);
}

}  // namespace

std::vector<CodeRange> normalize_ranges(std::vector<CodeRange> ranges) {
  std::vector<CodeRange> cut;
  for (CodeRange r : ranges) {
    if (r.lo > r.hi || r.lo > kMaxCodePoint) continue;
    r.hi = std::min(r.hi, kMaxCodePoint);
    if (r.lo < kSurrogateLo && r.hi >= kSurrogateLo) {
      cut.push_back({r.lo, kSurrogateLo - 1});
      r.lo = kSurrogateLo;
    }
    if (r.lo >= kSurrogateLo && r.lo <= kSurrogateHi) {
      if (r.hi <= kSurrogateHi) continue;
      r.lo = kSurrogateHi + 1;
    }
    cut.push_back(r);
  }
  std::sort(cut.begin(), cut.end());
  std::vector<CodeRange> merged;
  for (const CodeRange& r : cut) {
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

std::vector<CodeRange> complement_ranges(const std::vector<CodeRange>& normalized) {
  std::vector<CodeRange> out;
  uint32_t next = 0;
  for (const CodeRange& r : normalized) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return normalize_ranges(std::move(out));
}

void append_utf8_sequences(uint32_t lo, uint32_t hi, std::vector<Utf8Seq>& out) {
  static constexpr uint32_t kBandEnd[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  uint32_t start = lo;
  for (uint32_t end : kBandEnd) {
    if (start > hi) return;
    if (start > end) continue;
    const uint32_t stop = std::min(hi, end);
    split_same_length(start, stop, out);
    start = stop + 1;
  }
}

size_t decode_utf8(std::string_view s, size_t at, uint32_t& code_point) {
  const auto byte = [&](size_t i) { return uint8_t(s[i]); };
  const uint8_t c = byte(at);
  size_t len = 0;
  uint32_t cp = 0;
  uint32_t min = 0;
  if (c < 0x80) {
    code_point = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (at + len > s.size()) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (byte(at + i) & 0x3F);
  }
  if (cp < min || cp > kMaxCodePoint || (cp >= kSurrogateLo && cp <= kSurrogateHi)) return 0;
  code_point = cp;
  return len;
}

}  // namespace moeserve::runtime::grammar
