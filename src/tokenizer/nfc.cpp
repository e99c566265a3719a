#include "tokenizer/nfc.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "tokenizer/utf8.h"

namespace moeserve::tok {
namespace {

struct CombiningClassRange {
  uint32_t first, last, ccc;
};
struct CanonicalDecomposition {
  uint32_t cp, first, second;  // second == 0: a singleton mapping
};
struct PrimaryComposite {
  uint32_t first, second, cp;
};

#include "tokenizer/nfc_tables.inc"

// Hangul syllable arithmetic (Unicode ch. 3.12).
constexpr char32_t kHangulSBase = 0xAC00, kHangulLBase = 0x1100, kHangulVBase = 0x1161,
                   kHangulTBase = 0x11A7;
constexpr int kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr int kHangulNCount = kHangulVCount * kHangulTCount;
constexpr int kHangulSCount = kHangulLCount * kHangulNCount;

bool is_hangul_syllable(char32_t cp) { return cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount; }

const CanonicalDecomposition* find_decomposition(char32_t cp) {
  const auto* begin = std::begin(kCanonicalDecompositions);
  const auto* end = std::end(kCanonicalDecompositions);
  const auto* it = std::lower_bound(begin, end, cp, [](const CanonicalDecomposition& d, char32_t c) {
    return d.cp < c;
  });
  return it != end && it->cp == cp ? it : nullptr;
}

// Full canonical decomposition of one code point, appended to `out`. Mappings
// nest at most a few levels deep, so the recursion is shallow.
void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (is_hangul_syllable(cp)) {
    const int s = static_cast<int>(cp - kHangulSBase);
    out.push_back(kHangulLBase + s / kHangulNCount);
    out.push_back(kHangulVBase + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out.push_back(kHangulTBase + s % kHangulTCount);
    return;
  }
  const CanonicalDecomposition* d = find_decomposition(cp);
  if (d == nullptr) {
    out.push_back(cp);
    return;
  }
  decompose(d->first, out);
  if (d->second != 0) decompose(d->second, out);
}

// Canonical ordering: stable sort of every run of non-starters by class.
void reorder_marks(std::vector<char32_t>& cps) {
  size_t i = 0;
  while (i < cps.size()) {
    if (canonical_combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t run_end = i;
    while (run_end < cps.size() && canonical_combining_class(cps[run_end]) != 0) ++run_end;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(run_end),
                     [](char32_t a, char32_t b) {
                       return canonical_combining_class(a) < canonical_combining_class(b);
                     });
    i = run_end;
  }
}

// The primary composite of a pair, or 0.
char32_t compose_pair(char32_t first, char32_t second) {
  if (first >= kHangulLBase && first < kHangulLBase + kHangulLCount && second >= kHangulVBase &&
      second < kHangulVBase + kHangulVCount) {
    const int l = static_cast<int>(first - kHangulLBase), v = static_cast<int>(second - kHangulVBase);
    return kHangulSBase + static_cast<char32_t>((l * kHangulVCount + v) * kHangulTCount);
  }
  if (is_hangul_syllable(first) && (first - kHangulSBase) % kHangulTCount == 0 && second > kHangulTBase &&
      second < kHangulTBase + kHangulTCount) {
    return first + (second - kHangulTBase);
  }
  const auto* begin = std::begin(kPrimaryComposites);
  const auto* end = std::end(kPrimaryComposites);
  const auto* it = std::lower_bound(begin, end, std::pair<char32_t, char32_t>(first, second),
                                    [](const PrimaryComposite& c, const std::pair<char32_t, char32_t>& key) {
                                      return c.first != key.first ? c.first < key.first : c.second < key.second;
                                    });
  return it != end && it->first == first && it->second == second ? it->cp : 0;
}

// Canonical composition (UAX #15): each character combines with the last
// starter unless something between them blocks it (a starter, or a mark of
// equal or higher class).
std::vector<char32_t> compose(const std::vector<char32_t>& cps) {
  std::vector<char32_t> out;
  out.reserve(cps.size());
  size_t starter = SIZE_MAX;
  int previous_class = 0;
  for (char32_t cp : cps) {
    const int cls = canonical_combining_class(cp);
    if (starter != SIZE_MAX) {
      const bool adjacent = starter + 1 == out.size();
      if (adjacent || (previous_class != 0 && previous_class < cls)) {
        if (char32_t composite = compose_pair(out[starter], cp); composite != 0) {
          out[starter] = composite;
          continue;
        }
      }
    }
    out.push_back(cp);
    if (cls == 0) starter = out.size() - 1;
    previous_class = cls;
  }
  return out;
}

}  // namespace

int canonical_combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* begin = std::begin(kCombiningClassRanges);
  const auto* end = std::end(kCombiningClassRanges);
  const auto* it = std::upper_bound(begin, end, cp, [](char32_t c, const CombiningClassRange& r) {
    return c < r.first;
  });
  if (it == begin) return 0;
  --it;
  return cp <= it->last ? static_cast<int>(it->ccc) : 0;
}

std::string nfc_normalize(std::string_view valid_utf8) {
  // Every code point below U+0300 (lead bytes below 0xCC) is unchanged by NFC
  // and never combines with what precedes it: most text takes this path.
  const bool trivially_normal = std::all_of(valid_utf8.begin(), valid_utf8.end(),
                                            [](char c) { return static_cast<uint8_t>(c) < 0xCC; });
  if (trivially_normal) return std::string(valid_utf8);

  std::vector<char32_t> decomposed;
  decomposed.reserve(valid_utf8.size());
  for (char32_t cp : decode_valid_utf8(valid_utf8)) decompose(cp, decomposed);
  reorder_marks(decomposed);
  std::string out;
  out.reserve(valid_utf8.size());
  for (char32_t cp : compose(decomposed)) append_utf8(out, cp);
  return out;
}

}  // namespace moeserve::tok
