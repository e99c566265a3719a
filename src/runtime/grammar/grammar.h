// The compiled form of a GBNF grammar (gbnf.h parses the text into it): a
// byte-level context-free grammar that GrammarState (matcher.h) runs.
//
// Every terminal is a set of bytes, so character classes over code points
// have already been turned into alternatives of UTF-8 byte-range sequences
// and a token may end in the middle of a multi-byte character. Rules are
// lists of alternatives; all alternatives live in one flat array of 32-bit
// elements (`code`), each alternative a run of elements ended by kEnd, so a
// grammar position is just an index into that array.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace moeserve::runtime::grammar {

struct ByteSet {
  std::array<uint64_t, 4> bits{};

  bool test(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void set(uint8_t b) { bits[b >> 6] |= uint64_t(1) << (b & 63); }
  void set_range(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) set(uint8_t(b));
  }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  ByteSet& operator|=(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) bits[i] |= o.bits[i];
    return *this;
  }
  bool operator==(const ByteSet&) const = default;
};

// One element of `code`: the kind in the top two bits, an index below.
enum class ElemKind : uint32_t {
  kEnd = 0,    // the alternative ends: the rule returns
  kBytes = 1,  // a byte from set `index`
  kRule = 2,   // rule `index`
  // Rule `index` again, as the last element of a repetition helper whose
  // repeated part can match nothing: the matcher must guard against going
  // round that loop without consuming a byte (every other such loop is
  // refused as left recursion when the grammar is compiled).
  kLoop = 3,
};
inline constexpr uint32_t kMaxElemIndex = (uint32_t(1) << 30) - 1;
inline constexpr uint32_t make_elem(ElemKind kind, uint32_t index) { return uint32_t(kind) << 30 | index; }
inline constexpr ElemKind elem_kind(uint32_t e) { return ElemKind(e >> 30); }
inline constexpr uint32_t elem_index(uint32_t e) { return e & kMaxElemIndex; }

class Grammar {
 public:
  struct Parts {
    std::vector<uint32_t> code;            // the alternatives, each ended by kEnd
    std::vector<ByteSet> sets;             // what kBytes elements index
    std::vector<uint32_t> rule_first_alt;  // rule r's alternatives: alt_start[first[r] .. first[r+1])
    std::vector<uint32_t> alt_start;       // where each alternative begins in `code`
    std::vector<std::string> rule_names;   // generated helpers are named after the rule they serve
    uint32_t root = 0;
  };

  explicit Grammar(Parts parts);

  // Unique per compiled grammar in this process (never reused), so caches
  // keyed by it cannot confuse a freed grammar with a new one.
  uint64_t id() const { return id_; }
  uint32_t root() const { return p_.root; }
  size_t rule_count() const { return p_.rule_names.size(); }
  size_t element_count() const { return p_.code.size(); }
  size_t byte_set_count() const { return p_.sets.size(); }
  const std::string& rule_name(uint32_t rule) const { return p_.rule_names[rule]; }

  uint32_t elem(uint32_t pos) const { return p_.code[pos]; }
  const ByteSet& byte_set(uint32_t index) const { return p_.sets[index]; }
  std::span<const uint32_t> alternatives(uint32_t rule) const {
    return std::span<const uint32_t>(p_.alt_start.data() + p_.rule_first_alt[rule],
                                     p_.rule_first_alt[rule + 1] - p_.rule_first_alt[rule]);
  }

 private:
  Parts p_;
  uint64_t id_;
};

}  // namespace moeserve::runtime::grammar
