#include "runtime/grammar/grammar_builder.h"

#include <algorithm>
#include <atomic>

namespace moeserve::runtime::grammar {
namespace {

std::atomic<uint64_t> g_next_grammar_id{1};

bool is_rule_sym(Sym s) { return elem_kind(s) == ElemKind::kRule || elem_kind(s) == ElemKind::kLoop; }

}  // namespace

Grammar::Grammar(Parts parts) : p_(std::move(parts)), id_(g_next_grammar_id.fetch_add(1)) {}

Status grammar_error(std::string_view text, size_t offset, std::string_view reason) {
  offset = std::min(offset, text.size());
  size_t line = 1;
  size_t column = 1;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return make_error(StatusCode::kInvalidArgument, "grammar line {}, column {}: {}", line, column, reason);
}

Status GrammarBuilder::charge(uint64_t elements) {
  elements_ += elements;
  if (elements_ > limits_.max_elements) {
    return make_error(StatusCode::kInvalidArgument,
                      "the grammar compiles to more than {} elements (repetitions are expanded)",
                      limits_.max_elements);
  }
  return Status::ok();
}

Result<uint32_t> GrammarBuilder::new_rule(std::string name, uint32_t owner, bool helper) {
  if (rules_.size() >= limits_.max_rules) {
    return make_error(StatusCode::kInvalidArgument,
                      "the grammar needs more than {} rules (repetitions and classes add helper rules)",
                      limits_.max_rules);
  }
  Rule r;
  r.name = std::move(name);
  r.owner = owner;
  r.helper = helper;
  r.defined = helper;
  rules_.push_back(std::move(r));
  return uint32_t(rules_.size() - 1);
}

Result<uint32_t> GrammarBuilder::named_rule(std::string_view name, size_t at) {
  const std::string key(name);
  if (auto it = by_name_.find(key); it != by_name_.end()) return it->second;
  MOESERVE_ASSIGN_OR_RETURN(const uint32_t id, new_rule(key, 0, false));
  rules_[id].owner = id;
  rules_[id].at = at;
  by_name_.emplace(key, id);
  return id;
}

Status GrammarBuilder::define(uint32_t rule, std::vector<Seq> alts, size_t at) {
  Rule& r = rules_[rule];
  if (r.defined) return make_error(StatusCode::kInvalidArgument, "rule '{}' is defined twice", r.name);
  MOESERVE_RETURN_IF_ERROR(charge(alts.size()));  // each alternative's end marker
  r.defined = true;
  r.at = at;
  r.alts = std::move(alts);
  return Status::ok();
}

Result<Sym> GrammarBuilder::helper(uint32_t owner, std::vector<Seq> alts) {
  MOESERVE_RETURN_IF_ERROR(charge(alts.size() + 1));
  MOESERVE_ASSIGN_OR_RETURN(const uint32_t id, new_rule(rules_[owner].name, owner, true));
  rules_[id].alts = std::move(alts);
  return make_elem(ElemKind::kRule, id);
}

Sym GrammarBuilder::set_sym(const ByteSet& set) {
  auto [it, inserted] = set_index_.emplace(set.bits, uint32_t(sets_.size()));
  if (inserted) sets_.push_back(set);
  return make_elem(ElemKind::kBytes, it->second);
}

Sym GrammarBuilder::byte_sym(uint8_t b) {
  if (byte_syms_[b] < 0) {
    ByteSet s;
    s.set(b);
    byte_syms_[b] = set_sym(s);
  }
  return Sym(byte_syms_[b]);
}

Result<Seq> GrammarBuilder::rule_ref(std::string_view name, size_t at) {
  MOESERVE_RETURN_IF_ERROR(charge(1));
  MOESERVE_ASSIGN_OR_RETURN(const uint32_t id, named_rule(name, at));
  return Seq{make_elem(ElemKind::kRule, id)};
}

Result<Seq> GrammarBuilder::literal(std::string_view bytes) {
  MOESERVE_RETURN_IF_ERROR(charge(bytes.size()));
  Seq out;
  out.reserve(bytes.size());
  for (const char c : bytes) out.push_back(byte_sym(uint8_t(c)));
  return out;
}

Result<Seq> GrammarBuilder::char_class(const std::vector<CodeRange>& ranges, uint32_t owner) {
  if (auto it = class_cache_.find(ranges); it != class_cache_.end()) {
    MOESERVE_RETURN_IF_ERROR(charge(it->second.size()));
    return it->second;
  }
  std::vector<Utf8Seq> seqs;
  for (const CodeRange& r : ranges) append_utf8_sequences(r.lo, r.hi, seqs);
  // Single bytes become one set; longer sequences that differ only in their
  // first byte share one alternative (e.g. E1-EC and EE-EF before two
  // continuation bytes), which keeps the matcher's stacks few.
  ByteSet single;
  std::map<std::vector<Utf8Seq::Range>, ByteSet> by_tail;
  for (const Utf8Seq& s : seqs) {
    if (s.len == 1) {
      single.set_range(s.r[0].lo, s.r[0].hi);
      continue;
    }
    std::vector<Utf8Seq::Range> tail(s.r.begin() + 1, s.r.begin() + s.len);
    by_tail[tail].set_range(s.r[0].lo, s.r[0].hi);
  }
  std::vector<Seq> alts;
  if (!single.empty() || by_tail.empty()) alts.push_back({set_sym(single)});
  for (const auto& [tail, first] : by_tail) {
    Seq alt{set_sym(first)};
    for (const Utf8Seq::Range& r : tail) {
      ByteSet s;
      s.set_range(r.lo, r.hi);
      alt.push_back(set_sym(s));
    }
    alts.push_back(std::move(alt));
  }
  Seq out;
  if (alts.size() == 1) {
    out = std::move(alts[0]);
    MOESERVE_RETURN_IF_ERROR(charge(out.size()));
  } else {
    uint64_t size = 0;
    for (const Seq& a : alts) size += a.size();
    MOESERVE_RETURN_IF_ERROR(charge(size));
    MOESERVE_ASSIGN_OR_RETURN(const Sym h, helper(owner, std::move(alts)));
    out = {h};
  }
  class_cache_.emplace(ranges, out);
  return out;
}

// x{m,n} is m copies of x then a chain of n-m nested optionals,
// O_k ::= x O_{k-1} | ε, and x{m,} ends in R ::= x R | ε. Both recurse on the
// right, so the matcher's stacks do not grow with the count, and no
// alternative holds more than one copy of x.
Result<Seq> GrammarBuilder::repeat(const Seq& item, uint64_t min, uint64_t max, uint32_t owner) {
  if (item.empty() || max == 0) return Seq{};
  const uint64_t n = item.size();
  const uint64_t optional = max == kUnbounded ? 1 : max - min;
  // Counts before anything is allocated (the parser caps m and n at 1e9).
  MOESERVE_RETURN_IF_ERROR(charge(n * min + optional * (n + 3)));
  Seq out;
  out.reserve(size_t(n * min + 1));
  for (uint64_t i = 0; i < min; ++i) out.insert(out.end(), item.begin(), item.end());
  if (max == kUnbounded) {
    MOESERVE_ASSIGN_OR_RETURN(const uint32_t id, new_rule(rules_[owner].name, owner, true));
    Seq loop = item;
    loop.push_back(make_elem(ElemKind::kLoop, id));
    rules_[id].alts = {std::move(loop), Seq{}};
    out.push_back(make_elem(ElemKind::kRule, id));
    return out;
  }
  Sym inner = 0;
  for (uint64_t k = 1; k <= optional; ++k) {
    Seq alt = item;
    if (k > 1) alt.push_back(inner);
    MOESERVE_ASSIGN_OR_RETURN(inner, helper(owner, {std::move(alt), Seq{}}));
  }
  if (optional > 0) out.push_back(inner);
  return out;
}

std::vector<bool> GrammarBuilder::nullable() const {
  // Worklist: an alternative becomes nullable once every rule it mentions
  // is (it never is if it has a byte); each mention is counted down once.
  const size_t n = rules_.size();
  std::vector<bool> null(n, false);
  std::vector<std::vector<uint32_t>> mentions(n);  // rule -> alternatives mentioning it
  std::vector<uint32_t> alt_rule;
  std::vector<int64_t> pending;
  std::vector<uint32_t> work;
  for (uint32_t r = 0; r < n; ++r) {
    for (const Seq& alt : rules_[r].alts) {
      const uint32_t id = uint32_t(alt_rule.size());
      alt_rule.push_back(r);
      int64_t count = 0;
      bool has_byte = false;
      for (const Sym s : alt) {
        if (is_rule_sym(s)) {
          ++count;
          mentions[elem_index(s)].push_back(id);
        } else {
          has_byte = true;
        }
      }
      pending.push_back(has_byte ? -1 : count);
      if (!has_byte && count == 0 && !null[r]) {
        null[r] = true;
        work.push_back(r);
      }
    }
  }
  while (!work.empty()) {
    const uint32_t r = work.back();
    work.pop_back();
    for (const uint32_t id : mentions[r]) {
      if (pending[id] > 0 && --pending[id] == 0 && !null[alt_rule[id]]) {
        null[alt_rule[id]] = true;
        work.push_back(alt_rule[id]);
      }
    }
  }
  return null;
}

// A rule that can reach itself through leftmost symbols (everything before
// them nullable) would make the matcher expand forever without reading a
// byte. The tail self-reference of a `*` helper is the one loop allowed: the
// matcher recognises it (kLoop).
Status GrammarBuilder::check_left_recursion(const std::vector<bool>& nullable) const {
  const size_t n = rules_.size();
  std::vector<uint32_t> first(n + 1, 0);
  std::vector<uint32_t> edges;
  for (uint32_t r = 0; r < n; ++r) {
    first[r] = uint32_t(edges.size());
    for (const Seq& alt : rules_[r].alts) {
      for (const Sym s : alt) {
        if (elem_kind(s) != ElemKind::kRule) break;  // a byte, or the allowed loop
        edges.push_back(elem_index(s));
        if (!nullable[elem_index(s)]) break;
      }
    }
  }
  first[n] = uint32_t(edges.size());
  std::vector<uint8_t> color(n, 0);                 // 0 unseen, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, uint32_t>> path;  // rule, next edge
  for (uint32_t start = 0; start < n; ++start) {
    if (color[start] != 0) continue;
    color[start] = 1;
    path.push_back({start, first[start]});
    while (!path.empty()) {
      auto& [v, e] = path.back();
      if (e == first[v + 1]) {
        color[v] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t w = edges[e++];
      if (color[w] == 0) {
        color[w] = 1;
        path.push_back({w, first[w]});
      } else if (color[w] == 1) {
        // The cycle by user rule names (helpers show as the rule they serve).
        std::vector<std::string> names;
        size_t i = 0;
        while (path[i].first != w) ++i;
        for (; i < path.size(); ++i) {
          const std::string& name = rules_[rules_[path[i].first].owner].name;
          if (names.empty() || names.back() != name) names.push_back(name);
        }
        const Rule& owner = rules_[rules_[w].owner];
        std::string cycle;
        for (const std::string& name : names) cycle += name + " -> ";
        cycle += owner.name;
        return grammar_error(text_, owner.at,
                             fmt::format("left recursion: rule '{}' can reach itself before reading any "
                                         "input ({})",
                                         owner.name, cycle));
      }
    }
  }
  return Status::ok();
}

Result<std::shared_ptr<const Grammar>> GrammarBuilder::finish() {
  const Rule* undefined = nullptr;
  for (const Rule& r : rules_) {
    if (!r.defined && (undefined == nullptr || r.at < undefined->at)) undefined = &r;
  }
  if (undefined != nullptr) {
    return grammar_error(text_, undefined->at, fmt::format("undefined rule '{}'", undefined->name));
  }
  const auto root = by_name_.find("root");
  if (root == by_name_.end()) return grammar_error(text_, 0, "no rule named 'root' (matching starts there)");
  const std::vector<bool> null = nullable();
  MOESERVE_RETURN_IF_ERROR(check_left_recursion(null));

  Grammar::Parts p;
  p.root = root->second;
  for (const Rule& r : rules_) {
    p.rule_first_alt.push_back(uint32_t(p.alt_start.size()));
    p.rule_names.push_back(r.name);
    for (const Seq& alt : r.alts) {
      p.alt_start.push_back(uint32_t(p.code.size()));
      for (size_t i = 0; i < alt.size(); ++i) {
        Sym s = alt[i];
        if (elem_kind(s) == ElemKind::kLoop) {
          // Only a loop whose repeated part can match nothing needs the guard.
          const bool empty_body = std::all_of(alt.begin(), alt.begin() + i,
                                              [&](Sym x) { return is_rule_sym(x) && null[elem_index(x)]; });
          if (!empty_body) s = make_elem(ElemKind::kRule, elem_index(s));
        }
        p.code.push_back(s);
      }
      p.code.push_back(make_elem(ElemKind::kEnd, 0));
    }
  }
  p.rule_first_alt.push_back(uint32_t(p.alt_start.size()));
  p.sets = sets_;
  return std::shared_ptr<const Grammar>(std::make_shared<const Grammar>(std::move(p)));
}

}  // namespace moeserve::runtime::grammar
