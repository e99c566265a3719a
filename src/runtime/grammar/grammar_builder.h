// The compiler between the GBNF parser (gbnf.cpp) and the compiled Grammar:
// it owns the rules while they are built, turns literals, character classes
// and repetitions into byte-level symbols and helper rules, counts what is
// built against GrammarLimits, and at the end checks the grammar (every rule
// defined, a root, no left recursion) and flattens it. Internal to the
// grammar folder.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "runtime/grammar/gbnf.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/utf8_ranges.h"

namespace moeserve::runtime::grammar {

// "grammar line L, column C: reason" for the byte at `offset` of `text`.
Status grammar_error(std::string_view text, size_t offset, std::string_view reason);

// A symbol while building: a Grammar element (kBytes, kRule or kLoop).
using Sym = uint32_t;
using Seq = std::vector<Sym>;

inline constexpr uint64_t kUnbounded = ~uint64_t(0);

class GrammarBuilder {
 public:
  GrammarBuilder(std::string_view text, const GrammarLimits& limits) : text_(text), limits_(limits) {}

  // The user rule called `name`, created undefined at its first mention
  // (`at`: where, for the error when it is never defined).
  Result<uint32_t> named_rule(std::string_view name, size_t at);
  // Errors carry only the reason: the parser adds where.
  Status define(uint32_t rule, std::vector<Seq> alts, size_t at);
  // A generated rule serving user rule `owner`; returns a symbol referring to it.
  Result<Sym> helper(uint32_t owner, std::vector<Seq> alts);

  // A reference to user rule `name` (mentioned at `at`).
  Result<Seq> rule_ref(std::string_view name, size_t at);
  // One single-byte symbol per byte.
  Result<Seq> literal(std::string_view bytes);
  // A class over code points (normalized ranges): one byte-set symbol when
  // every match is a single byte, else a helper rule of UTF-8 sequences.
  Result<Seq> char_class(const std::vector<CodeRange>& ranges, uint32_t owner);
  // `item` repeated min..max times (max may be kUnbounded).
  Result<Seq> repeat(const Seq& item, uint64_t min, uint64_t max, uint32_t owner);

  Result<std::shared_ptr<const Grammar>> finish();

 private:
  struct Rule {
    std::string name;
    std::vector<Seq> alts;
    uint32_t owner = 0;  // the user rule a helper serves (itself for user rules)
    size_t at = 0;       // definition, or first mention while undefined
    bool defined = false;
    bool helper = false;
  };

  Status charge(uint64_t elements);
  Result<uint32_t> new_rule(std::string name, uint32_t owner, bool helper);
  Sym set_sym(const ByteSet& set);
  Sym byte_sym(uint8_t b);
  std::vector<bool> nullable() const;
  Status check_left_recursion(const std::vector<bool>& nullable) const;

  std::string_view text_;
  GrammarLimits limits_;
  std::vector<Rule> rules_;
  std::unordered_map<std::string, uint32_t> by_name_;
  std::vector<ByteSet> sets_;
  std::map<std::array<uint64_t, 4>, uint32_t> set_index_;
  std::map<std::vector<CodeRange>, Seq> class_cache_;
  std::array<int64_t, 256> byte_syms_ = make_unset();
  static std::array<int64_t, 256> make_unset() {
    std::array<int64_t, 256> a{};
    a.fill(-1);
    return a;
  }
  uint64_t elements_ = 0;  // charged so far (an upper bound of the final size)
};

}  // namespace moeserve::runtime::grammar
